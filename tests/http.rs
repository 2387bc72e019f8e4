//! The Idempotency-Key layer over real TCP with a real HTTP client (hyper), on a SQLite file
//! and on PostgreSQL: every status it answers, races of one key, principals, the storage
//! policy, bounded bodies, a transition route, retention.

use crate::common;
use crate::http_client;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::routing::post as route_post;
use http_client::{Reply, post, send, serve};
use idem::http::{Committed, FormTokens, IdempotencyLayer, RequestKey, Tx};
use idem::inbox::{Inbox, ManualClock};
use idem::{Outcome, StateMachine};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[derive(serde::Deserialize)]
pub struct NewOrder {
    pub amount: i64,
}

/// The leased route's lease.
const LEASE: Duration = Duration::from_secs(30);
/// `/charge-long`'s lease, in real time.
const SHORT_LEASE: Duration = Duration::from_secs(1);

fn is_problem(reply: &Reply, status: u16) -> bool {
    reply.status == status && reply.header("content-type") == Some("application/problem+json")
}

#[tokio::test]
async fn form_tokens_outliving_the_retention_are_refused_when_the_layer_is_built() {
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let hours = |n: u64| Duration::from_secs(n * 3600);
    let tokens = FormTokens::new([7u8; 32], hours(48)).unwrap();
    let layer = || IdempotencyLayer::new(pool.clone(), Inbox::new("forms").unwrap()).unscoped();
    let refused = |build: &dyn Fn()| {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).unwrap_err();
        let message = panicked
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.contains("longer than the layer's retention"),
            "{message}"
        );
    };
    // The default retention is 24 h; either order of the two settings is refused.
    refused(&|| drop(layer().form_tokens(tokens.clone())));
    refused(&|| {
        drop(
            layer()
                .retention(hours(72))
                .form_tokens(tokens.clone())
                .retention(hours(24)),
        )
    });
    drop(layer().retention(hours(48)).form_tokens(tokens.clone()));
    assert!(FormTokens::new(b"short", hours(1)).is_err());
}

