//! The inbox's statements (the table `idem_inbox`), and which of them each dialect runs.
//! Every value is bound.

use crate::dialect::Dialect;

/// Records a first delivery; does nothing if the key is recorded.
/// `$1` group, `$2` key, `$3` fingerprint, `$4` status, `$5` lease until, `$6` now.
pub const INSERT: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, 1, $5, $6, $6) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT`] on PostgreSQL, unless a transaction still working on the same key holds its
/// advisory lock: then nothing is inserted, at once, instead of waiting on that
/// transaction's uncommitted record. The lock is only a way not to wait; the primary key
/// still makes a second record impossible. Advisory locks are per database, so the lock's
/// hash is seeded with the inbox table's OID: the same key in another schema's inbox is
/// another lock.
pub const INSERT_UNLESS_BUSY: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, $2, $3, $4, 1, $5, $6, $6 \
    WHERE pg_try_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, \
        CAST(CAST(CAST('idem_inbox' AS regclass) AS oid) AS bigint))) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT`] on MySQL, which has no `ON CONFLICT`: a recorded key fails with the
/// duplicate-key error (1062), which the runtime reads as "nothing inserted" (the primary
/// key is the table's only unique index).
pub const INSERT_MYSQL: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, 1, $5, $6, $6)";

/// The record of `$1` group, `$2` key (SQLite: inside `BEGIN IMMEDIATE`, already locked).
pub const SELECT: &str = "SELECT status, fingerprint, attempts, result, error, lease_until \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2";

/// [`SELECT`], locking the row until the transaction ends (PostgreSQL, MySQL).
pub const SELECT_FOR_UPDATE: &str = "SELECT status, fingerprint, attempts, result, error, lease_until \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2 FOR UPDATE";

/// Another attempt at a failed or expired record, if nobody took it in between.
/// `$3` status, `$4` lease until, `$5` now, `$6` the attempts seen.
pub const RETRY: &str = "UPDATE idem_inbox \
    SET status = $3, attempts = attempts + 1, lease_until = $4, error = NULL, updated_at = $5 \
    WHERE consumer_group = $1 AND message_key = $2 AND attempts = $6";

/// Parks a record after its last allowed attempt. `$3` now.
pub const BURY: &str = "UPDATE idem_inbox \
    SET status = 'DEAD', lease_until = NULL, updated_at = $3 \
    WHERE consumer_group = $1 AND message_key = $2";

/// Stores the result of a transactional delivery. `$3` result.
pub const STORE_RESULT: &str = "UPDATE idem_inbox SET result = $3 \
    WHERE consumer_group = $1 AND message_key = $2";

/// Records the success of a leased attempt, if it still holds the lease.
/// `$3` result, `$4` now, `$5` the attempt.
pub const SUCCEED: &str = "UPDATE idem_inbox \
    SET status = 'SUCCESS', result = $3, error = NULL, lease_until = NULL, updated_at = $4 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// Records the failure of a leased attempt: FAILED, or DEAD after the last one.
/// `$3` max attempts, `$4` error, `$5` now, `$6` the attempt.
pub const FAIL: &str = "UPDATE idem_inbox \
    SET status = CASE WHEN attempts >= $3 THEN 'DEAD' ELSE 'FAILED' END, \
    error = $4, lease_until = NULL, updated_at = $5 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $6";

/// Extends a lease still held. `$3` lease until, `$4` now, `$5` the attempt.
pub const EXTEND: &str = "UPDATE idem_inbox SET lease_until = $3, updated_at = $4 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// How many records of `$1` group are PROCESSING with a lease that ended before `$2`, and
/// the oldest such lease.
pub const STUCK: &str = "SELECT COUNT(*) AS stuck, MIN(lease_until) AS oldest \
    FROM idem_inbox WHERE consumer_group = $1 AND status = 'PROCESSING' AND lease_until <= $2";

/// One bounded batch of retention (PostgreSQL): finished records of `$1` group last
/// touched before `$2`, at most `$3`, skipping rows another transaction holds.
pub const PURGE_POSTGRES: &str = "DELETE FROM idem_inbox WHERE ctid IN (\
    SELECT ctid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < $2 AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3 FOR UPDATE SKIP LOCKED)";

/// One bounded batch of retention (MySQL, which deletes with a `LIMIT` directly, oldest
/// first along the index on `updated_at`).
pub const PURGE_MYSQL: &str = "DELETE FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < $2 AND status IN ('SUCCESS', 'FAILED') \
    ORDER BY updated_at LIMIT $3";

/// One bounded batch of retention (SQLite).
pub const PURGE_SQLITE: &str = "DELETE FROM idem_inbox WHERE rowid IN (\
    SELECT rowid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < $2 AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3)";

