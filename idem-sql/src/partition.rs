//! The inbox's table partitioned by day (PostgreSQL, MariaDB/MySQL), and the DDL that keeps
//! its window of days.
//!
//! **Dated keys carry their partition.** A dated message key starts with [`DATED`], the
//! day of the message's own time (UTC) and a slash: `~d2026-12-05/order:42:paid`. The table
//! is partitioned by range of `message_key` (compared byte for byte, `COLLATE "C"`), one
//! partition a day, so the primary key `(consumer_group, message_key)` still holds across
//! the whole table (it contains the partitioning column), a lookup names its one partition,
//! and retention drops a whole day at once. Every redelivery of a message carries the same
//! day, since the day is part of its key.
//!
//! The ranges, contiguous from the least key to the greatest:
//!
//! | partition | keys |
//! |---|---|
//! | `idem_inbox_undated_low` | below `~d`: keys without a day (HTTP keys, undated message keys) |
//! | `idem_inbox_dated_past` | `~d` up to the first kept day: days already dropped (a message older than the window) |
//! | `idem_inbox_dYYYYMMDD` | one day each, over the window |
//! | `idem_inbox_dated_future` | after the last day made, up to `~e` |
//! | `idem_inbox_undated_high` | from `~e`: keys without a day that sort after the dated ones |
//!
//! On MariaDB/MySQL (`RANGE COLUMNS`, whose ranges are contiguous) there is no past
//! partition: the oldest day's partition holds the days before it.

/// The prefix of a dated message key, before its day (`YYYY-MM-DD`) and a slash.
pub const DATED: &str = "~d";

/// The first key after every dated one.
pub const AFTER_DATED: &str = "~e";

/// The partitioned table, as the shipped migration's `idem_inbox` with its key compared byte
/// for byte (the partitions' bounds are byte ranges).
pub const POSTGRES_TABLE: &str = "CREATE TABLE idem_inbox (\
    consumer_group TEXT NOT NULL, \
    message_key TEXT COLLATE \"C\" NOT NULL, \
    fingerprint TEXT NOT NULL, \
    status TEXT NOT NULL, \
    attempts BIGINT NOT NULL, \
    result TEXT, \
    error TEXT, \
    lease_until BIGINT, \
    created_at BIGINT NOT NULL, \
    updated_at BIGINT NOT NULL, \
    PRIMARY KEY (consumer_group, message_key)) \
    PARTITION BY RANGE (message_key)";

/// The index retention reads by age, on every partition.
pub const POSTGRES_UPDATED_AT: &str =
    "CREATE INDEX IF NOT EXISTS idem_inbox_updated_at ON idem_inbox (updated_at)";

/// Where the failed and dead records of a dropped day are kept, for the people who look at
/// them (the sources keep failures longer than successes).
pub const POSTGRES_FAILURES: &str = "CREATE TABLE IF NOT EXISTS idem_inbox_failures (\
    consumer_group TEXT NOT NULL, \
    message_key TEXT COLLATE \"C\" NOT NULL, \
    fingerprint TEXT NOT NULL, \
    status TEXT NOT NULL, \
    attempts BIGINT NOT NULL, \
    result TEXT, \
    error TEXT, \
    lease_until BIGINT, \
    created_at BIGINT NOT NULL, \
    updated_at BIGINT NOT NULL, \
    PRIMARY KEY (consumer_group, message_key))";

/// Whether `idem_inbox` is partitioned: one row, `partitioned`.
pub const POSTGRES_IS_PARTITIONED: &str = "SELECT CAST(CAST(relkind = 'p' AS INTEGER) AS BIGINT) AS partitioned \
    FROM pg_class WHERE oid = CAST(CAST('idem_inbox' AS regclass) AS oid)";

/// The partitions of `idem_inbox`, one row each: `name`.
pub const POSTGRES_PARTITIONS: &str = "SELECT CAST(c.relname AS TEXT) AS name \
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
    WHERE i.inhparent = CAST(CAST('idem_inbox' AS regclass) AS oid) ORDER BY c.relname";

