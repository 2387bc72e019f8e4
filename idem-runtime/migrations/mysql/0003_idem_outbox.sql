-- The outbox: messages staged in the transaction of the effect they announce, published
-- afterwards by a relay (idem::outbox). `seq` orders the messages of one ordering key.
-- Times are milliseconds since the Unix epoch, from the database's clock. Ids and ordering
-- keys are compared byte for byte (VARBINARY), each at most 255 bytes. A relay's claim
-- finds a key's head along idem_outbox_pending and the due messages in order along
-- idem_outbox_published (published_at IS NULL, then seq), which retention also follows.
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq BIGINT NOT NULL AUTO_INCREMENT,
    id VARBINARY(255) NOT NULL,
    ordering_key VARBINARY(255) NOT NULL,
    destination VARCHAR(255) NOT NULL,
    routing_key VARCHAR(255) NOT NULL,
    payload LONGBLOB NOT NULL,
    headers LONGTEXT NOT NULL,
    created_at BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    last_error LONGTEXT,
    published_at BIGINT,
    dead_at BIGINT,
    claimed_until BIGINT,
    PRIMARY KEY (seq),
    UNIQUE KEY idem_outbox_id (id),
    KEY idem_outbox_pending (ordering_key, published_at, seq),
    KEY idem_outbox_published (published_at, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
