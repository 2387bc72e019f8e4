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
}

/// What a database error means to idem, whichever backend raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The transaction lost a conflict with a concurrent one and is gone (PostgreSQL's
    /// serialization failure 40001 and deadlock 40P01; SQLite's BUSY and LOCKED, in any
    /// extended form): running it again from the start may succeed.
    Conflict,
    /// A lock was not granted within the lock timeout (PostgreSQL 55P03): only that
    /// statement failed.
    LockTimeout,
    /// Anything else: the caller's to report.
    Other,
}

impl Dialect {
    /// Every backend, in a fixed order.
    pub const ALL: [Dialect; 2] = [Dialect::Postgres, Dialect::Sqlite];

    /// The backend a URL scheme or a driver's name denotes (`postgres`, `postgresql`,
    /// `sqlite`, in any case); `None` for one idem does not run on.
    pub fn named(name: &str) -> Option<Dialect> {
        match name.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "sqlite" => Some(Dialect::Sqlite),
            _ => None,
        }
    }

    /// The database's name in OpenTelemetry's `db.system.name`.
    pub fn system_name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgresql",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The statement that opens a write transaction. SQLite must take the write lock up
    /// front: a deferred transaction that later upgrades fails with SQLITE_BUSY at once
    /// instead of waiting for the busy timeout.
    pub fn begin(self) -> &'static str {
        match self {
            Dialect::Postgres => "BEGIN",
            Dialect::Sqlite => "BEGIN IMMEDIATE",
        }
    }

    /// Whether a statement may write in a CTE (`WITH upd AS (UPDATE … RETURNING …)`), so
    /// that one statement moves a row and classifies a miss, or stores a result with it
    /// (PostgreSQL); elsewhere those take a second statement.
    pub fn writes_in_cte(self) -> bool {
        match self {
            Dialect::Postgres => true,
            Dialect::Sqlite => false,
        }
    }

    /// A machine's transition statements in this dialect, with the columns a handler sets.
    pub fn statements(self, names: &Names<'_>, set: &[Assignment<'_>]) -> Statements {
        match self {
            Dialect::Postgres => transition::postgres(names, set),
            Dialect::Sqlite => transition::sqlite(names, set),
        }
    }

    /// What the error code `code` of this backend's driver means (PostgreSQL: the
    /// SQLSTATE; SQLite: the extended result code, in decimal).
    pub fn error(self, code: &str) -> ErrorClass {
        match self {
            Dialect::Postgres => match code {
                "40001" | "40P01" => ErrorClass::Conflict,
                "55P03" => ErrorClass::LockTimeout,
                _ => ErrorClass::Other,
            },
            // SQLITE_BUSY (5) and SQLITE_LOCKED (6): the primary code is the low byte.
            Dialect::Sqlite => match code.parse::<u32>().map(|code| code & 0xff) {
                Ok(5 | 6) => ErrorClass::Conflict,
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
        assert_eq!(Dialect::named("mysql"), None);
        for dialect in Dialect::ALL {
            assert_eq!(Dialect::named(dialect.system_name()), Some(dialect));
        }
    }

    #[test]
    fn error_codes_mean_the_same_whichever_backend_raised_them() {
        let pg = Dialect::Postgres;
        assert_eq!(pg.error("40001"), ErrorClass::Conflict);
        assert_eq!(pg.error("40P01"), ErrorClass::Conflict);
        assert_eq!(pg.error("55P03"), ErrorClass::LockTimeout);
        assert_eq!(pg.error("23505"), ErrorClass::Other);
        let lite = Dialect::Sqlite;
        // SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT (517), SQLITE_LOCKED_SHAREDCACHE (262)
        for busy in ["5", "517", "6", "262"] {
            assert_eq!(lite.error(busy), ErrorClass::Conflict, "{busy}");
        }
        // SQLITE_CONSTRAINT_UNIQUE (2067), and a code that is no number
        assert_eq!(lite.error("2067"), ErrorClass::Other);
        assert_eq!(lite.error("40001"), ErrorClass::Other);
    }
}
