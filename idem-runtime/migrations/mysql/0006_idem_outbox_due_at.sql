-- A relay's candidates are the due messages in the order they came due (next_attempt_at,
-- then seq) along this index, so that messages delayed or backing off for later are never
-- scanned: along idem_outbox_due (published_at, dead_at, seq), a claim stepped over every
-- one of them with a lower seq than the first due message.
CREATE INDEX IF NOT EXISTS idem_outbox_due_at ON idem_outbox (published_at, dead_at, next_attempt_at, seq);
