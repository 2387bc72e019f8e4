//! The HTTP layer under crashes: a child process serves the idempotent route and is killed
//! with SIGKILL at a named point of a request, so the client gets no answer; the client
//! retries against another instance of the service on the same database.
//!
//! The transactional route, killed after the key record, after the handler, or after the
//! commit and before the response:
//! - before the commit nothing was kept, and the retry runs the handler once;
//! - after it, the retry gets the first response, replayed, and the handler does not run.
//!
//! The optimistic route (the key recorded with the response after the handler), killed after
//! the handler, after the record's insert, or after the commit: the same.
//!
//! The leased route (its handler calls a service outside the database that deduplicates by
//! idempotency key), killed after the claim, after the outside call, or after the commit:
//! the key is held no longer than the lease (the retry gets 409s until then), then the retry
//! takes it over and runs the handler, whose outside call carries the same derived key; after
//! the commit, the retry is replayed.
//!
//! The child is this test binary running only its ignored test [`http_crash_child`]; its
//! fault hook blocks at the point under test until the parent kills it (no timing).

use crate::brokers;
use crate::child;
use crate::http_client;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use brokers::Db;
use child::{ChildProcess, report};
use http_client::{Reply, serve, try_post};
use idem::fault::FaultPoint;
use idem::http::{Committed, IdempotencyLayer, RequestKey, Tx};
use idem::inbox::Inbox;
use std::net::SocketAddr;
use std::time::Duration;

const KEY: &str = "\"crash-1\"";
const BODY: &str = "{\"amount\":5}";

fn this_process() -> i64 {
    i64::from(std::process::id())
}

/// The leased route's lease: how long a crashed request holds its key.
const LEASE: Duration = Duration::from_secs(1);

/// The points a request passes, in order: on the transactional route (`/orders`), on the
/// optimistic one (`/optimistic`) and on the leased one (`/charge`).
fn points(path: &str) -> [FaultPoint; 3] {
    match path {
        "/orders" => [
            FaultPoint::Recorded,
            FaultPoint::BodyDone,
            FaultPoint::Committed,
        ],
        // The optimistic form records the key after the handler, just before the commit.
        "/optimistic" => [
            FaultPoint::BodyDone,
            FaultPoint::Recorded,
            FaultPoint::Committed,
        ],
        _ => [
            FaultPoint::Claimed,
            FaultPoint::WorkDone,
            FaultPoint::Committed,
        ],
    }
}

/// The outside service of the leased route: it deduplicates by idempotency key, counts the
/// calls, and answers with the process of the first.
const EXTERNAL: &str = "CREATE TABLE external_charges (
    idempotency_key TEXT PRIMARY KEY,
    process BIGINT NOT NULL,
    calls BIGINT NOT NULL
)";

macro_rules! service {
    ($module:ident, $db:ty, $variant:ident) => {
        mod $module {
            use super::*;

            async fn create(mut tx: Tx<$db>) -> Result<Committed<(StatusCode, String)>, StatusCode> {
                sqlx::query(
                    "INSERT INTO effects (order_id, kind, amount) VALUES (1, 'create', $1)",
                )
                .bind(this_process())
                .execute(&mut **tx)
                .await
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                Ok(tx.commit((
                    StatusCode::CREATED,
                    format!("{{\"process\":{}}}", this_process()),
                )))
            }

            /// The leased handler: one call outside the database, with the derived key.
            async fn charge(
                State(pool): State<sqlx::Pool<$db>>,
                key: RequestKey,
            ) -> Result<(StatusCode, String), StatusCode> {
                let first: i64 = sqlx::query_scalar(
                    "INSERT INTO external_charges (idempotency_key, process, calls) VALUES ($1, $2, 1) \
                     ON CONFLICT (idempotency_key) DO UPDATE SET calls = external_charges.calls + 1 \
                     RETURNING process",
                )
                .bind(key.derive("charge"))
                .bind(this_process())
                .fetch_one(&pool)
                .await
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                Ok((StatusCode::CREATED, format!("{{\"process\":{first}}}")))
            }

            /// The service, on `db`.
            pub async fn start(db: Db) -> SocketAddr {
                let Db::$variant(pool) = db else {
                    panic!("not a {} database", stringify!($variant))
                };
                let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("http-crashes").unwrap()).unscoped();
                let leased = IdempotencyLayer::new(pool.clone(), Inbox::new("http-crashes-leased").unwrap()).unscoped()
                    .leased(LEASE);
                let optimistic = IdempotencyLayer::new(pool.clone(), Inbox::new("http-crashes-optimistic").unwrap())
                    .unscoped()
                    .optimistic();
                let router = Router::new()
                    .route("/orders", post(create).layer(layer))
                    .route("/optimistic", post(create).layer(optimistic))
                    .route("/charge", post(charge).layer(leased))
                    .with_state(pool);
                serve(router).await
            }
        }
    };
}

service!(on_postgres, sqlx::Postgres, Postgres);
service!(on_sqlite, sqlx::Sqlite, Sqlite);

async fn start(db: Db) -> SocketAddr {
    match db {
        Db::Postgres(_) => on_postgres::start(db).await,
        Db::Sqlite(_) => on_sqlite::start(db).await,
        Db::MySql(_) => unreachable!("the HTTP crash tests run on PostgreSQL and SQLite"),
    }
}

