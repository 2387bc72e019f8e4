//! The HTTP layer's optimistic form (`IdempotencyLayer::optimistic`) over real TCP with a
//! real HTTP client, on a SQLite file, PostgreSQL and MySQL: a repeat runs its handler and
//! replays the first response with none of its own writes kept; copies of a key racing
//! through two instances commit one effect and all get the same response; a repeat whose
//! handler fails gets the first response; a record the leased form left failed is taken
//! over, and one it still holds is a 409.

use crate::common;
use crate::http_client;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post as route_post;
use http_client::{Reply, post, serve};
use idem::http::{Committed, IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Keys in the race, and copies of each, sent through each of two instances.
const KEYS: usize = 40;
const COPIES_PER_INSTANCE: usize = 4;

macro_rules! optimistic_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            #[derive(Clone)]
            struct App {
                executions: Arc<AtomicU64>,
                /// `/slow` and `/hold` (leased) wait for a permit here before they answer.
                gate: Arc<tokio::sync::Semaphore>,
            }

            /// Writes the effect row of run `n`.
            async fn effect(tx: &mut Tx<$db>, n: u64, kind: &str) -> Result<(), StatusCode> {
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 0)",
                ))
                .bind(n as i64)
                .bind(kind)
                .execute(&mut ***tx)
                .await
                .map(drop)
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
            }

            /// One effect row per run, and a response naming the run.
            async fn create(
                State(app): State<App>,
                mut tx: Tx<$db>,
                body: String,
            ) -> Result<Committed<(StatusCode, String)>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "create").await?;
                Ok(tx.commit((
                    StatusCode::CREATED,
                    format!("{{\"execution\":{n},\"request\":{body}}}"),
                )))
            }

            /// Writes a row keyed by the request's body: a repeat's insert collides with
            /// the first's, and the handler answers 500.
            async fn once(State(app): State<App>, mut tx: Tx<$db>, body: String) -> Response {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                let inserted = sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO once_rows (request) VALUES ($1)",
                ))
                .bind(&body)
                .execute(&mut **tx)
                .await;
                match inserted {
                    Ok(_) => tx
                        .commit((StatusCode::CREATED, format!("once {n}")))
                        .into_response(),
                    Err(e) => {
                        (StatusCode::INTERNAL_SERVER_ERROR, format!("run {n}: {e}")).into_response()
                    }
                }
            }

            /// Writes its effect, then waits for a permit of `gate` before it answers.
            async fn slow(
                State(app): State<App>,
                mut tx: Tx<$db>,
            ) -> Result<Committed<String>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "slow").await?;
                app.gate.acquire().await.unwrap().forget();
                Ok(tx.commit(format!("slow {n}")))
            }

            /// The leased form's handler: fails with 502.
            async fn failing(State(app): State<App>) -> (StatusCode, &'static str) {
                app.executions.fetch_add(1, Ordering::SeqCst);
                (StatusCode::BAD_GATEWAY, "gateway down")
            }

            /// The leased form's handler: holds its lease until a permit comes.
            async fn held(State(app): State<App>) -> (StatusCode, &'static str) {
                app.executions.fetch_add(1, Ordering::SeqCst);
                app.gate.acquire().await.unwrap().forget();
                (StatusCode::CREATED, "held")
            }

            struct Server {
                /// Two instances of the optimistic routes, each with its own layer (so
                /// neither knows of the other's requests in flight).
                addrs: [std::net::SocketAddr; 2],
                /// The leased form's routes, on the same inbox group.
                leased_addr: std::net::SocketAddr,
                pool: $pool,
                app: App,
            }

            impl Server {
                fn executions(&self) -> u64 {
                    self.app.executions.load(Ordering::SeqCst)
                }

                async fn effects(&self) -> i64 {
                    sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                        .fetch_one(&self.pool)
                        .await
                        .unwrap()
                }

                /// The status and attempts of the only record of the inbox group `group`.
                async fn record(&self, group: &str) -> (String, i64) {
                    sqlx::query_as(common::placed(
                        $positional,
                        "SELECT status, attempts FROM idem_inbox WHERE consumer_group = $1",
                    ))
                    .bind(group)
                    .fetch_one(&self.pool)
                    .await
                    .unwrap()
                }
            }

            async fn start() -> Option<Server> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(if $positional {
                    "CREATE TABLE once_rows (request VARCHAR(255) PRIMARY KEY)"
                } else {
                    "CREATE TABLE once_rows (request TEXT PRIMARY KEY)"
                })
                .execute(&pool)
                .await
                .unwrap();
                let app = App {
                    executions: Arc::default(),
                    gate: Arc::new(tokio::sync::Semaphore::new(0)),
                };
                let instance = || {
                    let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("api").unwrap())
                        .unscoped()
                        .wait(Duration::from_secs(30))
                        .optimistic();
                    let charges =
                        IdempotencyLayer::new(pool.clone(), Inbox::new("charges").unwrap())
                            .unscoped()
                            .optimistic();
                    Router::new()
                        .route("/orders", route_post(create).layer(layer.clone()))
                        .route("/once", route_post(once).layer(layer.clone()))
                        .route("/slow", route_post(slow).layer(layer))
                        .route("/charge", route_post(create).layer(charges.clone()))
                        .route("/hold", route_post(create).layer(charges))
                        .with_state(app.clone())
                };
                let leased = IdempotencyLayer::new(pool.clone(), Inbox::new("charges").unwrap())
                    .unscoped()
                    .leased(Duration::from_secs(30));
                let leased = Router::new()
                    .route("/charge", route_post(failing).layer(leased.clone()))
                    .route("/hold", route_post(held).layer(leased))
                    .with_state(app.clone());
                Some(Server {
                    addrs: [serve(instance()).await, serve(instance()).await],
                    leased_addr: serve(leased).await,
                    pool,
                    app,
                })
            }

            #[tokio::test]
            async fn a_repeat_runs_its_handler_but_replays_the_first_and_keeps_nothing() {
                let Some(s) = start().await else { return };
                let first = post(s.addrs[0], "/orders", "k-1", "{\"amount\":5}").await;
                assert_eq!(first.status, 201, "{first:?}");
                assert!(!first.replayed());
                for addr in s.addrs {
                    let again = post(addr, "/orders", "k-1", "{\"amount\":5}").await;
                    assert_eq!(again.status, 201, "{again:?}");
                    assert!(again.replayed(), "{again:?}");
                    assert_eq!(again.body, first.body);
                }
                // Three runs of the handler, one effect: the repeats' rolled back.
                assert_eq!(s.executions(), 3);
                assert_eq!(s.effects().await, 1);
                assert_eq!(s.record("api").await, ("SUCCESS".to_owned(), 1));
            }

            #[tokio::test]
            async fn a_key_reused_for_another_request_is_refused_and_the_first_stays() {
                let Some(s) = start().await else { return };
                let first = post(s.addrs[0], "/orders", "k-2", "{\"amount\":5}").await;
                assert_eq!(first.status, 201);
                let other = post(s.addrs[1], "/orders", "k-2", "{\"amount\":6}").await;
                assert_eq!(other.status, 422, "{other:?}");
                let again = post(s.addrs[1], "/orders", "k-2", "{\"amount\":5}").await;
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.body, first.body);
                assert_eq!(s.effects().await, 1);
            }

            #[tokio::test]
            async fn copies_racing_through_two_instances_commit_one_effect_and_one_response() {
                let Some(s) = start().await else { return };
                let mut sends = Vec::new();
                for copy in 0..COPIES_PER_INSTANCE {
                    for key in 0..KEYS {
                        for addr in s.addrs {
                            let key = format!("race-{key}");
                            let body = format!("{{\"key\":{key:?}}}");
                            sends.push(tokio::spawn(async move {
                                let reply = post(addr, "/orders", &key, &body).await;
                                (key, copy, reply)
                            }));
                        }
                    }
                }
                let mut responses: HashMap<String, Vec<Reply>> = HashMap::new();
                for send in sends {
                    let (key, _, reply) = send.await.unwrap();
                    responses.entry(key).or_default().push(reply);
                }
                assert_eq!(responses.len(), KEYS);
                for (key, replies) in &responses {
                    let first = replies.iter().find(|r| !r.replayed());
                    let first =
                        first.unwrap_or_else(|| panic!("{key}: no first response in {replies:?}"));
                    for reply in replies {
                        assert_eq!(reply.status, 201, "{key}: {reply:?}");
                        assert_eq!(reply.body, first.body, "{key}: {replies:?}");
                    }
                    let firsts = replies.iter().filter(|r| !r.replayed()).count();
                    assert_eq!(firsts, 1, "{key}: {replies:?}");
                }
                assert_eq!(s.effects().await, KEYS as i64);
                assert!(s.executions() >= KEYS as u64);
                println!(
                    "{} handler runs for {} requests of {KEYS} keys",
                    s.executions(),
                    KEYS * COPIES_PER_INSTANCE * 2
                );
            }

            /// A repeat that waits in the same instance for its first request (the layer's
            /// `wait`) then runs in the default form: replayed, its handler never run.
            #[tokio::test]
            async fn a_repeat_waiting_in_the_same_instance_is_replayed_without_running() {
                let Some(s) = start().await else { return };
                let first = tokio::spawn(post(s.addrs[0], "/slow", "k-7", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let repeat = tokio::spawn(post(s.addrs[0], "/slow", "k-7", "{}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert!(!repeat.is_finished(), "the repeat waits for the first");
                // A permit for the repeat's handler too, were it to run.
                s.app.gate.add_permits(2);
                let first = first.await.unwrap();
                assert_eq!((first.status, first.body.as_str()), (200, "slow 1"));
                let repeat = repeat.await.unwrap();
                assert!(repeat.replayed(), "{repeat:?}");
                assert_eq!(repeat.body, "slow 1");
                assert_eq!(s.executions(), 1);
                assert_eq!(s.effects().await, 1);
            }

            /// The first's row is committed when the repeat's handler tries it again: the
            /// handler fails (500, not stored), and the repeat still gets the first response.
            #[tokio::test]
            async fn a_repeat_whose_handler_fails_gets_the_first_response() {
                let Some(s) = start().await else { return };
                let first = post(s.addrs[0], "/once", "k-3", "\"row\"").await;
                assert_eq!((first.status, first.body.as_str()), (201, "once 1"));
                let again = post(s.addrs[1], "/once", "k-3", "\"row\"").await;
                assert_eq!(again.status, 201, "{again:?}");
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.body, "once 1");
                assert_eq!(s.executions(), 2);
                // A failure with no record behind it is the handler's own answer.
                let failed = post(s.addrs[1], "/once", "k-4", "\"row\"").await;
                assert_eq!(failed.status, 500, "{failed:?}");
                assert!(!failed.replayed());
            }

            /// The leased form failed the key (a 502, recorded FAILED): the optimistic
            /// request's handler runs, finds the record at the commit, and the request runs
            /// again in the default form, which takes the record over.
            #[tokio::test]
            async fn a_record_the_leased_form_failed_is_taken_over() {
                let Some(s) = start().await else { return };
                let failed = post(s.leased_addr, "/charge", "k-5", "{}").await;
                assert_eq!(failed.status, 502, "{failed:?}");
                assert_eq!(s.record("charges").await, ("FAILED".to_owned(), 1));
                let taken = post(s.addrs[0], "/charge", "k-5", "{}").await;
                assert_eq!(taken.status, 201, "{taken:?}");
                assert!(!taken.replayed());
                // The failed run, the optimistic run (rolled back), the default form's run.
                assert_eq!(s.executions(), 3);
                assert_eq!(s.effects().await, 1);
                assert_eq!(s.record("charges").await, ("SUCCESS".to_owned(), 2));
                assert!(post(s.addrs[1], "/charge", "k-5", "{}").await.replayed());
            }

            /// The leased form still holds the key: the optimistic request's writes roll
            /// back and it is a 409, never a second effect.
            #[tokio::test]
            async fn a_key_the_leased_form_holds_is_in_progress() {
                let Some(s) = start().await else { return };
                let holding = tokio::spawn(post(s.leased_addr, "/hold", "k-6", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let during = post(s.addrs[0], "/hold", "k-6", "{}").await;
                assert_eq!(during.status, 409, "{during:?}");
                assert!(during.header("retry-after").is_some(), "{during:?}");
                s.app.gate.add_permits(1);
                assert_eq!(holding.await.unwrap().status, 201);
                // The leased run and the optimistic run, whose effect rolled back.
                assert_eq!(s.executions(), 2);
                assert_eq!(s.effects().await, 0);
                let after = post(s.addrs[1], "/hold", "k-6", "{}").await;
                assert!(after.replayed(), "{after:?}");
                assert_eq!(after.body, "held");
            }
        }
    };
}

optimistic_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("http-optimistic-{}", common::next_id()), 4).await),
    positional = false
);
optimistic_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("http_optimistic_{}", common::next_id()), 8).await,
    positional = false
);
optimistic_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("http_optimistic_{}", common::next_id()), 8).await,
    positional = true
);
