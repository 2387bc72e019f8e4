//! The one-statement form: a handler whose first parameter is a pool, not a transaction.
//! Its body runs first and decides the result; the row moves and the result is stored
//! together (PostgreSQL: one autocommit statement; SQLite: autocommit, or one transaction
//! when there is a result to store). Every outcome as in the transaction form, on SQLite
//! and PostgreSQL, from a pool and inside the caller's transaction, and under 32
//! concurrent duplicates.

use crate::common;
use crate::order;

use idem::testing::assert_applied_once;
use idem::{Error, Outcome};
use order::Order;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order_id: i64,
    amount: i64,
}

macro_rules! statement_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:expr) => {
        statement_tests!($module, $db, $pool, $setup, $begin, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            /// The payment callback of the sources, whole: the state, the payment's time
            /// and amount in the one UPDATE; the receipt stored with it.
            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "PAID",
                set(paid_at = now(), amount)
            )]
            async fn pay(pool: &sqlx::Pool<$db>, order_id: i64, amount: i64) -> Result<Receipt, String> {
                if amount <= 0 {
                    return Err(format!("amount {amount} is not positive"));
                }
                Ok(Receipt { order_id, amount })
            }

            /// Nothing to store: on SQLite, no transaction at all.
            #[idem::idempotent(
                machine = Order, key = "order_id", from = "PAID", to = "SHIPPED",
                version = "expected", set(carrier)
            )]
            async fn ship(
                pool: &sqlx::Pool<$db>,
                order_id: i64,
                expected: Option<i64>,
                carrier: String,
            ) -> Result<(), std::convert::Infallible> {
                Ok(())
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                sqlx::raw_sql(
                    "ALTER TABLE orders ADD COLUMN paid_at TEXT;
                     ALTER TABLE orders ADD COLUMN amount BIGINT;
                     ALTER TABLE orders ADD COLUMN carrier TEXT;",
                )
                .execute(&pool)
                .await
                .unwrap();
                idem::create_results_table::<Order, _>(&pool).await.unwrap();
                sqlx::query(
                    "INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED'), (3, 'CANCELLED')",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            async fn row(pool: &$pool, order_id: i64) -> (String, i64, Option<i64>, bool, Option<String>) {
                sqlx::query_as(
                    common::placed($positional, "SELECT status, version, amount, paid_at IS NOT NULL, carrier FROM orders WHERE order_id = $1"),
                )
                .bind(order_id)
                .fetch_one(pool)
                .await
                .unwrap()
            }

            async fn stored(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_results")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn the_row_moves_and_the_result_is_stored_together_and_replayed() {
                let Some(pool) = setup().await else { return };
                let receipt = Receipt { order_id: 1, amount: 1250 };
                assert_eq!(pay(&pool, 1, 1250).await.unwrap(), Outcome::Applied(receipt.clone()));
                assert_eq!(row(&pool, 1).await, ("PAID".into(), 1, Some(1250), true, None));
                assert_eq!(stored(&pool).await, 1);
                // A duplicate with other arguments: the first receipt, nothing rewritten.
                assert_eq!(
                    pay(&pool, 1, 99).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some(receipt) }
                );
                assert_eq!(row(&pool, 1).await, ("PAID".into(), 1, Some(1250), true, None));
                // Refusals write nothing.
                assert_eq!(pay(&pool, 404, 5).await.unwrap(), Outcome::NotFound);
                assert!(matches!(pay(&pool, 3, 5).await.unwrap(), Outcome::IllegalState { .. }));
                assert_eq!(row(&pool, 3).await, ("CANCELLED".into(), 0, None, false, None));
                assert_eq!(stored(&pool).await, 1);
            }

            #[tokio::test]
            async fn an_error_from_the_body_writes_nothing() {
                let Some(pool) = setup().await else { return };
                match pay(&pool, 1, -5).await {
                    Err(Error::Handler(message)) => assert_eq!(message, "amount -5 is not positive"),
                    other => panic!("{other:?}"),
                }
                assert_eq!(row(&pool, 1).await, ("CREATED".into(), 0, None, false, None));
                assert_eq!(stored(&pool).await, 0);
                // The same call with a good amount applies.
                assert!(pay(&pool, 1, 10).await.unwrap().is_applied());
            }

            #[tokio::test]
            async fn a_result_of_nothing_and_a_version_guard() {
                let Some(pool) = setup().await else { return };
                assert!(pay(&pool, 2, 10).await.unwrap().is_applied());
                assert_eq!(
                    ship(&pool, 2, Some(7), "dhl".into()).await.unwrap(),
                    Outcome::StaleVersion { expected: 7, actual: 1 }
                );
                assert_eq!(row(&pool, 2).await.4, None);
                assert_eq!(ship(&pool, 2, Some(1), "dhl".into()).await.unwrap(), Outcome::Applied(()));
                assert_eq!(
                    ship(&pool, 2, None, "ups".into()).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Shipped, first_result: None }
                );
                assert_eq!(row(&pool, 2).await, ("SHIPPED".into(), 2, Some(10), true, Some("dhl".into())));
                // `()` is not stored.
                assert_eq!(stored(&pool).await, 1);
            }

            #[tokio::test]
            async fn inside_the_callers_transaction_it_commits_with_it_or_not_at_all() {
                let Some(pool) = setup().await else { return };
                let mut tx = pool.begin_with($begin).await.unwrap();
                assert!(pay(&mut tx, 1, 30).await.unwrap().is_applied());
                tx.rollback().await.unwrap();
                assert_eq!(row(&pool, 1).await, ("CREATED".into(), 0, None, false, None));
                assert_eq!(stored(&pool).await, 0);
                let mut tx = pool.begin_with($begin).await.unwrap();
                assert!(pay(&mut tx, 1, 30).await.unwrap().is_applied());
                // Refused inside the transaction: the savepoint is rolled back, the
                // transaction goes on.
                assert_eq!(pay(&mut tx, 404, 30).await.unwrap(), Outcome::NotFound);
                tx.commit().await.unwrap();
                assert_eq!(row(&pool, 1).await.0, "PAID");
                assert_eq!(
                    pay(&pool, 1, 30).await.unwrap(),
                    Outcome::AlreadyDone {
                        current: Order::Paid,
                        first_result: Some(Receipt { order_id: 1, amount: 30 })
                    }
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn thirty_two_concurrent_duplicates_apply_once() {
                let Some(pool) = setup().await else { return };
                let seen = assert_applied_once(32, || {
                    let pool = pool.clone();
                    async move { pay(&pool, 2, 77).await }
                })
                .await;
                assert_eq!(seen.result, Receipt { order_id: 2, amount: 77 });
                assert_eq!(seen.replays, 31);
                assert_eq!(row(&pool, 2).await, ("PAID".into(), 1, Some(77), true, None));
                assert_eq!(stored(&pool).await, 1);
            }
        }
    };
}

statement_tests!(
    sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("statement-form-{}", common::next_id()), 4).await),
    "BEGIN IMMEDIATE"
);

statement_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("statement_form_{}", common::next_id()), 8).await,
    "BEGIN"
);

statement_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("statement_form_{}", common::next_id()), 8).await,
    "BEGIN",
    positional = true
);
