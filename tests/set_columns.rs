//! `set(…)`: a transition's one conditional UPDATE also sets columns of the row, from the
//! handler's parameters and the database's clock, on SQLite and PostgreSQL: written exactly
//! when the row moves, never by a duplicate, a refusal or a failed body; bad values refused
//! before any statement, values the column's type refuses refused by the database, and
//! nothing written either way.

use crate::common;
use crate::order;

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::{ColumnProblem, Error, Outcome, Refusal};
use order::Order;

/// The row's columns a transition may set, as text (NULL as `-`).
const COLUMNS: &str = "SELECT status, CAST(version AS TEXT), \
     COALESCE(CAST(amount AS TEXT), '-'), COALESCE(note, '-'), \
     COALESCE(CAST(rate AS TEXT), '-'), COALESCE(CAST(flagged AS TEXT), '-'), \
     COALESCE(carrier, '-'), CASE WHEN paid_at IS NULL THEN '-' ELSE 'set' END \
     FROM orders WHERE order_id = $1";

/// [`COLUMNS`] on MySQL, which casts to `CHAR`.
const COLUMNS_MYSQL: &str = "SELECT status, CAST(version AS CHAR), \
     COALESCE(CAST(amount AS CHAR), '-'), COALESCE(note, '-'), \
     COALESCE(CAST(rate AS CHAR), '-'), COALESCE(CAST(flagged AS CHAR), '-'), \
     COALESCE(carrier, '-'), CASE WHEN paid_at IS NULL THEN '-' ELSE 'set' END \
     FROM orders WHERE order_id = $1";

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
);

