//! The backends idem speaks: how each names itself, opens a write transaction, spells a
//! transition's statements, and what its error codes mean.
//!
//! The one place a backend's spelling and its error codes are written down. The runtime
//! asks a [`Dialect`]; it does not match on SQLSTATEs or result codes of its own.

use crate::transition::{self, Assignment, Names, Statements};

/// A backend idem runs on.
///
/// Not `#[non_exhaustive]` on purpose: idem matches on it exhaustively, so that a new
/// backend shows every place that must learn it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL (and PostgreSQL-wire databases).
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL and MariaDB (InnoDB).
    MySql,
}

/// What a database error means to idem, whichever backend raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The transaction lost a conflict with a concurrent one and is gone (PostgreSQL's
    /// serialization failure 40001 and deadlock 40P01; SQLite's BUSY and LOCKED, in any
    /// extended form; MySQL's deadlock 1213 and MariaDB's snapshot conflict 1020): running
    /// it again from the start may succeed.
    Conflict,
    /// A lock was not granted within the lock timeout (PostgreSQL 55P03; MySQL 1205, and
    /// MySQL 8's `NOWAIT` 3572): only that statement failed.
    LockTimeout,
    /// A unique index refused the row (PostgreSQL 23505; SQLite's UNIQUE and PRIMARY KEY
    /// constraints; MySQL 1062): only that statement failed.
    Duplicate,
    /// The server ended the connection or cannot serve yet: it is shutting down, crashed,
    /// is starting up or recovering (PostgreSQL's connection exceptions, class 08 but 08P01, and
    /// 57P01–57P03, as a failover cuts its connections; MySQL's server shutdown 1053, a
    /// killed connection 1927, and 1047, a Galera node that is not part of the cluster's
    /// primary component). The transaction is gone; on another connection, perhaps to
    /// another server, the call may succeed.
    Unavailable,
    /// Anything else: the caller's to report.
    Other,
}

impl Dialect {
    /// Every backend, in a fixed order.
    pub const ALL: [Dialect; 3] = [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql];

    /// The position of this dialect in [`ALL`](Self::ALL).
    pub const fn index(self) -> usize {
        match self {
            Dialect::Postgres => 0,
            Dialect::Sqlite => 1,
            Dialect::MySql => 2,
        }
    }

