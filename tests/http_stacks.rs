//! The Idempotency-Key layer inside the stacks users build, over real TCP with a real client,
//! on a SQLite file, PostgreSQL and MariaDB: a router nested under a path with a parameter,
//! a timeout and a panic handler inside the layer (in the default and the optimistic form,
//! applied with `.layer` and with a `ServiceBuilder`; tower-http's timeout, and tower's under
//! `HandleErrorLayer`), the leased form's wait, a principal function that names no one, safe
//! methods carrying a key, and a form's media type spelled in another case.

use crate::common;
use crate::http_client;

use axum::BoxError;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post as route_post};
use http_client::{Reply, post, send, serve};
use idem::http::{Committed, FormTokens, IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;

/// How long a handler may run inside the routes with a timeout.
const TIMEOUT: Duration = Duration::from_millis(300);

fn is_problem(reply: &Reply, status: u16) -> bool {
    reply.status == status && reply.header("content-type") == Some("application/problem+json")
}

/// The caller, from the `x-tenant` header; a request without one is refused.
fn tenant(parts: &axum::http::request::Parts) -> Result<String, StatusCode> {
    match parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
        Some(tenant) => Ok(tenant.to_owned()),
        None => Err(StatusCode::UNAUTHORIZED),
    }
}

macro_rules! stack_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            #[derive(Clone)]
            struct App {
                executions: Arc<AtomicU64>,
                /// The next call of `/timed*` stalls between its debit and its credit.
                stall_next: Arc<AtomicBool>,
                /// The next call of `/panics*` panics after its debit.
                panic_next: Arc<AtomicBool>,
                /// `/leased` waits for a permit here before it answers.
                gate: Arc<tokio::sync::Semaphore>,
            }

            impl App {
                fn next(&self) -> i64 {
                    self.executions.fetch_add(1, Ordering::SeqCst) as i64 + 1
                }
            }

            async fn effect(tx: &mut Tx<$db>, n: i64, kind: &str) {
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 0)",
                ))
                .bind(n)
                .bind(kind)
                .execute(&mut ***tx)
                .await
                .unwrap();
            }

            /// A transfer from the account named by the nesting router's path.
            async fn transfer(
                State(app): State<App>,
                Path(account): Path<String>,
                mut tx: Tx<$db>,
            ) -> Committed<(StatusCode, String)> {
                let n = app.next();
                effect(&mut tx, n, &account).await;
                tx.commit((StatusCode::CREATED, format!("transfer {n} from {account}")))
            }

            /// A debit, then (unless it stalls past the timeout) the credit.
            async fn debit_then_credit(
                State(app): State<App>,
                mut tx: Tx<$db>,
            ) -> Committed<(StatusCode, String)> {
                let n = app.next();
                effect(&mut tx, n, "debit").await;
                if app.stall_next.swap(false, Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                effect(&mut tx, n, "credit").await;
                tx.commit((StatusCode::CREATED, format!("moved {n}")))
            }

            /// A debit, then (when told to) a panic before the credit.
            async fn panics(
                State(app): State<App>,
                mut tx: Tx<$db>,
            ) -> Committed<(StatusCode, String)> {
                let n = app.next();
                effect(&mut tx, n, "debit").await;
                assert!(
                    !app.panic_next.swap(false, Ordering::SeqCst),
                    "the handler panics between the debit and the credit"
                );
                effect(&mut tx, n, "credit").await;
                tx.commit((StatusCode::CREATED, format!("moved {n}")))
            }

            /// A leased handler: its effect is outside the database.
            async fn charge(State(app): State<App>) -> (StatusCode, String) {
                let n = app.next();
                app.gate.acquire().await.unwrap().forget();
                (StatusCode::CREATED, format!("charged {n}"))
            }

            /// A leased handler that stalls past the timeout when told to.
            async fn charge_or_stall(State(app): State<App>) -> (StatusCode, String) {
                let n = app.next();
                if app.stall_next.swap(false, Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                (StatusCode::CREATED, format!("charged {n}"))
            }

            /// A read: a GET whose answer changes with every call.
            async fn read(State(app): State<App>, mut tx: Tx<$db>) -> Committed<String> {
                let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                    .fetch_one(&mut **tx)
                    .await
                    .unwrap();
                tx.commit(format!("read {} with {effects} effects", app.next()))
            }

            struct Server {
                addr: std::net::SocketAddr,
                pool: $pool,
                app: App,
                tokens: FormTokens,
            }

            impl Server {
                fn executions(&self) -> u64 {
                    self.app.executions.load(Ordering::SeqCst)
                }

                async fn effects(&self) -> Vec<(i64, String)> {
                    sqlx::query_as("SELECT order_id, kind FROM effects ORDER BY order_id, kind")
                        .fetch_all(&self.pool)
                        .await
                        .unwrap()
                }

                async fn records(&self) -> i64 {
                    sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
                        .fetch_one(&self.pool)
                        .await
                        .unwrap()
                }

                async fn post_as(&self, path: &str, key: &str, tenant: &str) -> Reply {
                    send(
                        self.addr,
                        "POST",
                        path,
                        &[
                            ("idempotency-key", key.as_bytes()),
                            ("content-type", b"application/json"),
                            ("x-tenant", tenant.as_bytes()),
                        ],
                        "{}",
                    )
                    .await
                }
            }

            async fn start() -> Option<Server> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                let layer = |group: &str| {
                    IdempotencyLayer::new(pool.clone(), Inbox::new(group).unwrap())
                        .principal(tenant)
                };
                let keys = layer("stacks");
                let timeout =
                    || TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, TIMEOUT);
                let tokens = FormTokens::new(
                    b"the form secret of the stack test",
                    Duration::from_secs(3600),
                )
                .unwrap();
                let app = App {
                    executions: Arc::default(),
                    stall_next: Arc::default(),
                    panic_next: Arc::default(),
                    gate: Arc::new(tokio::sync::Semaphore::new(0)),
                };
                let accounts =
                    Router::new().route("/transfers", route_post(transfer).layer(keys.clone()));
                let router = Router::new()
                    .nest("/accounts/{account}", accounts)
                    .route(
                        "/timed",
                        route_post(debit_then_credit)
                            .layer::<_, Infallible>(timeout())
                            .layer(keys.clone()),
                    )
                    .route(
                        "/timed-optimistic",
                        route_post(debit_then_credit)
                            .layer::<_, Infallible>(timeout())
                            .layer(layer("stacks-optimistic").optimistic()),
                    )
                    .route(
                        "/timed-builder",
                        route_post(debit_then_credit).layer(
                            ServiceBuilder::new()
                                .layer(layer("stacks-builder"))
                                .layer(timeout()),
                        ),
                    )
                    .route(
                        "/timed-handled",
                        route_post(debit_then_credit).layer(
                            ServiceBuilder::new()
                                .layer(layer("stacks-handled"))
                                .layer(HandleErrorLayer::new(|_: BoxError| async {
                                    StatusCode::REQUEST_TIMEOUT
                                }))
                                .timeout(TIMEOUT),
                        ),
                    )
                    .route(
                        "/panics",
                        route_post(panics)
                            .layer::<_, Infallible>(CatchPanicLayer::new())
                            .layer(layer("stacks-panics").store_if(|_| true)),
                    )
                    .route(
                        "/panics-optimistic",
                        route_post(panics)
                            .layer::<_, Infallible>(CatchPanicLayer::new())
                            .layer(
                                layer("stacks-panics-optimistic")
                                    .optimistic()
                                    .store_if(|_| true),
                            ),
                    )
                    .route(
                        "/leased",
                        route_post(charge).layer(
                            layer("stacks-leased")
                                .leased(Duration::from_secs(30))
                                .wait(Duration::from_secs(10)),
                        ),
                    )
                    .route(
                        "/timed-leased",
                        route_post(charge_or_stall)
                            .layer::<_, Infallible>(timeout())
                            .layer(layer("stacks-timed-leased").leased(Duration::from_secs(30))),
                    )
                    .route(
                        "/anonymous",
                        route_post(debit_then_credit).layer(
                            IdempotencyLayer::new(pool.clone(), Inbox::new("stacks-anon").unwrap())
                                .principal(|_| Ok::<_, StatusCode>(String::new())),
                        ),
                    )
                    .route("/read", get(read).post(read).layer(layer("stacks-read")))
                    .route(
                        "/form",
                        route_post(debit_then_credit).layer(
                            IdempotencyLayer::new(pool.clone(), Inbox::new("stacks-form").unwrap())
                                .unscoped()
                                .form_tokens(tokens.clone()),
                        ),
                    )
                    .with_state(app.clone());
                let addr = serve(router).await;
                Some(Server {
                    addr,
                    pool,
                    app,
                    tokens,
                })
            }

            #[tokio::test]
            async fn a_key_reused_on_another_path_behind_a_nesting_router_is_refused() {
                let Some(s) = start().await else { return };
                let first = s.post_as("/accounts/A/transfers", "n-1", "t").await;
                assert_eq!(
                    (first.status, first.body.as_str()),
                    (201, "transfer 1 from A")
                );
                let other = s.post_as("/accounts/B/transfers", "n-1", "t").await;
                assert!(is_problem(&other, 422), "{other:?}");
                assert!(!other.replayed());
                let again = s.post_as("/accounts/A/transfers", "n-1", "t").await;
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.body, "transfer 1 from A");
                assert_eq!(s.executions(), 1, "B's transfer never ran under A's key");
                assert_eq!(s.effects().await, [(1, "A".to_owned())]);
            }

            /// A timeout inside the layer answers 408 while the handler, holding its
            /// transaction, has written the debit and not the credit.
            async fn a_timed_out_handler_commits_nothing(path: &str) {
                let Some(s) = start().await else { return };
                s.app.stall_next.store(true, Ordering::SeqCst);
                let timed_out = s.post_as(path, "t-1", "t").await;
                assert_eq!(timed_out.status, 408, "{timed_out:?}");
                assert_eq!(s.effects().await, [], "the debit rolled back");
                assert_eq!(s.records().await, 0, "the timeout's answer is not stored");
                // A retry runs the handler again, and this time it finishes.
                let retry = s.post_as(path, "t-1", "t").await;
                assert_eq!((retry.status, retry.body.as_str()), (201, "moved 2"));
                assert!(!retry.replayed());
                let replay = s.post_as(path, "t-1", "t").await;
                assert!(replay.replayed(), "{replay:?}");
                assert_eq!(replay.body, "moved 2");
                assert_eq!(
                    s.effects().await,
                    [(2, "credit".to_owned()), (2, "debit".to_owned())]
                );
            }

            #[tokio::test]
            async fn a_timeout_inside_the_layer_rolls_the_handler_back() {
                a_timed_out_handler_commits_nothing("/timed").await;
            }

            #[tokio::test]
            async fn a_timeout_inside_the_optimistic_layer_rolls_the_handler_back() {
                a_timed_out_handler_commits_nothing("/timed-optimistic").await;
            }

            #[tokio::test]
            async fn a_timeout_under_the_layer_in_a_service_builder_rolls_the_handler_back() {
                a_timed_out_handler_commits_nothing("/timed-builder").await;
            }

            #[tokio::test]
            async fn tower_s_timeout_under_handle_error_inside_the_layer_rolls_the_handler_back() {
                // The handler is dropped first, and only then is the 408 made up: no
                // response of its own, so nothing of it commits.
                a_timed_out_handler_commits_nothing("/timed-handled").await;
            }

            /// The leased form has no transaction to tell the handler's answer by: a timeout
            /// inside its layer answering 408 is a failed attempt under the default policy
            /// (a 408 says "try again"), never the key's answer for good; the retry runs the
            /// handler again.
            #[tokio::test]
            async fn a_timeout_inside_the_leased_layer_is_not_the_keys_answer() {
                let Some(s) = start().await else { return };
                s.app.stall_next.store(true, Ordering::SeqCst);
                let timed_out = s.post_as("/timed-leased", "l-1", "t").await;
                assert_eq!(timed_out.status, 408, "{timed_out:?}");
                let retry = s.post_as("/timed-leased", "l-1", "t").await;
                assert_eq!(
                    (retry.status, retry.body.as_str(), retry.replayed()),
                    (201, "charged 2", false),
                    "{retry:?}"
                );
                let replay = s.post_as("/timed-leased", "l-1", "t").await;
                assert!(replay.replayed(), "{replay:?}");
                assert_eq!(replay.body, "charged 2");
            }

            /// A handler panics after its debit; a layer inside turns the panic into a
            /// 500, which this route's policy would store.
            async fn a_panicked_handler_commits_nothing(path: &str) {
                let Some(s) = start().await else { return };
                s.app.panic_next.store(true, Ordering::SeqCst);
                let panicked = s.post_as(path, "p-1", "t").await;
                assert_eq!(panicked.status, 500, "{panicked:?}");
                assert_eq!(s.effects().await, [], "the debit rolled back");
                assert_eq!(s.records().await, 0, "the panic's answer is not stored");
                let retry = s.post_as(path, "p-1", "t").await;
                assert_eq!((retry.status, retry.body.as_str()), (201, "moved 2"));
                assert!(s.post_as(path, "p-1", "t").await.replayed());
                assert_eq!(s.effects().await.len(), 2);
            }

            #[tokio::test]
            async fn a_panic_caught_inside_the_layer_rolls_the_handler_back() {
                a_panicked_handler_commits_nothing("/panics").await;
            }

            #[tokio::test]
            async fn a_panic_caught_inside_the_optimistic_layer_rolls_the_handler_back() {
                a_panicked_handler_commits_nothing("/panics-optimistic").await;
            }

            #[tokio::test]
            async fn a_repeat_waits_for_the_leased_first_and_gets_its_response() {
                let Some(s) = start().await else { return };
                let charge = || {
                    let addr = s.addr;
                    tokio::spawn(async move {
                        let headers: [(&str, &[u8]); 2] =
                            [("idempotency-key", b"l-1"), ("x-tenant", b"t")];
                        send(addr, "POST", "/leased", &headers, "{}").await
                    })
                };
                let first = charge();
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // A double click: the repeat arrives while the first still runs.
                let repeat = charge();
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!repeat.is_finished(), "the repeat waits for the first");
                s.app.gate.add_permits(1);
                let first = first.await.unwrap();
                assert_eq!((first.status, first.body.as_str()), (201, "charged 1"));
                let repeat = repeat.await.unwrap();
                assert!(repeat.replayed(), "{repeat:?}");
                assert_eq!((repeat.status, repeat.body.as_str()), (201, "charged 1"));
                assert_eq!(s.executions(), 1);
            }

            #[tokio::test]
            async fn an_empty_principal_is_refused() {
                let Some(s) = start().await else { return };
                for key in ["e-1", "e-1", "e-2"] {
                    let refused = post(s.addr, "/anonymous", key, "{}").await;
                    assert!(is_problem(&refused, 401), "{refused:?}");
                }
                // The principal function's own refusal, for a request naming no tenant.
                let no_tenant = post(s.addr, "/accounts/A/transfers", "e-1", "{}").await;
                assert_eq!(no_tenant.status, 401);
                assert_eq!(s.executions(), 0);
                assert_eq!(s.records().await, 0);
            }

            #[tokio::test]
            async fn safe_methods_carrying_a_key_are_not_recorded() {
                let Some(s) = start().await else { return };
                let get_with = |key: &'static str, method: &'static str| {
                    let addr = s.addr;
                    async move {
                        send(
                            addr,
                            method,
                            "/read",
                            &[("idempotency-key", key.as_bytes()), ("x-tenant", b"t")],
                            "",
                        )
                        .await
                    }
                };
                let first = get_with("g-1", "GET").await;
                assert_eq!(
                    (first.status, first.body.as_str()),
                    (200, "read 1 with 0 effects")
                );
                let second = get_with("g-1", "GET").await;
                assert!(!second.replayed(), "{second:?}");
                assert_eq!(second.body, "read 2 with 0 effects", "fresh data");
                let head = get_with("g-1", "HEAD").await;
                assert_eq!(head.status, 200, "{head:?}");
                // A malformed key on a safe method is not looked at either.
                assert_eq!(get_with("\"unterminated", "GET").await.status, 200);
                assert_eq!(s.records().await, 0);
                // The same handler behind POST is recorded.
                let posted = s.post_as("/read", "g-1", "t").await;
                assert_eq!(posted.status, 200);
                assert!(s.post_as("/read", "g-1", "t").await.replayed());
                assert_eq!(s.records().await, 1);
            }

            #[tokio::test]
            async fn a_form_is_recognised_whatever_the_case_of_its_media_type() {
                let Some(s) = start().await else { return };
                let body = format!("{}={}&amount=5", s.tokens.field_name(), s.tokens.issue());
                let submit = || {
                    send(
                        s.addr,
                        "POST",
                        "/form",
                        &[(
                            "content-type",
                            b"Application/X-WWW-Form-Urlencoded ; Charset=UTF-8",
                        )],
                        &body,
                    )
                };
                let first = submit().await;
                assert_eq!((first.status, first.body.as_str()), (201, "moved 1"));
                let second = submit().await;
                assert!(second.replayed(), "{second:?}");
                assert_eq!(s.executions(), 1);
            }
        }
    };
}

stack_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("stacks-{}", common::next_id()), 4).await),
    positional = false
);
stack_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("stacks_{}", common::next_id()), 8).await,
    positional = false
);
stack_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("stacks_{}", common::next_id()), 8).await,
    positional = true
);
