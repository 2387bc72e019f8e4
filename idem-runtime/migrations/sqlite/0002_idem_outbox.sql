-- The outbox: messages staged in the transaction of the effect they announce, published
-- afterwards by a relay (idem::outbox). `seq` orders the messages of one ordering key.
-- Times are milliseconds since the Unix epoch, from the database's clock.
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    ordering_key TEXT NOT NULL,
    destination TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    payload BLOB NOT NULL,
    headers TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    attempts BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    last_error TEXT,
    published_at BIGINT,
    dead_at BIGINT,
    claimed_until BIGINT
);

-- A relay's claim: the unpublished messages of a key, to find its head, and the due ones in order.
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (ordering_key, seq) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (seq) WHERE published_at IS NULL AND dead_at IS NULL;
-- Retention deletes published messages by age in bounded batches.
CREATE INDEX IF NOT EXISTS idem_outbox_published_at ON idem_outbox (published_at) WHERE published_at IS NOT NULL;
