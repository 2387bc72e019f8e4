//! The migrations idem ships, applied by sqlx's own migrator (as the README tells users
//! to), give the tables `idem::migrate` gives: a delivery and a transition work on them,
//! applying them twice changes nothing, and `idem::migrate` afterwards finds nothing to do.

use crate::common;

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

/// An installation that applied MySQL's first migration with sqlx's migrator, and has
/// records, takes the second as it comes: the records stay, and from then on keys are
/// exact (`"k"` and `"k "` are two records, two first results).
#[tokio::test]
async fn sqlx_upgrades_an_older_mysql_installation_to_exact_keys() {
    let Some(pool) = common::mysql("migrations_upgrade", 2).await else {
        return;
    };
    // The installation as it was: the first migration alone, applied by sqlx.
    let older = common::scratch_file("mysql-migrations-0001");
    let _ = std::fs::remove_dir_all(&older);
    std::fs::create_dir_all(&older).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("idem-runtime/migrations/mysql");
    std::fs::copy(shipped.join("0001_idem.sql"), older.join("0001_idem.sql")).unwrap();
    Migrator::new(older.as_path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    delivered_on!(pool);
    sqlx::raw_sql(
        "INSERT INTO idem_results (machine, entity_key, from_state, to_state, result) \
         VALUES ('Order', 'k', 'CREATED', 'PAID', '1')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let padded = "INSERT INTO idem_results (machine, entity_key, from_state, to_state, result) \
                  VALUES ('Order', 'k ', 'CREATED', 'PAID', '2')";
    assert!(
        sqlx::raw_sql(padded).execute(&pool).await.is_err(),
        "before: `k ` is the same key as `k`"
    );

    let migrator = migrator("mysql").await;
    migrator.run(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(column_name AS CHAR), CAST(column_type AS CHAR) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND column_name IN \
         ('machine', 'entity_key', 'from_state', 'to_state', 'consumer_group', 'message_key') \
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let types: Vec<(&str, &str)> = types.iter().map(|(c, t)| (&**c, &**t)).collect();
    assert_eq!(
        types,
        [
            ("consumer_group", "varbinary(255)"),
            ("message_key", "varbinary(255)"),
            ("machine", "varbinary(255)"),
            ("entity_key", "varbinary(2048)"),
            ("from_state", "varbinary(64)"),
            ("to_state", "varbinary(64)"),
        ]
    );
    // The records are still there: a redelivery is a duplicate with its first result.
    let inbox = Inbox::new("billing").unwrap();
    let key = MessageKey::new("order:1:paid").unwrap();
    let again = match inbox.receive::<_, i64>(&pool, &key, b"m").await.unwrap() {
        Received::Done(done) => done,
        Received::New(_) => panic!("the record was lost in the migration"),
    };
    assert_eq!(
        again,
        Delivery::Duplicate {
            first_result: Some(7)
        }
    );
    let spaced = MessageKey::new("order:1:paid ").unwrap();
    assert!(matches!(
        inbox.receive::<_, i64>(&pool, &spaced, b"m").await.unwrap(),
        Received::New(_)
    ));
    sqlx::raw_sql(padded).execute(&pool).await.unwrap();
    let results: Vec<String> = sqlx::query_scalar(
        "SELECT result FROM idem_results WHERE machine = 'Order' ORDER BY entity_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(results, ["1", "2"]);
}

/// The derive's results table on MySQL (`idem::create_results_table`) is the table the
/// shipped migrations make, column for column.
#[tokio::test]
async fn the_mysql_results_table_of_the_derive_is_the_migrated_one() {
    let (Some(migrated), Some(derived)) = (
        common::mysql("migrations_results_migrated", 1).await,
        common::mysql("migrations_results_derived", 1).await,
    ) else {
        return;
    };
    #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    #[machine(table = "orders", key = "order_id")]
    enum Order {
        #[state(to(Paid))]
        Created,
        Paid,
    }
    idem::migrate(&migrated).await.unwrap();
    idem::create_results_table::<Order, _>(&derived)
        .await
        .unwrap();
    let mut shown = Vec::new();
    for pool in [&migrated, &derived] {
        let (_, ddl): (String, String) = sqlx::query_as("SHOW CREATE TABLE idem_results")
            .fetch_one(pool)
            .await
            .unwrap();
        shown.push(ddl);
    }
    assert_eq!(shown[0], shown[1]);
    assert!(
        shown[0].contains("`entity_key` varbinary(2048) NOT NULL"),
        "{}",
        shown[0]
    );
}
