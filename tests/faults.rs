//! The connection is cut in the middle of a transition (`pg_terminate_backend`, or MySQL's
//! `KILL`, from another session, as a failover or an idle-in-transaction killer would): the
//! call fails with a clear error, nothing of it is left in the database, and a retry
//! applies once.

use crate::common;

use idem::{Error, Outcome, StateMachine};
use std::time::Duration;
use tokio::sync::oneshot;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

macro_rules! cut_tests {
    ($module:ident, $db:ty, $setup:expr, positional = $positional:expr, cut = $cut:expr, surfaced = $surfaced:expr) => {
        mod $module {
            use super::*;

            /// Pays, after telling `inside` it is in the body and waiting for `go`.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut sqlx::Transaction<'_, $db>,
                order_id: i64,
                inside: Option<oneshot::Sender<()>>,
                go: Option<oneshot::Receiver<()>>,
            ) -> Result<String, sqlx::Error> {
                if let (Some(inside), Some(go)) = (inside, go) {
                    let _ = inside.send(());
                    let _ = go.await;
                }
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)",
                ))
                .bind(order_id)
                .execute(&mut **tx)
                .await?;
                Ok("paid".to_owned())
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_connection_cut_mid_transaction_leaves_nothing_and_the_retry_applies() {
                let Some(pool): Option<sqlx::Pool<$db>> = $setup else {
                    return;
                };
                idem::create_results_table::<Order, _>(&pool).await.unwrap();
                sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
                    .execute(&pool)
                    .await
                    .unwrap();

                let (inside_tx, inside_rx) = oneshot::channel();
                let (go_tx, go_rx) = oneshot::channel();
                let call = {
                    let pool = pool.clone();
                    tokio::spawn(async move { pay(&pool, 1, Some(inside_tx), Some(go_rx)).await })
                };
                // The handler has moved the row (uncommitted) and waits in its body.
                tokio::time::timeout(Duration::from_secs(10), inside_rx)
                    .await
                    .unwrap()
                    .unwrap();
                let cut: fn(&sqlx::Pool<$db>) -> _ = $cut;
                cut(&pool).await;
                go_tx.send(()).unwrap();

                match call.await.unwrap() {
                    Err(Error::Handler(e)) | Err(Error::Database(e)) => {
                        eprintln!("the cut surfaced as: {e}");
                        let surfaced: fn(&sqlx::Error) -> bool = $surfaced;
                        assert!(surfaced(&e), "a clear error: {e:?}");
                    }
                    other => panic!("expected the cut to surface as an error, got {other:?}"),
                }

                // Nothing of the cut transaction survived: the row, the effect, the stored
                // result.
                let (status, version): (String, i64) =
                    sqlx::query_as("SELECT status, version FROM orders WHERE order_id = 1")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!((status.as_str(), version), ("CREATED", 0));
                let leftovers: i64 = sqlx::query_scalar(
                    "SELECT (SELECT COUNT(*) FROM effects) + (SELECT COUNT(*) FROM idem_results)",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                assert_eq!(leftovers, 0);

                // The retry (on a fresh connection from the pool) applies, once.
                assert_eq!(
                    pay(&pool, 1, None, None).await.unwrap(),
                    Outcome::Applied("paid".to_owned())
                );
                assert_eq!(
                    pay(&pool, 1, None, None).await.unwrap(),
                    Outcome::AlreadyDone {
                        current: Order::Paid,
                        first_result: Some("paid".to_owned())
                    }
                );
                let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(effects, 1);
            }
        }
    };
}

cut_tests!(
    postgres,
    sqlx::Postgres,
    common::postgres("faults_cut", 2).await,
    positional = false,
    cut = |pool| {
        let pool = pool.clone();
        Box::pin(async move {
            let killed: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'idem_test_faults_cut' AND state = 'idle in transaction') AS k",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(killed, 1, "exactly the handler's session is cut");
        }) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
    },
    surfaced = |e| e.to_string().contains("terminating connection")
);

cut_tests!(
    mysql,
    sqlx::MySql,
    common::mysql("faults_cut", 2).await,
    positional = true,
    // `KILL` of the one connection of this database whose transaction wrote: the handler's.
    cut = |pool| {
        let pool = pool.clone();
        Box::pin(async move {
            let sessions: Vec<u64> = sqlx::query_scalar(
                "SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx t \
                 JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
                 WHERE p.db = DATABASE()",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            assert_eq!(
                sessions.len(),
                1,
                "exactly the handler's session: {sessions:?}"
            );
            sqlx::raw_sql(&format!("KILL {}", sessions[0]))
                .execute(&pool)
                .await
                .unwrap();
        }) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
    },
    // The server closes the connection: the next read finds EOF.
    surfaced = |e| matches!(e, sqlx::Error::Io(_) | sqlx::Error::Database(_))
);
