-- idem's tables for SQLite. Apply with sqlx's migrator or copy into your own tool.

-- First results of applied transitions (#[idempotent] handlers), replayed to duplicates.
CREATE TABLE IF NOT EXISTS idem_results (
    machine TEXT NOT NULL,
    entity_key TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    result TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (machine, entity_key, from_state, to_state)
);

-- The inbox: one record per (consumer group, message key). Times are milliseconds since
-- the Unix epoch, from the inbox's clock.
CREATE TABLE IF NOT EXISTS idem_inbox (
    consumer_group TEXT NOT NULL,
    message_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED', 'DEAD')),
    attempts BIGINT NOT NULL,
    result TEXT,
    error TEXT,
    lease_until BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (consumer_group, message_key)
);

-- Retention deletes by age in bounded batches.
CREATE INDEX IF NOT EXISTS idem_inbox_updated_at ON idem_inbox (updated_at);
