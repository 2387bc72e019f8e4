//! idem's own tables — the results table, the inbox, the outbox, the leases and the
//! scheduled jobs — as this version
//! makes them: their migrations, which [`migrate`] runs, and the columns
//! [`verify`](crate::verify) checks. Below every stage: a stage names its table here, and
//! this module names no stage.

use crate::backend::Backend;
use crate::backend::Dialect;
use crate::backend::ddl::{Ddl, install};
use sqlx::Pool;

pub(crate) mod tables;

/// The schema for PostgreSQL, as its sqlx migrations in order (`0001_idem.sql`: the
/// results table and the inbox; `0002_idem_inbox_unchecked_status.sql`: the inbox's status
/// without its CHECK constraint; `0003_idem_outbox.sql`: the outbox;
/// `0004_idem_leases_jobs.sql`: the leases and the scheduled jobs;
/// `0005_idem_outbox_due_at.sql`: the index a relay's claim follows in due order), in one
/// text.
pub const POSTGRES_MIGRATION: &str = concat!(
    include_str!("../../migrations/postgres/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/postgres/0002_idem_inbox_unchecked_status.sql"),
    "\n",
    include_str!("../../migrations/postgres/0003_idem_outbox.sql"),
    "\n",
    include_str!("../../migrations/postgres/0004_idem_leases_jobs.sql"),
    "\n",
    include_str!("../../migrations/postgres/0005_idem_outbox_due_at.sql"),
);
/// The schema for SQLite, as its sqlx migrations in order (`0001_idem.sql`: the results
/// table and the inbox; `0002_idem_outbox.sql`: the outbox; `0003_idem_leases_jobs.sql`:
/// the leases and the scheduled jobs; `0004_idem_outbox_due_at.sql`: the index a relay's
/// claim follows in due order), in one text.
pub const SQLITE_MIGRATION: &str = concat!(
    include_str!("../../migrations/sqlite/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/sqlite/0002_idem_outbox.sql"),
    "\n",
    include_str!("../../migrations/sqlite/0003_idem_leases_jobs.sql"),
    "\n",
    include_str!("../../migrations/sqlite/0004_idem_outbox_due_at.sql"),
);
/// The schema for MySQL and MariaDB, as its sqlx migrations in order (`0001_idem.sql`: the
/// results table and the inbox, its index declared with it; `0002_idem_exact_keys.sql`:
/// their key columns `VARBINARY`, compared byte for byte, trailing spaces included;
/// `0003_idem_outbox.sql`: the outbox; `0004_idem_outbox_held.sql`: the indexes a relay's
/// candidates and holds follow, which set dead and held messages apart;
/// `0005_idem_leases_jobs.sql`: the leases and the scheduled jobs;
/// `0006_idem_outbox_due_at.sql`: the index a relay's candidates follow in due order), in
/// one text.
pub const MYSQL_MIGRATION: &str = concat!(
    include_str!("../../migrations/mysql/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/mysql/0002_idem_exact_keys.sql"),
    "\n",
    include_str!("../../migrations/mysql/0003_idem_outbox.sql"),
    "\n",
    include_str!("../../migrations/mysql/0004_idem_outbox_held.sql"),
    "\n",
    include_str!("../../migrations/mysql/0005_idem_leases_jobs.sql"),
    "\n",
    include_str!("../../migrations/mysql/0006_idem_outbox_due_at.sql"),
);

/// What tells that a migration was applied: what it creates or changes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Probe {
    /// These tables exist.
    Tables(&'static [&'static str]),
    /// This index exists.
    Index(&'static str),
    /// The inbox exists without its first migration's status CHECK (PostgreSQL).
    InboxUnchecked,
    /// The results' and the inbox's key columns compare byte for byte (MySQL).
    ExactKeys,
}