/// The database's day (UTC), as days since 1970-01-01: one row, `today`.
pub const POSTGRES_TODAY: &str =
    "SELECT CAST(CAST(now() AT TIME ZONE 'UTC' AS date) - DATE '1970-01-01' AS BIGINT) AS today";

/// The name of the partition of `day` (`YYYY-MM-DD`): `idem_inbox_dYYYYMMDD`.
pub fn day_partition(day: &str) -> String {
    format!("idem_inbox_d{}", day.replace('-', ""))
}

/// The prefix of the keys of `day` (`YYYY-MM-DD`): `~dYYYY-MM-DD/`.
pub fn day_prefix(day: &str) -> String {
    format!("{DATED}{day}/")
}

/// A partition of `idem_inbox` named `name`, for the keys from `from` up to `to` (each a
/// literal bound, or `MINVALUE`/`MAXVALUE`). Bounds are idem's own text (digits, `~`, `-`,
/// `/`), never a caller's.
pub fn postgres_partition(name: &str, from: &Bound<'_>, to: &Bound<'_>) -> String {
    format!(
        "CREATE TABLE {name} PARTITION OF idem_inbox FOR VALUES FROM ({}) TO ({})",
        from.sql(),
        to.sql()
    )
}

/// Detaches partition `name` from `idem_inbox`.
pub fn postgres_detach(name: &str) -> String {
    format!("ALTER TABLE idem_inbox DETACH PARTITION {name}")
}

/// Renames table `name` to `to`.
pub fn postgres_rename(name: &str, to: &str) -> String {
    format!("ALTER TABLE {name} RENAME TO {to}")
}

/// Drops table `name`.
pub fn postgres_drop(name: &str) -> String {
    format!("DROP TABLE {name}")
}

/// Copies the failed and dead records of table `name` into `idem_inbox_failures`.
pub fn postgres_keep_failures(name: &str) -> String {
    format!(
        "INSERT INTO idem_inbox_failures SELECT * FROM {name} \
         WHERE status IN ('FAILED', 'DEAD') ON CONFLICT DO NOTHING"
    )
}

/// PostgreSQL: the failed and dead records of the day partition `name` as they are when it
/// is dropped, in the dropping transaction: its writers held off first (`SHARE` on that
/// partition alone: a delivery's update of a record of that old day waits for the drop,
/// the rest of the inbox goes on), then each copied into `idem_inbox_failures`, or updated
/// there if an earlier copy holds it as it was before (a FAILED record that turned DEAD).
pub fn postgres_keep_failures_at_drop(name: &str) -> String {
    format!(
        "LOCK TABLE {name} IN SHARE MODE; \
         INSERT INTO idem_inbox_failures SELECT * FROM {name} \
         WHERE status IN ('FAILED', 'DEAD') \
         ON CONFLICT (consumer_group, message_key) DO UPDATE SET \
         fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status, \
         attempts = EXCLUDED.attempts, result = EXCLUDED.result, error = EXCLUDED.error, \
         lease_until = EXCLUDED.lease_until, created_at = EXCLUDED.created_at, \
         updated_at = EXCLUDED.updated_at \
         WHERE (idem_inbox_failures.status, idem_inbox_failures.attempts, idem_inbox_failures.updated_at) \
         IS DISTINCT FROM (EXCLUDED.status, EXCLUDED.attempts, EXCLUDED.updated_at)"
    )
}

/// Routes every row of table `name` through `idem_inbox` again (into the partitions that
/// now hold their keys).
pub fn postgres_reinsert(name: &str) -> String {
    format!("INSERT INTO idem_inbox SELECT * FROM {name}")
}

