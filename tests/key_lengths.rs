//! Keys too long for the results table are refused before any statement runs, on every
//! backend: `Error::InvalidKey`, the body not run, nothing written. On MySQL outside strict
//! mode nothing is truncated either, so two long keys never collide.

use crate::common;

use idem::{Error, Outcome, StateMachine};

/// A machine keyed by five text columns: its key's text (a JSON array of the parts) can
/// outgrow the results table's 2048 bytes although each part is a valid key of 255.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "wide_orders", key = ("a", "b", "c", "d", "e"), state = "status")]
pub enum Wide {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

/// A machine whose id is longer than the first MySQL migration's 128 characters.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    id = "orders-with-an-id-of-two-hundred-bytes-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
)]
pub enum LongId {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

const TABLE: &str = "CREATE TABLE wide_orders (
    a TEXT NOT NULL, b TEXT NOT NULL, c TEXT NOT NULL, d TEXT NOT NULL, e TEXT NOT NULL,
    status TEXT NOT NULL,
    version BIGINT NOT NULL DEFAULT 0
)";

const TABLE_MYSQL: &str = "CREATE TABLE wide_orders (
    a VARCHAR(255) NOT NULL, b VARCHAR(255) NOT NULL, c VARCHAR(255) NOT NULL,
    d VARCHAR(255) NOT NULL, e VARCHAR(255) NOT NULL,
    status VARCHAR(16) NOT NULL,
    version BIGINT NOT NULL DEFAULT 0
)";

/// 255 bytes of `"`: a valid key, 512 bytes in a JSON array (each `"` escaped).
fn quotes() -> String {
    "\"".repeat(255)
}

macro_rules! key_length_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(machine = Wide, key = ("a", "b", "c", "d", "e"), from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                a: &str,
                b: &str,
                c: &str,
                d: &str,
                e: &str,
            ) -> Result<String, sqlx::Error> {
                sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (1, 'pay', 1)")
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("paid {}", [a, b, c, d, e].concat().len()))
            }

            #[idem::idempotent(machine = LongId, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_long_id(tx: &mut Transaction<'_, $db>, order_id: i64) -> Result<i64, sqlx::Error> {
                let _ = tx;
                Ok(order_id)
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(if $positional { TABLE_MYSQL } else { TABLE })
                    .execute(&pool)
                    .await
                    .unwrap();
                Some(pool)
            }

            async fn row(pool: &$pool, parts: [&str; 5]) {
                let mut insert = sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO wide_orders (a, b, c, d, e, status) VALUES ($1, $2, $3, $4, $5, 'CREATED')",
                ));
                for part in parts {
                    insert = insert.bind(part);
                }
                insert.execute(pool).await.unwrap();
            }

            async fn count(pool: &$pool, sql: &str) -> i64 {
                sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
            }

            /// Five parts of 255 bytes, 2566 bytes as text: refused before the body.
            #[tokio::test]
            async fn a_key_too_long_as_text_is_refused_before_any_statement() {
                let Some(pool) = setup().await else { return };
                let q = quotes();
                row(&pool, [&q, &q, &q, &q, &q]).await;
                let refused = pay(&pool, &q, &q, &q, &q, &q).await;
                assert!(matches!(refused, Err(Error::InvalidKey(_))), "{refused:?}");
                let message = refused.unwrap_err().to_string();
                assert!(message.contains("2566 bytes") && message.contains("2048"), "{message}");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 0, "the body did not run");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_results").await, 0);
                assert_eq!(
                    count(&pool, "SELECT COUNT(*) FROM wide_orders WHERE status = 'CREATED'").await,
                    1,
                    "the row did not move"
                );
            }

            /// Two keys alike in their first 512 characters (the first MySQL migration's
            /// column) have two first results; a key of exactly 2048 bytes fits.
            #[tokio::test]
            async fn long_keys_that_fit_are_stored_whole() {
                let Some(pool) = setup().await else { return };
                let x = "x".repeat(255);
                for last in ["1", "2"] {
                    row(&pool, [&x, &x, &x, &x, last]).await;
                }
                for last in ["1", "2"] {
                    assert_eq!(pay(&pool, &x, &x, &x, &x, last).await.unwrap(), Outcome::Applied("paid 1021".into()));
                }
                for last in ["1", "2"] {
                    assert_eq!(
                        pay(&pool, &x, &x, &x, &x, last).await.unwrap(),
                        Outcome::AlreadyDone { current: Wide::Paid, first_result: Some("paid 1021".into()) }
                    );
                }
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_results").await, 2);
                // Four parts of 250 `"` (502 bytes each in JSON) and one of 32 `y`: 2048
                // bytes, the most that fits; one `y` more is refused.
                let q = "\"".repeat(250);
                let (fits, over) = ("y".repeat(32), "y".repeat(33));
                row(&pool, [&q, &q, &q, &q, &fits]).await;
                row(&pool, [&q, &q, &q, &q, &over]).await;
                assert!(pay(&pool, &q, &q, &q, &q, &fits).await.unwrap().is_applied());
                let refused = pay(&pool, &q, &q, &q, &q, &over).await;
                assert!(matches!(refused, Err(Error::InvalidKey(_))), "{refused:?}");
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 3);
                // A machine id of 200 bytes fits the results table's `machine` column.
                sqlx::query("INSERT INTO orders (order_id, status, version) VALUES (1, 'CREATED', 0)")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(pay_long_id(&pool, 1).await.unwrap_or_else(|e| panic!("{e}")), Outcome::Applied(1));
                assert_eq!(pay_long_id(&pool, 1).await.unwrap(), Outcome::AlreadyDone { current: LongId::Paid, first_result: Some(1) });
            }
        }
    };
}

