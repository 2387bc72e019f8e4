-- A relay's candidates: the due messages (published_at IS NULL, dead_at IS NULL) in seq
-- order, along one index that leaves out the dead messages and those held behind them
-- (dead_at = 0). Along idem_outbox_published (published_at, seq), every claim stepped over
-- each message held behind a dead one before reaching the other keys' messages. The same
-- index finds the dead messages (dead_at > 0) and the held ones.
CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (published_at, dead_at, seq);
-- Staging on MySQL does not hold a message behind its key's dead head (its INSERT would lock
-- the head): a relay holds them before each claim, finding the unheld ones behind a dead
-- message (dead_at IS NULL, seq above its) along this index, without stepping over the held.
CREATE INDEX IF NOT EXISTS idem_outbox_unheld ON idem_outbox (ordering_key, dead_at, seq);
-- A relay's claim locks, with each message, the row of its ordering key's bucket (CRC32 of
-- the key, modulo 16384), and passes over a message whose bucket another relay holds: while
-- one relay publishes a message of a key, no other claims another of it, even one with a
-- lower seq committed meanwhile (AUTO_INCREMENT hands out seq at INSERT, not at COMMIT).
-- A transaction's row lock, not GET_LOCK, which a session holds and Galera refuses. The
-- rows are made once, and never written again.
CREATE TABLE IF NOT EXISTS idem_outbox_locks (
    bucket INT NOT NULL,
    PRIMARY KEY (bucket)
) ENGINE = InnoDB;
INSERT IGNORE INTO idem_outbox_locks (bucket)
SELECT a.n + 16 * b.n + 256 * c.n + 4096 * d.n
FROM (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9
      UNION ALL SELECT 10 UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13
      UNION ALL SELECT 14 UNION ALL SELECT 15) AS a
CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9
      UNION ALL SELECT 10 UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13
      UNION ALL SELECT 14 UNION ALL SELECT 15) AS b
CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
      UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9
      UNION ALL SELECT 10 UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13
      UNION ALL SELECT 14 UNION ALL SELECT 15) AS c
CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS d
WHERE (SELECT COUNT(*) FROM idem_outbox_locks) < 16384;
