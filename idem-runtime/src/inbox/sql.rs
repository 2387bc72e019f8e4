//! The inbox's schema (its migrations), and its statements from the dialect layer
//! (`idem_sql::inbox`).

/// The schema for PostgreSQL, as its sqlx migrations in order (`0001_idem.sql`: the
/// results table and the inbox; `0002_idem_inbox_unchecked_status.sql`: the inbox's status
/// without its CHECK constraint; `0003_idem_outbox.sql`: the outbox), in one text.
pub const POSTGRES_MIGRATION: &str = concat!(
    include_str!("../../migrations/postgres/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/postgres/0002_idem_inbox_unchecked_status.sql"),
    "\n",
    include_str!("../../migrations/postgres/0003_idem_outbox.sql"),
);
/// The schema for SQLite, as its sqlx migrations in order (`0001_idem.sql`: the results
/// table and the inbox; `0002_idem_outbox.sql`: the outbox), in one text.
pub const SQLITE_MIGRATION: &str = concat!(
    include_str!("../../migrations/sqlite/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/sqlite/0002_idem_outbox.sql"),
);
/// The schema for MySQL and MariaDB, as its sqlx migrations in order (`0001_idem.sql`: the
/// results table and the inbox, its index declared with it; `0002_idem_exact_keys.sql`:
/// their key columns `VARBINARY`, compared byte for byte, trailing spaces included;
/// `0003_idem_outbox.sql`: the outbox; `0004_idem_outbox_held.sql`: the indexes a relay's
/// candidates and holds follow, which set dead and held messages apart), in one text.
pub const MYSQL_MIGRATION: &str = concat!(
    include_str!("../../migrations/mysql/0001_idem.sql"),
    "\n",
    include_str!("../../migrations/mysql/0002_idem_exact_keys.sql"),
    "\n",
    include_str!("../../migrations/mysql/0003_idem_outbox.sql"),
    "\n",
    include_str!("../../migrations/mysql/0004_idem_outbox_held.sql"),
);

/// The schema of `dialect`, as its migrations in order in one text.
pub fn migration(dialect: crate::backend::Dialect) -> &'static str {
    use crate::backend::Dialect;
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

    #[test]
    fn migrations_split_into_their_statements() {
        for (migration, count) in [
            (POSTGRES_MIGRATION, 8),
            (SQLITE_MIGRATION, 7),
            (MYSQL_MIGRATION, 9),
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
}
