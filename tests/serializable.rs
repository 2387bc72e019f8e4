//! Under SERIALIZABLE, PostgreSQL (and InnoDB, by deadlock detection) aborts transactions whose bodies read what concurrent
//! ones write, after the body ran: at COMMIT or in one of its statements. Such a call is
//! rolled back whole and reported as a conflict ([`idem::Error::is_conflict`]);
//! [`idem::retry`] calls it again, and each order is applied exactly once.
//!
//! The bodies keep a running ledger: each reads the highest balance and inserts the next.
//! Eight of them read the empty ledger before any writes (a barrier), which no serial order
//! explains, so at least one must lose. After the retries the balances are exactly 1..=8,
//! one per order: what some serial order of the payments would have produced.

use crate::common;

use idem::{Outcome, StateMachine};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const ORDERS: i64 = 8;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

macro_rules! serializable_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            /// Pays `order_id`: appends the next balance to the ledger. With `gate`, waits there after
            /// reading, until every payer has read.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                gate: Option<Arc<Barrier>>,
            ) -> Result<i64, sqlx::Error> {
                let highest: i64 =
                    sqlx::query_scalar("SELECT COALESCE(MAX(balance), 0) FROM ledger")
                        .fetch_one(&mut **tx)
                        .await?;
                if let Some(gate) = gate {
                    tokio::time::timeout(Duration::from_secs(10), gate.wait())
                        .await
                        .expect("every payer reaches the gate");
                }
                let balance = highest + 1;
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO ledger (order_id, balance) VALUES ($1, $2)",
                ))
                .bind(order_id)
                .bind(balance)
                .execute(&mut **tx)
                .await?;
                Ok(balance)
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::raw_sql(
                    "CREATE TABLE ledger (order_id BIGINT NOT NULL, balance BIGINT NOT NULL);
         INSERT INTO orders (order_id, status) VALUES
             (1, 'CREATED'), (2, 'CREATED'), (3, 'CREATED'), (4, 'CREATED'),
             (5, 'CREATED'), (6, 'CREATED'), (7, 'CREATED'), (8, 'CREATED');",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn conflicts_after_the_body_roll_back_and_retry_applies_once() {
                let Some(pool) = setup().await else { return };

                // Eight payments that all read the empty ledger before any of them writes.
                let gate = Arc::new(Barrier::new(ORDERS as usize));
                let tasks: Vec<_> = (1..=ORDERS)
                    .map(|order| {
                        let (pool, gate) = (pool.clone(), gate.clone());
                        tokio::spawn(async move { (order, pay(&pool, order, Some(gate)).await) })
                    })
                    .collect();
                let mut lost = Vec::new();
                let mut committed = Vec::new();
                for task in tasks {
                    match task.await.unwrap() {
                        (_, Ok(Outcome::Applied(balance))) => committed.push(balance),
                        (order, Err(e)) => {
                            assert!(e.is_conflict(), "order {order}: not a conflict: {e}");
                            assert!(e.to_string().contains("rolled back"), "{e}");
                            lost.push(order);
                        }
                        (order, Ok(other)) => panic!("order {order}: {other:?}"),
                    }
                }
                assert!(
                    !lost.is_empty(),
                    "no serial order explains eight reads of an empty ledger"
                );
                // The winners are serializable among themselves: distinct balances…
                committed.sort();
                committed.dedup();
                assert_eq!(committed.len(), ORDERS as usize - lost.len());
                // …and the losers left nothing: no ledger row, no state change, no stored result.
                for &order in &lost {
                    let (rows, status): (i64, String) = sqlx::query_as(common::placed(
                        $positional,
                        "SELECT (SELECT COUNT(*) FROM ledger WHERE order_id = $1), \
                    (SELECT status FROM orders WHERE order_id = $2)",
                    ))
                    .bind(order)
                    .bind(order)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    assert_eq!((rows, status.as_str()), (0, "CREATED"), "order {order}");
                }

                // The losers, called again until they stop conflicting.
                let retries: Vec<_> = lost
                    .iter()
                    .map(|&order| {
                        let pool = pool.clone();
                        tokio::spawn(async move { idem::retry(|| pay(&pool, order, None)).await })
                    })
                    .collect();
                for retry in retries {
                    let outcome = retry.await.unwrap().expect("applied after retries");
                    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
                }

                // Every payment once: the balances a serial order produces, one row per order.
                let ledger: Vec<(i64, i64)> =
                    sqlx::query_as("SELECT order_id, balance FROM ledger ORDER BY balance")
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                let balances: Vec<i64> = ledger.iter().map(|&(_, b)| b).collect();
                assert_eq!(balances, (1..=ORDERS).collect::<Vec<_>>());
                let mut orders: Vec<i64> = ledger.iter().map(|&(o, _)| o).collect();
                orders.sort();
                assert_eq!(orders, (1..=ORDERS).collect::<Vec<_>>());

                // Redeliveries are duplicates that replay each order's own balance.
                for (order, balance) in ledger {
                    let again = idem::retry(|| pay(&pool, order, None)).await.unwrap();
                    assert_eq!(
                        again,
                        Outcome::AlreadyDone {
                            current: Order::Paid,
                            first_result: Some(balance)
                        }
                    );
                }
            }
        }
    };
}

