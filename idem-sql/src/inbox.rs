//! The inbox's statements (the table `idem_inbox`), and which of them each dialect runs.
//! Every value is bound.
//!
//! **Time is the database's.** Lease ends, `created_at`/`updated_at` and retention cutoffs
//! are milliseconds since the Unix epoch read from the database's own clock inside each
//! statement ([`Dialect::now_millis`]), so instances whose clocks disagree never disagree on
//! whether a lease lives or a record is inside its retention. Each statement takes the time
//! as one parameter, `COALESCE($n, <the database's now>)`: bound NULL (what idem does by
//! default) the database decides; bound to a value (a test clock) that value is used. The
//! templates below write the database's now as `{now}`; [`Dialect::inbox`] spells it.

use crate::dialect::Dialect;
use std::sync::LazyLock;

/// Records a first delivery; does nothing if the key is recorded.
/// `$1` group, `$2` key, `$3` fingerprint, `$4` status, `$5` the lease in milliseconds
/// (NULL: no lease), `$6` now (NULL: the database's).
pub const INSERT: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, 1, COALESCE($6, {now}) + $5, COALESCE($6, {now}), COALESCE($6, {now})) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT`] on PostgreSQL, unless a transaction still working on the same key holds its
/// advisory lock: then nothing is inserted, at once, instead of waiting on that
/// transaction's uncommitted record. The lock is only a way not to wait; the primary key
/// still makes a second record impossible. Advisory locks are per database, so the lock's
/// hash is seeded with the inbox table's OID: the same key in another schema's inbox is
/// another lock.
pub const INSERT_UNLESS_BUSY: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, $2, $3, $4, 1, COALESCE($6, {now}) + $5, COALESCE($6, {now}), COALESCE($6, {now}) \
    WHERE pg_try_advisory_xact_lock(hashtextextended($1 || chr(10) || $2, \
        CAST(CAST(CAST('idem_inbox' AS regclass) AS oid) AS bigint))) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT`] on MySQL, which has no `ON CONFLICT`: a recorded key fails with the
/// duplicate-key error (1062), which the runtime reads as "nothing inserted" (the primary
/// key is the table's only unique index).
pub const INSERT_MYSQL: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, 1, COALESCE($6, {now}) + $5, COALESCE($6, {now}), COALESCE($6, {now}))";

/// Records a delivery with its result at once, as the last statement before the commit of
/// its handler's writes (the HTTP layer's optimistic form); does nothing if the key is
/// recorded. `$1` group, `$2` key, `$3` fingerprint, `$4` result (NULL: none), `$5` now
/// (NULL: the database's).
pub const INSERT_DONE: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, result, created_at, updated_at) \
    VALUES ($1, $2, $3, 'SUCCESS', 1, NULL, $4, COALESCE($5, {now}), COALESCE($5, {now})) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`INSERT_DONE`] on MySQL: a recorded key fails with the duplicate-key error (1062), as
/// [`INSERT_MYSQL`].
pub const INSERT_DONE_MYSQL: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, result, created_at, updated_at) \
    VALUES ($1, $2, $3, 'SUCCESS', 1, NULL, $4, COALESCE($5, {now}), COALESCE($5, {now}))";

/// The record of `$1` group, `$2` key (SQLite: inside `BEGIN IMMEDIATE`, already locked),
/// with the time its lease is judged by, `now` (`$3`, NULL: the database's).
pub const SELECT: &str = "SELECT status, fingerprint, attempts, result, error, lease_until, updated_at, \
    COALESCE($3, {now}) AS now \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2";

/// [`SELECT`], locking the row until the transaction ends (PostgreSQL, MySQL).
pub const SELECT_FOR_UPDATE: &str = "SELECT status, fingerprint, attempts, result, error, lease_until, updated_at, \
    COALESCE($3, {now}) AS now \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2 FOR UPDATE";

/// [`SELECT`] on MySQL, reading the record as last committed rather than as the
/// transaction's snapshot saw it, with a shared lock: several transactions that each lost
/// the key to it read it at once (an exclusive lock there, after each one's insert already
/// holds a shared one, would deadlock them).
pub const SELECT_COMMITTED_MYSQL: &str = "SELECT status, fingerprint, attempts, result, error, lease_until, updated_at, \
    COALESCE($3, {now}) AS now \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2 LOCK IN SHARE MODE";

