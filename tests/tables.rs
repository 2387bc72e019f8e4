//! `idem::check_tables` against real databases: which migrations a database has, told by
//! what each creates, and the problems of idem's own tables, with no machine.

use crate::common;

use idem::SchemaProblem;

/// The migrations of the backend `pool` is on, as `check_tables` names them.
async fn names<DB: idem::Backend>(pool: &sqlx::Pool<DB>) -> Vec<&'static str> {
    idem::check_tables(pool, None)
        .await
        .unwrap()
        .migrations
        .iter()
        .map(|m| m.name)
        .collect()
}

/// A database before, after and between migrations: `current` is the last of the unbroken
/// run, `pending` what `idem::migrate` would add.
async fn told_by_what_each_migration_made<DB: idem::Backend>(pool: sqlx::Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let report = idem::check_tables(&pool, None).await.unwrap();
    assert_eq!(report.current(), None, "{report}");
    assert!(report.migrations.iter().all(|m| !m.applied), "{report:?}");
    assert_eq!(
        report.problems,
        [SchemaProblem::MissingTable {
            table: "idem_results".to_owned()
        }]
    );
    assert!(!report.is_ok());
    assert!(
        report
            .to_string()
            .starts_with("idem's tables are not migrated; not applied: 0001_idem.sql, "),
        "{report}"
    );

    idem::migrate(&pool).await.unwrap();
    let all = names(&pool).await;
    let last = *all.last().unwrap();
    let report = idem::check_tables(&pool, None).await.unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.current(), Some(last));
    assert_eq!(
        report.tables,
        [
            "idem_results",
            "idem_inbox",
            "idem_outbox",
            "idem_leases",
            "idem_jobs"
        ]
    );
    assert_eq!(
        report.to_string(),
        format!("idem's tables are on migration {last}")
    );

    // A database from before the last migration: its index is not there yet.
    // MySQL names the table; the others do not.
    if sqlx::raw_sql("DROP INDEX idem_outbox_due_at ON idem_outbox")
        .execute(&pool)
        .await
        .is_err()
    {
        sqlx::raw_sql("DROP INDEX idem_outbox_due_at")
            .execute(&pool)
            .await
            .unwrap();
    }
    let report = idem::check_tables(&pool, None).await.unwrap();
    assert_eq!(report.current(), Some(all[all.len() - 2]), "{report}");
    assert_eq!(report.pending().collect::<Vec<_>>(), [last]);
    assert!(report.problems.is_empty(), "{report}");
    assert!(!report.is_ok());
    assert!(
        report
            .to_string()
            .ends_with(&format!("; not applied: {last} (run `idem::migrate`)")),
        "{report}"
    );

    // Without the leases and jobs: a gap in the run, and `current` stops before it.
    sqlx::raw_sql("DROP TABLE idem_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let report = idem::check_tables(&pool, None).await.unwrap();
    assert!(!report.has("idem_jobs") && report.has("idem_leases"));
    let jobs = all.iter().position(|m| m.contains("leases_jobs")).unwrap();
    assert_eq!(report.current(), Some(all[jobs - 1]), "{report}");
    assert_eq!(report.pending().collect::<Vec<_>>(), [all[jobs], last]);

    idem::migrate(&pool).await.unwrap();
    let report = idem::check_tables(&pool, None).await.unwrap();
    assert!(report.is_ok(), "{report}");

    // A results table of the user's own name, which does not exist.
    let report = idem::check_tables(&pool, Some("billing_results"))
        .await
        .unwrap();
    assert_eq!(
        report.problems,
        [SchemaProblem::MissingTable {
            table: "billing_results".to_owned()
        }]
    );
}

#[tokio::test]
async fn sqlite_migrations_are_told_apart() {
    let pool = common::sqlite_file(&format!("tables_{}", common::next_id()), 1).await;
    told_by_what_each_migration_made(pool).await;
}

#[tokio::test]
async fn postgres_migrations_are_told_apart() {
    let Some(pool) = common::postgres(&format!("tables_{}", common::next_id()), 2).await else {
        return;
    };
    told_by_what_each_migration_made(pool).await;
}

#[tokio::test]
async fn mysql_migrations_are_told_apart() {
    let Some(pool) = common::mysql(&format!("tables_{}", common::next_id()), 2).await else {
        return;
    };
    told_by_what_each_migration_made(pool).await;
}

/// The first migration alone: on PostgreSQL the inbox keeps its status CHECK, on MySQL its
/// keys compare under `utf8mb4_bin`; each database is on `0001_idem.sql`, with the second
/// pending and its problem named, until `idem::migrate`.
#[tokio::test]
async fn a_database_on_the_first_migration_is_on_the_first_migration() {
    let mut checked = 0;
    if let Some(pool) = common::postgres(&format!("tables_first_{}", common::next_id()), 2).await {
        let first = idem::inbox::POSTGRES_MIGRATION
            .split("ALTER TABLE")
            .next()
            .unwrap();
        sqlx::raw_sql(first).execute(&pool).await.unwrap();
        let report = idem::check_tables(&pool, None).await.unwrap();
        assert_eq!(report.current(), Some("0001_idem.sql"), "{report}");
        assert_eq!(
            report.pending().next(),
            Some("0002_idem_inbox_unchecked_status.sql")
        );
        assert!(
            matches!(report.problems.as_slice(), [SchemaProblem::OutdatedTable { table, .. }] if table == "idem_inbox"),
            "{report}"
        );
        idem::migrate(&pool).await.unwrap();
        assert!(idem::check_tables(&pool, None).await.unwrap().is_ok());
        checked += 1;
    }
    if let Some(pool) = common::mysql(&format!("tables_first_{}", common::next_id()), 2).await {
        let first = idem::inbox::MYSQL_MIGRATION
            .split("ALTER TABLE")
            .next()
            .unwrap();
        sqlx::raw_sql(first).execute(&pool).await.unwrap();
        let report = idem::check_tables(&pool, None).await.unwrap();
        assert_eq!(report.current(), Some("0001_idem.sql"), "{report}");
        assert_eq!(report.pending().next(), Some("0002_idem_exact_keys.sql"));
        assert_eq!(report.problems.len(), 2, "{report}");
        idem::migrate(&pool).await.unwrap();
        assert!(idem::check_tables(&pool, None).await.unwrap().is_ok());
        checked += 1;
    }
    assert!(checked > 0 || !common::require_servers());
}
