//! The HTTP layer under crashes: a child process serves the idempotent route and is killed
//! with SIGKILL at a named point of a request (after its key record, after the handler,
//! after the commit and before the response), so the client gets no answer; the client
//! retries against another instance of the service on the same database.
//!
//! - Killed before the commit: nothing was kept; the retry runs the handler once.
//! - Killed after the commit: the retry gets the first response, replayed, and the handler
//!   does not run again.
//!
//! The child is this test binary running only its ignored test [`http_crash_child`]; its
//! fault hook blocks at the point under test until the parent kills it (no timing).

#[path = "common/brokers.rs"]
mod brokers;
#[path = "common/child.rs"]
mod child;
mod common;
#[path = "common/http_client.rs"]
mod http_client;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use brokers::Db;
use child::{ChildProcess, report};
use http_client::{Reply, serve, try_post};
use idem::fault::FaultPoint;
use idem::http::{IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

const KEY: &str = "\"crash-1\"";
const BODY: &str = "{\"amount\":5}";

fn this_process() -> i64 {
    i64::from(std::process::id())
}

/// The points a request passes, in order.
const POINTS: [FaultPoint; 3] = [
    FaultPoint::Recorded,
    FaultPoint::BodyDone,
    FaultPoint::Committed,
];

macro_rules! service {
    ($module:ident, $db:ty, $variant:ident) => {
        mod $module {
            use super::*;

            async fn create(mut tx: Tx<$db>) -> Result<(StatusCode, String), StatusCode> {
                sqlx::query(
                    "INSERT INTO effects (order_id, kind, amount) VALUES (1, 'create', $1)",
                )
                .bind(this_process())
                .execute(&mut **tx)
                .await
                .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                Ok((
                    StatusCode::CREATED,
                    format!("{{\"process\":{}}}", this_process()),
                ))
            }

            /// The service, on `db`.
            pub async fn start(db: Db) -> SocketAddr {
                let Db::$variant(pool) = db else {
                    panic!("not a {} database", stringify!($variant))
                };
                let layer = IdempotencyLayer::new(pool, Inbox::new("http-crashes").unwrap());
                serve(Router::new().route("/orders", post(create).layer(layer))).await
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
    }
}

async fn effects(db: &Db) -> Vec<i64> {
    let sql = "SELECT amount FROM effects";
    match db {
        Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
        Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(pool).await.unwrap(),
    }
}

/// A client's retry: like a client that honours 409 (the killed process's transaction may
/// take the server a moment to end), for at most 10 s.
async fn retry(addr: SocketAddr) -> Reply {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = try_post(addr, "/orders", KEY, BODY).await.unwrap();
        if reply.status != 409 || tokio::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn crash(db: Option<Db>, point: FaultPoint) {
    let Some(db) = db else { return };
    let env = [
        ("IDEM_HTTP_CRASH_DB", db.spec()),
        ("IDEM_HTTP_CRASH_POINT", point.name().to_owned()),
    ];
    let mut child = ChildProcess::spawn("http_crash_child", &env, &[]);
    let child_process: i64 = child.step("process ").await["process ".len()..]
        .parse()
        .unwrap();
    let port: u16 = child.step("listening ").await["listening ".len()..]
        .parse()
        .unwrap();
    let request = tokio::spawn(try_post(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "/orders",
        KEY,
        BODY,
    ));
    let at = POINTS.iter().position(|p| *p == point).unwrap();
    for before in &POINTS[..at] {
        child.step(&format!("point {}", before.name())).await;
    }
    child.step(&format!("crash-point {}", point.name())).await;
    let committed = point == FaultPoint::Committed;
    assert_eq!(
        effects(&db).await.len(),
        usize::from(committed),
        "effects while the child stands at the point"
    );

    child.kill();
    let lost = request.await.unwrap();
    assert!(lost.is_err(), "the client got no response: {lost:?}");

    // The client retries against another instance of the service.
    let addr = start(Db::connect(&db.spec()).await).await;
    let reply = retry(addr).await;
    assert_eq!(reply.status, 201, "{reply:?}");
    if committed {
        assert!(
            reply.replayed(),
            "the committed first response is replayed: {reply:?}"
        );
        assert_eq!(reply.body, format!("{{\"process\":{child_process}}}"));
        assert_eq!(effects(&db).await, [child_process]);
    } else {
        assert!(
            !reply.replayed(),
            "nothing was kept, the retry runs: {reply:?}"
        );
        assert_eq!(reply.body, format!("{{\"process\":{}}}", this_process()));
        assert_eq!(effects(&db).await, [this_process()]);
    }
    let again = retry(addr).await;
    assert!(again.replayed());
    assert_eq!(again.body, reply.body);
    assert_eq!(effects(&db).await.len(), 1);
}

/// The point under test, in the child.
static TARGET: OnceLock<FaultPoint> = OnceLock::new();

/// The child's fault hook: reports each point; at the target, blocks until killed.
fn stop_at_target(point: FaultPoint) {
    if TARGET.get() == Some(&point) {
        report(&format!("crash-point {}", point.name()));
        loop {
            std::thread::park();
        }
    }
    report(&format!("point {}", point.name()));
}

#[test]
#[ignore = "the child process of the HTTP crash tests, which run it"]
fn http_crash_child() {
    let Ok(spec) = std::env::var("IDEM_HTTP_CRASH_DB") else {
        eprintln!("http_crash_child runs only as the child of an HTTP crash test");
        return;
    };
    let point = std::env::var("IDEM_HTTP_CRASH_POINT").unwrap();
    TARGET
        .set(FaultPoint::from_name(&point).expect("a fault point"))
        .unwrap();
    assert!(idem::fault::set_hook(stop_at_target));
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
    ($($test:ident at $point:ident;)*) => {
        mod killed {
            use super::*;
            $(
                mod $test {
                    use super::*;
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn postgres() {
                        let name = concat!("http_crash_pg_", stringify!($test));
                        crash(Db::postgres(name, 4).await, FaultPoint::$point).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sqlite() {
                        let name = concat!("http_crash_sqlite_", stringify!($test));
                        crash(Some(Db::sqlite(name, 4).await), FaultPoint::$point).await;
                    }
                }
            )*
        }
    };
}

crash_tests! {
    after_the_key_record at Recorded;
    after_the_handler at BodyDone;
    after_the_commit_before_the_response at Committed;
}