async fn effects(db: &Db, path: &str) -> Vec<i64> {
    let sql = match path {
        "/orders" | "/optimistic" => "SELECT amount FROM effects",
        _ => "SELECT calls FROM external_charges",
    };
    match db {
        Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
        Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
        Db::MySql(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
    }
}

/// A client's retry: like a client that honours 409 (the killed process's transaction may
/// take the server a moment to end), for at most 10 s.
async fn retry(addr: SocketAddr, path: &str) -> Reply {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = try_post(addr, path, KEY, BODY).await.unwrap();
        if reply.status != 409 || tokio::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn crash(db: Option<Db>, path: &'static str, point: FaultPoint) {
    let Some(db) = db else { return };
    match &db {
        Db::Postgres(pool) => sqlx::query(EXTERNAL).execute(pool).await.map(drop),
        Db::Sqlite(pool) => sqlx::query(EXTERNAL).execute(pool).await.map(drop),
        Db::MySql(pool) => sqlx::query(EXTERNAL).execute(pool).await.map(drop),
    }
    .unwrap();
    let env = [
        ("IDEM_HTTP_CRASH_DB", db.spec()),
        ("IDEM_HTTP_CRASH_POINT", point.name().to_owned()),
    ];
    let mut child = ChildProcess::spawn("http_crashes::http_crash_child", &env, &[]);
    let child_process: i64 = child.step("process ").await["process ".len()..]
        .parse()
        .unwrap();
    let port: u16 = child.step("listening ").await["listening ".len()..]
        .parse()
        .unwrap();
    let request = tokio::spawn(try_post(
        SocketAddr::from(([127, 0, 0, 1], port)),
        path,
        KEY,
        BODY,
    ));
    let points = points(path);
    let at = points.iter().position(|p| *p == point).unwrap();
    for before in &points[..at] {
        child.step(&format!("point {}", before.name())).await;
    }
    child.step(&format!("crash-point {}", point.name())).await;
    let committed = point == FaultPoint::Committed;
    // The transactional route's effect commits with its record; the leased route's
    // outside call happened once the handler returned.
    let done = committed || point == FaultPoint::WorkDone;
    assert_eq!(
        effects(&db, path).await.len(),
        usize::from(done),
        "effects while the child stands at the point"
    );

    child.kill();
    let lost = request.await.unwrap();
    assert!(lost.is_err(), "the client got no response: {lost:?}");

    // The client retries against another instance of the service; on the leased route a
    // crashed request holds its key until its lease ends (409s until then), never longer.
    let addr = start(Db::connect(&db.spec()).await).await;
    let reply = retry(addr, path).await;
    assert_eq!(reply.status, 201, "{reply:?}");
    let child_body = format!("{{\"process\":{child_process}}}");
    let own_body = format!("{{\"process\":{}}}", this_process());
    match (path, point) {
        (_, FaultPoint::Committed) => {
            assert!(
                reply.replayed(),
                "the committed first response is replayed: {reply:?}"
            );
            assert_eq!(reply.body, child_body);
            let effect = if path == "/charge" { 1 } else { child_process };
            assert_eq!(effects(&db, path).await, [effect]);
        }
        ("/orders" | "/optimistic", _) => {
            assert!(
                !reply.replayed(),
                "nothing was kept, the retry runs: {reply:?}"
            );
            assert_eq!(reply.body, own_body);
            assert_eq!(effects(&db, path).await, [this_process()]);
        }
        (_, FaultPoint::Claimed) => {
            // The lease expired and the retry took the key over and ran the handler.
            assert!(!reply.replayed());
            assert_eq!(reply.body, own_body);
            assert_eq!(effects(&db, path).await, [1]);
        }
        _ => {
            // The outside call had happened: the takeover calls again with the same key,
            // and the outside service answers with the first call's result.
            assert!(!reply.replayed());
            assert_eq!(reply.body, child_body);
            assert_eq!(effects(&db, path).await, [2]);
        }
    }
    let again = retry(addr, path).await;
    assert!(again.replayed());
    assert_eq!(again.body, reply.body);
}

#[test]
#[ignore = "the child process of the HTTP crash tests, which run it"]
fn http_crash_child() {
    let Ok(spec) = std::env::var("IDEM_HTTP_CRASH_DB") else {
        eprintln!("http_crash_child runs only as the child of an HTTP crash test");
        return;
    };
    let point = std::env::var("IDEM_HTTP_CRASH_POINT").unwrap();
    child::stop_at(FaultPoint::from_name(&point).expect("a fault point"));
    report(&format!("process {}", this_process()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let addr = start(Db::connect(&spec).await).await;
        report(&format!("listening {}", addr.port()));
        std::future::pending::<()>().await
    });
}

macro_rules! crash_tests {
    ($($test:ident: $path:literal at $point:ident;)*) => {
        mod killed {
            use super::*;
            $(
                mod $test {
                    use super::*;
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn postgres() {
                        let name = concat!("http_crash_pg_", stringify!($test));
                        crash(Db::postgres(name, 4).await, $path, FaultPoint::$point).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sqlite() {
                        let name = concat!("http_crash_sqlite_", stringify!($test));
                        crash(Some(Db::sqlite(name, 4).await), $path, FaultPoint::$point).await;
                    }
                }
            )*
        }
    };
}

crash_tests! {
    after_the_key_record: "/orders" at Recorded;
    after_the_handler: "/orders" at BodyDone;
    after_the_commit_before_the_response: "/orders" at Committed;
    optimistic_after_the_handler: "/optimistic" at BodyDone;
    optimistic_after_the_record: "/optimistic" at Recorded;
    optimistic_after_the_commit_before_the_response: "/optimistic" at Committed;
    leased_after_the_claim: "/charge" at Claimed;
    leased_after_the_outside_call: "/charge" at WorkDone;
    leased_after_the_commit_before_the_response: "/charge" at Committed;
}
