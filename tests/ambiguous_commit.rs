//! The ambiguous commit, on PostgreSQL, MariaDB and a MariaDB Galera cluster: a proxy between the pool and the server
//! cuts the connection after the server answered a `COMMIT` and before the answer reaches
//! the client, so the caller gets an error (transient: the connection was lost) for a call
//! that committed. Its retry is a duplicate: the transition `AlreadyDone`, the creation
//! `Duplicate`, the inbox `Duplicate` and the HTTP request replayed, each with the first
//! result, and no effect twice. A `COMMIT` cut before the server gets it rolls back, and the
//! retry applies. Then 32 tasks pay 48 orders 3 times each through a proxy that cuts every
//! fifth `COMMIT` one way and every fifth the other, the clients retrying every transient
//! error: every order paid once.

use crate::common;
use crate::galera_cluster;
use crate::http_client;
use crate::order::Order;
use crate::proxy::{Cut, CutProxy};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{Committed, IdempotencyLayer, Tx};
use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::{Creation, Error, Outcome, StateMachine};
use std::sync::Arc;
use std::sync::Mutex;
use tokio::task::JoinSet;

/// A machine whose rows the creation makes.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tickets", key = "code", state = "state")]
pub enum Ticket {
    #[state(name = "OPEN")]
    Open,
}

const TICKETS: &str = "CREATE TABLE tickets (
    code VARCHAR(64) PRIMARY KEY,
    state VARCHAR(16) NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    seats BIGINT NOT NULL
)";

/// The Galera cluster's turn, held by the tests on it.
type Turn = Option<tokio::sync::MutexGuard<'static, ()>>;

const KEYS: i64 = 48;
const COPIES: usize = 3;
const TASKS: usize = 32;

/// Calls `call` again while it fails with a transient error (the cut connection), as a
/// client does; at most 50 times.
async fn until_answered<
    T,
    E: std::fmt::Debug + 'static,
    F: Future<Output = Result<T, Error<E>>>,
>(
    mut call: impl FnMut() -> F,
) -> (T, usize) {
    let mut failures = 0;
    loop {
        match call().await {
            Ok(answer) => return (answer, failures),
            Err(e) if e.is_transient() && failures < 50 => failures += 1,
            Err(e) => panic!("not a transient error, or never answered: {e:?}"),
        }
    }
}

fn message_key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