macro_rules! set_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $table:expr) => {
        set_tests!($module, $db, $pool, $setup, $table, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $table:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// The payment callback of the sources: the state, the payment time and the
            /// amount in one UPDATE. The body sees them already set.
            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "PAID",
                set(paid_at = now(), amount = "amount_cents", note, rate, flagged)
            )]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                amount_cents: i64,
                note: Option<String>,
                rate: f64,
                flagged: bool,
            ) -> Result<i64, sqlx::Error> {
                let seen: i64 =
                    sqlx::query_scalar(common::placed($positional, if $positional {
                        "SELECT CAST(amount AS SIGNED) FROM orders WHERE order_id = $1"
                    } else {
                        "SELECT CAST(amount AS BIGINT) FROM orders WHERE order_id = $1"
                    }))
                        .bind(order_id)
                        .fetch_one(&mut **tx)
                        .await?;
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"))
                    .bind(order_id)
                    .bind(seen)
                    .execute(&mut **tx)
                    .await?;
                Ok(seen)
            }

            /// A guarded transition that sets a column: the column's value is bound after
            /// the expected version.
            #[idem::idempotent(
                machine = Order, key = "order_id", from = "PAID", to = "SHIPPED",
                version = "expected", set(carrier)
            )]
            async fn ship(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                expected: i64,
                carrier: &str,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED",
                set(note = "reason")
            )]
            async fn cancel(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                reason: String,
                fail: bool,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                if fail {
                    return Err(sqlx::Error::Protocol("the body refused".into()));
                }
                Ok(())
            }

            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED",
                set(amount = "refund")
            )]
            async fn cancel_with_refund(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                refund: u64,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            /// Text bound to the integer column `amount`.
            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED",
                set(amount = "label")
            )]
            async fn cancel_mislabelled(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                label: String,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            /// A consumer whose transition sets a column.
            #[idem::idempotent(
                inbox = "inbox", message = "key", payload = "payload",
                machine = Order, key = "order_id", from = "PAID", to = "SHIPPED",
                set(carrier)
            )]
            async fn ship_message(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
                carrier: String,
            ) -> Result<String, sqlx::Error> {
                let _ = (tx, payload);
                Ok(carrier)
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                sqlx::raw_sql($table).execute(&pool).await.unwrap();
                idem::migrate(&pool).await.unwrap();
                sqlx::query(
                    "INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED'), (3, 'PAID'), (4, 'CANCELLED')",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            async fn row(pool: &$pool, order_id: i64) -> Row {
                sqlx::query_as(common::placed($positional, if $positional { COLUMNS_MYSQL } else { COLUMNS }))
                    .bind(order_id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            fn untouched(status: &str) -> Row {
                let dash = || "-".to_owned();
                (status.to_owned(), "0".to_owned(), dash(), dash(), dash(), dash(), dash(), dash())
            }

            async fn stored_results(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_results")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn the_columns_are_set_by_the_update_that_moves_the_row_and_only_by_it() {
                let Some(pool) = setup().await else { return };
                let first = pay(&pool, 1, 1250, Some("first".into()), 0.5, true).await.unwrap();
                // The body saw the amount already written by the transition's UPDATE.
                assert_eq!(first, Outcome::Applied(1250));
                let paid = row(&pool, 1).await;
                assert_eq!(
                    (paid.0.as_str(), paid.1.as_str(), paid.2.as_str(), paid.3.as_str()),
                    ("PAID", "1", "1250", "first")
                );
                assert!(paid.4.starts_with("0.5"), "{paid:?}");
                assert!(matches!(paid.5.as_str(), "1" | "true"), "{paid:?}");
                assert_eq!(paid.7, "set");
                let paid_at: String = sqlx::query_scalar(if $positional {
                    "SELECT CAST(paid_at AS CHAR) FROM orders WHERE order_id = 1"
                } else {
                    "SELECT CAST(paid_at AS TEXT) FROM orders WHERE order_id = 1"
                })
                .fetch_one(&pool)
                .await
                .unwrap();

                // A duplicate with other values writes none of them, and replays.
                let again = pay(&pool, 1, 9999, None, 2.0, false).await.unwrap();
                assert_eq!(
                    again,
                    Outcome::AlreadyDone {
                        current: Order::Paid,
                        first_result: Some(1250)
                    }
                );
                assert_eq!(row(&pool, 1).await, paid);
                let paid_at_again: String = sqlx::query_scalar(if $positional {
                    "SELECT CAST(paid_at AS CHAR) FROM orders WHERE order_id = 1"
                } else {
                    "SELECT CAST(paid_at AS TEXT) FROM orders WHERE order_id = 1"
                })
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!(paid_at_again, paid_at);

                // `None` binds NULL.
                assert_eq!(pay(&pool, 2, 5, None, 1.0, false).await.unwrap(), Outcome::Applied(5));
                assert_eq!(row(&pool, 2).await.3, "-");
                let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(effects, 2);
            }

            #[tokio::test]
            async fn a_refused_transition_sets_nothing() {
                let Some(pool) = setup().await else { return };
                // Order 4 is CANCELLED: CREATED → PAID is illegal for it.
                let refused = pay(&pool, 4, 1, Some("x".into()), 1.0, true).await.unwrap();
                assert!(matches!(refused, Outcome::IllegalState { .. }), "{refused:?}");
                assert_eq!(row(&pool, 4).await, untouched("CANCELLED"));
                // Order 3 was paid by other means: a duplicate, which writes nothing either.
                let done = pay(&pool, 3, 1, Some("x".into()), 1.0, true).await.unwrap();
                assert!(matches!(done, Outcome::AlreadyDone { .. }), "{done:?}");
                assert_eq!(row(&pool, 3).await, untouched("PAID"));
                // Not found: nothing anywhere.
                let missing = pay(&pool, 404, 1, None, 1.0, true).await.unwrap();
                assert_eq!(missing, Outcome::NotFound);
                assert_eq!(stored_results(&pool).await, 0);
            }

            #[tokio::test]
            async fn a_guarded_transition_binds_its_columns_after_the_version() {
                let Some(pool) = setup().await else { return };
                let stale = ship(&pool, 3, 7, "dhl").await.unwrap();
                assert_eq!(stale, Outcome::StaleVersion { expected: 7, actual: 0 });
                assert_eq!(row(&pool, 3).await, untouched("PAID"));
                assert_eq!(ship(&pool, 3, 0, "dhl").await.unwrap(), Outcome::Applied(()));
                let shipped = row(&pool, 3).await;
                assert_eq!((shipped.0.as_str(), shipped.6.as_str()), ("SHIPPED", "dhl"));
            }

            #[tokio::test]
            async fn a_failed_body_rolls_the_columns_back() {
                let Some(pool) = setup().await else { return };
                let failed = cancel(&pool, 1, "changed my mind".into(), true).await;
                assert!(matches!(failed, Err(Error::Handler(_))), "{failed:?}");
                assert_eq!(row(&pool, 1).await, untouched("CREATED"));
                assert_eq!(
                    cancel(&pool, 1, "changed my mind".into(), false).await.unwrap(),
                    Outcome::Applied(())
                );
                assert_eq!(row(&pool, 1).await.3, "changed my mind");
            }

            #[tokio::test]
            async fn a_value_that_cannot_be_bound_is_refused_before_any_statement() {
                let Some(pool) = setup().await else { return };
                let too_big = cancel_with_refund(&pool, 1, u64::MAX).await;
                match too_big {
                    Err(Error::InvalidColumn {
                        column: "amount",
                        problem: ColumnProblem::OutOfRange { value },
                    }) => assert_eq!(value, u64::MAX.to_string()),
                    other => panic!("{other:?}"),
                }
                let nul = cancel(&pool, 1, "a\0b".into(), false).await;
                assert!(
                    matches!(
                        nul,
                        Err(Error::InvalidColumn { column: "note", problem: ColumnProblem::NulInText })
                    ),
                    "{nul:?}"
                );
                let message = cancel(&pool, 1, "a\0b".into(), false).await.unwrap_err().to_string();
                assert_eq!(
                    message,
                    "invalid value for column `note`: the text holds a NUL character; nothing was written"
                );
                assert_eq!(row(&pool, 1).await, untouched("CREATED"));
                assert_eq!(stored_results(&pool).await, 0);
            }

            #[tokio::test]
            async fn a_value_of_the_wrong_type_is_the_databases_error_and_writes_nothing() {
                let Some(pool) = setup().await else { return };
                let wrong = cancel_mislabelled(&pool, 1, "twelve".into()).await;
                let Err(Error::Database(sqlx::Error::Database(e))) = &wrong else {
                    panic!("text in an integer column was accepted: {wrong:?}");
                };
                assert!(e.message().contains("amount") || e.message().contains("integer"), "{e}");
                assert_eq!(row(&pool, 1).await, untouched("CREATED"));
                // The row is as it was, and the right call still applies.
                assert_eq!(cancel_with_refund(&pool, 1, 12).await.unwrap(), Outcome::Applied(()));
                assert_eq!(row(&pool, 1).await.2, "12");
            }

            #[tokio::test]
            async fn a_consumer_transition_sets_its_columns_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("shipping").unwrap();
                let key = MessageKey::business("order:3", "ship").unwrap();
                let first = ship_message(&pool, &inbox, &key, b"s", 3, "ups".into()).await.unwrap();
                assert_eq!(first, Delivery::Processed("ups".to_owned()));
                let again = ship_message(&pool, &inbox, &key, b"s", 3, "fedex".into()).await.unwrap();
                assert_eq!(again, Delivery::Duplicate { first_result: Some("ups".to_owned()) });
                assert_eq!(row(&pool, 3).await.6, "ups");
                // Early (order 1 is not paid): refused, nothing set.
                let early = MessageKey::business("order:1", "ship").unwrap();
                let refused = ship_message(&pool, &inbox, &early, b"s", 1, "ups".into()).await.unwrap();
                assert!(matches!(refused, Delivery::Refused(Refusal::NotYet { .. })), "{refused:?}");
                assert_eq!(row(&pool, 1).await, untouched("CREATED"));
            }
        }
    };
}

