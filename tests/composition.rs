//! Handlers inside a transaction the caller owns: several transitions of different
//! machines in one transaction, a handler called from another handler's body, refusals and
//! errors that leave the caller's earlier work intact, several deliveries of an inbox in one
//! transaction (a batch, duplicates within it), on SQLite, PostgreSQL and MariaDB.

use crate::common;

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::{Error, Outcome, StateMachine};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID")]
    Paid,
    #[state(name = "CANCELLED")]
    Cancelled,
}

/// A second machine on another table: a stock item, reserved once.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "text_orders", key = "code", state = "state")]
pub enum Stock {
    #[state(name = "AVAILABLE", to(Reserved))]
    Available,
    #[state(name = "RESERVED")]
    Reserved,
}

macro_rules! composition_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:path) => {
        composition_tests!($module, $db, $pool, $setup, $begin, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:path, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                fail: bool,
            ) -> Result<i64, sqlx::Error> {
                effect(tx, order_id, "pay").await?;
                if fail {
                    return Err(sqlx::Error::Protocol("declined".into()));
                }
                Ok(order_id * 10)
            }

            #[idem::idempotent(machine = Stock, key = "code", from = "AVAILABLE", to = "RESERVED")]
            async fn reserve(tx: &mut Transaction<'_, $db>, code: &str) -> Result<String, sqlx::Error> {
                effect(tx, 0, "reserve").await?;
                Ok(format!("reserved {code}"))
            }

            /// A handler whose body calls another handler in its own transaction.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
            async fn cancel_and_release(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                code: &str,
                fail_after: bool,
            ) -> Result<String, sqlx::Error> {
                let reserved = reserve(&mut *tx, code).await.map_err(|e| match e {
                    Error::Database(e) => e,
                    other => sqlx::Error::Protocol(other.to_string()),
                })?;
                effect(tx, order_id, "cancel").await?;
                if fail_after {
                    return Err(sqlx::Error::Protocol("failed after the inner handler".into()));
                }
                Ok(format!("{reserved:?}"))
            }

            /// A message handler whose body fails when told to, after its effect.
            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn consume(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
                fail: bool,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                effect(tx, order_id, "consume").await?;
                if fail {
                    return Err(sqlx::Error::Protocol("declined".into()));
                }
                Ok(order_id * 10)
            }

            async fn effect(tx: &mut Transaction<'_, $db>, order_id: i64, kind: &str) -> Result<(), sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 0)"))
                    .bind(order_id)
                    .bind(kind)
                    .execute(&mut **tx)
                    .await
                    .map(drop)
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CANCELLED'), (3, 'CREATED')")
                    .execute(&pool)
                    .await
                    .unwrap();
                sqlx::query("INSERT INTO text_orders (code, state) VALUES ('sku-1', 'AVAILABLE'), ('sku-2', 'AVAILABLE')")
                    .execute(&pool)
                    .await
                    .unwrap();
                Some(pool)
            }

            async fn count(pool: &$pool, kind: &str) -> i64 {
                sqlx::query_scalar(common::placed($positional, "SELECT COUNT(*) FROM effects WHERE kind = $1"))
                    .bind(kind)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn status(pool: &$pool, order_id: i64) -> String {
                sqlx::query_scalar(common::placed($positional, "SELECT status FROM orders WHERE order_id = $1"))
                    .bind(order_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn stock(pool: &$pool, code: &str) -> String {
                sqlx::query_scalar(common::placed($positional, "SELECT state FROM text_orders WHERE code = $1"))
                    .bind(code)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn two_machines_commit_together_in_the_callers_transaction() {
                let Some(pool) = setup().await else { return };
                let mut tx = $begin(&pool).await;
                assert_eq!(pay(&mut tx, 1, false).await.unwrap(), Outcome::Applied(10));
                assert_eq!(
                    reserve(&mut tx, "sku-1").await.unwrap(),
                    Outcome::Applied("reserved sku-1".to_owned())
                );
                // Nothing is visible outside before the caller commits...
                assert_eq!(count(&pool, "pay").await, 0);
                tx.commit().await.unwrap();
                // ...and everything after.
                assert_eq!((status(&pool, 1).await.as_str(), stock(&pool, "sku-1").await.as_str()), ("PAID", "RESERVED"));
                assert_eq!((count(&pool, "pay").await, count(&pool, "reserve").await), (1, 1));
                // A retry, from the pool or from another transaction, is a duplicate with the
                // first result: the results were stored in the caller's transaction.
                assert_eq!(
                    pay(&pool, 1, false).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some(10) }
                );
            }

            #[tokio::test]
            async fn a_caller_that_rolls_back_leaves_nothing_and_a_retry_applies() {
                let Some(pool) = setup().await else { return };
                let mut tx = $begin(&pool).await;
                assert!(pay(&mut tx, 1, false).await.unwrap().is_applied());
                tx.rollback().await.unwrap();
                assert_eq!((status(&pool, 1).await.as_str(), count(&pool, "pay").await), ("CREATED", 0));
                assert!(pay(&pool, 1, false).await.unwrap().is_applied());
            }

            #[tokio::test]
            async fn a_refusal_or_a_body_error_keeps_the_callers_earlier_work() {
                let Some(pool) = setup().await else { return };
                let mut tx = $begin(&pool).await;
                effect(&mut tx, 7, "caller").await.unwrap();
                // Order 2 is cancelled: refused, and the caller's insert stays.
                assert!(matches!(
                    pay(&mut tx, 2, false).await.unwrap(),
                    Outcome::IllegalState { current: Order::Cancelled, .. }
                ));
                // The body fails after its own insert: rolled back to the savepoint, so the
                // transition and that insert are gone, the caller's insert stays, and the
                // caller's transaction is still usable.
                match pay(&mut tx, 1, true).await {
                    Err(Error::Handler(_)) => {}
                    other => panic!("expected the body's error, got {other:?}"),
                }
                effect(&mut tx, 8, "caller").await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!(count(&pool, "caller").await, 2);
                assert_eq!((count(&pool, "pay").await, status(&pool, 1).await.as_str()), (0, "CREATED"));
            }

            #[tokio::test]
            async fn a_handler_called_from_another_handlers_body_shares_its_fate() {
                let Some(pool) = setup().await else { return };
                // The outer body fails after the inner handler applied: both roll back.
                match cancel_and_release(&pool, 3, "sku-2", true).await {
                    Err(Error::Handler(_)) => {}
                    other => panic!("expected the body's error, got {other:?}"),
                }
                assert_eq!((status(&pool, 3).await.as_str(), stock(&pool, "sku-2").await.as_str()), ("CREATED", "AVAILABLE"));
                assert_eq!(count(&pool, "reserve").await, 0);
                // It succeeds: both commit, once.
                let done = cancel_and_release(&pool, 3, "sku-2", false).await.unwrap();
                assert!(done.is_applied(), "{done:?}");
                assert_eq!((status(&pool, 3).await.as_str(), stock(&pool, "sku-2").await.as_str()), ("CANCELLED", "RESERVED"));
                assert_eq!((count(&pool, "reserve").await, count(&pool, "cancel").await), (1, 1));
            }

            /// A batch: several deliveries in one transaction of the caller's, one commit. A
            /// message delivered twice in it applies once (its second delivery replays the
            /// first result), a failing body or a conflicting payload touches its own delivery
            /// alone, and the failed message applies in a later batch.
            #[tokio::test]
            async fn deliveries_batched_in_the_callers_transaction_apply_once_each() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("batch").unwrap();
                let key = |m: i64| MessageKey::business(format!("m:{m}"), "paid").unwrap();
                let mut tx = $begin(&pool).await;
                assert_eq!(consume(&mut tx, &inbox, &key(1), b"1", 1, false).await.unwrap(), Delivery::Processed(10));
                assert_eq!(consume(&mut tx, &inbox, &key(2), b"2", 2, false).await.unwrap(), Delivery::Processed(20));
                assert_eq!(
                    consume(&mut tx, &inbox, &key(1), b"1", 1, false).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(10) }
                );
                assert!(matches!(
                    consume(&mut tx, &inbox, &key(3), b"3", 3, true).await,
                    Err(Error::Handler(_))
                ));
                assert_eq!(consume(&mut tx, &inbox, &key(2), b"other", 2, false).await.unwrap(), Delivery::Conflict);
                tx.commit().await.unwrap();
                assert_eq!(count(&pool, "consume").await, 2, "messages 1 and 2, once each");

                let mut tx = $begin(&pool).await;
                assert_eq!(consume(&mut tx, &inbox, &key(3), b"3", 3, false).await.unwrap(), Delivery::Processed(30));
                assert_eq!(
                    consume(&mut tx, &inbox, &key(1), b"1", 1, false).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(10) }
                );
                tx.commit().await.unwrap();
                assert_eq!(count(&pool, "consume").await, 3);
            }

            #[tokio::test]
            async fn in_transaction_calls_are_send() {
                let Some(pool) = setup().await else { return };
                let task = tokio::spawn({
                    let pool = pool.clone();
                    async move {
                        let mut tx = $begin(&pool).await;
                        let outcome = pay(&mut tx, 1, false).await.unwrap();
                        tx.commit().await.unwrap();
                        outcome
                    }
                });
                assert_eq!(task.await.unwrap(), Outcome::Applied(10));
            }
        }
    };
}

composition_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("composition-{}", common::next_id()), 4).await),
    begin_sqlite
);
composition_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("composition_{}", common::next_id()), 4).await,
    begin_postgres
);
composition_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("composition_{}", common::next_id()), 4).await,
    begin_mysql,
    positional = true
);

/// SQLite: take the write lock up front, as idem does for its own transactions.
async fn begin_sqlite(pool: &sqlx::SqlitePool) -> sqlx::Transaction<'static, sqlx::Sqlite> {
    pool.begin_with("BEGIN IMMEDIATE").await.unwrap()
}

async fn begin_postgres(pool: &sqlx::PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    pool.begin().await.unwrap()
}

async fn begin_mysql(pool: &sqlx::MySqlPool) -> sqlx::Transaction<'static, sqlx::MySql> {
    pool.begin().await.unwrap()
}