macro_rules! ambiguous_commit_tests {
    ($module:ident, $db:ty, $setup:ident, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(tx: &mut Transaction<'_, $db>, order_id: i64) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("receipt {order_id}"))
            }

            #[idem::idempotent(machine = Ticket, key = "code", create = "OPEN", set(seats))]
            async fn open(tx: &mut Transaction<'_, $db>, code: &str, seats: i64) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES (0, 'open', $1)"))
                    .bind(seats)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("ticket {code}"))
            }

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn consume(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'consume', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id * 10)
            }

            async fn charge(mut tx: Tx<$db>) -> Result<Committed<(StatusCode, String)>, StatusCode> {
                sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (0, 'charge', 0)")
                    .execute(&mut **tx)
                    .await
                    .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                Ok(tx.commit((StatusCode::CREATED, "{\"charged\":true}".to_owned())))
            }

            /// The pool through the proxy (whose `COMMIT`s it cuts), and one straight to the
            /// server to look at the rows with.
            async fn setup(name: &str) -> Option<(sqlx::Pool<$db>, sqlx::Pool<$db>, CutProxy, Turn)> {
                let (direct, proxied, proxy, turn) = $setup(name).await?;
                sqlx::query(TICKETS).execute(&direct).await.unwrap();
                idem::migrate(&direct).await.unwrap();
                idem::create_results_table::<Ticket, _>(&direct).await.unwrap();
                for order_id in 1..=KEYS {
                    sqlx::query(common::placed($positional, "INSERT INTO orders (order_id, status) VALUES ($1, 'CREATED')"))
                        .bind(order_id)
                        .execute(&direct)
                        .await
                        .unwrap();
                }
                Some((direct, proxied, proxy, turn))
            }

            async fn effects(pool: &sqlx::Pool<$db>, kind: &str) -> Vec<(i64, i64)> {
                sqlx::query_as(common::placed($positional, "SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id"))
                    .bind(kind)
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }

            /// Each form, its `COMMIT`'s answer cut: the caller sees a transient error for a
            /// call that committed; the retry is the duplicate, with the first result.
            #[tokio::test]
            async fn a_commit_whose_answer_is_lost_is_a_duplicate_on_retry() {
                let Some((direct, pool, proxy, _turn)) = setup("ambiguous_answer").await else { return };
                let inbox = Inbox::new("ambiguous").unwrap();

                proxy.cut_next(Cut::Answer);
                let lost = pay(&pool, 1).await.unwrap_err();
                assert!(lost.is_transient(), "{lost:?}");
                assert_eq!(proxy.cut_answers(), 1, "the proxy cut the answer to the COMMIT");
                assert_eq!(
                    pay(&pool, 1).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some("receipt 1".into()) }
                );
                assert_eq!(effects(&direct, "pay").await, vec![(1, 1)]);

                proxy.cut_next(Cut::Answer);
                assert!(open(&pool, "T-1", 3).await.unwrap_err().is_transient());
                assert_eq!(
                    open(&pool, "T-1", 3).await.unwrap(),
                    Creation::Duplicate { current: Ticket::Open, first_result: Some("ticket T-1".into()) }
                );
                assert_eq!(effects(&direct, "open").await, vec![(0, 1)]);

                proxy.cut_next(Cut::Answer);
                assert!(consume(&pool, &inbox, &message_key(2), b"m2", 2).await.unwrap_err().is_transient());
                assert_eq!(
                    consume(&pool, &inbox, &message_key(2), b"m2", 2).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(20) }
                );
                assert_eq!(effects(&direct, "consume").await, vec![(2, 1)]);

                let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("ambiguous-http").unwrap()).unscoped();
                let addr = http_client::serve(Router::new().route("/charges", post(charge).layer(layer))).await;
                proxy.cut_next(Cut::Answer);
                let first = http_client::post(addr, "/charges", "\"charge-1\"", "{}").await;
                assert_eq!(first.status, 503, "a lost connection at COMMIT is worth a retry: {first:?}");
                assert_eq!(first.header("retry-after"), Some("1"), "{first:?}");
                let retry = http_client::post(addr, "/charges", "\"charge-1\"", "{}").await;
                assert_eq!((retry.status, retry.body.as_str()), (201, "{\"charged\":true}"), "{retry:?}");
                assert!(retry.replayed(), "{retry:?}");
                assert_eq!(effects(&direct, "charge").await, vec![(0, 1)]);
                assert_eq!(proxy.cut_answers(), 4);
            }

            /// Each form, its `COMMIT` cut before the server got it: rolled back, so the
            /// retry applies, once.
            #[tokio::test]
            async fn a_commit_that_never_arrived_applies_on_retry() {
                let Some((direct, pool, proxy, _turn)) = setup("ambiguous_request").await else { return };
                let inbox = Inbox::new("ambiguous").unwrap();

                proxy.cut_next(Cut::Request);
                assert!(pay(&pool, 1).await.unwrap_err().is_transient());
                assert_eq!(proxy.cut_requests(), 1, "the proxy cut the COMMIT");
                assert_eq!(pay(&pool, 1).await.unwrap(), Outcome::Applied("receipt 1".into()));

                proxy.cut_next(Cut::Request);
                assert!(open(&pool, "T-1", 3).await.unwrap_err().is_transient());
                assert_eq!(open(&pool, "T-1", 3).await.unwrap(), Creation::Created("ticket T-1".into()));

                proxy.cut_next(Cut::Request);
                assert!(consume(&pool, &inbox, &message_key(2), b"m2", 2).await.unwrap_err().is_transient());
                assert_eq!(consume(&pool, &inbox, &message_key(2), b"m2", 2).await.unwrap(), Delivery::Processed(20));

                let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("ambiguous-http").unwrap()).unscoped();
                let addr = http_client::serve(Router::new().route("/charges", post(charge).layer(layer))).await;
                proxy.cut_next(Cut::Request);
                let first = http_client::post(addr, "/charges", "\"charge-1\"", "{}").await;
                assert_eq!(first.status, 503, "{first:?}");
                let retry = http_client::post(addr, "/charges", "\"charge-1\"", "{}").await;
                assert_eq!(retry.status, 201, "{retry:?}");
                assert!(!retry.replayed(), "{retry:?}");

                assert_eq!(proxy.cut_requests(), 4);
                assert_eq!(effects(&direct, "pay").await, vec![(1, 1)]);
                assert_eq!(effects(&direct, "open").await, vec![(0, 1)]);
                assert_eq!(effects(&direct, "consume").await, vec![(2, 1)]);
                assert_eq!(effects(&direct, "charge").await, vec![(0, 1)]);
            }

            /// 32 tasks, 48 orders paid 3 times each and their messages consumed 3 times
            /// each, through a proxy that cuts the answer to every fifth `COMMIT` and every
            /// fifth `COMMIT` itself; every transient error is retried by its caller.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cut_commits_under_load_lose_nothing_and_double_nothing() {
                let Some((direct, pool, proxy, _turn)) = setup("ambiguous_storm").await else { return };
                proxy.schedule(|n| match n % 5 {
                    1 => Cut::Answer,
                    3 => Cut::Request,
                    _ => Cut::Pass,
                });
                let inbox = Inbox::new("ambiguous-storm").unwrap();
                let work: Arc<Mutex<Vec<i64>>> = Arc::new(Mutex::new(
                    (1..=KEYS).flat_map(|k| std::iter::repeat_n(k, COPIES)).collect(),
                ));
                work.lock().unwrap().reverse();
                let mut tasks = JoinSet::new();
                for _ in 0..TASKS {
                    let (pool, inbox, work) = (pool.clone(), inbox.clone(), work.clone());
                    tasks.spawn(async move {
                        let mut seen = Vec::new();
                        loop {
                            let Some(order_id) = work.lock().unwrap().pop() else { return seen };
                            let (paid, _) = until_answered(|| pay(&pool, order_id)).await;
                            let key = message_key(order_id);
                            let (consumed, _) =
                                until_answered(|| consume(&pool, &inbox, &key, b"m", order_id)).await;
                            seen.push((order_id, paid, consumed));
                        }
                    });
                }
                let mut applied = vec![0; KEYS as usize + 1];
                let mut processed = vec![0; KEYS as usize + 1];
                while let Some(seen) = tasks.join_next().await {
                    for (order_id, paid, consumed) in seen.unwrap() {
                        match paid {
                            Outcome::Applied(receipt) => {
                                assert_eq!(receipt, format!("receipt {order_id}"));
                                applied[order_id as usize] += 1;
                            }
                            Outcome::AlreadyDone { current: Order::Paid, first_result } => {
                                assert_eq!(first_result, Some(format!("receipt {order_id}")));
                            }
                            other => panic!("order {order_id}: {other:?}"),
                        }
                        match consumed {
                            Delivery::Processed(result) => {
                                assert_eq!(result, order_id * 10);
                                processed[order_id as usize] += 1;
                            }
                            Delivery::Duplicate { first_result } => {
                                assert_eq!(first_result, Some(order_id * 10));
                            }
                            other => panic!("message {order_id}: {other:?}"),
                        }
                    }
                }
                assert!(applied.iter().chain(&processed).all(|n| *n <= 1), "{applied:?} {processed:?}");
                assert!(proxy.cut_answers() >= 20 && proxy.cut_requests() >= 20,
                    "cut {} answers and {} commits", proxy.cut_answers(), proxy.cut_requests());
                let once: Vec<(i64, i64)> = (1..=KEYS).map(|k| (k, 1)).collect();
                assert_eq!(effects(&direct, "pay").await, once);
                assert_eq!(effects(&direct, "consume").await, once);
            }
        }
    };
}