    /// The backend a URL scheme or a driver's name denotes (`postgres`, `postgresql`,
    /// `sqlite`, `mysql`, `mariadb`, in any case); `None` for one idem does not run on.
    pub fn named(name: &str) -> Option<Dialect> {
        // Asked for every statement through `sqlx::Any`: compared in place, no allocation.
        const NAMES: [(&str, Dialect); 5] = [
            ("postgres", Dialect::Postgres),
            ("postgresql", Dialect::Postgres),
            ("sqlite", Dialect::Sqlite),
            ("mysql", Dialect::MySql),
            ("mariadb", Dialect::MySql),
        ];
        NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|&(_, dialect)| dialect)
    }

    /// The database's name in OpenTelemetry's `db.system.name` (MariaDB speaks MySQL's
    /// protocol and is reported as `mysql`).
    pub fn system_name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgresql",
            Dialect::Sqlite => "sqlite",
            Dialect::MySql => "mysql",
        }
    }

    /// Whether statements bind positionally (`?`, each use of a value bound again: MySQL),
    /// not by number (`$1`); idem writes them numbered, and binds them through
    /// [`positional`](crate::placeholder::positional) where this holds.
    pub fn binds_positionally(self) -> bool {
        matches!(self, Dialect::MySql)
    }

    /// The statement that opens a write transaction. SQLite must take the write lock up
    /// front: a deferred transaction that later upgrades fails with SQLITE_BUSY at once
    /// instead of waiting for the busy timeout.
    pub fn begin(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::MySql => "BEGIN",
            Dialect::Sqlite => "BEGIN IMMEDIATE",
        }
    }

    /// Whether a statement may write in a CTE (`WITH upd AS (UPDATE … RETURNING …)`), so
    /// that one statement moves a row and classifies a miss, or stores a result with it
    /// (PostgreSQL); elsewhere those take a second statement.
    pub fn writes_in_cte(self) -> bool {
        match self {
            Dialect::Postgres => true,
            Dialect::Sqlite | Dialect::MySql => false,
        }
    }

    /// A machine's transition statements in this dialect, with the columns a handler sets.
    pub fn statements(self, names: &Names<'_>, set: &[Assignment<'_>]) -> Statements {
        match self {
            Dialect::Postgres => transition::postgres(names, set),
            Dialect::Sqlite => transition::sqlite(names, set),
            Dialect::MySql => transition::mysql(names, set),
        }
    }

    /// What the error code `code` of this backend's driver means (PostgreSQL: the
    /// SQLSTATE; SQLite: the extended result code, in decimal; MySQL: the server's error
    /// number, in decimal — its SQLSTATE is too coarse: a lock wait timeout is `HY000`).
    pub fn error(self, code: &str) -> ErrorClass {
        match self {
            Dialect::Postgres => match code {
                "40001" | "40P01" => ErrorClass::Conflict,
                "55P03" => ErrorClass::LockTimeout,
                "23505" => ErrorClass::Duplicate,
                // admin_shutdown (also "terminating connection due to unexpected postmaster
                // exit"), crash_shutdown, cannot_connect_now (starting up, in recovery)
                "57P01" | "57P02" | "57P03" => ErrorClass::Unavailable,
                // connection exceptions, but a protocol violation (08P01): a bug, not the
                // server going away
                code if code.starts_with("08") && code != "08P01" => ErrorClass::Unavailable,
                _ => ErrorClass::Other,
            },
            Dialect::Sqlite => match code.parse::<u32>() {
                // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE
                Ok(1555 | 2067) => ErrorClass::Duplicate,
                // SQLITE_BUSY (5) and SQLITE_LOCKED (6): the primary code is the low byte.
                Ok(code) if matches!(code & 0xff, 5 | 6) => ErrorClass::Conflict,
                _ => ErrorClass::Other,
            },
            Dialect::MySql => match code {
                // ER_LOCK_DEADLOCK; ER_CHECKREAD (MariaDB 11.6+ snapshot isolation)
                "1213" | "1020" => ErrorClass::Conflict,
                // ER_LOCK_WAIT_TIMEOUT; ER_LOCK_NOWAIT (MySQL 8)
                "1205" | "3572" => ErrorClass::LockTimeout,
                // ER_DUP_ENTRY; ER_DUP_ENTRY_WITH_KEY_NAME
                "1062" | "1586" => ErrorClass::Duplicate,
                // ER_SERVER_SHUTDOWN; ER_CONNECTION_KILLED; ER_UNKNOWN_COM_ERROR, which a
                // Galera node outside the primary component answers every statement with
                "1053" | "1927" | "1047" => ErrorClass::Unavailable,
                _ => ErrorClass::Other,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_as_drivers_and_urls_spell_them() {
        assert_eq!(Dialect::named("PostgreSQL"), Some(Dialect::Postgres));
        assert_eq!(Dialect::named("postgres"), Some(Dialect::Postgres));
        assert_eq!(Dialect::named("SQLite"), Some(Dialect::Sqlite));
        assert_eq!(Dialect::named("MariaDB"), Some(Dialect::MySql));
        assert_eq!(Dialect::named("mssql"), None);
        for (i, dialect) in Dialect::ALL.into_iter().enumerate() {
            assert_eq!(Dialect::named(dialect.system_name()), Some(dialect));
            assert_eq!(dialect.index(), i);
        }
    }

    #[test]
    fn error_codes_mean_the_same_whichever_backend_raised_them() {
        let pg = Dialect::Postgres;
        assert_eq!(pg.error("40001"), ErrorClass::Conflict);
        assert_eq!(pg.error("40P01"), ErrorClass::Conflict);
        assert_eq!(pg.error("55P03"), ErrorClass::LockTimeout);
        assert_eq!(pg.error("23505"), ErrorClass::Duplicate);
        assert_eq!(pg.error("23514"), ErrorClass::Other);
        for gone in ["57P01", "57P02", "57P03", "08006", "08003"] {
            assert_eq!(pg.error(gone), ErrorClass::Unavailable, "{gone}");
        }
        assert_eq!(pg.error("08P01"), ErrorClass::Other);
        let lite = Dialect::Sqlite;
        // SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT (517), SQLITE_LOCKED_SHAREDCACHE (262)
        for busy in ["5", "517", "6", "262"] {
            assert_eq!(lite.error(busy), ErrorClass::Conflict, "{busy}");
        }
        // SQLITE_CONSTRAINT_UNIQUE (2067), SQLITE_CONSTRAINT_CHECK (275), and a code that
        // is no number
        assert_eq!(lite.error("2067"), ErrorClass::Duplicate);
        assert_eq!(lite.error("275"), ErrorClass::Other);
        assert_eq!(lite.error("40001"), ErrorClass::Other);
        let my = Dialect::MySql;
        assert_eq!(my.error("1213"), ErrorClass::Conflict);
        assert_eq!(my.error("1020"), ErrorClass::Conflict);
        assert_eq!(my.error("1205"), ErrorClass::LockTimeout);
        assert_eq!(my.error("1062"), ErrorClass::Duplicate);
        for gone in ["1053", "1927", "1047"] {
            assert_eq!(my.error(gone), ErrorClass::Unavailable, "{gone}");
        }
        // a SIGNAL from a trigger, a CHECK constraint, and a SQLSTATE
        for other in ["1644", "4025", "40001"] {
            assert_eq!(my.error(other), ErrorClass::Other, "{other}");
        }
    }
}
