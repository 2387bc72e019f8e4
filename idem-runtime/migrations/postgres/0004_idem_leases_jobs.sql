-- Leases (idem::lease): one row per name, with the fencing token of its latest holder,
-- which rises with every holder, and the time the lease ends. Scheduled jobs
-- (idem::schedule): one row per job, with the first occurrence not yet run (next_at), the
-- leased run of it in flight (running_at, fence, lease_until, which also holds back the
-- retry of a failed one), and the last occurrence that ran, with its result or the last
-- failure. Times are milliseconds since the Unix epoch, from the database's clock.
CREATE TABLE IF NOT EXISTS idem_leases (
    name TEXT NOT NULL PRIMARY KEY,
    fence BIGINT NOT NULL,
    holder TEXT NOT NULL,
    lease_until BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS idem_jobs (
    job TEXT NOT NULL PRIMARY KEY,
    next_at BIGINT NOT NULL,
    fence BIGINT NOT NULL,
    running_at BIGINT,
    lease_until BIGINT,
    attempts BIGINT NOT NULL,
    last_at BIGINT,
    result TEXT,
    error TEXT,
    updated_at BIGINT NOT NULL
);
