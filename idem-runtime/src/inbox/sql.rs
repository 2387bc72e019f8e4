//! The inbox's statements. Every value is bound; the table is `idem_inbox`.

/// The schema for PostgreSQL, as its sqlx migrations in order (`0001_idem.sql`: the
/// results table and the inbox; `0002_idem_inbox_unchecked_status.sql`: the inbox's status
/// without its CHECK constraint), in one text.
pub const POSTGRES_MIGRATION: &str = concat!(
    include_str!("../../migrations/postgres/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/postgres/0002_idem_inbox_unchecked_status.sql"),
);
/// The schema, as a sqlx migration for SQLite: the results table and the inbox.
pub const SQLITE_MIGRATION: &str = include_str!("../../migrations/sqlite/0001_idem.sql");

/// Records a first delivery; does nothing if the key is recorded.
/// `$1` group, `$2` key, `$3` fingerprint, `$4` status, `$5` lease until, `$6` now.
pub(crate) const INSERT: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, 1, $5, $6, $6) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT`] on PostgreSQL, unless a transaction still working on the same key holds its
/// advisory lock: then nothing is inserted, at once, instead of waiting on that
/// transaction's uncommitted record. The lock is only a way not to wait; the primary key
/// still makes a second record impossible. Advisory locks are per database, so the lock's
/// hash is seeded with the inbox table's OID: the same key in another schema's inbox is
/// another lock.
pub(crate) const INSERT_UNLESS_BUSY: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, $2, $3, $4, 1, $5, $6, $6 \
    WHERE pg_try_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, \
        CAST(CAST(CAST('idem_inbox' AS regclass) AS oid) AS bigint))) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// The record of `$1` group, `$2` key (SQLite: inside `BEGIN IMMEDIATE`, already locked).
pub(crate) const SELECT: &str = "SELECT status, fingerprint, attempts, result, error, lease_until \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2";

/// [`SELECT`], locking the row until the transaction ends (PostgreSQL).
pub(crate) const SELECT_FOR_UPDATE: &str = "SELECT status, fingerprint, attempts, result, error, lease_until \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2 FOR UPDATE";

/// Another attempt at a failed or expired record, if nobody took it in between.
/// `$3` status, `$4` lease until, `$5` now, `$6` the attempts seen.
pub(crate) const RETRY: &str = "UPDATE idem_inbox \
    SET status = $3, attempts = attempts + 1, lease_until = $4, error = NULL, updated_at = $5 \
    WHERE consumer_group = $1 AND message_key = $2 AND attempts = $6";

/// Parks a record after its last allowed attempt. `$3` now.
pub(crate) const BURY: &str = "UPDATE idem_inbox \
    SET status = 'DEAD', lease_until = NULL, updated_at = $3 \
    WHERE consumer_group = $1 AND message_key = $2";

/// Stores the result of a transactional delivery. `$3` result.
pub(crate) const STORE_RESULT: &str = "UPDATE idem_inbox SET result = $3 \
    WHERE consumer_group = $1 AND message_key = $2";

/// Records the success of a leased attempt, if it still holds the lease.
/// `$3` result, `$4` now, `$5` the attempt.
pub(crate) const SUCCEED: &str = "UPDATE idem_inbox \
    SET status = 'SUCCESS', result = $3, error = NULL, lease_until = NULL, updated_at = $4 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// Records the failure of a leased attempt: FAILED, or DEAD after the last one.
/// `$3` max attempts, `$4` error, `$5` now, `$6` the attempt.
pub(crate) const FAIL: &str = "UPDATE idem_inbox \
    SET status = CASE WHEN attempts >= $3 THEN 'DEAD' ELSE 'FAILED' END, \
    error = $4, lease_until = NULL, updated_at = $5 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $6";

/// Extends a lease still held. `$3` lease until, `$4` now, `$5` the attempt.
pub(crate) const EXTEND: &str = "UPDATE idem_inbox SET lease_until = $3, updated_at = $4 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// How many records of `$1` group are PROCESSING with a lease that ended before `$2`, and
/// the oldest such lease.
pub(crate) const STUCK: &str = "SELECT COUNT(*) AS stuck, MIN(lease_until) AS oldest \
    FROM idem_inbox WHERE consumer_group = $1 AND status = 'PROCESSING' AND lease_until <= $2";

/// One bounded batch of retention (PostgreSQL): finished records of `$1` group last
/// touched before `$2`, at most `$3`, skipping rows another transaction holds.
pub(crate) const PURGE_POSTGRES: &str = "DELETE FROM idem_inbox WHERE ctid IN (\
    SELECT ctid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < $2 AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3 FOR UPDATE SKIP LOCKED)";

/// One bounded batch of retention (SQLite).
pub(crate) const PURGE_SQLITE: &str = "DELETE FROM idem_inbox WHERE rowid IN (\
    SELECT rowid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < $2 AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3)";

/// The statements of a migration, one by one (a prepared statement holds one command).
pub(crate) fn statements(migration: &str) -> impl Iterator<Item = &str> {
    migration.split(';').map(str::trim).filter(|statement| {
        statement
            .lines()
            .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_split_into_their_statements() {
        for (migration, count) in [(POSTGRES_MIGRATION, 4), (SQLITE_MIGRATION, 3)] {
            let statements: Vec<&str> = statements(migration).collect();
            assert_eq!(statements.len(), count, "{statements:#?}");
            assert!(statements[1].contains("CREATE TABLE IF NOT EXISTS idem_inbox"));
        }
        // `statements` splits at every semicolon, so a comment must not hold one.
        for migration in [POSTGRES_MIGRATION, SQLITE_MIGRATION] {
            for line in migration
                .lines()
                .filter(|l| l.trim_start().starts_with("--"))
            {
                assert!(!line.contains(';'), "a semicolon in a comment: {line}");
            }
        }
        let last = statements(POSTGRES_MIGRATION).last().unwrap();
        assert!(last.contains("DROP CONSTRAINT IF EXISTS idem_inbox_status_check"));
    }
}