/// The schema of `name`, and a pool on it through a proxy that cuts PostgreSQL's `COMMIT`s.
async fn postgres(name: &str) -> Option<(sqlx::PgPool, sqlx::PgPool, CutProxy, Turn)> {
    let direct = common::postgres(name, 2).await?;
    let options = (*direct.connect_options()).clone();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = CutProxy::start(resolve(&upstream).await, crate::proxy::POSTGRES_COMMIT).await;
    let proxied = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.host("127.0.0.1").port(proxy.port()))
        .await
        .unwrap();
    Some((direct, proxied, proxy, None))
}

/// The database `name`, and a pool on it through a proxy that cuts MySQL's `COMMIT`s.
async fn mysql(name: &str) -> Option<(sqlx::MySqlPool, sqlx::MySqlPool, CutProxy, Turn)> {
    let direct = common::mysql(name, 2).await?;
    through_proxy(direct, None).await
}

/// The database `name` on the first node of the Galera cluster (`scripts/galera`), and a
/// pool on it through a proxy that cuts MySQL's `COMMIT`s; the cluster's turn held (a test
/// of tests/galera.rs kills a node).
async fn galera(name: &str) -> Option<(sqlx::MySqlPool, sqlx::MySqlPool, CutProxy, Turn)> {
    let turn = galera_cluster::CLUSTER.lock().await;
    let direct = galera_cluster::pools(name, common::MYSQL_TABLES, 2)
        .await?
        .swap_remove(0);
    through_proxy(direct, Some(turn)).await
}

async fn through_proxy(
    direct: sqlx::MySqlPool,
    turn: Turn,
) -> Option<(sqlx::MySqlPool, sqlx::MySqlPool, CutProxy, Turn)> {
    let options = (*direct.connect_options()).clone();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = CutProxy::start(resolve(&upstream).await, crate::proxy::MYSQL_COMMIT).await;
    let proxied = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with(options.host("127.0.0.1").port(proxy.port()))
        .await
        .unwrap();
    Some((direct, proxied, proxy, turn))
}

async fn resolve(host_port: &str) -> std::net::SocketAddr {
    tokio::net::lookup_host(host_port)
        .await
        .unwrap()
        .find(std::net::SocketAddr::is_ipv4)
        .unwrap()
}

ambiguous_commit_tests!(on_postgres, sqlx::Postgres, postgres, positional = false);
ambiguous_commit_tests!(on_mysql, sqlx::MySql, mysql, positional = true);
ambiguous_commit_tests!(on_galera, sqlx::MySql, galera, positional = true);
