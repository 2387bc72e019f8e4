//! Idempotent creation (`create = "CREATED"`): the call makes the row under the client's
//! business key with one atomic insert into the unique key. Created (the body ran, its
//! result stored), Duplicate (the same values: the first result replayed) and Conflict
//! (other values: the first row stays); on SQLite, PostgreSQL and MariaDB, from a pool and inside
//! the caller's transaction, with 32 concurrent creations of one key and concurrent
//! conflicting ones.

use crate::common;

use idem::testing::assert_applied_once;
use idem::{Creation, Error, KeyError, Outcome, RowProblem, StateMachine};
use serde::{Deserialize, Serialize};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "pay_orders", key = "out_trade_no", state = "status")]
pub enum PayOrder {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    order: String,
    amount: i64,
}

const TABLES: &str = "
    CREATE TABLE pay_orders (
        out_trade_no TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        version BIGINT NOT NULL DEFAULT 0,
        amount BIGINT NOT NULL,
        customer TEXT,
        created_at TEXT
    );
    CREATE TABLE created_effects (out_trade_no TEXT NOT NULL);
";

/// [`TABLES`] on MySQL: the key a `VARCHAR` (InnoDB indexes no whole `TEXT`), in the
/// default collation so that the test reads it as a `String` (sqlx reads a `_bin` column
/// as bytes).
const MYSQL_TABLES: &str = "
    CREATE TABLE pay_orders (
        out_trade_no VARCHAR(64) PRIMARY KEY,
        status VARCHAR(16) NOT NULL,
        version BIGINT NOT NULL DEFAULT 0,
        amount BIGINT NOT NULL,
        customer VARCHAR(64),
        created_at TEXT
    );
    CREATE TABLE created_effects (out_trade_no TEXT NOT NULL);
";

