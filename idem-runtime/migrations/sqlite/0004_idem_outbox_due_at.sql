-- A relay's claim takes the due messages in the order they came due (next_attempt_at, then
-- seq) along this index, so that messages delayed or backing off for later are never
-- scanned: along idem_outbox_due (seq), a claim stepped over every one of them with a lower
-- seq than the first due message (100,000 delayed: 8.4 ms a claim, against 0.1 ms).
CREATE INDEX IF NOT EXISTS idem_outbox_due_at ON idem_outbox (next_attempt_at, seq) WHERE published_at IS NULL AND dead_at IS NULL;