macro_rules! http_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        http_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            #[derive(Clone)]
            struct App {
                pool: $pool,
                executions: Arc<AtomicU64>,
                /// `/slow` waits for a permit here before it answers.
                gate: Arc<tokio::sync::Semaphore>,
                /// `/charge`'s next call answers 500 (after its outside call).
                fail_next: Arc<AtomicBool>,
                /// `/charge`'s next call waits for a permit of `gate` before it answers.
                hold_next: Arc<AtomicBool>,
            }

            /// A leased handler: it calls a service outside the database (here a table
            /// written outside any transaction of idem's, standing for a payment API that
            /// deduplicates by idempotency key), with the request's derived key.
            async fn charge(
                State(app): State<App>,
                key: RequestKey,
            ) -> (StatusCode, String) {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                let upsert = if $positional {
                    "INSERT INTO external_charges (idempotency_key, calls) VALUES (?, 1) \
                     ON DUPLICATE KEY UPDATE calls = calls + 1"
                } else {
                    "INSERT INTO external_charges (idempotency_key, calls) VALUES ($1, 1) \
                     ON CONFLICT (idempotency_key) DO UPDATE SET calls = external_charges.calls + 1"
                };
                sqlx::query(upsert)
                .bind(key.derive("charge"))
                .execute(&app.pool)
                .await
                .unwrap();
                if app.hold_next.swap(false, Ordering::SeqCst) {
                    app.gate.acquire().await.unwrap().forget();
                }
                if app.fail_next.swap(false, Ordering::SeqCst) {
                    return (StatusCode::BAD_GATEWAY, format!("gateway down {n}"));
                }
                (StatusCode::CREATED, format!("charged {n}"))
            }

            /// An outside call that takes three of `/charge-long`'s leases.
            async fn long_charge(State(app): State<App>) -> (StatusCode, String) {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(3 * SHORT_LEASE).await;
                (StatusCode::CREATED, format!("charged {n}"))
            }

            async fn effect(tx: &mut Tx<$db>, n: u64, kind: &str) -> Result<(), StatusCode> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 0)"))
                    .bind(n as i64)
                    .bind(kind)
                    .execute(&mut ***tx)
                    .await
                    .map(drop)
                    .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
            }

            async fn create(
                State(app): State<App>,
                mut tx: Tx<$db>,
                body: String,
            ) -> Result<Committed<(StatusCode, [(header::HeaderName, String); 1], String)>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "create").await?;
                Ok(tx.commit((
                    StatusCode::CREATED,
                    [(header::LOCATION, format!("/orders/{n}"))],
                    format!("{{\"execution\":{n},\"request\":{body}}}"),
                )))
            }

            async fn slow(State(app): State<App>, mut tx: Tx<$db>) -> Result<Committed<String>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "slow").await?;
                app.gate.acquire().await.unwrap().forget();
                Ok(tx.commit(format!("slow {n}")))
            }

            /// A response larger than the layer keeps (256 KiB by default).
            async fn big(State(app): State<App>, mut tx: Tx<$db>) -> Result<Committed<(StatusCode, String)>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "big").await?;
                Ok(tx.commit((StatusCode::CREATED, "x".repeat(300 * 1024))))
            }

            /// An event stream: passed through, never kept.
            async fn events(State(app): State<App>, mut tx: Tx<$db>) -> Result<Committed<([(header::HeaderName, &'static str); 1], String)>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "events").await?;
                Ok(tx.commit(([(header::CONTENT_TYPE, "text/event-stream")], format!("data: {n}\n\n"))))
            }

            /// Takes its transaction twice: refused, never a wait for itself.
            async fn twice(_first: Tx<$db>, _second: Tx<$db>) -> &'static str {
                "unreachable"
            }

            async fn fail(State(app): State<App>, mut tx: Tx<$db>) -> Committed<(StatusCode, String)> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = effect(&mut tx, n, "fail").await;
                tx.commit((StatusCode::INTERNAL_SERVER_ERROR, format!("failed {n}")))
            }

            async fn validated(
                State(app): State<App>,
                mut tx: Tx<$db>,
                axum::Json(order): axum::Json<NewOrder>,
            ) -> Result<Committed<String>, StatusCode> {
                let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
                effect(&mut tx, n, "validated").await?;
                Ok(tx.commit(format!("order of {}", order.amount)))
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_order(
                tx: &mut sqlx::Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("paid {order_id}"))
            }

            async fn pay(Path(id): Path<i64>, mut tx: Tx<$db>) -> Committed<(StatusCode, String)> {
                let answer = match pay_order(&mut *tx, id).await {
                    Ok(Outcome::Applied(receipt)) => (StatusCode::OK, receipt),
                    Ok(Outcome::AlreadyDone { first_result, .. }) => (
                        StatusCode::OK,
                        format!("already: {}", first_result.unwrap_or_default()),
                    ),
                    Ok(other) => (StatusCode::CONFLICT, format!("{other:?}")),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                };
                tx.commit(answer)
            }

            struct Server {
                addr: std::net::SocketAddr,
                other_addr: std::net::SocketAddr,
                pool: $pool,
                app: App,
                clock: ManualClock,
                layer: IdempotencyLayer<$db>,
                tokens: FormTokens,
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

                async fn records(&self) -> i64 {
                    sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
                        .fetch_one(&self.pool)
                        .await
                        .unwrap()
                }
            }

            fn inbox_of(clock: &ManualClock) -> Inbox {
                Inbox::new("orders-api").unwrap().clock(clock.clone())
            }

            async fn start() -> Option<Server> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query("INSERT INTO orders (order_id, status) VALUES (7, 'CREATED')")
                    .execute(&pool)
                    .await
                    .unwrap();
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = inbox_of(&clock);
                // A request naming no tenant is this test's one anonymous caller (a principal
                // of its own, not an empty one: that would be refused).
                let tenant = |parts: &axum::http::request::Parts| {
                    Ok::<_, StatusCode>(
                        parts
                            .headers
                            .get("x-tenant")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("anonymous")
                            .to_owned(),
                    )
                };
                let layer = IdempotencyLayer::new(pool.clone(), inbox.clone()).principal(tenant);
                let small = IdempotencyLayer::new(pool.clone(), inbox.clone()).unscoped().max_request_body(64);
                let optional = IdempotencyLayer::new(pool.clone(), inbox).unscoped().required(false);
                let tokens = FormTokens::new(b"the form secret of this test....", Duration::from_secs(3600))
                    .unwrap()
                    .clock(clock.clone());
                let leased = IdempotencyLayer::new(
                    pool.clone(),
                    Inbox::new("payments-api").unwrap().clock(clock.clone()),
                )
                .principal(tenant)
                .leased(LEASE);
                sqlx::query(if $positional {
                    "CREATE TABLE external_charges (idempotency_key VARCHAR(255) PRIMARY KEY, calls BIGINT NOT NULL)"
                } else {
                    "CREATE TABLE external_charges (idempotency_key TEXT PRIMARY KEY, calls BIGINT NOT NULL)"
                })
                .execute(&pool)
                .await
                .unwrap();
                let app = App {
                    pool: pool.clone(),
                    executions: Arc::default(),
                    gate: Arc::new(tokio::sync::Semaphore::new(0)),
                    fail_next: Arc::default(),
                    hold_next: Arc::default(),
                };
                let router = Router::new()
                    .route("/orders", route_post(create).layer(layer.clone()))
                    .route("/small", route_post(create).layer(small))
                    .route("/optional", route_post(create).layer(optional))
                    .route("/slow", route_post(slow).layer(layer.clone()))
                    .route(
                        "/slow-waiting",
                        route_post(slow).layer(
                            IdempotencyLayer::new(pool.clone(), inbox_of(&clock))
                                .principal(tenant)
                                .wait(Duration::from_secs(10)),
                        ),
                    )
                    .route("/twice", route_post(twice).layer(layer.clone()))
                    .route(
                        "/form",
                        route_post(create).layer(
                            IdempotencyLayer::new(pool.clone(), inbox_of(&clock))
                                .unscoped()
                                .form_tokens(tokens.clone())
                                .wait(Duration::from_secs(10)),
                        ),
                    )
                    .route("/big", route_post(big).layer(layer.clone()))
                    .route("/events", route_post(events).layer(layer.clone()))
                    .route("/fail", route_post(fail).layer(layer.clone()))
                    .route("/validated", route_post(validated).layer(layer.clone()))
                    .route("/orders/{id}/pay", route_post(pay).layer(layer.clone()))
                    .route(
                        "/bounded",
                        route_post(create).layer(
                            IdempotencyLayer::new(pool.clone(), inbox_of(&clock))
                                .principal(tenant)
                                .max_wait(Duration::from_millis(300)),
                        ),
                    )
                    .route("/charge", route_post(charge).layer(leased))
                    .route(
                        "/charge-long",
                        route_post(long_charge).layer(
                            IdempotencyLayer::new(pool.clone(), Inbox::new("long-api").unwrap())
                                .unscoped()
                                .leased(SHORT_LEASE),
                        ),
                    )
                    .with_state(app.clone());
                // A second instance of the service on the same database: its own layer,
                // so it knows nothing of the first's requests in flight.
                let other = Router::new()
                    .route(
                        "/slow",
                        route_post(slow)
                            .layer(IdempotencyLayer::new(pool.clone(), inbox_of(&clock)).principal(tenant)),
                    )
                    .with_state(app.clone());
                let other_addr = serve(other).await;
                let addr = serve(router).await;
                Some(Server {
                    other_addr,
                    addr,
                    pool,
                    app,
                    clock,
                    layer,
                    tokens,
                })
            }

            #[tokio::test]
            async fn a_repeat_gets_the_first_response_replayed() {
                let Some(s) = start().await else { return };
                let first = post(s.addr, "/orders", "\"k-1\"", "{\"amount\":5}").await;
                assert_eq!(first.status, 201, "{first:?}");
                assert!(!first.replayed());
                assert_eq!(first.header("location"), Some("/orders/1"));
                // A bare token is the same key as the Structured Field string.
                let again = post(s.addr, "/orders", "k-1", "{\"amount\":5}").await;
                assert_eq!(again.status, 201);
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.body, first.body);
                assert_eq!(again.header("location"), Some("/orders/1"));
                assert_eq!(s.executions(), 1);
                assert_eq!(s.effects().await, 1);
            }

            #[tokio::test]
            async fn a_key_reused_for_another_request_is_refused_and_the_first_stays() {
                let Some(s) = start().await else { return };
                let first = post(s.addr, "/orders", "k-2", "{\"amount\":5}").await;
                assert_eq!(first.status, 201);
                let other = post(s.addr, "/orders", "k-2", "{\"amount\":6}").await;
                assert!(is_problem(&other, 422), "{other:?}");
                let other_path = post(s.addr, "/slow", "k-2", "{\"amount\":5}").await;
                assert!(is_problem(&other_path, 422), "{other_path:?}");
                let again = post(s.addr, "/orders", "k-2", "{\"amount\":5}").await;
                assert!(again.replayed());
                assert_eq!(again.body, first.body);
                assert_eq!(s.effects().await, 1);
            }

            #[tokio::test]
            async fn bad_keys_are_refused_before_anything_runs() {
                let Some(s) = start().await else { return };
                let json: (&str, &[u8]) = ("content-type", b"application/json");
                let long = "x".repeat(256);
                let cases: Vec<Vec<(&str, &[u8])>> = vec![
                    vec![json],
                    vec![json, ("idempotency-key", long.as_bytes())],
                    vec![json, ("idempotency-key", b"a\tb")],
                    vec![json, ("idempotency-key", b"\"unclosed")],
                    vec![json, ("idempotency-key", b"\"\"")],
                    vec![
                        json,
                        ("idempotency-key", b"one"),
                        ("idempotency-key", b"two"),
                    ],
                ];
                for headers in cases {
                    let reply = send(s.addr, "POST", "/orders", &headers, "{}").await;
                    assert!(is_problem(&reply, 400), "{headers:?}: {reply:?}");
                }
                let longest = "x".repeat(255);
                assert_eq!(post(s.addr, "/orders", &longest, "{}").await.status, 201);
                assert_eq!(s.executions(), 1);
                assert_eq!(s.records().await, 1);
            }

            #[tokio::test]
            async fn a_repeat_while_the_first_runs_is_409_then_replayed() {
                let Some(s) = start().await else { return };
                let first = tokio::spawn(post(s.addr, "/slow", "k-3", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let during = post(s.addr, "/slow", "k-3", "{}").await;
                assert!(is_problem(&during, 409), "{during:?}");
                assert!(during.header("retry-after").is_some());
                s.app.gate.add_permits(1);
                let first = first.await.unwrap();
                assert_eq!((first.status, first.body.as_str()), (200, "slow 1"));
                let after = post(s.addr, "/slow", "k-3", "{}").await;
                assert!(after.replayed());
                assert_eq!(after.body, "slow 1");
                assert_eq!(s.executions(), 1);
            }

            /// Another instance cannot see this one's requests in flight; the database
            /// decides. PostgreSQL: the repeat finds the key's advisory lock held and is a
            /// 409 at once. SQLite: the repeat waits for the database's writer, then finds
            /// the first's record and replays it.
            #[tokio::test]
            async fn a_repeat_through_another_instance_never_runs_twice() {
                let Some(s) = start().await else { return };
                let first = tokio::spawn(post(s.addr, "/slow", "k-11", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let repeat = tokio::spawn(post(s.other_addr, "/slow", "k-11", "{}"));
                let postgres = <$db as sqlx::Database>::NAME == "PostgreSQL";
                if postgres {
                    let during = repeat.await.unwrap();
                    assert!(is_problem(&during, 409), "{during:?}");
                    s.app.gate.add_permits(1);
                    assert_eq!(first.await.unwrap().body, "slow 1");
                } else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    assert!(!repeat.is_finished(), "the repeat waits for the writer");
                    s.app.gate.add_permits(1);
                    assert_eq!(first.await.unwrap().body, "slow 1");
                    let replayed = repeat.await.unwrap();
                    assert!(replayed.replayed(), "{replayed:?}");
                    assert_eq!(replayed.body, "slow 1");
                }
                assert!(post(s.other_addr, "/slow", "k-11", "{}").await.replayed());
                assert_eq!(s.executions(), 1);
            }

            /// Two services on one server, each with its tables in a schema of its own
            /// (SQLite: a file of its own), the same route and the same key: neither sees
            /// the other's request in flight (PostgreSQL's advisory locks are per
            /// database, so the key's lock is scoped to the inbox table).
            #[tokio::test]
            async fn the_same_key_in_another_schema_is_another_request() {
                let Some(a) = start().await else { return };
                let Some(b) = start().await else { return };
                let first = tokio::spawn(post(a.addr, "/slow", "k-shared", "{}"));
                while a.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                b.app.gate.add_permits(1);
                let other = post(b.addr, "/slow", "k-shared", "{}").await;
                assert_eq!((other.status, other.body.as_str()), (200, "slow 1"), "{other:?}");
                a.app.gate.add_permits(1);
                assert_eq!(first.await.unwrap().body, "slow 1");
            }

            #[tokio::test]
            async fn with_wait_a_repeat_waits_for_the_first_and_gets_its_response() {
                let Some(s) = start().await else { return };
                let first = tokio::spawn(post(s.addr, "/slow-waiting", "k-12", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let repeat = tokio::spawn(post(s.addr, "/slow-waiting", "k-12", "{}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert!(!repeat.is_finished(), "the repeat waits");
                s.app.gate.add_permits(1);
                assert_eq!(first.await.unwrap().body, "slow 1");
                let repeat = repeat.await.unwrap();
                assert!(repeat.replayed(), "{repeat:?}");
                assert_eq!(repeat.body, "slow 1");
                assert_eq!(s.executions(), 1);
            }

            /// Too large to keep, or streamed: sent whole the first time; the record keeps
            /// the status and headers, and a repeat gets them with an empty body, never a
            /// second run.
            #[tokio::test]
            async fn large_and_streamed_responses_are_sent_but_not_kept() {
                let Some(s) = start().await else { return };
                let first = post(s.addr, "/big", "k-14", "{}").await;
                assert_eq!((first.status, first.body.len()), (201, 300 * 1024));
                let again = post(s.addr, "/big", "k-14", "{}").await;
                assert!(again.replayed(), "{again:?}");
                assert_eq!((again.status, again.body.as_str()), (201, ""));
                let stream = post(s.addr, "/events", "k-15", "{}").await;
                assert_eq!((stream.status, stream.body.as_str()), (200, "data: 2\n\n"));
                let again = post(s.addr, "/events", "k-15", "{}").await;
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.header("content-type"), Some("text/event-stream"));
                assert_eq!(again.body, "");
                assert_eq!(s.executions(), 2);
                assert_eq!(s.effects().await, 2);
            }

            async fn submit(addr: std::net::SocketAddr, form: &str) -> Reply {
                send(
                    addr,
                    "POST",
                    "/form",
                    &[("content-type", b"application/x-www-form-urlencoded")],
                    form,
                )
                .await
            }

            #[tokio::test]
            async fn a_form_submitted_twice_runs_once() {
                let Some(s) = start().await else { return };
                let token = s.tokens.issue();
                let form = format!("amount=5&idem_token={token}");
                // A double click: both submits at once; the second waits for the first.
                let (a, b) = tokio::join!(submit(s.addr, &form), submit(s.addr, &form));
                assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
                assert_eq!(a.body, b.body);
                assert!(a.replayed() != b.replayed(), "one ran, one was replayed");
                assert!(submit(s.addr, &form).await.replayed());
                assert_eq!(s.executions(), 1);
                assert_eq!(s.effects().await, 1);
                // Another form, another token: runs.
                let other = format!("amount=5&idem_token={}", s.tokens.issue());
                assert!(!submit(s.addr, &other).await.replayed());
                assert_eq!(s.executions(), 2);
            }

            #[tokio::test]
            async fn forged_expired_and_missing_form_tokens_are_refused() {
                let Some(s) = start().await else { return };
                let token = s.tokens.issue();
                let forged = FormTokens::new(b"not the secret, but just as long", Duration::from_secs(3600))
                    .unwrap()
                    .issue();
                for form in [
                    format!("amount=5&idem_token={forged}"),
                    "amount=5&idem_token=hello".to_owned(),
                    "amount=5".to_owned(),
                ] {
                    let reply = submit(s.addr, &form).await;
                    assert!(is_problem(&reply, 400), "{form}: {reply:?}");
                }
                s.clock.advance(Duration::from_secs(3601));
                let expired = submit(s.addr, &format!("amount=5&idem_token={token}")).await;
                assert!(is_problem(&expired, 400), "{expired:?}");
                assert!(expired.body.contains("expired"), "{expired:?}");
                assert_eq!(s.executions(), 0);
            }

            #[tokio::test]
            async fn a_transaction_taken_twice_is_refused_not_waited_for() {
                let Some(s) = start().await else { return };
                let reply = tokio::time::timeout(
                    Duration::from_secs(10),
                    post(s.addr, "/twice", "k-13", "{}"),
                )
                .await
                .expect("the request must not hang");
                assert!(is_problem(&reply, 500), "{reply:?}");
                assert!(reply.body.contains("twice"), "{reply:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn thirty_two_clients_with_one_key_run_it_once() {
                let Some(s) = start().await else { return };
                let clients: Vec<_> = (0..32)
                    .map(|_| tokio::spawn(post(s.addr, "/orders", "k-4", "{\"amount\":1}")))
                    .collect();
                let mut replies = Vec::new();
                for client in clients {
                    replies.push(client.await.unwrap());
                }
                let firsts: Vec<&Reply> = replies
                    .iter()
                    .filter(|r| r.status == 201 && !r.replayed())
                    .collect();
                assert_eq!(firsts.len(), 1, "{replies:#?}");
                for reply in &replies {
                    match reply.status {
                        201 => assert_eq!(reply.body, firsts[0].body),
                        409 => assert!(reply.header("retry-after").is_some()),
                        other => panic!("unexpected {other}: {reply:?}"),
                    }
                }
                assert_eq!(s.executions(), 1);
                assert_eq!(s.effects().await, 1);
            }

            #[tokio::test]
            async fn two_principals_with_one_key_never_see_each_other() {
                let Some(s) = start().await else { return };
                let as_tenant = |tenant: &'static str| {
                    let addr = s.addr;
                    async move {
                        send(
                            addr,
                            "POST",
                            "/orders",
                            &[
                                ("idempotency-key", b"k-5"),
                                ("content-type", b"application/json"),
                                ("x-tenant", tenant.as_bytes()),
                            ],
                            "{}",
                        )
                        .await
                    }
                };
                let a = as_tenant("a").await;
                let b = as_tenant("b").await;
                assert!(!a.replayed() && !b.replayed());
                assert_ne!(a.body, b.body);
                assert_eq!(as_tenant("a").await.body, a.body);
                assert_eq!(as_tenant("b").await.body, b.body);
                assert_eq!(s.executions(), 2);
                // Another principal's different request under the same key is its own
                // first request, not a 422 telling it the key was used.
                let c = send(
                    s.addr,
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", b"k-5"),
                        ("content-type", b"application/json"),
                        ("x-tenant", b"c"),
                    ],
                    "{\"amount\":9}",
                )
                .await;
                assert_eq!((c.status, c.replayed()), (201, false), "{c:?}");
                assert_eq!(s.executions(), 3);
                // Keys are stored as digests, never as sent.
                let stored: Vec<String> = sqlx::query_scalar(if $positional {
                    // sqlx reads a `_bin` column as bytes.
                    "SELECT CAST(message_key AS CHAR) FROM idem_inbox"
                } else {
                    "SELECT message_key FROM idem_inbox"
                })
                    .fetch_all(&s.pool)
                    .await
                    .unwrap();
                assert!(
                    stored.iter().all(|k| k.len() == 64 && !k.contains("k-5")),
                    "{stored:?}"
                );
            }

            #[tokio::test]
            async fn a_leased_request_longer_than_its_lease_keeps_its_key() {
                let Some(s) = start().await else { return };
                let addr = s.addr;
                let first = tokio::spawn(async move { post(addr, "/charge-long", "k-long", "{}").await });
                // Repeats while the first runs three leases: its lease is extended as it runs,
                // so none takes the key over.
                for _ in 0..4 {
                    tokio::time::sleep(SHORT_LEASE * 6 / 10).await;
                    let repeat = post(s.addr, "/charge-long", "k-long", "{}").await;
                    assert!(is_problem(&repeat, 409), "{repeat:?}");
                    assert!(repeat.header("retry-after").is_some());
                }
                let first = first.await.unwrap();
                assert_eq!((first.status, first.body.as_str()), (201, "charged 1"));
                let again = post(s.addr, "/charge-long", "k-long", "{}").await;
                assert_eq!((again.status, again.replayed()), (201, true), "{again:?}");
                assert_eq!(again.body, "charged 1");
                assert_eq!(s.executions(), 1);
            }

            #[tokio::test]
            async fn a_hung_handler_keeps_other_keys_waiting_no_longer_than_max_wait() {
                let Some(s) = start().await else { return };
                let addr = s.addr;
                let hung = tokio::spawn(async move { post(addr, "/slow", "k-hung", "{}").await });
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // The hung handler's transaction is open. On SQLite it holds the one writer:
                // another key waits at most `max_wait` (300 ms) for it, then a 503 with
                // `Retry-After`, and nothing ran; PostgreSQL and MySQL let it through.
                let other = tokio::time::timeout(
                    Duration::from_secs(5),
                    post(s.addr, "/bounded", "k-other", "{\"amount\":1}"),
                )
                .await
                .expect("the wait for the writer is bounded");
                let sqlite = std::any::TypeId::of::<$db>() == std::any::TypeId::of::<sqlx::Sqlite>();
                if sqlite {
                    assert!(is_problem(&other, 503), "{other:?}");
                    assert_eq!(other.header("retry-after"), Some("1"));
                    assert_eq!(s.executions(), 1, "the refused request ran nothing");
                } else {
                    assert_eq!((other.status, other.replayed()), (201, false), "{other:?}");
                }
                s.app.gate.add_permits(1);
                assert_eq!(hung.await.unwrap().status, 200);
                // The refused request recorded nothing: its retry runs, once.
                let again = post(s.addr, "/bounded", "k-other", "{\"amount\":1}").await;
                assert_eq!(again.status, 201, "{again:?}");
                assert_eq!(again.replayed(), !sqlite);
                assert_eq!(s.effects().await, 2);
            }

            #[tokio::test]
            async fn bodies_over_the_limit_are_413_whatever_their_framing_says() {
                let Some(s) = start().await else { return };
                // Content-Length says 10, the body is 2 MiB: the layer reads through its
                // limit (1 MiB), never trusting the header (a service called directly, with a
                // body no HTTP server would frame so).
                let mut service = tower_layer::Layer::layer(&s.layer, axum::routing::any(|| async { "ran" }));
                let request = axum::http::Request::post("/orders")
                    .header("idempotency-key", "k-lying")
                    .header("content-length", "10")
                    .body(axum::body::Body::from(vec![b'x'; 2 * 1024 * 1024]))
                    .unwrap();
                type Request = axum::http::Request<axum::body::Body>;
                std::future::poll_fn(|cx| {
                    <_ as tower_service::Service<Request>>::poll_ready(&mut service, cx)
                })
                .await
                .unwrap();
                let response = tower_service::Service::call(&mut service, request).await.unwrap();
                assert_eq!(response.status(), 413);
                // A chunked body over the limit, over TCP (`/small` keeps 64 bytes).
                let mut stream = tokio::net::TcpStream::connect(s.addr).await.unwrap();
                let chunk = "y".repeat(100);
                let raw = format!(
                    "POST /small HTTP/1.1\r\nhost: idem\r\nidempotency-key: k-chunked\r\n\
                     content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
                     64\r\n{chunk}\r\n64\r\n{chunk}\r\n0\r\n\r\n"
                );
                tokio::io::AsyncWriteExt::write_all(&mut stream, raw.as_bytes()).await.unwrap();
                let mut head = [0u8; 12];
                tokio::io::AsyncReadExt::read_exact(&mut stream, &mut head).await.unwrap();
                assert_eq!(&head, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&head));
                assert_eq!(s.executions(), 0, "no handler ran");
                assert_eq!(s.records().await, 0, "nothing was recorded");
            }

            #[tokio::test]
            async fn keys_too_long_after_unescaping_or_huge_headers_are_400_with_no_database_work() {
                let Some(s) = start().await else { return };
                // 256 characters once unescaped (each `\"` is one), 382 as sent.
                let quoted = format!("\"{}{}\"", "\\\"".repeat(126), "k".repeat(130));
                let long = post(s.addr, "/orders", &quoted, "{}").await;
                assert!(is_problem(&long, 400), "{long:?}");
                assert!(long.body.contains("256 characters"), "{}", long.body);
                // Exactly 255 unescaped characters is a key.
                let at_limit = format!("\"{}{}\"", "\\\"".repeat(125), "k".repeat(130));
                assert_eq!(post(s.addr, "/orders", &at_limit, "{}").await.status, 201);
                let huge = "k".repeat(8 * 1024);
                let refused = post(s.addr, "/orders", &huge, "{}").await;
                assert!(is_problem(&refused, 400), "{refused:?}");
                assert_eq!(s.executions(), 1, "only the key at the limit ran");
                assert_eq!(s.records().await, 1, "the refused keys wrote nothing");
            }

            #[tokio::test]
            async fn a_damaged_stored_response_is_a_500_that_says_so() {
                let Some(s) = start().await else { return };
                let first = post(s.addr, "/orders", "k-damaged", "{\"amount\":5}").await;
                assert_eq!(first.status, 201);
                let stored: String = sqlx::query_scalar("SELECT result FROM idem_inbox")
                    .fetch_one(&s.pool)
                    .await
                    .unwrap();
                /// The stored response's object, wherever the record nests it.
                fn response(value: &mut serde_json::Value) -> &mut serde_json::Map<String, serde_json::Value> {
                    let nested = value.get("status").is_none();
                    let serde_json::Value::Object(map) = value else {
                        panic!("not a stored response: {value}")
                    };
                    if nested {
                        return response(map.values_mut().next().unwrap());
                    }
                    map
                }
                let damaged_by = |damage: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
                    let mut value: serde_json::Value = serde_json::from_str(&stored).unwrap();
                    damage(response(&mut value));
                    value.to_string()
                };
                let cases = [
                    damaged_by(&|r| { r.insert("status".into(), 99.into()); }),
                    damaged_by(&|r| { r.insert("headers".into(), serde_json::json!([["bad header", "x"]])); }),
                    damaged_by(&|r| { r.insert("body".into(), serde_json::json!({"base64": "not base64!"})); }),
                    stored[..stored.len() / 2].to_owned(),
                ];
                for damaged in cases {
                    sqlx::query(common::placed($positional, "UPDATE idem_inbox SET result = $1"))
                        .bind(&damaged)
                        .execute(&s.pool)
                        .await
                        .unwrap();
                    let again = post(s.addr, "/orders", "k-damaged", "{\"amount\":5}").await;
                    assert!(is_problem(&again, 500), "{damaged}: {again:?}");
                    assert!(again.body.contains("damaged"), "{damaged}: {}", again.body);
                }
                assert_eq!(s.executions(), 1, "a damaged record never runs the request again");
            }

            #[tokio::test]
            async fn an_unscoped_layer_shares_keys_across_principals_as_it_says() {
                let Some(s) = start().await else { return };
                // `/small`'s layer is `.unscoped()`: one scope for every caller.
                let as_tenant = |tenant: &'static str, body: &'static str| {
                    let addr = s.addr;
                    async move {
                        send(
                            addr,
                            "POST",
                            "/small",
                            &[
                                ("idempotency-key", b"k-shared"),
                                ("content-type", b"application/json"),
                                ("x-tenant", tenant.as_bytes()),
                            ],
                            body,
                        )
                        .await
                    }
                };
                let a = as_tenant("a", "{}").await;
                let b = as_tenant("b", "{}").await;
                assert_eq!((a.status, a.replayed()), (201, false), "{a:?}");
                assert_eq!((b.status, b.replayed()), (201, true), "{b:?}");
                assert_eq!(b.body, a.body);
                assert!(is_problem(&as_tenant("c", "{\"amount\":1}").await, 422));
                assert_eq!(s.executions(), 1);
            }

            #[tokio::test]
            async fn server_errors_and_rejections_are_not_stored() {
                let Some(s) = start().await else { return };
                let failed = post(s.addr, "/fail", "k-6", "{}").await;
                assert_eq!((failed.status, failed.body.as_str()), (500, "failed 1"));
                assert_eq!(
                    s.effects().await,
                    0,
                    "a 5xx rolls the handler's writes back"
                );
                let again = post(s.addr, "/fail", "k-6", "{}").await;
                assert_eq!((again.status, again.body.as_str()), (500, "failed 2"));
                assert!(!again.replayed());
                // The body extractor refuses the request before the handler runs: not
                // stored, so the corrected request runs under the same key.
                let rejected = post(s.addr, "/validated", "k-7", "{\"amount\":\"five\"}").await;
                assert_eq!(rejected.status, 422, "{rejected:?}");
                let fixed = post(s.addr, "/validated", "k-7", "{\"amount\":5}").await;
                assert_eq!((fixed.status, fixed.body.as_str()), (200, "order of 5"));
                assert_eq!(s.records().await, 1);
            }

            #[tokio::test]
            async fn a_body_over_the_limit_is_413_and_nothing_runs() {
                let Some(s) = start().await else { return };
                let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
                let reply = post(s.addr, "/small", "k-8", &big).await;
                assert!(is_problem(&reply, 413), "{reply:?}");
                assert_eq!(post(s.addr, "/small", "k-8", "{}").await.status, 201);
                assert_eq!(s.executions(), 1);
            }

            #[tokio::test]
            async fn a_transition_route_is_an_http_replay_and_an_already_done() {
                let Some(s) = start().await else { return };
                let paid = post(s.addr, "/orders/7/pay", "pay-1", "").await;
                assert_eq!((paid.status, paid.body.as_str()), (200, "paid 7"));
                let replay = post(s.addr, "/orders/7/pay", "pay-1", "").await;
                assert!(replay.replayed());
                assert_eq!(replay.body, "paid 7");
                // Another key: the request runs, and the transition is already done.
                let other = post(s.addr, "/orders/7/pay", "pay-2", "").await;
                assert_eq!(
                    (other.status, other.body.as_str()),
                    (200, "already: paid 7")
                );
                assert!(!other.replayed());
                assert_eq!(s.effects().await, 1);
            }

            #[tokio::test]
            async fn a_key_runs_again_after_its_record_is_purged() {
                let Some(s) = start().await else { return };
                assert_eq!(post(s.addr, "/orders", "k-9", "{}").await.status, 201);
                assert!(post(s.addr, "/orders", "k-9", "{}").await.replayed());
                assert_eq!(s.layer.purge(100).await.unwrap(), 0, "within the retention");
                s.clock
                    .advance(s.layer.retention_period() + Duration::from_secs(1));
                assert_eq!(s.layer.purge(100).await.unwrap(), 1);
                let again = post(s.addr, "/orders", "k-9", "{}").await;
                assert!(!again.replayed());
                assert_eq!(s.executions(), 2);
            }

            async fn outside_calls(s: &Server) -> Vec<i64> {
                sqlx::query_scalar("SELECT calls FROM external_charges")
                    .fetch_all(&s.pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn leased_a_repeat_is_replayed_and_the_outside_call_made_once() {
                let Some(s) = start().await else { return };
                let first = post(s.addr, "/charge", "c-1", "{}").await;
                assert_eq!((first.status, first.body.as_str()), (201, "charged 1"));
                let again = post(s.addr, "/charge", "c-1", "{}").await;
                assert!(again.replayed(), "{again:?}");
                assert_eq!(again.body, "charged 1");
                assert!(is_problem(&post(s.addr, "/charge", "c-1", "{\"x\":1}").await, 422));
                assert_eq!(outside_calls(&s).await, [1]);
            }

            #[tokio::test]
            async fn leased_a_failed_attempt_runs_again_with_the_same_outside_key() {
                let Some(s) = start().await else { return };
                s.app.fail_next.store(true, Ordering::SeqCst);
                let failed = post(s.addr, "/charge", "c-2", "{}").await;
                assert_eq!((failed.status, failed.body.as_str()), (502, "gateway down 1"));
                let retried = post(s.addr, "/charge", "c-2", "{}").await;
                assert_eq!((retried.status, retried.body.as_str()), (201, "charged 2"));
                assert!(!retried.replayed());
                // One outside key for both attempts: the payment API saw the same charge twice.
                assert_eq!(outside_calls(&s).await, [2]);
                assert!(post(s.addr, "/charge", "c-2", "{}").await.replayed());
            }

            #[tokio::test]
            async fn leased_a_repeat_waits_for_the_lease_then_takes_the_key_over() {
                let Some(s) = start().await else { return };
                s.app.hold_next.store(true, Ordering::SeqCst);
                let first = tokio::spawn(post(s.addr, "/charge", "c-3", "{}"));
                while s.executions() == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let during = post(s.addr, "/charge", "c-3", "{}").await;
                assert!(is_problem(&during, 409), "{during:?}");
                assert_eq!(during.header("retry-after"), Some("30"), "the lease's end");
                // The first request hangs past its lease: a repeat takes the key over.
                s.clock.advance(LEASE + Duration::from_secs(1));
                let taken = post(s.addr, "/charge", "c-3", "{}").await;
                assert_eq!((taken.status, taken.body.as_str()), (201, "charged 2"));
                s.app.gate.add_permits(1);
                // The first one's response still reaches its client, but is not recorded.
                assert_eq!(first.await.unwrap().body, "charged 1");
                let replay = post(s.addr, "/charge", "c-3", "{}").await;
                assert_eq!(replay.body, "charged 2");
                assert_eq!(outside_calls(&s).await, [2], "one outside key throughout");
            }

            #[tokio::test]
            async fn an_optional_key_may_be_left_out() {
                let Some(s) = start().await else { return };
                let no_key = [("content-type", &b"application/json"[..])];
                assert_eq!(
                    send(s.addr, "POST", "/optional", &no_key, "{}")
                        .await
                        .status,
                    201
                );
                assert_eq!(
                    send(s.addr, "POST", "/optional", &no_key, "{}")
                        .await
                        .status,
                    201
                );
                assert_eq!(s.executions(), 2);
                assert_eq!(s.effects().await, 2, "the handler's writes commit");
                assert_eq!(s.records().await, 0);
                assert!(post(s.addr, "/optional", "k-10", "{}").await.status == 201);
                assert!(post(s.addr, "/optional", "k-10", "{}").await.replayed());
            }
        }
    };
}

http_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("http-{}", common::next_id()), 4).await)
);
http_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("http_{}", common::next_id()), 8).await
);
// MySQL: a repeat in flight waits for the first's record (its row lock), as on SQLite,
// then replays it.
http_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("http_{}", common::next_id()), 8).await,
    positional = true
);