macro_rules! creation_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:expr, $tables:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// Whether the backend binds `?` (MySQL) rather than `$1`.
            const POSITIONAL: bool = $positional;

            /// The order creation of the sources: the client's `out_trade_no` is the key.
            #[idem::idempotent(
                machine = PayOrder, key = "out_trade_no", create = "CREATED",
                set(amount, customer, created_at = now())
            )]
            async fn create_order(
                tx: &mut Transaction<'_, $db>,
                out_trade_no: &str,
                amount: i64,
                customer: Option<String>,
            ) -> Result<Receipt, String> {
                if amount <= 0 {
                    return Err(format!("amount {amount} is not positive"));
                }
                sqlx::query(common::placed(POSITIONAL, "INSERT INTO created_effects (out_trade_no) VALUES ($1)"))
                    .bind(out_trade_no)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Receipt { order: out_trade_no.to_owned(), amount })
            }

            /// The same creation without a transaction: the body decides the receipt
            /// first, then one statement (PostgreSQL) creates the row and stores it.
            #[idem::idempotent(
                machine = PayOrder, key = "out_trade_no", create = "CREATED",
                set(amount, created_at = now())
            )]
            async fn open_order(
                pool: &sqlx::Pool<$db>,
                out_trade_no: &str,
                amount: i64,
            ) -> Result<Receipt, std::convert::Infallible> {
                Ok(Receipt { order: out_trade_no.to_owned(), amount })
            }

            #[idem::idempotent(machine = PayOrder, key = "out_trade_no", from = "CREATED", to = "PAID")]
            async fn pay(tx: &mut Transaction<'_, $db>, out_trade_no: &str) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                sqlx::raw_sql($tables).execute(&pool).await.unwrap();
                idem::create_results_table::<PayOrder, _>(&pool).await.unwrap();
                Some(pool)
            }

            async fn rows(pool: &$pool) -> Vec<(String, String, i64, i64)> {
                sqlx::query_as("SELECT out_trade_no, status, version, amount FROM pay_orders ORDER BY out_trade_no")
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }

            async fn effects(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM created_effects")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            fn receipt(order: &str, amount: i64) -> Receipt {
                Receipt { order: order.to_owned(), amount }
            }

            /// A row another unique index of the table refuses is the database's error, not
            /// a taken key (MySQL reports both as a duplicate key: the read after it tells).
            #[tokio::test]
            async fn another_unique_index_refusing_the_row_is_an_error() {
                let Some(pool) = setup().await else { return };
                sqlx::query("CREATE UNIQUE INDEX pay_orders_customer ON pay_orders (customer)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let first = create_order(&pool, "T-1", 500, Some("ann".into())).await.unwrap();
                assert_eq!(first, Creation::Created(receipt("T-1", 500)));
                match create_order(&pool, "T-2", 700, Some("ann".into())).await {
                    Err(Error::Database(sqlx::Error::Database(e))) => {
                        assert!(e.is_unique_violation(), "{e}");
                    }
                    other => panic!("expected the unique index's error, got {other:?}"),
                }
                assert_eq!(rows(&pool).await, [("T-1".into(), "CREATED".into(), 0, 500)]);
                assert_eq!(effects(&pool).await, 1);
            }

            #[tokio::test]
            async fn created_then_duplicate_then_conflict() {
                let Some(pool) = setup().await else { return };
                let first = create_order(&pool, "T-1", 500, Some("ann".into())).await.unwrap();
                assert_eq!(first, Creation::Created(receipt("T-1", 500)));
                assert_eq!(rows(&pool).await, [("T-1".into(), "CREATED".into(), 0, 500)]);
                // The same request again: the first receipt.
                assert_eq!(
                    create_order(&pool, "T-1", 500, Some("ann".into())).await.unwrap(),
                    Creation::Duplicate { current: PayOrder::Created, first_result: Some(receipt("T-1", 500)) }
                );
                // The same key with other content: refused, the first stays.
                for (amount, customer) in [(501, Some("ann")), (500, Some("bob")), (500, None)] {
                    let other = create_order(&pool, "T-1", amount, customer.map(Into::into)).await.unwrap();
                    assert_eq!(other, Creation::Conflict { current: PayOrder::Created }, "{amount} {customer:?}");
                    assert!(!other.is_done());
                }
                assert_eq!(rows(&pool).await, [("T-1".into(), "CREATED".into(), 0, 500)]);
                assert_eq!(effects(&pool).await, 1);
                // NULL content compares equal to NULL.
                assert!(create_order(&pool, "T-2", 7, None).await.unwrap().is_created());
                assert!(matches!(
                    create_order(&pool, "T-2", 7, None).await.unwrap(),
                    Creation::Duplicate { .. }
                ));
            }

            #[tokio::test]
            async fn a_duplicate_after_the_workflow_moved_on_still_replays() {
                let Some(pool) = setup().await else { return };
                assert!(create_order(&pool, "T-3", 10, None).await.unwrap().is_created());
                assert_eq!(pay(&pool, "T-3").await.unwrap(), Outcome::Applied(()));
                assert_eq!(
                    create_order(&pool, "T-3", 10, None).await.unwrap(),
                    Creation::Duplicate { current: PayOrder::Paid, first_result: Some(receipt("T-3", 10)) }
                );
                assert_eq!(rows(&pool).await, [("T-3".into(), "PAID".into(), 1, 10)]);
            }

            #[tokio::test]
            async fn a_failed_body_and_bad_keys_create_nothing() {
                let Some(pool) = setup().await else { return };
                match create_order(&pool, "T-4", 0, None).await {
                    Err(Error::Handler(message)) => assert_eq!(message, "amount 0 is not positive"),
                    other => panic!("{other:?}"),
                }
                assert!(matches!(create_order(&pool, "", 5, None).await, Err(Error::InvalidKey(KeyError::Empty))));
                let long = "k".repeat(256);
                assert!(matches!(
                    create_order(&pool, &long, 5, None).await,
                    Err(Error::InvalidKey(KeyError::TooLong { .. }))
                ));
                assert!(rows(&pool).await.is_empty());
                assert_eq!(effects(&pool).await, 0);
                assert!(create_order(&pool, "T-4", 5, None).await.unwrap().is_created());
            }

            /// A row whose state was written by hand and is not declared: an error naming
            /// it, and the row stays as it is.
            #[tokio::test]
            async fn a_row_in_an_undeclared_state_is_an_error_not_a_guess() {
                let Some(pool) = setup().await else { return };
                sqlx::query("INSERT INTO pay_orders (out_trade_no, status, amount) VALUES ('T-8', 'HACKED', 5)")
                    .execute(&pool)
                    .await
                    .unwrap();
                match create_order(&pool, "T-8", 5, None).await {
                    Err(Error::CorruptRow { problem: RowProblem::UnknownState(state), key, .. }) => {
                        assert_eq!((state.as_str(), key.as_str()), ("HACKED", "T-8"));
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(rows(&pool).await, [("T-8".into(), "HACKED".into(), 0, 5)]);
                assert_eq!(effects(&pool).await, 0);
            }

            #[tokio::test]
            async fn inside_the_callers_transaction_it_is_created_with_it_or_not_at_all() {
                let Some(pool) = setup().await else { return };
                let mut tx = pool.begin_with($begin).await.unwrap();
                assert!(create_order(&mut tx, "T-5", 9, None).await.unwrap().is_created());
                tx.rollback().await.unwrap();
                assert!(rows(&pool).await.is_empty());
                let mut tx = pool.begin_with($begin).await.unwrap();
                assert!(create_order(&mut tx, "T-5", 9, None).await.unwrap().is_created());
                // A conflict inside the transaction rolls back to its savepoint only.
                assert!(matches!(
                    create_order(&mut tx, "T-5", 8, None).await.unwrap(),
                    Creation::Conflict { .. }
                ));
                tx.commit().await.unwrap();
                assert_eq!(rows(&pool).await, [("T-5".into(), "CREATED".into(), 0, 9)]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn thirty_two_concurrent_creations_make_one_row_and_one_effect() {
                let Some(pool) = setup().await else { return };
                let seen = assert_applied_once(32, || {
                    let pool = pool.clone();
                    async move { create_order(&pool, "T-6", 42, Some("ann".into())).await }
                })
                .await;
                assert_eq!((seen.result, seen.replays), (receipt("T-6", 42), 31));
                assert_eq!(rows(&pool).await, [("T-6".into(), "CREATED".into(), 0, 42)]);
                assert_eq!(effects(&pool).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_one_statement_form_creates_once_and_tells_a_conflict() {
                let Some(pool) = setup().await else { return };
                let seen = assert_applied_once(32, || {
                    let pool = pool.clone();
                    async move { open_order(&pool, "S-1", 30).await }
                })
                .await;
                assert_eq!((seen.result, seen.replays), (receipt("S-1", 30), 31));
                assert_eq!(
                    open_order(&pool, "S-1", 31).await.unwrap(),
                    Creation::Conflict { current: PayOrder::Created }
                );
                assert_eq!(rows(&pool).await, [("S-1".into(), "CREATED".into(), 0, 30)]);
                // Inside the caller's transaction, rolled back: nothing.
                let mut tx = pool.begin_with($begin).await.unwrap();
                assert!(open_order(&mut tx, "S-2", 5).await.unwrap().is_created());
                tx.rollback().await.unwrap();
                assert_eq!(rows(&pool).await.len(), 1);
                assert!(open_order(&pool, "S-2", 5).await.unwrap().is_created());
            }

            /// Two different requests racing for one key: one is created, its copies are
            /// duplicates, the other's are conflicts.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_requests_with_other_content_conflict() {
                let Some(pool) = setup().await else { return };
                let start = std::sync::Arc::new(tokio::sync::Barrier::new(32));
                let tasks: Vec<_> = (0..32i64)
                    .map(|i| {
                        let (pool, start) = (pool.clone(), start.clone());
                        let amount = 100 + i % 2;
                        tokio::spawn(async move {
                            start.wait().await;
                            (amount, create_order(&pool, "T-7", amount, None).await.unwrap())
                        })
                    })
                    .collect();
                let mut answers = Vec::new();
                for task in tasks {
                    answers.push(task.await.unwrap());
                }
                let winners: Vec<i64> = answers
                    .iter()
                    .filter(|(_, c)| c.is_created())
                    .map(|(amount, _)| *amount)
                    .collect();
                assert_eq!(winners.len(), 1, "{answers:?}");
                let winner = winners[0];
                for (amount, answer) in &answers {
                    match answer {
                        Creation::Created(r) => assert_eq!(r.amount, winner),
                        Creation::Duplicate { first_result, .. } => {
                            assert_eq!(*amount, winner);
                            assert_eq!(first_result.as_ref().map(|r| r.amount), Some(winner));
                        }
                        Creation::Conflict { .. } => assert_ne!(*amount, winner),
                    }
                }
                assert_eq!(rows(&pool).await, [("T-7".into(), "CREATED".into(), 0, winner)]);
                assert_eq!(effects(&pool).await, 1);
            }
        }
    };
}

creation_tests!(
    sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("creation-{}", common::next_id()), 4).await),
    "BEGIN IMMEDIATE",
    TABLES,
    positional = false
);
creation_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("creation_{}", common::next_id()), 8).await,
    "BEGIN",
    TABLES,
    positional = false
);
creation_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("creation_{}", common::next_id()), 8).await,
    "BEGIN",
    MYSQL_TABLES,
    positional = true
);