/// MariaDB/MySQL: `idem_inbox` partitioned in place by range of its key (a byte string,
/// `VARBINARY`): the undated keys below `~d`, every dated key in one partition until
/// [`mysql_split_future`] makes its days, the undated keys from `~e`. Ranges are contiguous
/// here: the oldest day's partition also holds the days before it (a message older than the
/// window), and goes with it.
pub const MYSQL_PARTITION_BY: &str = "ALTER TABLE idem_inbox PARTITION BY RANGE COLUMNS(message_key) (\
    PARTITION idem_inbox_undated_low VALUES LESS THAN ('~d'), \
    PARTITION idem_inbox_dated_future VALUES LESS THAN ('~e'), \
    PARTITION idem_inbox_undated_high VALUES LESS THAN (MAXVALUE))";

/// MariaDB/MySQL: [`POSTGRES_FAILURES`], as the inbox's own columns are there.
pub const MYSQL_FAILURES: &str = "CREATE TABLE IF NOT EXISTS idem_inbox_failures (\
    consumer_group VARBINARY(255) NOT NULL, \
    message_key VARBINARY(255) NOT NULL, \
    fingerprint VARCHAR(64) NOT NULL, \
    status VARCHAR(16) NOT NULL, \
    attempts BIGINT NOT NULL, \
    result LONGTEXT, \
    error LONGTEXT, \
    lease_until BIGINT, \
    created_at BIGINT NOT NULL, \
    updated_at BIGINT NOT NULL, \
    PRIMARY KEY (consumer_group, message_key)) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4";

/// MariaDB/MySQL: the partitions of `idem_inbox` in order, one row each: `name` (none if it
/// is not partitioned).
pub const MYSQL_PARTITIONS: &str = "SELECT CAST(partition_name AS CHAR) AS name \
    FROM information_schema.PARTITIONS \
    WHERE table_schema = DATABASE() AND table_name = 'idem_inbox' AND partition_name IS NOT NULL \
    ORDER BY partition_ordinal_position";

/// MariaDB/MySQL: the database's day (UTC), in days since 1970-01-01: one row, `today`.
pub const MYSQL_TODAY: &str = "SELECT CAST(DATEDIFF(UTC_DATE(), '1970-01-01') AS SIGNED) AS today";

/// MariaDB/MySQL: the wait for the table's metadata lock, bounded to 1 s for the statements
/// that follow (deliveries queue behind a statement waiting for it); the session's own
/// value kept for [`MYSQL_RESET_LOCK_WAIT`].
pub const MYSQL_SET_LOCK_WAIT: &str =
    "SET @idem_lock_wait = @@SESSION.lock_wait_timeout, SESSION lock_wait_timeout = 1";

/// MariaDB/MySQL: a plain table shaped as `idem_inbox` (its columns and keys, not its
/// partitioning), made afresh, into which a day's partition is exchanged before it is
/// dropped ([`mysql_exchange`]); one statement each.
pub const MYSQL_DROPPING_MAKE: [&str; 3] = [
    "DROP TABLE IF EXISTS idem_inbox_dropping",
    "CREATE TABLE idem_inbox_dropping LIKE idem_inbox",
    "ALTER TABLE idem_inbox_dropping REMOVE PARTITIONING",
];

/// MariaDB/MySQL: the day partition `name`'s records moved out of `idem_inbox` into
/// `idem_inbox_dropping` at once (a swap of their storage, the partition left empty): from
/// then on nobody writes to them, and their failures are copied as they were at that moment
/// ([`MYSQL_KEEP_DROPPED_FAILURES`]). DDL is not transactional there: this is how a record
/// turning DEAD just before the drop is not lost with it.
pub fn mysql_exchange(name: &str) -> String {
    format!("ALTER TABLE idem_inbox EXCHANGE PARTITION {name} WITH TABLE idem_inbox_dropping")
}

/// MariaDB/MySQL: the failed and dead records of the exchanged day copied into
/// `idem_inbox_failures`, or updated there if an earlier copy holds them as they were.
pub const MYSQL_KEEP_DROPPED_FAILURES: &str = "INSERT INTO idem_inbox_failures \
    SELECT * FROM idem_inbox_dropping WHERE status IN ('FAILED', 'DEAD') \
    ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), status = VALUES(status), \
    attempts = VALUES(attempts), result = VALUES(result), error = VALUES(error), \
    lease_until = VALUES(lease_until), created_at = VALUES(created_at), \
    updated_at = VALUES(updated_at)";

