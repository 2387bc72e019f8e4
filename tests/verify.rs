//! `idem::verify` against real databases: a matching schema passes; every kind of mismatch
//! is reported, all of them in one report.

use crate::common;
use crate::order;

use idem::{ColumnRole, SchemaProblem, StateMachine};
use order::Order;

/// A machine whose table the databases do not have.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "refunds", key = "refund_id")]
pub enum Refund {
    #[state(to(Done))]
    Open,
    Done,
}

/// A machine on a table without its version column, and with its own results table.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "text_orders",
    key = "code",
    state = "state",
    version = "revision",
    results = "text_results"
)]
pub enum TextOrder {
    #[state(to(Sent))]
    Draft,
    Sent,
}

macro_rules! verify_tests {
    ($module:ident, $pool:ty, $setup:expr) => {
        mod $module {
            use super::*;

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                Some(pool)
            }

            #[tokio::test]
            async fn a_matching_database_passes() {
                let Some(pool) = setup().await else { return };
                sqlx::query("INSERT INTO orders (order_id, status, version) VALUES (1, 'CREATED', 0), (2, 'PAID', 3)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                assert!(report.is_ok(), "{report}");
                assert_eq!(report.to_string(), "the database matches the state machine `Order`");
                assert!(report.into_result().is_ok());
            }

            #[tokio::test]
            async fn rows_idem_cannot_move_are_reported_with_their_counts() {
                let Some(pool) = setup().await else { return };
                sqlx::query(
                    "INSERT INTO orders (order_id, status, version) VALUES \
                     (1, 'CREATED', 0), (2, 'SHIPED', 1), (3, 'SHIPED', 1), (4, 'SHIPED', NULL), \
                     (5, 'created', 0), (6, NULL, 0), (7, 'PAID', NULL)",
                )
                .execute(&pool)
                .await
                .unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                assert_eq!(
                    report.problems,
                    vec![
                        SchemaProblem::UndeclaredStates {
                            table: "orders".into(),
                            column: "status".into(),
                            values: vec![("SHIPED".into(), 3), ("created".into(), 1)],
                            distinct: 2,
                            rows: 4,
                        },
                        SchemaProblem::NullStates { table: "orders".into(), column: "status".into(), rows: 1 },
                        SchemaProblem::NullVersions { table: "orders".into(), column: "version".into(), rows: 2 },
                    ],
                    "{report}"
                );
                let text = report.clone().into_result().unwrap_err().to_string();
                assert!(text.starts_with("the database does not match the state machine `Order`:"), "{text}");
                assert!(text.contains("`orders`: states the machine does not declare in `status`, in 4 rows: \"SHIPED\" (3 rows), \"created\" (1 row); declare them or correct the rows"), "{text}");
                assert_eq!(text.lines().count(), 4, "one line per problem: {text}");
                assert!(
                    include_str!("../docs/guide/schema.md").contains(&format!("```text\n{text}\n```")),
                    "docs/guide/schema.md shows this report as it reads:\n{text}"
                );
            }

            /// A state with a trailing space is not a declared state: `verify` reports it, as
            /// `enforce` refuses it (MySQL's `utf8mb4_bin` would group it with `CREATED`).
            #[tokio::test]
            async fn a_state_with_a_trailing_space_is_reported_as_enforce_refuses_it() {
                let Some(pool) = setup().await else { return };
                sqlx::query("INSERT INTO orders (order_id, status, version) VALUES (1, 'CREATED', 0), (2, 'CREATED ', 0), (3, 'PAID  ', 0)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                assert_eq!(
                    report.problems,
                    vec![SchemaProblem::UndeclaredStates {
                        table: "orders".into(),
                        column: "status".into(),
                        values: vec![("CREATED ".into(), 1), ("PAID  ".into(), 1)],
                        distinct: 2,
                        rows: 2,
                    }],
                    "{report}"
                );
                sqlx::query("DELETE FROM orders WHERE order_id > 1").execute(&pool).await.unwrap();
                assert!(idem::verify::<Order, _>(&pool).await.unwrap().is_ok());
                idem::enforce::<Order, _>(&pool).await.unwrap();
                for spaced in ["CREATED ", "PAID  "] {
                    let insert = format!("INSERT INTO orders (order_id, status, version) VALUES (4, '{spaced}', 0)");
                    assert!(sqlx::query(&insert).execute(&pool).await.is_err(), "enforce refuses {spaced:?}");
                }
            }

            #[tokio::test]
            async fn missing_tables_and_columns_are_all_reported() {
                let Some(pool) = setup().await else { return };
                let report = idem::verify::<Refund, _>(&pool).await.unwrap();
                assert_eq!(
                    report.problems,
                    vec![SchemaProblem::MissingTable { table: "refunds".into() }],
                    "{report}"
                );
                // `text_orders` has no `revision` column, and `text_results` does not exist.
                let report = idem::verify::<TextOrder, _>(&pool).await.unwrap();
                assert_eq!(
                    report.problems,
                    vec![
                        SchemaProblem::MissingColumn {
                            table: "text_orders".into(),
                            column: "revision".into(),
                            role: ColumnRole::Version,
                        },
                        SchemaProblem::MissingTable { table: "text_results".into() },
                    ],
                    "{report}"
                );
            }

            #[tokio::test]
            async fn an_inbox_table_of_another_shape_is_reported() {
                let Some(pool) = setup().await else { return };
                sqlx::query("DROP TABLE idem_inbox").execute(&pool).await.unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                assert!(report.is_ok(), "a database without an inbox needs none: {report}");
                sqlx::query("CREATE TABLE idem_inbox (consumer_group TEXT, message_key TEXT, fingerprint TEXT, \
                             status TEXT, attempts BIGINT, result TEXT, error TEXT, created_at BIGINT, updated_at BIGINT)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                // MySQL's TEXT compares under its default collation, not byte for byte: the
                // key columns are reported too.
                let (outdated, problems): (Vec<_>, Vec<_>) = report
                    .problems
                    .iter()
                    .cloned()
                    .partition(|p| matches!(p, SchemaProblem::OutdatedTable { .. }));
                assert_eq!(
                    problems,
                    vec![SchemaProblem::MissingColumn {
                        table: "idem_inbox".into(),
                        column: "lease_until".into(),
                        role: ColumnRole::Idem,
                    }],
                    "{report}"
                );
                let mysql = stringify!($module) == "mysql";
                assert_eq!(outdated.len(), usize::from(mysql), "{report}");
            }

            #[tokio::test]
            async fn an_outbox_table_of_another_shape_is_reported() {
                let Some(pool) = setup().await else { return };
                sqlx::query("DROP TABLE idem_outbox").execute(&pool).await.unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                assert!(report.is_ok(), "a database without an outbox needs none: {report}");
                sqlx::query("CREATE TABLE idem_outbox (seq BIGINT, id VARCHAR(64), ordering_key VARCHAR(64), \
                             destination TEXT, routing_key TEXT, payload TEXT, headers TEXT, created_at BIGINT, \
                             attempts BIGINT, next_attempt_at BIGINT, last_error TEXT, published_at BIGINT, dead_at BIGINT)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let report = idem::verify::<Order, _>(&pool).await.unwrap();
                let problems: Vec<_> = report
                    .problems
                    .iter()
                    .filter(|p| !matches!(p, SchemaProblem::OutdatedTable { .. }))
                    .cloned()
                    .collect();
                assert_eq!(
                    problems,
                    vec![SchemaProblem::MissingColumn {
                        table: "idem_outbox".into(),
                        column: "claimed_until".into(),
                        role: ColumnRole::Idem,
                    }],
                    "{report}"
                );
            }
        }
    };
}

verify_tests!(
    sqlite_file,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("verify-{}", common::next_id()), 2).await)
);
verify_tests!(
    postgres,
    sqlx::PgPool,
    common::postgres(&format!("verify_{}", common::next_id()), 2).await
);
verify_tests!(
    mysql,
    sqlx::MySqlPool,
    common::mysql(&format!("verify_{}", common::next_id()), 2).await
);