impl Dialect {
    /// The statement that records a first delivery: [`INSERT`] ([`INSERT_MYSQL`] on
    /// MySQL); on PostgreSQL with `unblocked`, [`INSERT_UNLESS_BUSY`] (a delivery in
    /// progress elsewhere makes it insert nothing at once instead of waiting; elsewhere the
    /// lock timeout bounds the wait). The flag says which: whether inserting nothing may
    /// also find no record (the key was busy).
    pub fn inbox_insert(self, unblocked: bool) -> (&'static str, bool) {
        match self {
            Dialect::Postgres if unblocked => (INSERT_UNLESS_BUSY, true),
            Dialect::Postgres | Dialect::Sqlite => (INSERT, false),
            Dialect::MySql => (INSERT_MYSQL, false),
        }
    }

    /// Whether an insert that finds its key taken fails with the duplicate-key error
    /// instead of inserting nothing (MySQL: no `ON CONFLICT … DO NOTHING`).
    pub fn refuses_taken_keys(self) -> bool {
        matches!(self, Dialect::MySql)
    }

    /// The read of a record that a delivery may go on to retry: locking on PostgreSQL
    /// ([`SELECT_FOR_UPDATE`]); SQLite's `BEGIN IMMEDIATE` holds the database already, so
    /// the plain [`SELECT`]. `None` when the plain read already done suffices.
    pub fn inbox_locking_select(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres | Dialect::MySql => Some(SELECT_FOR_UPDATE),
            Dialect::Sqlite => None,
        }
    }

    /// One bounded batch of retention: [`PURGE_POSTGRES`], [`PURGE_SQLITE`] or
    /// [`PURGE_MYSQL`].
    pub fn inbox_purge(self) -> &'static str {
        match self {
            Dialect::Postgres => PURGE_POSTGRES,
            Dialect::Sqlite => PURGE_SQLITE,
            Dialect::MySql => PURGE_MYSQL,
        }
    }

    /// The statement that bounds how long this transaction waits for a lock, `millis`
    /// (at least 1); `None` where the backend has no such setting (SQLite: its busy
    /// timeout is the connection's).
    pub fn set_lock_timeout(self, millis: i64) -> Option<String> {
        match self {
            // SET takes no parameters; the value is an integer.
            Dialect::Postgres => Some(format!("SET LOCAL lock_timeout = '{}ms'", millis.max(1))),
            // InnoDB counts whole seconds, and has no transaction-local setting: the
            // session's is put back by `reset_lock_timeout`.
            Dialect::MySql => Some(format!(
                "SET SESSION innodb_lock_wait_timeout = {}",
                (millis.max(1) + 999) / 1000
            )),
            Dialect::Sqlite => None,
        }
    }

    /// Whether the setting of [`set_lock_timeout`](Self::set_lock_timeout) outlives the
    /// transaction (MySQL: a session variable), so that it must be reset whatever the
    /// transaction does next; PostgreSQL's `SET LOCAL` ends with the transaction.
    pub fn lock_timeout_outlives_transaction(self) -> bool {
        matches!(self, Dialect::MySql)
    }

    /// The statement that puts the lock timeout back to the session's own, after
    /// [`set_lock_timeout`](Self::set_lock_timeout).
    pub fn reset_lock_timeout(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some("SET LOCAL lock_timeout = DEFAULT"),
            Dialect::MySql => Some("SET SESSION innodb_lock_wait_timeout = DEFAULT"),
            Dialect::Sqlite => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_runs_its_own_inbox_statements() {
        assert_eq!(
            Dialect::Postgres.inbox_insert(true),
            (INSERT_UNLESS_BUSY, true)
        );
        assert_eq!(Dialect::Postgres.inbox_insert(false), (INSERT, false));
        assert_eq!(Dialect::Sqlite.inbox_insert(true), (INSERT, false));
        assert_eq!(
            Dialect::Postgres.set_lock_timeout(0).as_deref(),
            Some("SET LOCAL lock_timeout = '1ms'")
        );
        assert_eq!(Dialect::Sqlite.set_lock_timeout(50), None);
        assert!(Dialect::Sqlite.inbox_locking_select().is_none());
        assert!(PURGE_POSTGRES.contains("SKIP LOCKED"));
        let my = Dialect::MySql;
        assert_eq!(my.inbox_insert(true), (INSERT_MYSQL, false));
        assert!(my.refuses_taken_keys() && !Dialect::Postgres.refuses_taken_keys());
        // whole seconds, rounded up
        assert_eq!(
            my.set_lock_timeout(1500).as_deref(),
            Some("SET SESSION innodb_lock_wait_timeout = 2")
        );
        assert_eq!(
            my.set_lock_timeout(0).as_deref(),
            Some("SET SESSION innodb_lock_wait_timeout = 1")
        );
        assert!(my.inbox_purge().contains("ORDER BY updated_at LIMIT $3"));
    }
}