/// The migrations of `dialect`, in order, each named by its file and told by its [`Probe`].
pub(crate) fn migrations(dialect: Dialect) -> &'static [(&'static str, Probe)] {
    const FIRST: Probe = Probe::Tables(&["idem_results", "idem_inbox"]);
    const OUTBOX: Probe = Probe::Tables(&["idem_outbox"]);
    const LEASES_JOBS: Probe = Probe::Tables(&["idem_leases", "idem_jobs"]);
    const DUE_AT: Probe = Probe::Index("idem_outbox_due_at");
    match dialect {
        Dialect::Postgres => &[
            ("0001_idem.sql", FIRST),
            (
                "0002_idem_inbox_unchecked_status.sql",
                Probe::InboxUnchecked,
            ),
            ("0003_idem_outbox.sql", OUTBOX),
            ("0004_idem_leases_jobs.sql", LEASES_JOBS),
            ("0005_idem_outbox_due_at.sql", DUE_AT),
        ],
        Dialect::Sqlite => &[
            ("0001_idem.sql", FIRST),
            ("0002_idem_outbox.sql", OUTBOX),
            ("0003_idem_leases_jobs.sql", LEASES_JOBS),
            ("0004_idem_outbox_due_at.sql", DUE_AT),
        ],
        Dialect::MySql => &[
            ("0001_idem.sql", FIRST),
            ("0002_idem_exact_keys.sql", Probe::ExactKeys),
            ("0003_idem_outbox.sql", OUTBOX),
            (
                "0004_idem_outbox_held.sql",
                Probe::Tables(&["idem_outbox_locks"]),
            ),
            ("0005_idem_leases_jobs.sql", LEASES_JOBS),
            ("0006_idem_outbox_due_at.sql", DUE_AT),
        ],
    }
}

/// The schema of `dialect`, as its migrations in order in one text.
pub fn migration(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => POSTGRES_MIGRATION,
        Dialect::Sqlite => SQLITE_MIGRATION,
        Dialect::MySql => MYSQL_MIGRATION,
    }
}

/// The statements of a migration, one by one (a prepared statement holds one command).
pub(crate) fn statements(migration: &str) -> impl Iterator<Item = &str> {
    migration.split(';').map(str::trim).filter(|statement| {
        statement
            .lines()
            .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
    })
}

/// Creates idem's tables (the default results table and the inbox) if they do not
/// exist, and brings tables of older migrations up to date (PostgreSQL: the inbox's status
/// without its CHECK; MySQL: key columns compared byte for byte, `VARBINARY`, which
/// rewrites each table once): [`SQLITE_MIGRATION`], [`POSTGRES_MIGRATION`] or
/// [`MYSQL_MIGRATION`], statement by statement.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    install(pool, |dialect| {
        // Collected before any `.await`: held across one, `map(Ddl::Statement)` would keep
        // rustc from proving this future `Send`.
        let statements = statements(migration(dialect));
        statements.map(Ddl::Statement).collect::<Vec<_>>()
    })
    .await
}

/// The columns of the results table idem reads and writes.
pub(crate) const RESULT_COLUMNS: [&str; 6] = [
    "machine",
    "entity_key",
    "from_state",
    "to_state",
    "result",
    "created_at",
];

/// The columns of the inbox table idem reads and writes.
pub(crate) const INBOX_COLUMNS: [&str; 10] = [
    "consumer_group",
    "message_key",
    "fingerprint",
    "status",
    "attempts",
    "result",
    "error",
    "lease_until",
    "created_at",
    "updated_at",
];

/// The columns of the outbox table idem reads and writes.
pub(crate) const OUTBOX_COLUMNS: [&str; 14] = [
    "seq",
    "id",
    "ordering_key",
    "destination",
    "routing_key",
    "payload",
    "headers",
    "created_at",
    "attempts",
    "next_attempt_at",
    "last_error",
    "published_at",
    "dead_at",
    "claimed_until",
];

/// The columns of the leases table idem reads and writes.
pub(crate) const LEASE_COLUMNS: [&str; 5] =
    ["name", "fence", "holder", "lease_until", "updated_at"];

/// The columns of the scheduled jobs' table idem reads and writes.
pub(crate) const JOB_COLUMNS: [&str; 10] = [
    "job",
    "next_at",
    "fence",
    "running_at",
    "lease_until",
    "attempts",
    "last_at",
    "result",
    "error",
    "updated_at",
];

/// The columns of the outbox table compared byte for byte: its id and ordering key.
pub(crate) const OUTBOX_KEY_COLUMNS: [&str; 2] = ["id", "ordering_key"];

/// The columns of the results table that make its key: compared byte for byte.
pub(crate) const RESULT_KEY_COLUMNS: [&str; 4] =
    ["machine", "entity_key", "from_state", "to_state"];

/// The columns of the inbox table that make its key: compared byte for byte.
pub(crate) const INBOX_KEY_COLUMNS: [&str; 2] = ["consumer_group", "message_key"];

#[cfg(test)]
mod tests {
    use super::*;

    /// The MySQL migration makes as many lock rows as a claim's buckets count.
    #[test]
    fn the_lock_rows_are_the_claims_buckets() {
        let buckets = idem_sql::outbox::MYSQL_KEY_BUCKETS;
        assert!(MYSQL_MIGRATION.contains(&format!("FROM idem_outbox_locks) < {buckets}")));
        assert_eq!(
            buckets,
            16 * 16 * 16 * 4,
            "the cross join of four digit tables"
        );
    }

