-- A relay's claim takes the due messages in the order they came due (next_attempt_at, then
-- seq) along this index, so that messages delayed or backing off for later are never
-- scanned: along idem_outbox_due (seq), a claim stepped over every one of them with a lower
-- seq than the first due message (on PostgreSQL, 100,000 delayed before 1,000 due: a claim
-- of 100 in 55.0 ms along idem_outbox_due, 100,000 rows filtered out, and in 0.50 ms along
-- this index, none).
CREATE INDEX IF NOT EXISTS idem_outbox_due_at ON idem_outbox (next_attempt_at, seq) WHERE published_at IS NULL AND dead_at IS NULL;
