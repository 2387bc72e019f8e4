//! Keys as users have them: `uuid::Uuid` bound natively (a PostgreSQL `uuid` column; on
//! SQLite, the blob sqlx stores), and integer keys of every width.

use crate::common;

use idem::{Outcome, StateMachine};
use uuid::Uuid;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "accounts", key = "account_id", state = "status")]
pub enum Account {
    #[state(name = "OPEN", to(Closed))]
    Open,
    #[state(name = "CLOSED")]
    Closed,
}

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

macro_rules! key_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $uuid_column:literal) => {
        key_tests!(
            $module,
            $db,
            $pool,
            $setup,
            $uuid_column,
            positional = false
        );
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $uuid_column:literal, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(machine = Account, key = "account_id", from = "OPEN", to = "CLOSED")]
            async fn close(
                tx: &mut Transaction<'_, $db>,
                account_id: Uuid,
            ) -> Result<String, sqlx::Error> {
                sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (0, 'close', 0)")
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("closed {account_id}"))
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_u64(
                tx: &mut Transaction<'_, $db>,
                order_id: u64,
            ) -> Result<u64, sqlx::Error> {
                let _ = tx;
                Ok(order_id)
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_u8(
                tx: &mut Transaction<'_, $db>,
                order_id: u8,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(concat!(
                    "CREATE TABLE accounts (account_id ",
                    $uuid_column,
                    " PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0)"
                ))
                .execute(&pool)
                .await
                .unwrap();
                sqlx::query(
                    "INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (200, 'CREATED')",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            #[tokio::test]
            async fn uuid_keys_are_bound_natively() {
                let Some(pool) = setup().await else { return };
                let id = Uuid::from_u128(0x0192_3a4b_5c6d_7e8f_9a0b_1c2d_3e4f_5a6b);
                // Inserted as sqlx binds a Uuid: the same encoding idem must match.
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO accounts (account_id, status) VALUES ($1, 'OPEN')",
                ))
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
                let first = close(&pool, id).await.unwrap();
                assert_eq!(first, Outcome::Applied(format!("closed {id}")));
                assert_eq!(
                    close(&pool, id).await.unwrap(),
                    Outcome::AlreadyDone {
                        current: Account::Closed,
                        first_result: Some(format!("closed {id}"))
                    }
                );
                assert_eq!(
                    close(&pool, Uuid::from_u128(7)).await.unwrap(),
                    Outcome::NotFound
                );
                // The first result is scoped by the key's hyphenated text.
                let stored: String = sqlx::query_scalar(if $positional {
                    // sqlx reads a `_bin` column as bytes.
                    "SELECT CAST(entity_key AS CHAR) FROM idem_results WHERE machine = 'accounts'"
                } else {
                    "SELECT entity_key FROM idem_results WHERE machine = 'accounts'"
                })
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!(stored, id.hyphenated().to_string());
            }

            #[tokio::test]
            async fn integer_keys_of_every_width_work_and_out_of_range_is_refused() {
                let Some(pool) = setup().await else { return };
                assert_eq!(pay_u64(&pool, 1).await.unwrap(), Outcome::Applied(1));
                assert!(pay_u8(&pool, 200).await.unwrap().is_applied());
                match pay_u64(&pool, u64::MAX).await {
                    Err(idem::Error::InvalidKey(idem::KeyError::OutOfRange { value })) => {
                        assert_eq!(value, u64::MAX.to_string());
                    }
                    other => panic!("expected an out-of-range key, got {other:?}"),
                }
            }
        }
    };
}

key_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("keys-{}", common::next_id()), 4).await),
    "BLOB"
);
key_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("keys_{}", common::next_id()), 4).await,
    "UUID"
);
key_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("keys_{}", common::next_id()), 4).await,
    "BINARY(16)",
    positional = true
);
