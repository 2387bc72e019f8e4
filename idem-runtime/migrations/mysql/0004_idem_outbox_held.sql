-- A relay's candidates: the due messages (published_at IS NULL, dead_at IS NULL) in seq
-- order, along one index that leaves out the dead messages and those held behind them
-- (dead_at = 0). Along idem_outbox_published (published_at, seq), every claim stepped over
-- each message held behind a dead one before reaching the other keys' messages. The same
-- index finds the dead messages (dead_at > 0) and the held ones.
CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (published_at, dead_at, seq);