/// MySQL checks the columns' types too, by `information_schema`'s names.
#[tokio::test]
async fn mysql_column_types_are_checked() {
    let Some(pool) = common::mysql(&format!("verify_types_{}", common::next_id()), 2).await else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "DROP TABLE orders;
         CREATE TABLE orders (order_id DATE, status BLOB, version VARCHAR(8))",
    )
    .execute(&pool)
    .await
    .unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    let unusable = |column: &str, role, found: &str| SchemaProblem::UnusableType {
        table: "orders".into(),
        column: column.into(),
        role,
        found: found.into(),
    };
    assert_eq!(
        report.problems,
        vec![
            unusable("order_id", ColumnRole::Key, "date"),
            unusable("status", ColumnRole::State, "blob"),
            unusable("version", ColumnRole::Version, "varchar"),
        ],
        "{report}"
    );
    sqlx::raw_sql(
        "DROP TABLE orders;
         CREATE TABLE orders (order_id BIGINT PRIMARY KEY,
             status ENUM('CREATED', 'PAID', 'SHIPPED', 'CANCELLED') NOT NULL, version INT NOT NULL);
         INSERT INTO orders VALUES (1, 'PAID', 2)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
}

/// PostgreSQL checks the columns' types: what idem binds must fit. A domain counts as its
/// base type and an ENUM state column is fine.
#[tokio::test]
async fn postgres_column_types_are_checked() {
    let Some(pool) = common::postgres(&format!("verify_types_{}", common::next_id()), 2).await
    else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "DROP TABLE orders;
         CREATE TABLE orders (order_id JSONB, status BYTEA, version TEXT)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    let unusable = |column: &str, role, found: &str| SchemaProblem::UnusableType {
        table: "orders".into(),
        column: column.into(),
        role,
        found: found.into(),
    };
    assert_eq!(
        report.problems,
        vec![
            unusable("order_id", ColumnRole::Key, "jsonb"),
            unusable("status", ColumnRole::State, "bytea"),
            unusable("version", ColumnRole::Version, "text"),
        ],
        "{report}"
    );
    assert!(
        report.to_string().contains("column `orders.status` (the state column) is of type `bytea`; it must be text, varchar or an ENUM"),
        "{report}"
    );
    sqlx::raw_sql(
        "DROP TABLE orders;
         CREATE TYPE order_status AS ENUM ('CREATED', 'PAID', 'SHIPPED', 'CANCELLED');
         CREATE DOMAIN order_number AS BIGINT CHECK (VALUE > 0);
         CREATE TABLE orders (order_id order_number PRIMARY KEY, status order_status NOT NULL, version INTEGER NOT NULL);
         INSERT INTO orders VALUES (1, 'PAID', 2)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
}

/// An inbox table created by the first migration alone still has the status CHECK; the
/// report says so, and `idem::migrate` fixes it.
#[tokio::test]
async fn an_outdated_postgres_inbox_is_reported_until_migrated() {
    let Some(pool) = common::postgres(&format!("verify_outdated_{}", common::next_id()), 2).await
    else {
        return;
    };
    let first = idem::inbox::POSTGRES_MIGRATION
        .split("ALTER TABLE")
        .next()
        .unwrap();
    sqlx::raw_sql(first).execute(&pool).await.unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(
        matches!(report.problems.as_slice(), [SchemaProblem::OutdatedTable { table, .. }] if table == "idem_inbox"),
        "{report}"
    );
    idem::migrate(&pool).await.unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
}

/// Tables from the first MySQL migration alone compare keys under `utf8mb4_bin`, which
/// pads (`"k"` is `"k "`): the report names each, until `idem::migrate` (or the second
/// migration) makes them binary.
#[tokio::test]
async fn outdated_mysql_key_columns_are_reported_until_migrated() {
    let Some(pool) = common::mysql(&format!("verify_padded_{}", common::next_id()), 2).await else {
        return;
    };
    let first = idem::inbox::MYSQL_MIGRATION
        .split("ALTER TABLE")
        .next()
        .unwrap();
    sqlx::raw_sql(first).execute(&pool).await.unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    let outdated: Vec<(&str, &str)> = report
        .problems
        .iter()
        .map(|p| match p {
            SchemaProblem::OutdatedTable { table, problem } => (table.as_str(), problem.as_str()),
            other => panic!("unexpected problem {other:?}"),
        })
        .collect();
    assert_eq!(
        outdated.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        ["idem_results", "idem_inbox"],
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("idem's table `idem_results` is outdated: its key columns `machine`, `entity_key`, `from_state`, `to_state` compare under `utf8mb4_bin`, not byte for byte (keys that differ by trailing spaces are one); run `idem::migrate` or the migration `0002_idem_exact_keys.sql`"),
        "{text}"
    );
    idem::migrate(&pool).await.unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
}

/// An outbox without the relays' lock rows of the fourth migration (MySQL) is outdated: no
/// relay could claim from it.
#[tokio::test]
async fn an_outbox_without_its_lock_rows_is_reported_until_migrated() {
    let Some(pool) = common::mysql(&format!("verify_locks_{}", common::next_id()), 2).await else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    sqlx::query("DROP TABLE idem_outbox_locks")
        .execute(&pool)
        .await
        .unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(
        report.to_string().contains("idem's table `idem_outbox` is outdated: its relays' lock rows (`idem_outbox_locks`) and indexes are missing, and no relay can claim; run `idem::migrate` or the migration `0004_idem_outbox_held.sql`"),
        "{report}"
    );
    idem::migrate(&pool).await.unwrap();
    let report = idem::verify::<Order, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
    let buckets: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox_locks")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(buckets, i64::from(idem_sql::outbox::MYSQL_KEY_BUCKETS));
}

/// Through `sqlx::Any` (the examples' pool), on every database.
#[tokio::test]
async fn verify_runs_through_any() {
    sqlx::any::install_default_drivers();
    let path = common::scratch_file("verify-any.db");
    let sqlite = sqlx::AnyPool::connect(&format!("sqlite:{}?mode=rwc", path.display()))
        .await
        .unwrap();
    let mut pools = vec![sqlite];
    pools.extend(common::any_postgres(&format!("verify_any_{}", common::next_id())).await);
    pools.extend(common::any_mysql(&format!("verify_any_{}", common::next_id())).await);
    for pool in pools {
        sqlx::raw_sql(
            "DROP TABLE IF EXISTS orders;
             CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT, version BIGINT);
             INSERT INTO orders VALUES (1, 'CREATED', 0), (2, 'LOST', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        idem::create_results_table::<Order, _>(&pool).await.unwrap();
        let report = idem::verify::<Order, _>(&pool).await.unwrap();
        assert_eq!(
            report.problems,
            vec![SchemaProblem::UndeclaredStates {
                table: "orders".into(),
                column: "status".into(),
                values: vec![("LOST".into(), 1)],
                distinct: 1,
                rows: 1,
            }],
            "{report}"
        );
    }
}