/// Another attempt at a failed or expired record, if nobody took it in between.
/// `$3` status, `$4` the lease in milliseconds (NULL: none), `$5` now (NULL: the
/// database's), `$6` the attempts seen.
pub const RETRY: &str = "UPDATE idem_inbox \
    SET status = $3, attempts = attempts + 1, lease_until = COALESCE($5, {now}) + $4, \
    error = NULL, updated_at = COALESCE($5, {now}) \
    WHERE consumer_group = $1 AND message_key = $2 AND attempts = $6";

/// Parks a record after its last allowed attempt. `$3` now (NULL: the database's).
pub const BURY: &str = "UPDATE idem_inbox \
    SET status = 'DEAD', lease_until = NULL, updated_at = COALESCE($3, {now}) \
    WHERE consumer_group = $1 AND message_key = $2";

/// Stores the result of a transactional delivery. `$3` result.
pub const STORE_RESULT: &str = "UPDATE idem_inbox SET result = $3 \
    WHERE consumer_group = $1 AND message_key = $2";

/// Records the success of a leased attempt, if it still holds the lease.
/// `$3` result, `$4` now (NULL: the database's), `$5` the attempt.
pub const SUCCEED: &str = "UPDATE idem_inbox \
    SET status = 'SUCCESS', result = $3, error = NULL, lease_until = NULL, \
    updated_at = COALESCE($4, {now}) \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// Records the failure of a leased attempt: FAILED, or DEAD after the last one.
/// `$3` max attempts, `$4` error, `$5` now (NULL: the database's), `$6` the attempt.
pub const FAIL: &str = "UPDATE idem_inbox \
    SET status = CASE WHEN attempts >= $3 THEN 'DEAD' ELSE 'FAILED' END, \
    error = $4, lease_until = NULL, updated_at = COALESCE($5, {now}) \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $6";

/// Extends a lease still held. `$3` the lease's new end (milliseconds since the epoch, read
/// from the same clock as `$4`), `$4` now, `$5` the attempt.
pub const EXTEND: &str = "UPDATE idem_inbox SET lease_until = $3, updated_at = $4 \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING' AND attempts = $5";

/// How many records of `$1` group are PROCESSING with a lease that ended by now (`$2`,
/// NULL: the database's), and the oldest such lease.
pub const STUCK: &str = "SELECT COUNT(*) AS stuck, MIN(lease_until) AS oldest \
    FROM idem_inbox WHERE consumer_group = $1 AND status = 'PROCESSING' \
    AND lease_until <= COALESCE($2, {now})";

/// One bounded batch of retention (PostgreSQL): finished records of `$1` group last
/// touched more than `$4` milliseconds before now (`$2`, NULL: the database's), at most
/// `$3`, skipping rows another transaction holds. Rows are named by `tableoid` and `ctid`
/// together: a `ctid` alone repeats across the partitions of a partitioned table.
pub const PURGE_POSTGRES: &str = "DELETE FROM idem_inbox WHERE (tableoid, ctid) IN (\
    SELECT tableoid, ctid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < COALESCE($2, {now}) - $4 \
    AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3 FOR UPDATE SKIP LOCKED)";

/// One bounded batch of retention (MySQL, which deletes with a `LIMIT` directly, oldest
/// first along the index on `updated_at`).
pub const PURGE_MYSQL: &str = "DELETE FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < COALESCE($2, {now}) - $4 \
    AND status IN ('SUCCESS', 'FAILED') \
    ORDER BY updated_at LIMIT $3";

/// One bounded batch of retention (SQLite).
pub const PURGE_SQLITE: &str = "DELETE FROM idem_inbox WHERE rowid IN (\
    SELECT rowid FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < COALESCE($2, {now}) - $4 \
    AND status IN ('SUCCESS', 'FAILED') \
    LIMIT $3)";

/// Every consumer group's records by status: `processing`, of which `stuck` (the lease
/// ended by now, `$1`, NULL: the database's), `succeeded`, `failed`, `dead`, and the last
/// time one was touched (`last_at`). One scan of the table.
pub const GROUPS: &str = "SELECT consumer_group, \
    COUNT(CASE WHEN status = 'PROCESSING' THEN 1 END) AS processing, \
    COUNT(CASE WHEN status = 'PROCESSING' AND lease_until <= COALESCE($1, {now}) THEN 1 END) AS stuck, \
    COUNT(CASE WHEN status = 'SUCCESS' THEN 1 END) AS succeeded, \
    COUNT(CASE WHEN status = 'FAILED' THEN 1 END) AS failed, \
    COUNT(CASE WHEN status = 'DEAD' THEN 1 END) AS dead, \
    MAX(updated_at) AS last_at \
    FROM idem_inbox GROUP BY consumer_group ORDER BY consumer_group";

