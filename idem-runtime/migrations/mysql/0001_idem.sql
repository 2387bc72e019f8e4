-- idem's tables for MySQL and MariaDB (InnoDB). Apply with sqlx's migrator or copy into your own tool.
-- Key columns are VARCHAR under a binary collation, compared byte for byte as on the other
-- backends (a TEXT key would need a prefix, and the default collations ignore case and
-- trailing spaces). The other text columns keep the default collation, read as text.

-- First results of applied transitions (#[idempotent] handlers), replayed to duplicates.
-- The key's 768 characters are InnoDB's limit of 3072 bytes in utf8mb4.
CREATE TABLE IF NOT EXISTS idem_results (
    machine VARCHAR(128) COLLATE utf8mb4_bin NOT NULL,
    entity_key VARCHAR(512) COLLATE utf8mb4_bin NOT NULL,
    from_state VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    to_state VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    result LONGTEXT NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (machine, entity_key, from_state, to_state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The inbox: one record per (consumer group, message key), each at most 255 bytes. Times
-- are milliseconds since the Unix epoch, from the inbox's clock. Retention deletes by age
-- in bounded batches, along the index on updated_at.
CREATE TABLE IF NOT EXISTS idem_inbox (
    consumer_group VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    message_key VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    fingerprint VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    attempts BIGINT NOT NULL,
    result LONGTEXT,
    error LONGTEXT,
    lease_until BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (consumer_group, message_key),
    KEY idem_inbox_updated_at (updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