set_tests!(
    sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_memory().await),
    // STRICT, so that SQLite refuses a value of the wrong type as PostgreSQL does.
    "DROP TABLE orders;
     CREATE TABLE orders (
         order_id INTEGER PRIMARY KEY, status TEXT, version INTEGER DEFAULT 0,
         paid_at TEXT, amount INTEGER, note TEXT, rate REAL, flagged INTEGER, carrier TEXT
     ) STRICT;"
);

set_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("set_columns_{}", common::next_id()), 4).await,
    // `amount` is an `integer`: the bound 64-bit value is assigned to it.
    "DROP TABLE orders;
     CREATE TABLE orders (
         order_id BIGINT PRIMARY KEY, status TEXT, version BIGINT DEFAULT 0,
         paid_at TIMESTAMPTZ, amount INTEGER, note TEXT, rate DOUBLE PRECISION,
         flagged BOOLEAN, carrier VARCHAR(20)
     );"
);

set_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("set_columns_{}", common::next_id()), 4).await,
    // MariaDB's strict mode (the default) refuses a value that does not fit, as PostgreSQL.
    "DROP TABLE orders;
     CREATE TABLE orders (
         order_id BIGINT PRIMARY KEY, status VARCHAR(32), version BIGINT DEFAULT 0,
         paid_at DATETIME, amount INT, note TEXT, rate DOUBLE,
         flagged BOOLEAN, carrier VARCHAR(20)
     );",
    positional = true
);

/// Both PostgreSQL forms of the statement (the UPDATE that classifies a miss itself, and
/// the plain UPDATE with a classifying SELECT) set the same columns.
#[tokio::test]
async fn postgres_sets_the_columns_in_both_forms() {
    use idem::Classification;
    use sqlx::{Postgres, Transaction};

    #[idem::idempotent(
        machine = Order, key = "order_id", from = "CREATED", to = "PAID",
        set(amount = "amount_cents", paid_at = now())
    )]
    async fn pay(
        tx: &mut Transaction<'_, Postgres>,
        order_id: i64,
        amount_cents: i32,
    ) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }

    let name = format!("set_columns_forms_{}", common::next_id());
    let Some(pool) = common::postgres(&name, 2).await else {
        return;
    };
    sqlx::raw_sql(
        "ALTER TABLE orders ADD COLUMN amount INTEGER, ADD COLUMN paid_at TIMESTAMPTZ;
         INSERT INTO orders (order_id, status) SELECT n, 'CREATED' FROM generate_series(1, 4) AS n;",
    )
    .execute(&pool)
    .await
    .unwrap();
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    for (form, order_id) in [(Classification::Inline, 1), (Classification::OnMiss, 3)] {
        idem::set_postgres_classification(form);
        assert_eq!(
            pay(&pool, order_id, 70).await.unwrap(),
            Outcome::Applied(())
        );
        assert!(matches!(
            pay(&pool, order_id, 71).await.unwrap(),
            Outcome::AlreadyDone { .. }
        ));
        let (amount, paid): (i32, bool) =
            sqlx::query_as("SELECT amount, paid_at IS NOT NULL FROM orders WHERE order_id = $1")
                .bind(order_id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!((amount, paid), (70, true), "{form:?}");
        // The neighbour was not touched.
        let untouched: Option<i32> =
            sqlx::query_scalar("SELECT amount FROM orders WHERE order_id = $1")
                .bind(order_id + 1)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(untouched, None);
    }
    idem::set_postgres_classification(Classification::Adaptive);
}