/// What each consumer group's records show of the last `$2` milliseconds before now (`$1`,
/// NULL: the database's), along the index on `updated_at`: the records touched, first
/// delivered, done, done after more than one attempt, given more than one attempt, failed
/// and parked.
pub const ACTIVITY: &str = "SELECT consumer_group, COUNT(*) AS touched, \
    COUNT(CASE WHEN created_at >= COALESCE($1, {now}) - $2 THEN 1 END) AS first_delivered, \
    COUNT(CASE WHEN status = 'SUCCESS' THEN 1 END) AS succeeded, \
    COUNT(CASE WHEN status = 'SUCCESS' AND attempts > 1 THEN 1 END) AS succeeded_after_retry, \
    COUNT(CASE WHEN attempts > 1 THEN 1 END) AS retried, \
    COUNT(CASE WHEN status = 'FAILED' THEN 1 END) AS failed, \
    COUNT(CASE WHEN status = 'DEAD' THEN 1 END) AS dead \
    FROM idem_inbox WHERE updated_at >= COALESCE($1, {now}) - $2 \
    GROUP BY consumer_group ORDER BY consumer_group";

/// Each consumer group's records last touched in the `$2` milliseconds before now (`$1`,
/// NULL: the database's), counted by status in buckets of `$3` milliseconds: `bucket` 0
/// starts `$2` before now (a record touched exactly now falls in the bucket after the
/// last, which the reader folds into the last). One range read of the index on
/// `updated_at`, like [`ACTIVITY`]; `{div}` is the dialect's integer division.
pub const ACTIVITY_SERIES: &str = "SELECT consumer_group, \
    (updated_at - (COALESCE($1, {now}) - $2)) {div} $3 AS bucket, \
    COUNT(CASE WHEN status = 'PROCESSING' THEN 1 END) AS processing, \
    COUNT(CASE WHEN status = 'SUCCESS' THEN 1 END) AS succeeded, \
    COUNT(CASE WHEN status = 'FAILED' THEN 1 END) AS failed, \
    COUNT(CASE WHEN status = 'DEAD' THEN 1 END) AS dead \
    FROM idem_inbox WHERE updated_at >= COALESCE($1, {now}) - $2 \
    AND updated_at <= COALESCE($1, {now}) \
    GROUP BY consumer_group, bucket ORDER BY consumer_group, bucket";

/// The records of status `$2` in group `$1` (`''`: every group), least recently touched
/// first, at most `$5`; with `$3` = 1 only those whose lease ended by now (`$4`, NULL: the
/// database's). Never their results: they may hold personal data.
pub const RECORDS: &str = "SELECT consumer_group, message_key, status, attempts, error, \
    lease_until, created_at, updated_at FROM idem_inbox \
    WHERE ($1 = '' OR consumer_group = $1) AND status = $2 \
    AND ($3 = 0 OR lease_until <= COALESCE($4, {now})) \
    ORDER BY updated_at, consumer_group, message_key LIMIT $5";

/// The record of `$1` group, `$2` key, as [`RECORDS`] lists it.
pub const RECORD: &str = "SELECT consumer_group, message_key, status, attempts, error, \
    lease_until, created_at, updated_at FROM idem_inbox \
    WHERE consumer_group = $1 AND message_key = $2";

/// Ends the lease of a PROCESSING record now (`$4`, NULL: the database's), so the next
/// delivery takes it over at once; `$3` says who, in its error.
pub const RELEASE: &str = "UPDATE idem_inbox \
    SET lease_until = COALESCE($4, {now}), error = $3, updated_at = COALESCE($4, {now}) \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'PROCESSING'";

/// Brings a DEAD record back as FAILED with no attempts: its next delivery runs it again,
/// with every attempt allowed. `$3` says who, in its error; `$4` now (NULL: the database's).
pub const REVIVE: &str = "UPDATE idem_inbox \
    SET status = 'FAILED', attempts = 0, lease_until = NULL, error = $3, \
    updated_at = COALESCE($4, {now}) \
    WHERE consumer_group = $1 AND message_key = $2 AND status = 'DEAD'";

/// How many records of `$1` group a purge with retention `$3` milliseconds would delete
/// now (`$2`, NULL: the database's), as `n`.
pub const PURGEABLE: &str = "SELECT COUNT(*) AS n FROM idem_inbox \
    WHERE consumer_group = $1 AND updated_at < COALESCE($2, {now}) - $3 \
    AND status IN ('SUCCESS', 'FAILED')";