/// MariaDB/MySQL: whether `idem_inbox_dropping` is there, left by a maintenance that stopped
/// after its exchange and before its copy (its records are nowhere else): one row, `left`.
pub const MYSQL_DROPPING_LEFT: &str = "SELECT COUNT(*) AS `left` FROM information_schema.TABLES \
    WHERE table_schema = DATABASE() AND table_name = 'idem_inbox_dropping'";

/// MariaDB/MySQL: the exchanged day's records, gone.
pub const MYSQL_DROPPING_DROP: &str = "DROP TABLE IF EXISTS idem_inbox_dropping";

/// MariaDB/MySQL: the session's own metadata-lock wait, back.
pub const MYSQL_RESET_LOCK_WAIT: &str = "SET SESSION lock_wait_timeout = @idem_lock_wait";

/// MariaDB/MySQL: the partition of dated keys not made yet split into `days` (each a name
/// and the prefix of the day after it, in order), then itself.
pub fn mysql_split_future(days: &[(String, String)]) -> String {
    let mut into = String::new();
    for (name, next) in days {
        into.push_str(&format!(
            "PARTITION {name} VALUES LESS THAN ({}), ",
            Bound::Key(next).sql()
        ));
    }
    format!(
        "ALTER TABLE idem_inbox REORGANIZE PARTITION idem_inbox_dated_future INTO \
         ({into}PARTITION idem_inbox_dated_future VALUES LESS THAN ('{AFTER_DATED}'))"
    )
}

/// MariaDB/MySQL: drops partitions `names` of `idem_inbox`, with their records.
pub fn mysql_drop(names: &[String]) -> String {
    format!("ALTER TABLE idem_inbox DROP PARTITION {}", names.join(", "))
}

/// A partition bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound<'a> {
    /// Below every key.
    Min,
    /// This key (a literal of idem's own: digits, `~`, `-`, `/`, letters).
    Key(&'a str),
    /// Above every key.
    Max,
}

impl Bound<'_> {
    fn sql(&self) -> String {
        match self {
            Bound::Min => "MINVALUE".into(),
            Bound::Key(key) => {
                assert!(
                    key.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '~' | '-' | '/')),
                    "a partition bound is idem's own text: {key}"
                );
                format!("'{key}'")
            }
            Bound::Max => "MAXVALUE".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_name_their_partition_and_their_keys() {
        assert_eq!(day_partition("2026-12-05"), "idem_inbox_d20261205");
        assert_eq!(day_prefix("2026-12-05"), "~d2026-12-05/");
        // Byte order: undated keys below `~d`, a day's keys between its prefix and the next
        // day's, every dated key below `~e`.
        let keys = [
            "order:42:paid",
            "~d2026-12-05/order:42:paid",
            "~d2026-12-06/",
            "~e",
        ];
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert!("~d" < "~d2026-12-05/" && "~d9999-12-31/z" < AFTER_DATED);
        assert_eq!(
            postgres_partition(
                "idem_inbox_d20261205",
                &Bound::Key("~d2026-12-05/"),
                &Bound::Key("~d2026-12-06/")
            ),
            "CREATE TABLE idem_inbox_d20261205 PARTITION OF idem_inbox \
             FOR VALUES FROM ('~d2026-12-05/') TO ('~d2026-12-06/')"
        );
        assert_eq!(
            postgres_partition("idem_inbox_undated_low", &Bound::Min, &Bound::Key(DATED)),
            "CREATE TABLE idem_inbox_undated_low PARTITION OF idem_inbox \
             FOR VALUES FROM (MINVALUE) TO ('~d')"
        );
    }

    #[test]
    #[should_panic(expected = "a partition bound is idem's own text")]
    fn a_bound_is_never_a_callers_text() {
        postgres_partition("p", &Bound::Key("x'); DROP TABLE t; --"), &Bound::Max);
    }
}
