//! `idem::enforce`: once installed, the database itself refuses an undeclared state and an
//! UPDATE along an undeclared transition, from any writer; idem's own transitions pass.

use crate::common;
use crate::order;

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

/// Two machines on tables whose names share their first 58 bytes: each gets its own
/// constraint, triggers and (PostgreSQL) function, named within 63 bytes. Before the names
/// were shortened by a digest, PostgreSQL truncated both functions' names to one, so the
/// second machine's transitions replaced the first's; MySQL refused names over 64 bytes.
/// What an older idem installed under the long names is dropped.
mod long_names {
    use super::*;

    #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    #[machine(
        table = "orders_kept_by_the_billing_department_of_the_northern_region_a",
        key = "order_id",
        state = "status",
        version = "version"
    )]
    pub enum Paying {
        #[state(name = "CREATED", to(Paid))]
        Created,
        #[state(name = "PAID")]
        Paid,
    }

    #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    #[machine(
        table = "orders_kept_by_the_billing_department_of_the_northern_region_b",
        key = "order_id",
        state = "status",
        version = "version"
    )]
    pub enum Cancelling {
        #[state(name = "CREATED", to(Cancelled))]
        Created,
        #[state(name = "CANCELLED")]
        Cancelled,
    }

    const A: &str = "orders_kept_by_the_billing_department_of_the_northern_region_a";
    const B: &str = "orders_kept_by_the_billing_department_of_the_northern_region_b";

    macro_rules! long_name_tests {
        ($test:ident, $pool:ty, $setup:expr, $legacy:expr, $triggers:expr) => {
            #[tokio::test]
            async fn $test() {
                let Some(pool): Option<$pool> = $setup else {
                    return;
                };
                for table in [A, B] {
                    sqlx::raw_sql(&format!(
                        "CREATE TABLE {table} (order_id BIGINT PRIMARY KEY, \
                         status VARCHAR(32), version BIGINT DEFAULT 0); \
                         INSERT INTO {table} (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED')"
                    ))
                    .execute(&pool)
                    .await
                    .unwrap();
                }
                // What an older idem installed under the long names, refusing every
                // UPDATE: enforce replaces it.
                if !$legacy.is_empty() {
                    sqlx::raw_sql($legacy).execute(&pool).await.unwrap();
                }
                for _ in 0..2 {
                    idem::enforce::<Paying, _>(&pool).await.unwrap();
                    idem::enforce::<Cancelling, _>(&pool).await.unwrap();
                }
                let update = |table: &str, to: &str, id: i64| {
                    format!("UPDATE {table} SET status = '{to}' WHERE order_id = {id}")
                };
                // Each table keeps its own machine's transitions.
                sqlx::query(&update(A, "PAID", 1)).execute(&pool).await.unwrap();
                sqlx::query(&update(B, "CANCELLED", 1)).execute(&pool).await.unwrap();
                for (table, to) in [(A, "CANCELLED"), (B, "PAID")] {
                    let refused = sqlx::query(&update(table, to, 2)).execute(&pool).await;
                    assert!(
                        matches!(refused, Err(sqlx::Error::Database(_))),
                        "{table} -> {to}: {refused:?}"
                    );
                }
                // Each trigger (and its function) is the table's own, named within 63 bytes.
                let names: Vec<(String, String)> = sqlx::query_as($triggers)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                let of = |table: &str| -> Vec<&str> {
                    names
                        .iter()
                        .filter(|(t, _)| t == table)
                        .map(|(_, n)| n.as_str())
                        .collect()
                };
                let (a, b) = (of(A), of(B));
                assert!(!a.is_empty() && a.len() == b.len(), "{names:?}");
                for name in a.iter().chain(&b) {
                    assert!(name.len() <= 63, "{name}");
                    assert!(!a.contains(name) || !b.contains(name), "shared: {name}");
                }
            }
        };
    }

    long_name_tests!(
        on_sqlite,
        sqlx::SqlitePool,
        Some(common::sqlite_file(&format!("enforce-long-{}", common::next_id()), 2).await),
        "CREATE TRIGGER idem_orders_kept_by_the_billing_department_of_the_northern_region_a_status_edges \
         BEFORE UPDATE ON orders_kept_by_the_billing_department_of_the_northern_region_a \
         BEGIN SELECT RAISE(ABORT, 'older idem'); END;",
        "SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'"
    );
    long_name_tests!(
        on_postgres,
        sqlx::PgPool,
        common::postgres(&format!("enforce_long_{}", common::next_id()), 2).await,
        // PostgreSQL cut an older idem's names at 63 bytes: one function, two triggers,
        // and a CHECK.
        "CREATE FUNCTION idem_orders_kept_by_the_billing_department_of_the_northern_regi() \
         RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'older idem'; END $$; \
         CREATE TRIGGER idem_orders_kept_by_the_billing_department_of_the_northern_regi \
         BEFORE UPDATE ON orders_kept_by_the_billing_department_of_the_northern_region_a \
         FOR EACH ROW EXECUTE FUNCTION idem_orders_kept_by_the_billing_department_of_the_northern_regi(); \
         CREATE TRIGGER idem_orders_kept_by_the_billing_department_of_the_northern_regi \
         BEFORE UPDATE ON orders_kept_by_the_billing_department_of_the_northern_region_b \
         FOR EACH ROW EXECUTE FUNCTION idem_orders_kept_by_the_billing_department_of_the_northern_regi(); \
         ALTER TABLE orders_kept_by_the_billing_department_of_the_northern_region_a \
         ADD CONSTRAINT idem_orders_kept_by_the_billing_department_of_the_northern_regi \
         CHECK (status = 'CREATED');",
        // Each trigger with its function's name: one function per machine.
        "SELECT CAST(c.relname AS TEXT), CAST(t.tgname AS TEXT) FROM pg_trigger t \
         JOIN pg_class c ON c.oid = t.tgrelid \
         WHERE NOT t.tgisinternal AND c.relnamespace = CAST(current_schema() AS regnamespace) \
         UNION ALL SELECT CAST(c.relname AS TEXT), CAST(p.proname AS TEXT) FROM pg_trigger t \
         JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid \
         WHERE NOT t.tgisinternal AND c.relnamespace = CAST(current_schema() AS regnamespace)"
    );
    long_name_tests!(
        on_mysql,
        sqlx::MySqlPool,
        common::mysql(&format!("enforce_long_{}", common::next_id()), 2).await,
        // An older idem could not install these (names over 64 bytes were refused).
        "",
        "SELECT CAST(event_object_table AS CHAR), CAST(trigger_name AS CHAR) \
         FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
    );
}