/// The database's time, alone: `now` (`$1`, NULL: the database's), for the units of work
/// that need to know it (a leased claim reports when its lease ends).
pub const NOW: &str = "SELECT COALESCE($1, {now}) AS now";

/// A batch of deliveries: the records of every message that has none, in one statement.
/// `$1` group, `$2` the messages as a JSON array of `{"k": key, "f": fingerprint}`, keys
/// distinct and in order, `$3` now (NULL: the database's). A key already recorded is left
/// as it is. A record this statement inserts carries the lease `-1`, which no lease ever
/// is (leases end at a time since the epoch): it marks, inside the batch's transaction,
/// the records the batch made, and the batch's last statements clear it before the
/// commit, so no other transaction ever sees it.
pub const BATCH_INSERT: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, j.k, j.f, 'SUCCESS', 1, -1, COALESCE($3, {now}), COALESCE($3, {now}) \
    FROM json_to_recordset(CAST($2 AS json)) AS j(k text, f text) \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`BATCH_INSERT`] on SQLite (`json_each`; `WHERE true` tells its parser that `ON
/// CONFLICT` is the upsert clause, not a join's).
pub const BATCH_INSERT_SQLITE: &str = "INSERT INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, json_extract(j.value, '$.k'), json_extract(j.value, '$.f'), 'SUCCESS', 1, -1, \
    COALESCE($3, {now}), COALESCE($3, {now}) \
    FROM json_each($2) AS j WHERE true \
    ON CONFLICT (consumer_group, message_key) DO NOTHING";

/// [`BATCH_INSERT`] on MySQL/MariaDB (`JSON_TABLE`: MySQL 8, MariaDB 10.6). `IGNORE`
/// skips a recorded key; it would also turn a value too long for its column into a
/// truncated one, but every value is checked before (keys and groups of at most 255
/// bytes, fingerprints of 64), and a missing one is an error (`ERROR ON EMPTY`), never
/// an empty string.
pub const BATCH_INSERT_MYSQL: &str = "INSERT IGNORE INTO idem_inbox \
    (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at) \
    SELECT $1, j.k, j.f, 'SUCCESS', 1, -1, COALESCE($3, {now}), COALESCE($3, {now}) \
    FROM JSON_TABLE($2, '$[*]' COLUMNS (\
    k VARBINARY(255) PATH '$.k' ERROR ON EMPTY, f VARCHAR(64) PATH '$.f' ERROR ON EMPTY)) AS j";

/// A batch's records, one probe of the primary key each: `$1` group, `$2` the messages
/// (as for [`BATCH_INSERT`]), `$3` now (NULL: the database's), read with the records. The
/// messages drive, each probing the primary key (`OFFSET 0` keeps the planner from turning
/// the probes into a hash of the whole group, which it would choose for a table it has no
/// statistics of yet).
pub const BATCH_SELECT: &str = "SELECT b.message_key, b.status, b.fingerprint, b.attempts, \
    b.result, b.error, b.lease_until, COALESCE($3, {now}) AS now \
    FROM json_to_recordset(CAST($2 AS json)) AS j(k text, f text) \
    CROSS JOIN LATERAL (SELECT message_key, status, fingerprint, attempts, result, error, lease_until \
    FROM idem_inbox WHERE consumer_group = $1 AND message_key = j.k OFFSET 0) AS b";

/// [`BATCH_SELECT`] on SQLite (`CROSS JOIN` fixes the order: the messages drive).
pub const BATCH_SELECT_SQLITE: &str = "SELECT b.message_key, b.status, b.fingerprint, b.attempts, \
    b.result, b.error, b.lease_until, COALESCE($3, {now}) AS now \
    FROM json_each($2) AS j \
    CROSS JOIN idem_inbox b ON b.consumer_group = $1 AND b.message_key = json_extract(j.value, '$.k')";

/// [`BATCH_SELECT`] on MySQL/MariaDB (`STRAIGHT_JOIN`: the messages drive).
pub const BATCH_SELECT_MYSQL: &str = "SELECT STRAIGHT_JOIN b.message_key, b.status, b.fingerprint, \
    b.attempts, b.result, b.error, b.lease_until, COALESCE($3, {now}) AS now \
    FROM JSON_TABLE($2, '$[*]' COLUMNS (k VARBINARY(255) PATH '$.k' ERROR ON EMPTY)) AS j \
    JOIN idem_inbox b ON b.consumer_group = $1 AND b.message_key = j.k";

/// A batch's results, in one statement: `$1` group, `$2` a JSON array of `{"k": key, "r":
/// result}` (`r` the result's JSON as a string, or `null` for none), one per message whose
/// handler ran. Clears the batch's mark (see [`BATCH_INSERT`]). Each message probes the
/// primary key (as in [`BATCH_SELECT`]) and its row is updated by its `ctid` (with its
/// `tableoid`: a `ctid` repeats across the partitions of a partitioned table): the batch
/// holds the row's lock, so it cannot move meanwhile.
pub const BATCH_STORE: &str = "UPDATE idem_inbox SET result = v.r, lease_until = NULL \
    FROM (SELECT b.tableoid AS part, b.ctid AS row_id, j.r \
    FROM json_to_recordset(CAST($2 AS json)) AS j(k text, r text) \
    CROSS JOIN LATERAL (SELECT tableoid, ctid FROM idem_inbox \
    WHERE consumer_group = $1 AND message_key = j.k OFFSET 0) AS b) AS v \
    WHERE idem_inbox.tableoid = v.part AND idem_inbox.ctid = v.row_id";

/// [`BATCH_STORE`] on SQLite (the `IN` list makes each key a probe of the primary key).
pub const BATCH_STORE_SQLITE: &str = "UPDATE idem_inbox \
    SET result = json_extract(j.value, '$.r'), lease_until = NULL \
    FROM json_each($2) AS j \
    WHERE idem_inbox.consumer_group = $1 AND idem_inbox.message_key = json_extract(j.value, '$.k') \
    AND idem_inbox.message_key IN (SELECT json_extract(value, '$.k') FROM json_each($2))";

/// [`BATCH_STORE`] on MySQL/MariaDB.
pub const BATCH_STORE_MYSQL: &str = "UPDATE JSON_TABLE($2, '$[*]' COLUMNS (\
    k VARBINARY(255) PATH '$.k' ERROR ON EMPTY, r LONGTEXT PATH '$.r')) AS j \
    STRAIGHT_JOIN idem_inbox b ON b.consumer_group = $1 AND b.message_key = j.k \
    SET b.result = j.r, b.lease_until = NULL";

/// The failed attempt of a message in a batch, whose handler's effects were rolled back:
/// `$3` FAILED, or DEAD after its last allowed attempt, `$4` the error, `$5` now (NULL: the
/// database's).
pub const BATCH_FAIL: &str = "UPDATE idem_inbox \
    SET status = $3, error = $4, result = NULL, lease_until = NULL, updated_at = COALESCE($5, {now}) \
    WHERE consumer_group = $1 AND message_key = $2";

/// A message of a batch that came early (`idem::inbox::not_yet` in its
/// handler), whose handler's effects were rolled back: its record goes back to FAILED with
/// this attempt not counted (a record the batch made is left at 0 attempts), so that a
/// redelivery tries it again and no wait for another message ever parks it. `$3` why (the
/// handler's error), `$4` now (NULL: the database's).
pub const BATCH_NOT_YET: &str = "UPDATE idem_inbox \
    SET status = 'FAILED', attempts = attempts - 1, error = $3, result = NULL, lease_until = NULL, \
    updated_at = COALESCE($4, {now}) \
    WHERE consumer_group = $1 AND message_key = $2";

/// The savepoint each handler of a batch runs in once a handler of the batch failed (every
/// backend spells it so): a failing handler's effects roll back to it, the rest stay.
pub const BATCH_SAVEPOINT: &str = "SAVEPOINT idem_batch";

/// Back to [`BATCH_SAVEPOINT`], after a handler failed.
pub const BATCH_ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idem_batch";

/// Ends [`BATCH_SAVEPOINT`], keeping what its handler did.
pub const BATCH_RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT idem_batch";

/// The inbox's statements as one dialect spells them ([`Dialect::inbox`]).
#[derive(Debug)]
pub struct InboxSql {
    /// [`INSERT`], [`INSERT_MYSQL`] on MySQL.
    pub insert: String,
    /// [`INSERT_UNLESS_BUSY`] on PostgreSQL; elsewhere [`insert`](Self::insert).
    pub insert_unless_busy: String,
    /// [`INSERT_DONE`], [`INSERT_DONE_MYSQL`] on MySQL.
    pub insert_done: String,
    /// [`SELECT`].
    pub select: String,
    /// [`SELECT_FOR_UPDATE`] where the read locks (PostgreSQL, MySQL).
    pub select_for_update: Option<String>,
    /// [`SELECT_COMMITTED_MYSQL`] on MySQL; elsewhere [`select`](Self::select).
    pub select_committed: String,
    /// [`RETRY`].
    pub retry: String,
    /// [`BURY`].
    pub bury: String,
    /// [`STORE_RESULT`].
    pub store_result: String,
    /// [`SUCCEED`].
    pub succeed: String,
    /// [`FAIL`].
    pub fail: String,
    /// [`EXTEND`].
    pub extend: String,
    /// [`STUCK`].
    pub stuck: String,
    /// [`PURGE_POSTGRES`], [`PURGE_SQLITE`] or [`PURGE_MYSQL`].
    pub purge: String,
    /// [`NOW`].
    pub now: String,
    /// [`GROUPS`].
    pub groups: String,
    /// [`RECORDS`].
    pub records: String,
    /// [`ACTIVITY`].
    pub activity: String,
    /// [`ACTIVITY_SERIES`].
    pub activity_series: String,
    /// [`RECORD`].
    pub record: String,
    /// [`RELEASE`].
    pub release: String,
    /// [`REVIVE`].
    pub revive: String,
    /// [`PURGEABLE`].
    pub purgeable: String,
    /// [`BATCH_INSERT`], [`BATCH_INSERT_SQLITE`] or [`BATCH_INSERT_MYSQL`].
    pub batch_insert: String,
    /// [`BATCH_SELECT`], [`BATCH_SELECT_SQLITE`] or [`BATCH_SELECT_MYSQL`].
    pub batch_select: String,
    /// [`BATCH_STORE`], [`BATCH_STORE_SQLITE`] or [`BATCH_STORE_MYSQL`].
    pub batch_store: String,
    /// [`BATCH_FAIL`].
    pub batch_fail: String,
    /// [`BATCH_NOT_YET`].
    pub batch_not_yet: String,
}

impl InboxSql {
    fn of(dialect: Dialect) -> InboxSql {
        let now = dialect.now_millis();
        let spell = |template: &str| template.replace("{now}", now);
        let insert = spell(match dialect {
            Dialect::MySql => INSERT_MYSQL,
            Dialect::Postgres | Dialect::Sqlite => INSERT,
        });
        InboxSql {
            insert_unless_busy: match dialect {
                Dialect::Postgres => spell(INSERT_UNLESS_BUSY),
                Dialect::Sqlite | Dialect::MySql => insert.clone(),
            },
            insert,
            insert_done: spell(match dialect {
                Dialect::MySql => INSERT_DONE_MYSQL,
                Dialect::Postgres | Dialect::Sqlite => INSERT_DONE,
            }),
            select: spell(SELECT),
            select_committed: spell(match dialect {
                Dialect::MySql => SELECT_COMMITTED_MYSQL,
                Dialect::Postgres | Dialect::Sqlite => SELECT,
            }),
            select_for_update: match dialect {
                Dialect::Postgres | Dialect::MySql => Some(spell(SELECT_FOR_UPDATE)),
                Dialect::Sqlite => None,
            },
            retry: spell(RETRY),
            bury: spell(BURY),
            store_result: STORE_RESULT.to_owned(),
            succeed: spell(SUCCEED),
            fail: spell(FAIL),
            extend: EXTEND.to_owned(),
            stuck: spell(STUCK),
            purge: spell(match dialect {
                Dialect::Postgres => PURGE_POSTGRES,
                Dialect::Sqlite => PURGE_SQLITE,
                Dialect::MySql => PURGE_MYSQL,
            }),
            now: spell(NOW),
            groups: spell(GROUPS),
            records: spell(RECORDS),
            activity: spell(ACTIVITY),
            activity_series: spell(ACTIVITY_SERIES).replace("{div}", dialect.integer_division()),
            record: RECORD.to_owned(),
            release: spell(RELEASE),
            revive: spell(REVIVE),
            purgeable: spell(PURGEABLE),
            batch_insert: spell(match dialect {
                Dialect::Postgres => BATCH_INSERT,
                Dialect::Sqlite => BATCH_INSERT_SQLITE,
                Dialect::MySql => BATCH_INSERT_MYSQL,
            }),
            batch_select: spell(match dialect {
                Dialect::Postgres => BATCH_SELECT,
                Dialect::Sqlite => BATCH_SELECT_SQLITE,
                Dialect::MySql => BATCH_SELECT_MYSQL,
            }),
            batch_store: match dialect {
                Dialect::Postgres => BATCH_STORE,
                Dialect::Sqlite => BATCH_STORE_SQLITE,
                Dialect::MySql => BATCH_STORE_MYSQL,
            }
            .to_owned(),
            batch_fail: spell(BATCH_FAIL),
            batch_not_yet: spell(BATCH_NOT_YET),
        }
    }
}

static POSTGRES: LazyLock<InboxSql> = LazyLock::new(|| InboxSql::of(Dialect::Postgres));
static SQLITE: LazyLock<InboxSql> = LazyLock::new(|| InboxSql::of(Dialect::Sqlite));
static MYSQL: LazyLock<InboxSql> = LazyLock::new(|| InboxSql::of(Dialect::MySql));

impl Dialect {
    /// The database's clock, as milliseconds since the Unix epoch (a `BIGINT`), in this
    /// dialect: the time every inbox statement judges leases and retention by.
    ///
    /// - PostgreSQL: `statement_timestamp()`, the start of the current statement;
    /// - SQLite: `julianday('now')`, fixed for the statement (on SQLite the database's clock
    ///   is the application's machine's: the database is in its process);
    /// - MySQL/MariaDB: `UTC_TIMESTAMP(6)`, free of the session's time zone (and of the hour
    ///   a daylight-saving change repeats).
    pub fn now_millis(self) -> &'static str {
        match self {
            Dialect::Postgres => {
                "CAST(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000) AS BIGINT)"
            }
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::MySql => {
                "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)"
            }
        }
    }

    /// Integer division of two integers, truncated (`/`; MySQL's `/` gives a decimal, so
    /// `DIV`).
    pub fn integer_division(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::Sqlite => "/",
            Dialect::MySql => "DIV",
        }
    }

    /// The inbox's statements as this dialect spells them (built once per dialect).
    pub fn inbox(self) -> &'static InboxSql {
        match self {
            Dialect::Postgres => &POSTGRES,
            Dialect::Sqlite => &SQLITE,
            Dialect::MySql => &MYSQL,
        }
    }

    /// The statement that records a first delivery: [`INSERT`] ([`INSERT_MYSQL`] on
    /// MySQL); on PostgreSQL with `unblocked`, [`INSERT_UNLESS_BUSY`] (a delivery in
    /// progress elsewhere makes it insert nothing at once instead of waiting; elsewhere the
    /// lock timeout bounds the wait). The flag says which: whether inserting nothing may
    /// also find no record (the key was busy).
    pub fn inbox_insert(self, unblocked: bool) -> (&'static str, bool) {
        let sql = self.inbox();
        match self {
            Dialect::Postgres if unblocked => (&sql.insert_unless_busy, true),
            _ => (&sql.insert, false),
        }
    }

    /// The read of a record another transaction committed after this one's first read
    /// (the optimistic form's, once its insert found the key taken): the plain [`SELECT`]
    /// where each statement sees what committed before it (PostgreSQL at READ COMMITTED,
    /// its default; SQLite, whose writer holds the database), [`SELECT_COMMITTED_MYSQL`] on
    /// MySQL, whose REPEATABLE READ snapshot a plain read would use.
    pub fn inbox_select_committed(self) -> &'static str {
        &self.inbox().select_committed
    }

    /// Whether an insert that finds its key taken fails with the duplicate-key error
    /// instead of inserting nothing (MySQL: no `ON CONFLICT … DO NOTHING`).
    pub fn refuses_taken_keys(self) -> bool {
        matches!(self, Dialect::MySql)
    }

    /// The read of a record that a delivery may go on to retry: locking on PostgreSQL and
    /// MySQL ([`SELECT_FOR_UPDATE`]); SQLite's `BEGIN IMMEDIATE` holds the database already,
    /// so the plain [`SELECT`]. `None` when the plain read already done suffices.
    pub fn inbox_locking_select(self) -> Option<&'static str> {
        self.inbox().select_for_update.as_deref()
    }

    /// One bounded batch of retention: [`PURGE_POSTGRES`], [`PURGE_SQLITE`] or
    /// [`PURGE_MYSQL`].
    pub fn inbox_purge(self) -> &'static str {
        &self.inbox().purge
    }

    /// The statement that bounds how long this transaction waits for a lock, `millis`
    /// (at least 1); `None` where the backend has no such setting (SQLite: its busy
    /// timeout is the connection's).
    pub fn set_lock_timeout(self, millis: i64) -> Option<String> {
        match self {
            // SET takes no parameters; the value is an integer.
            // Transaction-local, with the value in force before it (the session's own, from
            // its options, an `after_connect` or a pooler's `connect_query`) kept in the
            // transaction-local `idem.lock_timeout` for `reset_lock_timeout`. The FROM item
            // is read first.
            Dialect::Postgres => Some(format!(
                "SELECT set_config('lock_timeout', '{}ms', true) FROM \
                 (SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true)) AS kept",
                millis.max(1)
            )),
            // InnoDB counts whole seconds, and has no transaction-local setting: the
            // session's own value is kept in a user variable and put back by
            // `reset_lock_timeout`.
            Dialect::MySql => Some(format!(
                "SET @idem_lock_wait_timeout = @@SESSION.innodb_lock_wait_timeout, \
                 SESSION innodb_lock_wait_timeout = {}",
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
    /// [`set_lock_timeout`](Self::set_lock_timeout): the value in force before it, never
    /// the server's default (`SET LOCAL lock_timeout = DEFAULT` would drop a session's
    /// setting for the rest of the transaction).
    pub fn reset_lock_timeout(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some(
                "SELECT set_config('lock_timeout', current_setting('idem.lock_timeout'), true)",
            ),
            Dialect::MySql => {
                Some("SET SESSION innodb_lock_wait_timeout = @idem_lock_wait_timeout")
            }
            Dialect::Sqlite => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_runs_its_own_inbox_statements() {
        let pg = Dialect::Postgres;
        assert!(
            pg.inbox_insert(true)
                .0
                .contains("pg_try_advisory_xact_lock")
        );
        assert!(pg.inbox_insert(true).1);
        assert!(
            !pg.inbox_insert(false)
                .0
                .contains("pg_try_advisory_xact_lock")
        );
        assert_eq!(
            Dialect::Sqlite.inbox_insert(true),
            Dialect::Sqlite.inbox_insert(false)
        );
        assert_eq!(
            Dialect::Postgres.set_lock_timeout(0).as_deref(),
            Some(
                "SELECT set_config('lock_timeout', '1ms', true) FROM \
                 (SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true)) AS kept"
            )
        );
        assert_eq!(Dialect::Sqlite.set_lock_timeout(50), None);
        assert!(Dialect::Sqlite.inbox_locking_select().is_none());
        assert!(pg.inbox_purge().contains("SKIP LOCKED"));
        let my = Dialect::MySql;
        assert!(!my.inbox_insert(true).0.contains("ON CONFLICT"));
        assert!(!my.inbox_insert(true).1);
        assert!(my.refuses_taken_keys() && !Dialect::Postgres.refuses_taken_keys());
        // MySQL's `/` would give a decimal bucket.
        assert!(my.inbox().activity_series.contains(")) DIV $3 AS bucket"));
        for dialect in [Dialect::Postgres, Dialect::Sqlite] {
            let series = &dialect.inbox().activity_series;
            assert!(series.contains(")) / $3 AS bucket") && !series.contains('{'));
        }
        // whole seconds, rounded up
        let set = my.set_lock_timeout(1500).unwrap();
        assert!(
            set.starts_with("SET @idem_lock_wait_timeout = @@SESSION.innodb_lock_wait_timeout")
        );
        assert!(
            set.ends_with("SESSION innodb_lock_wait_timeout = 2"),
            "{set}"
        );
        assert!(
            my.set_lock_timeout(0)
                .unwrap()
                .ends_with("innodb_lock_wait_timeout = 1")
        );
        assert!(my.inbox_purge().contains("ORDER BY updated_at LIMIT $3"));
    }

    #[test]
    fn every_time_is_the_database_clock_unless_one_is_bound() {
        for dialect in Dialect::ALL {
            let sql = dialect.inbox();
            let now = dialect.now_millis();
            for statement in [
                &sql.insert,
                &sql.insert_unless_busy,
                &sql.select,
                &sql.retry,
                &sql.bury,
                &sql.succeed,
                &sql.fail,
                &sql.stuck,
                &sql.purge,
                &sql.now,
                &sql.batch_insert,
                &sql.batch_select,
                &sql.batch_fail,
            ] {
                assert!(!statement.contains("{now}"), "{statement}");
                assert!(statement.contains(now), "{dialect:?}: {statement}");
            }
            assert!(sql.select_for_update.iter().all(|s| s.contains(now)));
        }
    }
}
