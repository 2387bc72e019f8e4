//! `idem::enforce`: once installed, the database itself refuses an undeclared state and an
//! UPDATE along an undeclared transition, from any writer; idem's own transitions pass.

mod common;
#[path = "common/order.rs"]
mod order;

use idem::Outcome;
use order::Order;

macro_rules! enforce_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $refusal:expr) => {
        enforce_tests!($module, $db, $pool, $setup, $refusal, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $refusal:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut sqlx::Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = tx;
                Ok(order_id)
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
            async fn ship(
                tx: &mut sqlx::Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(
                    "INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED')",
                )
                .execute(&pool)
                .await
                .unwrap();
                idem::enforce::<Order, _>(&pool).await.unwrap();
                // Rerunnable.
                idem::enforce::<Order, _>(&pool).await.unwrap();
                Some(pool)
            }

            async fn status(pool: &$pool, order_id: i64) -> String {
                sqlx::query_scalar(common::placed(
                    $positional,
                    "SELECT status FROM orders WHERE order_id = $1",
                ))
                .bind(order_id)
                .fetch_one(pool)
                .await
                .unwrap()
            }

            /// The database's refusal: its message, checked against `$refusal`.
            fn refused(result: Result<(), sqlx::Error>, what: &str) -> String {
                let Err(sqlx::Error::Database(e)) = result else {
                    panic!("{what} was not refused: {result:?}");
                };
                let check: fn(&dyn sqlx::error::DatabaseError) = $refusal;
                check(&*e);
                e.message().to_owned()
            }

            async fn raw(pool: &$pool, sql: &str) -> Result<(), sqlx::Error> {
                sqlx::query(sql).execute(pool).await.map(drop)
            }

            #[tokio::test]
            async fn idem_transitions_pass() {
                let Some(pool) = setup().await else { return };
                assert_eq!(pay(&pool, 1).await.unwrap(), Outcome::Applied(1));
                assert_eq!(ship(&pool, 1).await.unwrap(), Outcome::Applied(()));
                assert_eq!(status(&pool, 1).await, "SHIPPED");
                // Duplicates and refusals are as before.
                assert!(matches!(
                    pay(&pool, 1).await.unwrap(),
                    Outcome::IllegalState { .. } | Outcome::AlreadyDone { .. }
                ));
                assert!(matches!(
                    ship(&pool, 2).await.unwrap(),
                    Outcome::NotYet { .. }
                ));
            }

            #[tokio::test]
            async fn a_hand_written_update_along_no_transition_fails() {
                let Some(pool) = setup().await else { return };
                let message = refused(
                    raw(
                        &pool,
                        "UPDATE orders SET status = 'SHIPPED' WHERE order_id = 2",
                    )
                    .await,
                    "CREATED -> SHIPPED",
                );
                assert!(message.contains("state machine Order"), "{message}");
                assert_eq!(status(&pool, 2).await, "CREATED", "nothing changed");
                // Backwards along a declared edge is no transition either.
                raw(
                    &pool,
                    "UPDATE orders SET status = 'PAID' WHERE order_id = 2",
                )
                .await
                .unwrap();
                refused(
                    raw(
                        &pool,
                        "UPDATE orders SET status = 'CREATED' WHERE order_id = 2",
                    )
                    .await,
                    "PAID -> CREATED",
                );
                // A declared transition, other columns and an unchanged state pass.
                raw(
                    &pool,
                    "UPDATE orders SET status = 'SHIPPED' WHERE order_id = 2",
                )
                .await
                .unwrap();
                raw(
                    &pool,
                    "UPDATE orders SET version = version + 1, status = status WHERE order_id = 2",
                )
                .await
                .unwrap();
            }

            #[tokio::test]
            async fn an_undeclared_state_is_refused_on_insert_and_update() {
                let Some(pool) = setup().await else { return };
                refused(
                    raw(
                        &pool,
                        "INSERT INTO orders (order_id, status) VALUES (3, 'SHIPED')",
                    )
                    .await,
                    "insert SHIPED",
                );
                refused(
                    raw(
                        &pool,
                        "UPDATE orders SET status = 'created' WHERE order_id = 1",
                    )
                    .await,
                    "update to created",
                );
                raw(
                    &pool,
                    "INSERT INTO orders (order_id, status) VALUES (3, 'CREATED')",
                )
                .await
                .unwrap();
                let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(rows, 3);
            }
        }
    };
}

enforce_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("enforce-{}", common::next_id()), 2).await),
    |e| assert!(e.message().contains("idem: not a"), "{}", e.message())
);
enforce_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("enforce_{}", common::next_id()), 2).await,
    |e| assert_eq!(e.code().as_deref(), Some("23514"), "{}", e.message())
);

enforce_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("enforce_{}", common::next_id()), 2).await,
    |e| {
        assert_eq!(e.code().as_deref(), Some("23000"), "{}", e.message());
        assert!(e.message().starts_with("idem: "), "{}", e.message());
    },
    positional = true
);

/// MySQL names both states in the trigger's message too.
#[tokio::test]
async fn mysql_names_the_refused_move() {
    let Some(pool) = common::mysql(&format!("enforce_msg_{}", common::next_id()), 2).await else {
        return;
    };
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    idem::enforce::<Order, _>(&pool).await.unwrap();
    let e = sqlx::query("UPDATE orders SET status = 'SHIPPED'")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().message(),
        "idem: CREATED -> SHIPPED is not a transition of the state machine Order"
    );
}

/// PostgreSQL names both states in the trigger's message.
#[tokio::test]
async fn postgres_names_the_refused_move() {
    let Some(pool) = common::postgres(&format!("enforce_msg_{}", common::next_id()), 2).await
    else {
        return;
    };
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    idem::enforce::<Order, _>(&pool).await.unwrap();
    let e = sqlx::query("UPDATE orders SET status = 'SHIPPED'")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().message(),
        "idem: CREATED -> SHIPPED is not a transition of the state machine Order"
    );
    // A table already holding an undeclared state cannot take the CHECK: verify first.
    sqlx::raw_sql("DROP TRIGGER idem_orders_status_edges ON orders; ALTER TABLE orders DROP CONSTRAINT idem_orders_status_declared; UPDATE orders SET status = 'LOST'")
        .execute(&pool)
        .await
        .unwrap();
    let e = idem::enforce::<Order, _>(&pool).await.unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().code().as_deref(),
        Some("23514"),
        "{e}"
    );
}
