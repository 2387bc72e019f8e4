//! Every outcome, rollback and retry, the version guard and bad rows, on every backend.

use crate::common;

use idem::{Error, Outcome, RowProblem, StateMachine};
use serde::{Deserialize, Serialize};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "text_orders", key = "code", results = "text_results")]
pub enum TextOrder {
    Created,
    #[state(to(Created))]
    Draft,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub order_id: i64,
    pub amount: i64,
    pub note: String,
}

#[derive(Debug, PartialEq)]
pub enum PayError {
    Declined,
    Db(String),
}

impl std::fmt::Display for PayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<sqlx::Error> for PayError {
    fn from(e: sqlx::Error) -> Self {
        PayError::Db(e.to_string())
    }
}

macro_rules! backend_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// Whether the backend binds `?` (MySQL) rather than `$1`.
            const POSITIONAL: bool = $positional;

            /// Records the payment; declines negative amounts after writing (to prove rollback).
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                amount: i64,
            ) -> Result<Receipt, PayError> {
                sqlx::query(common::placed(POSITIONAL, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"))
                    .bind(order_id)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                if amount < 0 {
                    return Err(PayError::Declined);
                }
                Ok(Receipt { order_id, amount, note: format!("paid {amount}") })
            }

            /// Pays with a note of the caller's choosing, returned in the receipt.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_with_note(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                note: String,
            ) -> Result<Receipt, sqlx::Error> {
                sqlx::query(common::placed(POSITIONAL, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(Receipt { order_id, amount: 1, note })
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
            async fn ship(tx: &mut Transaction<'_, $db>, order_id: i64) -> Result<(), sqlx::Error> {
                sqlx::query(common::placed(POSITIONAL, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'ship', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
            async fn cancel(tx: &mut Transaction<'_, $db>, order_id: i64) -> Result<(), sqlx::Error> {
                let _ = tx;
                let _ = order_id;
                Ok(())
            }

            /// Optimistic locking: pays only if the row is still at `expected`.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", version = "expected")]
            async fn pay_at(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                expected: Option<i64>,
            ) -> Result<i64, sqlx::Error> {
                let _ = tx;
                Ok(order_id * 10 + expected.unwrap_or(-1))
            }

            #[idem::idempotent(machine = TextOrder, key = "code", from = "DRAFT", to = "CREATED")]
            async fn submit(tx: &mut Transaction<'_, $db>, code: &str) -> Result<String, sqlx::Error> {
                let _ = tx;
                Ok(format!("submitted {code}"))
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::create_results_table::<Order, _>(&pool).await.unwrap();
                idem::create_results_table::<TextOrder, _>(&pool).await.unwrap();
                sqlx::raw_sql(
                    "INSERT INTO orders (order_id, status, version) VALUES
                        (1, 'CREATED', 0), (2, 'CREATED', 0), (3, 'CREATED', 0),
                        (4, 'CREATED', 0), (5, 'CREATED', 0);
                     INSERT INTO text_orders (code, state) VALUES ('A-1', 'DRAFT')",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            async fn state(pool: &$pool, order_id: i64) -> (Option<String>, Option<i64>) {
                sqlx::query_as(common::placed(POSITIONAL, "SELECT status, version FROM orders WHERE order_id = $1"))
                    .bind(order_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn effects(pool: &$pool, order_id: i64) -> i64 {
                sqlx::query_scalar(common::placed(POSITIONAL, "SELECT COUNT(*) FROM effects WHERE order_id = $1"))
                    .bind(order_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn stored_results(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_results")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            /// Entity keys compare byte for byte in the results table: `"k"` and `"k "` are
            /// two rows of the user's table (an exact column) and two first results, neither
            /// replayed to the other.
            #[tokio::test]
            async fn keys_that_differ_by_a_trailing_space_have_their_own_results() {
                let Some(pool) = setup().await else { return };
                sqlx::query("INSERT INTO text_orders (code, state) VALUES ('k', 'DRAFT'), ('k ', 'DRAFT')")
                    .execute(&pool)
                    .await
                    .unwrap();
                for code in ["k", "k "] {
                    assert_eq!(submit(&pool, code).await.unwrap(), Outcome::Applied(format!("submitted {code}")));
                }
                for code in ["k", "k "] {
                    assert_eq!(
                        submit(&pool, code).await.unwrap(),
                        Outcome::AlreadyDone { current: TextOrder::Created, first_result: Some(format!("submitted {code}")) },
                        "{code:?} replays its own first result"
                    );
                }
                let results: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM text_results")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(results, 2);
            }

            #[tokio::test]
            async fn applied_then_duplicate_replays_the_first_result() {
                let Some(pool) = setup().await else { return };
                let first = pay(&pool, 1, 500).await.unwrap();
                let receipt = Receipt { order_id: 1, amount: 500, note: "paid 500".into() };
                assert_eq!(first, Outcome::Applied(receipt.clone()));
                // A retry with different arguments still gets the first result, not a new one.
                let again = pay(&pool, 1, 999).await.unwrap();
                assert_eq!(
                    again,
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some(receipt.clone()) }
                );
                assert_eq!(state(&pool, 1).await, (Some("PAID".into()), Some(1)));
                assert_eq!(effects(&pool, 1).await, 1);

                // Later states are reachable from PAID: still a duplicate, still the first result.
                assert!(ship(&pool, 1).await.unwrap().is_applied());
                assert_eq!(
                    pay(&pool, 1, 500).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Shipped, first_result: Some(receipt) }
                );
                // A `()` result is not stored, so nothing is replayed: `None`, as documented.
                assert_eq!(
                    ship(&pool, 1).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Shipped, first_result: None }
                );
                assert_eq!(effects(&pool, 1).await, 2);
                assert_eq!(state(&pool, 1).await, (Some("SHIPPED".into()), Some(2)));
            }

            #[tokio::test]
            async fn a_state_off_the_path_is_illegal_not_a_duplicate() {
                let Some(pool) = setup().await else { return };
                assert!(cancel(&pool, 2).await.unwrap().is_applied());
                assert_eq!(
                    pay(&pool, 2, 500).await.unwrap(),
                    Outcome::IllegalState { current: Order::Cancelled, from: Order::Created, to: Order::Paid }
                );
                // A cancelled order can never be shipped: illegal, and nothing changes.
                assert_eq!(
                    ship(&pool, 2).await.unwrap(),
                    Outcome::IllegalState { current: Order::Cancelled, from: Order::Paid, to: Order::Shipped }
                );
                assert_eq!(effects(&pool, 2).await, 0);
                assert_eq!(state(&pool, 2).await, (Some("CANCELLED".into()), Some(1)));
            }

            #[tokio::test]
            async fn a_call_that_came_early_is_not_yet_not_illegal() {
                let Some(pool) = setup().await else { return };
                // Out of order: a ship before its pay. CREATED can still reach PAID, so the
                // ship is early, not a bug; nothing changes, and after the pay it applies.
                assert_eq!(
                    ship(&pool, 3).await.unwrap(),
                    Outcome::NotYet { current: Order::Created, from: Order::Paid, to: Order::Shipped }
                );
                assert_eq!(effects(&pool, 3).await, 0);
                assert_eq!(state(&pool, 3).await, (Some("CREATED".into()), Some(0)));
                assert!(pay(&pool, 3, 10).await.unwrap().is_applied());
                assert!(ship(&pool, 3).await.unwrap().is_applied());
            }

            #[tokio::test]
            async fn a_missing_row_is_not_found() {
                let Some(pool) = setup().await else { return };
                assert_eq!(pay(&pool, 404, 1).await.unwrap(), Outcome::NotFound);
                assert_eq!(effects(&pool, 404).await, 0);
            }

            #[tokio::test]
            async fn a_body_error_rolls_everything_back_and_a_retry_applies() {
                let Some(pool) = setup().await else { return };
                match pay(&pool, 4, -1).await {
                    Err(Error::Handler(PayError::Declined)) => {}
                    other => panic!("expected the handler's error, got {other:?}"),
                }
                // The body's insert, the transition and the result are all gone.
                assert_eq!(state(&pool, 4).await, (Some("CREATED".into()), Some(0)));
                assert_eq!(effects(&pool, 4).await, 0);
                assert_eq!(stored_results(&pool).await, 0);
                let retry = pay(&pool, 4, 70).await.unwrap();
                assert!(retry.is_applied(), "{retry:?}");
                assert_eq!(effects(&pool, 4).await, 1);
                assert_eq!(stored_results(&pool).await, 1);
            }

            #[tokio::test]
            async fn an_oversized_result_is_refused_and_nothing_commits() {
                let Some(pool) = setup().await else { return };
                let note = "x".repeat(idem::MAX_RESULT_LEN);
                match pay_with_note(&pool, 5, note).await {
                    Err(e @ Error::ResultTooLarge { len, max }) => {
                        assert!(len > max && max == idem::MAX_RESULT_LEN, "{len} {max}");
                        assert!(!e.is_transient());
                        assert!(e.to_string().contains("nothing was committed"), "{e}");
                    }
                    other => panic!("expected ResultTooLarge, got {other:?}"),
                }
                // The body's insert, the transition and the result are all gone…
                assert_eq!(state(&pool, 5).await, (Some("CREATED".into()), Some(0)));
                assert_eq!(effects(&pool, 5).await, 0);
                assert_eq!(stored_results(&pool).await, 0);
                // …and the same call with a result that fits applies.
                let note = "y".repeat(1000);
                let applied = pay_with_note(&pool, 5, note.clone()).await.unwrap();
                assert_eq!(applied, Outcome::Applied(Receipt { order_id: 5, amount: 1, note }));
                assert_eq!(effects(&pool, 5).await, 1);
            }

            #[tokio::test]
            async fn the_version_guard_holds_and_misses() {
                let Some(pool) = setup().await else { return };
                assert_eq!(
                    pay_at(&pool, 5, Some(7)).await.unwrap(),
                    Outcome::StaleVersion { expected: 7, actual: 0 }
                );
                assert_eq!(state(&pool, 5).await, (Some("CREATED".into()), Some(0)));
                assert_eq!(pay_at(&pool, 5, Some(0)).await.unwrap(), Outcome::Applied(50));
                // A duplicate is a duplicate whatever version it carries.
                assert_eq!(
                    pay_at(&pool, 5, Some(0)).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some(50) }
                );
                // No expected version: no guard.
                assert_eq!(pay_at(&pool, 1, None).await.unwrap(), Outcome::Applied(9));
            }

            #[tokio::test]
            async fn text_keys_work_and_bad_keys_are_refused_before_any_write() {
                let Some(pool) = setup().await else { return };
                assert_eq!(
                    submit(&pool, "A-1").await.unwrap(),
                    Outcome::Applied("submitted A-1".to_owned())
                );
                assert_eq!(
                    submit(&pool, "A-1").await.unwrap(),
                    Outcome::AlreadyDone {
                        current: TextOrder::Created,
                        first_result: Some("submitted A-1".to_owned())
                    }
                );
                let long = "x".repeat(300);
                for bad in ["", "a\nb", long.as_str()] {
                    match submit(&pool, bad).await {
                        Err(Error::InvalidKey(_)) => {}
                        other => panic!("expected an invalid key error for {bad:?}, got {other:?}"),
                    }
                }
            }

            /// A version at `i64::MAX` cannot take `version + 1`: the database refuses the
            /// UPDATE (SQLite would turn the sum into a REAL), nothing is written, the body
            /// never runs.
            #[tokio::test]
            async fn a_version_that_would_overflow_is_a_database_error_and_nothing_changes() {
                let Some(pool) = setup().await else { return };
                sqlx::raw_sql("UPDATE orders SET version = 9223372036854775807 WHERE order_id = 4")
                    .execute(&pool)
                    .await
                    .unwrap();
                match pay(&pool, 4, 10).await {
                    Err(Error::Database(_)) => {}
                    other => panic!("expected a database error, got {other:?}"),
                }
                match pay_at(&pool, 4, Some(i64::MAX)).await {
                    Err(Error::Database(_)) => {}
                    other => panic!("expected a database error, got {other:?}"),
                }
                assert_eq!(state(&pool, 4).await, (Some("CREATED".into()), Some(i64::MAX)));
                assert_eq!(effects(&pool, 4).await, 0);
                assert_eq!(stored_results(&pool).await, 0);
                // The other rows move as ever.
                assert!(matches!(pay(&pool, 5, 10).await, Ok(Outcome::Applied(_))));
            }

            #[tokio::test]
            async fn bad_rows_are_named_and_left_untouched() {
                let Some(pool) = setup().await else { return };
                sqlx::raw_sql(
                    "UPDATE orders SET status = 'PAYED' WHERE order_id = 1;
                     UPDATE orders SET status = NULL WHERE order_id = 2;
                     UPDATE orders SET version = NULL WHERE order_id = 3;",
                )
                .execute(&pool)
                .await
                .unwrap();
                let cases = [
                    (1, RowProblem::UnknownState("PAYED".into())),
                    (2, RowProblem::NullState),
                    (3, RowProblem::NullVersion),
                ];
                for (order_id, expected) in cases {
                    match pay(&pool, order_id, 10).await {
                        Err(Error::CorruptRow { table, key, problem, .. }) => {
                            assert_eq!((table, key.as_str(), &problem), ("orders", order_id.to_string().as_str(), &expected));
                        }
                        other => panic!("row {order_id}: expected a corrupt-row error, got {other:?}"),
                    }
                    assert_eq!(effects(&pool, order_id).await, 0);
                }
                assert_eq!(state(&pool, 1).await, (Some("PAYED".into()), Some(0)));
                assert_eq!(state(&pool, 3).await, (Some("CREATED".into()), None));
                let message = pay(&pool, 1, 10).await.unwrap_err().to_string();
                assert!(message.contains("\"PAYED\"") && message.contains("`orders`"), "{message}");
            }
        }
    };
}

backend_tests!(
    sqlite_memory,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_memory().await),
    positional = false
);
backend_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("transitions-{}", common::next_id()), 4).await),
    positional = false
);
backend_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("transitions_{}", common::next_id()), 4).await,
    positional = false
);
backend_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("transitions_{}", common::next_id()), 4).await,
    positional = true
);
backend_tests!(
    any_sqlite,
    sqlx::Any,
    sqlx::AnyPool,
    Some(
        any_pool(&format!(
            "sqlite:{}",
            common::scratch_file(&format!("any-{}.db", common::next_id())).display()
        ))
        .await
    ),
    positional = false
);
backend_tests!(
    any_postgres,
    sqlx::Any,
    sqlx::AnyPool,
    common::any_postgres(&format!("any_{}", common::next_id())).await,
    positional = false
);
backend_tests!(
    any_mysql,
    sqlx::Any,
    sqlx::AnyPool,
    common::any_mysql(&format!("any_{}", common::next_id())).await,
    positional = true
);