serializable_tests!(
    postgres,
    Postgres,
    PgPool,
    common::postgres_with(
        "serializable",
        ORDERS as u32 + 2,
        &[("default_transaction_isolation", "serializable")]
    )
    .await,
    positional = false
);
// InnoDB's SERIALIZABLE makes every read a locking one: the eight reads share the empty
// ledger's gap, each insert waits for the others' shared locks, and deadlock detection
// (1213) rolls back all but one.
serializable_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql_with(
        "serializable",
        ORDERS as u32 + 2,
        "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"
    )
    .await,
    positional = true
);

/// A real serialization failure (SQLSTATE 40001) from PostgreSQL.
async fn conflict(pool: &sqlx::PgPool) -> sqlx::Error {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END $$")
        .execute(&mut *tx)
        .await
        .unwrap_err()
}

/// `idem::retry` gives up after its attempts, when every attempt loses; a conflict in the
/// body comes back as the body's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_gives_up_after_its_attempts() {
    let Some(pool) = common::postgres("serializable_retry", 1).await else {
        return;
    };
    let mut calls = 0;
    // A caller whose every attempt loses a conflict (here: always the same error).
    let result: Result<(), idem::Error<sqlx::Error>> = idem::retry(|| {
        calls += 1;
        let pool = pool.clone();
        async move { Err(idem::Error::Handler(conflict(&pool).await)) }
    })
    .await;
    match result {
        Err(idem::Error::Handler(last)) => {
            assert_eq!(calls, 8);
            assert!(idem::is_transient(&last), "{last}");
        }
        other => panic!("expected the last conflict, got {other:?}"),
    }
    // A conflict in idem's own statements (here: a stand-in for COMMIT) gives Contention.
    let mut calls = 0;
    let result: Result<(), idem::Error<sqlx::Error>> = idem::retry(|| {
        calls += 1;
        let pool = pool.clone();
        async move { Err(idem::Error::Database(conflict(&pool).await)) }
    })
    .await;
    assert!(
        matches!(result, Err(idem::Error::Contention { attempts: 8, .. })),
        "{result:?}"
    );
    assert_eq!(calls, 8);
}

/// A handler error that wraps the conflict: boxed, it is found through its `source()`
/// chain by `retry`; in a type of the user's own, by `retry_when(is_conflict_source)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_wrapped_in_handler_errors_are_retried() {
    let Some(pool) = common::postgres("serializable_wrapped", 1).await else {
        return;
    };
    #[derive(Debug)]
    enum PayError {
        Db(sqlx::Error),
    }
    impl std::fmt::Display for PayError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("payment failed")
        }
    }
    impl std::error::Error for PayError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            match self {
                PayError::Db(e) => Some(e),
            }
        }
    }
    type Boxed = Box<dyn std::error::Error + Send + Sync>;

    // Boxed, and wrapped once more inside the box: `retry` sees it.
    let mut calls = 0;
    let result: Result<(), idem::Error<Boxed>> = idem::retry(|| {
        calls += 1;
        let pool = pool.clone();
        async move {
            let wrapped: Boxed = Box::new(PayError::Db(conflict(&pool).await));
            Err(idem::Error::Handler(wrapped))
        }
    })
    .await;
    assert!(matches!(result, Err(idem::Error::Handler(_))), "{result:?}");
    assert_eq!(calls, 8, "a boxed conflict is retried");

    // A type of the user's own: `retry` cannot see into it...
    let mut calls = 0;
    let result: Result<(), idem::Error<PayError>> = idem::retry(|| {
        calls += 1;
        let pool = pool.clone();
        async move { Err(idem::Error::Handler(PayError::Db(conflict(&pool).await))) }
    })
    .await;
    assert!(result.is_err());
    assert_eq!(
        calls, 1,
        "without a way to look inside, it is the handler's to judge"
    );
    // ...`retry_when` with `is_conflict_source` does.
    let mut calls = 0;
    let result: Result<(), idem::Error<PayError>> = idem::retry_when(
        |e| idem::is_conflict_source(e),
        || {
            calls += 1;
            let pool = pool.clone();
            async move { Err(idem::Error::Handler(PayError::Db(conflict(&pool).await))) }
        },
    )
    .await;
    assert!(result.is_err());
    assert_eq!(calls, 8);
}