key_length_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("key-lengths-{}", common::next_id()), 2).await),
    positional = false
);
key_length_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("key_lengths_{}", common::next_id()), 2).await,
    positional = false
);
key_length_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("key_lengths_{}", common::next_id()), 2).await,
    positional = true
);
// Outside strict mode MySQL truncates a value too long for its column, with a warning:
// two keys alike in their first 2048 bytes would share one first result.
key_length_tests!(
    mysql_not_strict,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql_with(
        &format!("key_lengths_lax_{}", common::next_id()),
        2,
        "SET SESSION sql_mode = ''"
    )
    .await,
    positional = true
);

/// Outside strict mode, two keys too long for the column that differ only past its end are
/// both refused, not truncated into one.
#[tokio::test]
async fn mysql_outside_strict_mode_truncates_no_key() {
    let Some(pool) = common::mysql_with(
        &format!("key_lengths_truncated_{}", common::next_id()),
        2,
        "SET SESSION sql_mode = ''",
    )
    .await
    else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    sqlx::query(TABLE_MYSQL).execute(&pool).await.unwrap();
    #[idem::idempotent(machine = Wide, key = ("a", "b", "c", "d", "e"), from = "CREATED", to = "PAID")]
    async fn pay(
        tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
        a: &str,
        b: &str,
        c: &str,
        d: &str,
        e: &str,
    ) -> Result<String, sqlx::Error> {
        let _ = tx;
        Ok(e.to_owned())
    }
    let q = quotes();
    let (first, second) = (
        format!("{}1", "\"".repeat(254)),
        format!("{}2", "\"".repeat(254)),
    );
    for last in [&first, &second] {
        sqlx::query(
            "INSERT INTO wide_orders (a, b, c, d, e, status) VALUES (?, ?, ?, ?, ?, 'CREATED')",
        )
        .bind(&q)
        .bind(&q)
        .bind(&q)
        .bind(&q)
        .bind(last)
        .execute(&pool)
        .await
        .unwrap();
    }
    for last in [&first, &second] {
        let refused = pay(&pool, &q, &q, &q, &q, last).await;
        assert!(matches!(refused, Err(Error::InvalidKey(_))), "{refused:?}");
    }
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_results")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
}