async fn any_pool(url: &str) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        .connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::raw_sql(common::TABLES).execute(&pool).await.unwrap();
    pool
}

/// The same protocol without the macro, for code that builds transitions at run time.
#[tokio::test]
async fn run_without_the_macro() {
    const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
    let pool = common::sqlite_memory().await;
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (9, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    for expected in [
        Outcome::Applied(90),
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some(90),
        },
    ] {
        let outcome = idem::run(
            &pool,
            PAY,
            idem::Key::Int(9).into(),
            None,
            async |tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
                sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (9, 'pay', 90)")
                    .execute(&mut **tx)
                    .await?;
                Ok::<i64, sqlx::Error>(90)
            },
        )
        .await
        .unwrap();
        assert_eq!(outcome, expected);
    }
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 1);
}

/// A body that panics after its write: the call is rolled back and answered with
/// `Error::Panicked`, the row still `CREATED`, and the next call applies.
#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay_or_panic(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    order_id: i64,
    panics: bool,
) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    assert!(!panics, "the payment provider's client panicked");
    Ok(order_id)
}

#[tokio::test]
async fn a_body_that_panics_is_rolled_back_and_answered_with_the_panic() {
    let pool = common::sqlite_file(&format!("panics-{}", common::next_id()), 2).await;
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    match pay_or_panic(&pool, 1, true).await {
        Err(Error::Panicked(message)) => {
            assert_eq!(message, "the payment provider's client panicked")
        }
        other => panic!("{other:?}"),
    }
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "the body's write rolled back");
    assert_eq!(
        pay_or_panic(&pool, 1, false).await.unwrap(),
        Outcome::Applied(1)
    );
}