    /// Each migration probed is one the schema includes, in the same order.
    #[test]
    fn the_probed_migrations_are_the_included_ones() {
        for (dialect, migration, dir) in [
            (Dialect::Postgres, POSTGRES_MIGRATION, "postgres"),
            (Dialect::Sqlite, SQLITE_MIGRATION, "sqlite"),
            (Dialect::MySql, MYSQL_MIGRATION, "mysql"),
        ] {
            let mut files: Vec<String> =
                std::fs::read_dir(format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR")))
                    .unwrap()
                    .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                    .collect();
            files.sort();
            let probed: Vec<&str> = migrations(dialect).iter().map(|(name, _)| *name).collect();
            assert_eq!(probed, files, "{dir}");
            for (name, probe) in migrations(dialect) {
                let text = std::fs::read_to_string(format!(
                    "{}/migrations/{dir}/{name}",
                    env!("CARGO_MANIFEST_DIR")
                ))
                .unwrap();
                assert!(
                    migration.contains(text.trim()),
                    "{name} is not in the schema"
                );
                if let Probe::Index(index) = probe {
                    assert!(
                        text.contains(&format!("INDEX IF NOT EXISTS {index} ")),
                        "{name}"
                    );
                }
                if let Probe::Tables(tables) = probe {
                    for table in *tables {
                        assert!(
                            text.contains(&format!("TABLE IF NOT EXISTS {table} ")),
                            "{name}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn migrations_split_into_their_statements() {
        for (migration, count) in [
            (POSTGRES_MIGRATION, 11),
            (SQLITE_MIGRATION, 10),
            (MYSQL_MIGRATION, 12),
        ] {
            let statements: Vec<&str> = statements(migration).collect();
            assert_eq!(statements.len(), count, "{statements:#?}");
            assert!(statements[1].contains("CREATE TABLE IF NOT EXISTS idem_inbox"));
        }
        // `statements` splits at every semicolon, so a comment must not hold one.
        for migration in [POSTGRES_MIGRATION, SQLITE_MIGRATION, MYSQL_MIGRATION] {
            for line in migration
                .lines()
                .filter(|l| l.trim_start().starts_with("--"))
            {
                assert!(!line.contains(';'), "a semicolon in a comment: {line}");
            }
        }
        let postgres: Vec<&str> = statements(POSTGRES_MIGRATION).collect();
        assert!(postgres[3].contains("DROP CONSTRAINT IF EXISTS idem_inbox_status_check"));
        assert!(postgres[4].contains("CREATE TABLE IF NOT EXISTS idem_outbox"));
        let sqlite: Vec<&str> = statements(SQLITE_MIGRATION).collect();
        assert!(sqlite[3].contains("CREATE TABLE IF NOT EXISTS idem_outbox"));
        let mysql: Vec<&str> = statements(MYSQL_MIGRATION).collect();
        assert!(mysql[2].contains("ALTER TABLE idem_results"));
        assert!(mysql[3].starts_with("ALTER TABLE idem_inbox"));
        assert!(mysql[4].contains("CREATE TABLE IF NOT EXISTS idem_outbox"));
    }

    /// The columns checked are the columns the migrations create.
    #[test]
    fn the_checked_columns_are_the_migrated_ones() {
        for migration in [POSTGRES_MIGRATION, SQLITE_MIGRATION, MYSQL_MIGRATION] {
            let table = |name: &str| {
                let start = migration
                    .find(&format!("CREATE TABLE IF NOT EXISTS {name} ("))
                    .unwrap();
                let end = start + migration[start..].find("\n)").unwrap();
                migration[start..end].to_owned()
            };
            let columns = |ddl: String| -> Vec<String> {
                ddl.lines()
                    .skip(1)
                    .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                    .filter(|c| c != "PRIMARY" && c != "KEY" && c != "UNIQUE")
                    .collect()
            };
            assert_eq!(columns(table("idem_inbox")), INBOX_COLUMNS);
            assert_eq!(columns(table("idem_results")), RESULT_COLUMNS);
            assert_eq!(columns(table("idem_outbox")), OUTBOX_COLUMNS);
            assert_eq!(columns(table("idem_leases")), LEASE_COLUMNS);
            assert_eq!(columns(table("idem_jobs")), JOB_COLUMNS);
        }
    }
}
