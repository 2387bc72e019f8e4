//! The migrations idem ships, applied by sqlx's own migrator (as the README tells users
//! to), give the tables `idem::migrate` gives: a delivery and a transition work on them,
//! applying them twice changes nothing, and `idem::migrate` afterwards finds nothing to do.

mod common;

use idem::inbox::{Delivery, Inbox, MessageKey, Received};
use sqlx::migrate::Migrator;
use std::path::Path;

async fn migrator(backend: &str) -> Migrator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("idem-runtime/migrations")
        .join(backend);
    Migrator::new(dir).await.unwrap()
}

/// The shipped migrations, in order, as one text without its blank lines.
fn concatenated(migrator: &Migrator) -> String {
    let text: String = migrator.iter().map(|m| format!("{}\n", m.sql)).collect();
    without_blank_lines(&text)
}

fn without_blank_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

macro_rules! delivered_on {
    ($pool:expr) => {{
        let inbox = Inbox::new("billing").unwrap();
        let key = MessageKey::new("order:1:paid").unwrap();
        for first in [true, false] {
            let delivery = match inbox.receive::<_, i64>(&$pool, &key, b"m").await.unwrap() {
                Received::New(receipt) => receipt.finish(Ok::<i64, ()>(7)).await.unwrap(),
                Received::Done(done) => done,
            };
            let expected = if first {
                Delivery::Processed(7)
            } else {
                Delivery::Duplicate {
                    first_result: Some(7),
                }
            };
            assert_eq!(delivery, expected);
        }
    }};
}

#[tokio::test]
async fn sqlx_applies_the_sqlite_migrations() {
    let pool = common::sqlite_file("migrations-sqlx", 2).await;
    let migrator = migrator("sqlite").await;
    assert_eq!(
        concatenated(&migrator),
        without_blank_lines(idem::inbox::SQLITE_MIGRATION),
        "idem::inbox::SQLITE_MIGRATION is the shipped migrations"
    );
    migrator.run(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    delivered_on!(pool);
}

#[tokio::test]
async fn sqlx_applies_the_postgres_migrations_and_the_status_is_unchecked() {
    let Some(pool) = common::postgres("migrations_sqlx", 2).await else {
        return;
    };
    let migrator = migrator("postgres").await;
    assert_eq!(
        concatenated(&migrator),
        without_blank_lines(idem::inbox::POSTGRES_MIGRATION),
        "idem::inbox::POSTGRES_MIGRATION is the shipped migrations, in order"
    );
    migrator.run(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    delivered_on!(pool);
    let checks: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_constraint WHERE contype = 'c' AND conrelid = 'idem_inbox'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(checks, 0, "the second migration drops the status CHECK");
}

#[tokio::test]
async fn sqlx_applies_the_mysql_migrations() {
    let Some(pool) = common::mysql("migrations_sqlx", 2).await else {
        return;
    };
    let migrator = migrator("mysql").await;
    assert_eq!(
        concatenated(&migrator),
        without_blank_lines(idem::inbox::MYSQL_MIGRATION),
        "idem::inbox::MYSQL_MIGRATION is the shipped migrations"
    );
    migrator.run(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    delivered_on!(pool);
}

/// A database whose inbox table came from the first migration alone (before the second
/// existed) loses the constraint when `idem::migrate` runs again.
#[tokio::test]
async fn migrate_drops_the_status_check_of_an_older_postgres_table() {
    let Some(pool) = common::postgres("migrations_older", 2).await else {
        return;
    };
    let first = migrator("postgres").await;
    let first_sql = &first.iter().next().unwrap().sql;
    sqlx::raw_sql(first_sql).execute(&pool).await.unwrap();
    let count = "SELECT COUNT(*) FROM pg_constraint WHERE contype = 'c' AND conrelid = 'idem_inbox'::regclass";
    let before: i64 = sqlx::query_scalar(count).fetch_one(&pool).await.unwrap();
    assert_eq!(before, 1);
    idem::migrate(&pool).await.unwrap();
    let after: i64 = sqlx::query_scalar(count).fetch_one(&pool).await.unwrap();
    assert_eq!(after, 0);
    delivered_on!(pool);
}
