//! The Idempotency-Key layer against the same axum handler without idempotency and with
//! the key table written by hand in the handler's transaction, over loopback HTTP.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test cargo bench -p idem --bench http
//! ```
//!
//! Six routes on one server, one handler each (insert one effect row, answer 201 with a body):
//! - `plain`: no idempotency; the handler begins and commits its own transaction;
//! - `idem`: behind `IdempotencyLayer`, the handler writes through its `Tx`;
//! - `idem-optimistic`: the same behind `IdempotencyLayer::optimistic` (the key recorded
//!   with the response, just before the commit);
//! - `by-hand`: the handler begins, inserts the key's digest into a key table
//!   (`ON CONFLICT DO NOTHING`), on a conflict reads the stored response and replays it (or
//!   answers 422 for another request), else writes the effect, stores the response, commits;
//! - `by-hand-inbox`: the same by hand, with idem's statements on idem's table (its inbox
//!   insert, its store of the response): tells the cost of idem's statements and schema from
//!   the cost of its layer;
//! - `by-hand-optimistic`: `by-hand` in the optimistic form (the effect, then the key with
//!   its response in one insert, then the commit; a taken key rolls back and replays): the
//!   floor of `idem-optimistic`.
//!
//! Two workloads: every key once; every key twice (the second send a retry). 1, 8 and 32
//! clients, each on its own keep-alive connection. Every cell runs each route `ROUNDS` times
//! in a fresh random order per round; the table shows medians and the median of the
//! per-round ratios to `plain` (no idempotency). Every run starts from empty tables after a checkpoint, and
//! reports the CPU time per request of this process (clients and server, and SQLite) and of
//! PostgreSQL's processes (`/proc/<pid>/task/*/sched`): on two cores the throughput is
//! bounded by CPU, and CPU time is far less noisy than throughput. `IDEM_BENCH_REQUESTS` (default 2000) and
//! `IDEM_BENCH_ROUNDS` (default 5) scale it; `IDEM_BENCH_SQLITE=0` skips SQLite;
//! `IDEM_BENCH_ROUTES=idem` runs only some routes (and `plain`, the baseline).

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use env::env_usize;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use idem::http::{IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const ROUTES: [&str; 6] = [
    "plain",
    "idem",
    "idem-optimistic",
    "by-hand",
    "by-hand-inbox",
    "by-hand-optimistic",
];
/// The route the others are compared with.
const BASELINE: usize = 0;

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    text
}

/// The hand-written key table, with what retention needs (a time, and an index on it to
/// purge by), as the layer's records have.
const KEY_TABLE: &str = "CREATE TABLE http_keys (
    key_digest TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status BIGINT,
    response TEXT,
    created_at BIGINT NOT NULL
)";
const KEY_TABLE_INDEX: &str = "CREATE INDEX http_keys_created_at ON http_keys (created_at)";

macro_rules! routes {
    ($module:ident, $db:ty, $pool:ty, $begin:expr) => {
        mod $module {
            use super::*;

            fn key_of(headers: &HeaderMap) -> String {
                headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            }

            async fn plain(State(pool): State<$pool>, headers: HeaderMap, body: String) -> Response {
                let mut tx = pool.begin_with($begin).await.unwrap();
                sqlx::query("INSERT INTO effects (request_key, body) VALUES ($1, $2)")
                    .bind(key_of(&headers))
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                (StatusCode::CREATED, format!("{{\"created\":{}}}", body.len())).into_response()
            }

            async fn idem_route(mut tx: Tx<$db>, headers: HeaderMap, body: String) -> Response {
                sqlx::query("INSERT INTO effects (request_key, body) VALUES ($1, $2)")
                    .bind(key_of(&headers))
                    .bind(&body)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                tx.commit((StatusCode::CREATED, format!("{{\"created\":{}}}", body.len()))).into_response()
            }

            /// The hand-written routes' answer to a taken key: its stored response replayed
            /// (or a 422 for another request), the transaction rolled back.
            async fn replay(
                mut tx: sqlx::Transaction<'_, $db>,
                digest: &str,
                fingerprint: &str,
            ) -> Response {
                let (stored_fingerprint, status, response): (String, Option<i64>, Option<String>) =
                    sqlx::query_as(
                        "SELECT fingerprint, status, response FROM http_keys WHERE key_digest = $1",
                    )
                    .bind(digest)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                tx.rollback().await.unwrap();
                if stored_fingerprint != fingerprint {
                    return StatusCode::UNPROCESSABLE_ENTITY.into_response();
                }
                let status = StatusCode::from_u16(status.unwrap_or(409) as u16).unwrap();
                (status, [("idempotent-replayed", "true")], response.unwrap_or_default())
                    .into_response()
            }

            async fn by_hand(State(pool): State<$pool>, headers: HeaderMap, body: String) -> Response {
                let key = key_of(&headers);
                let digest = hex(&Sha256::digest(key.as_bytes()));
                let fingerprint = hex(&Sha256::digest(format!("POST\n/by-hand\n{body}").as_bytes()));
                let mut tx = pool.begin_with($begin).await.unwrap();
                let inserted = sqlx::query(
                    "INSERT INTO http_keys (key_digest, fingerprint, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (key_digest) DO NOTHING",
                )
                .bind(&digest)
                .bind(&fingerprint)
                .bind(now_millis())
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected();
                if inserted == 0 {
                    return replay(tx, &digest, &fingerprint).await;
                }
                sqlx::query("INSERT INTO effects (request_key, body) VALUES ($1, $2)")
                    .bind(&key)
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let response = format!("{{\"created\":{}}}", body.len());
                sqlx::query("UPDATE http_keys SET status = 201, response = $2 WHERE key_digest = $1")
                    .bind(&digest)
                    .bind(&response)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                (StatusCode::CREATED, [(header::CONTENT_TYPE, "text/plain")], response).into_response()
            }

            /// `by_hand` in the optimistic form: the effect first, then the key with its
            /// response in one insert, just before the commit; a taken key rolls back and
            /// replays.
            async fn by_hand_optimistic(State(pool): State<$pool>, headers: HeaderMap, body: String) -> Response {
                let key = key_of(&headers);
                let digest = hex(&Sha256::digest(key.as_bytes()));
                let fingerprint = hex(&Sha256::digest(format!("POST\n/by-hand\n{body}").as_bytes()));
                let mut tx = pool.begin_with($begin).await.unwrap();
                sqlx::query("INSERT INTO effects (request_key, body) VALUES ($1, $2)")
                    .bind(&key)
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let response = format!("{{\"created\":{}}}", body.len());
                let inserted = sqlx::query(
                    "INSERT INTO http_keys (key_digest, fingerprint, status, response, created_at) \
                     VALUES ($1, $2, 201, $3, $4) ON CONFLICT (key_digest) DO NOTHING",
                )
                .bind(&digest)
                .bind(&fingerprint)
                .bind(&response)
                .bind(now_millis())
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected();
                if inserted == 0 {
                    return replay(tx, &digest, &fingerprint).await;
                }
                tx.commit().await.unwrap();
                (StatusCode::CREATED, [(header::CONTENT_TYPE, "text/plain")], response).into_response()
            }

            /// `by_hand` with idem's own statements and table.
            async fn by_hand_inbox(State(pool): State<$pool>, headers: HeaderMap, body: String) -> Response {
                let key = key_of(&headers);
                let digest = hex(&Sha256::digest(key.as_bytes()));
                let fingerprint = hex(&Sha256::digest(format!("POST\n/by-hand\n{body}").as_bytes()));
                let mut tx = pool.begin_with($begin).await.unwrap();
                // idem's own insert, as its dialect spells it (the time is the database's).
                let insert = if $begin == "BEGIN" {
                    idem_sql::dialect::Dialect::Postgres.inbox_insert(true).0
                } else {
                    idem_sql::dialect::Dialect::Sqlite.inbox_insert(false).0
                };
                let inserted = sqlx::query(insert)
                    .bind("by-hand")
                    .bind(&digest)
                    .bind(&fingerprint)
                    .bind("SUCCESS")
                    .bind(None::<i64>)
                    .bind(None::<i64>)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .rows_affected();
                if inserted == 0 {
                    let found: Option<(String, Option<String>)> = sqlx::query_as(
                        "SELECT fingerprint, result FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2",
                    )
                    .bind("by-hand")
                    .bind(&digest)
                    .fetch_optional(&mut *tx)
                    .await
                    .unwrap();
                    tx.rollback().await.unwrap();
                    // The key's lock is held: its first request still runs.
                    let Some((stored_fingerprint, response)) = found else {
                        return StatusCode::CONFLICT.into_response();
                    };
                    if stored_fingerprint != fingerprint {
                        return StatusCode::UNPROCESSABLE_ENTITY.into_response();
                    }
                    return (StatusCode::CREATED, [("idempotent-replayed", "true")], response.unwrap_or_default())
                        .into_response();
                }
                sqlx::query("INSERT INTO effects (request_key, body) VALUES ($1, $2)")
                    .bind(&key)
                    .bind(&body)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let response = format!("{{\"created\":{}}}", body.len());
                sqlx::query("UPDATE idem_inbox SET result = $3 WHERE consumer_group = $1 AND message_key = $2")
                    .bind("by-hand")
                    .bind(&digest)
                    .bind(&response)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                (StatusCode::CREATED, [(header::CONTENT_TYPE, "text/plain")], response).into_response()
            }

            pub async fn serve(pool: $pool) -> SocketAddr {
                idem::migrate(&pool).await.unwrap();
                let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("bench").unwrap()).unscoped();
                let app = Router::new()
                    .route("/plain", post(plain))
                    .route("/idem", post(idem_route).layer(layer.clone()))
                    .route("/idem-optimistic", post(idem_route).layer(layer.optimistic()))
                    .route("/by-hand", post(by_hand))
                    .route("/by-hand-inbox", post(by_hand_inbox))
                    .route("/by-hand-optimistic", post(by_hand_optimistic))
                    .with_state(pool);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
                addr
            }
        }
    };
}

routes!(on_postgres, sqlx::Postgres, sqlx::PgPool, "BEGIN");
routes!(on_sqlite, sqlx::Sqlite, sqlx::SqlitePool, "BEGIN IMMEDIATE");

/// One client's connection.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// What one run of one route measured.
struct Run {
    requests_per_second: f64,
    p50: Duration,
    p99: Duration,
    statuses_ok: bool,
    /// CPU time per request of this process (clients and server), microseconds.
    process_cpu: f64,
    /// CPU time per request of the database's processes (PostgreSQL), microseconds.
    database_cpu: f64,
}

/// CPU time, in milliseconds, the scheduler has given the threads of process `pid`
/// (`/proc/<pid>/task/*/sched`, `se.sum_exec_runtime`): nanosecond resolution, unlike the
/// ticks of `/proc/<pid>/stat`. 0 where it cannot be read.
fn cpu_ms(pid: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("sched")).ok())
        .filter_map(|sched| {
            let line = sched
                .lines()
                .find(|l| l.starts_with("se.sum_exec_runtime"))?;
            line.split(':').nth(1)?.trim().parse::<f64>().ok()
        })
        .sum()
}

/// CPU time, in milliseconds, of every `postgres` process on this machine.
fn database_cpu_ms() -> f64 {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    processes
        .flatten()
        .filter(|p| {
            std::fs::read_to_string(p.path().join("comm")).is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|p| cpu_ms(&p.file_name().to_string_lossy()))
        .sum()
}

/// Sends `keys` (each `sends` times, shuffled) to `route` from `clients` connections.
async fn run(
    addr: SocketAddr,
    route: &str,
    prefix: &str,
    keys: usize,
    sends: usize,
    clients: usize,
    database: fn() -> f64,
) -> Run {
    let mut work: Vec<String> = (0..keys)
        .flat_map(|k| std::iter::repeat_n(format!("{prefix}-{k}"), sends))
        .collect();
    work.shuffle(&mut rand::rngs::StdRng::seed_from_u64(keys as u64));
    let chunks: Vec<Vec<String>> = (0..clients)
        .map(|c| work.iter().skip(c).step_by(clients).cloned().collect())
        .collect();
    let (process_before, database_before) = (cpu_ms("self"), database());
    let started = Instant::now();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|keys| {
            let path = format!("/{route}");
            tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let mut latencies = Vec::with_capacity(keys.len());
                let mut ok = true;
                for key in keys {
                    let request = hyper::Request::post(path.as_str())
                        .header("host", "bench")
                        .header("idempotency-key", key.as_str())
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
                        .unwrap();
                    let sent = Instant::now();
                    sender.ready().await.unwrap();
                    let response = sender.send_request(request).await.unwrap();
                    // 409: a retry that overtook its first send (it runs concurrently).
                    ok &= matches!(response.status().as_u16(), 201 | 409);
                    response.into_body().collect().await.unwrap();
                    latencies.push(sent.elapsed());
                }
                (latencies, ok)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut statuses_ok = true;
    for task in tasks {
        let (l, ok) = task.await.unwrap();
        latencies.extend(l);
        statuses_ok &= ok;
    }
    let elapsed = started.elapsed();
    let per_request = |ms: f64| ms * 1e3 / latencies.len() as f64;
    let process_cpu = per_request(cpu_ms("self") - process_before);
    let database_cpu = per_request(database() - database_before);
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Run {
        requests_per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        statuses_ok,
        process_cpu,
        database_cpu,
    }
}

/// `IDEM_BENCH_ROUTES` (e.g. `idem,by-hand`) runs only some routes (the baseline always).
fn selected(route: usize) -> bool {
    route == BASELINE
        || std::env::var("IDEM_BENCH_ROUTES")
            .map_or(true, |names| names.split(',').any(|n| n == ROUTES[route]))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// Effects written for keys starting with `prefix`, and how many keys they were for.
async fn effects(pool: &Db, prefix: &str) -> (i64, i64) {
    let sql = "SELECT COUNT(*), COUNT(DISTINCT request_key) FROM effects WHERE request_key LIKE $1";
    let pattern = format!("{prefix}-%");
    match pool {
        Db::Postgres(p) => sqlx::query_as(sql)
            .bind(pattern)
            .fetch_one(p)
            .await
            .unwrap(),
        Db::Sqlite(p) => sqlx::query_as(sql)
            .bind(pattern)
            .fetch_one(p)
            .await
            .unwrap(),
    }
}

/// Empties the tables and checkpoints, so that every run starts from the same state: the
/// same (empty) indexes to insert into, and no pages already written since the last
/// checkpoint (whose first write after it costs a full page in the log).
async fn reset(pool: &Db) {
    match pool {
        Db::Postgres(p) => {
            sqlx::raw_sql("TRUNCATE effects, http_keys, idem_inbox; CHECKPOINT")
                .execute(p)
                .await
                .unwrap();
        }
        Db::Sqlite(p) => {
            sqlx::raw_sql(
                "DELETE FROM effects; DELETE FROM http_keys; DELETE FROM idem_inbox; \
                 PRAGMA wal_checkpoint(TRUNCATE)",
            )
            .execute(p)
            .await
            .unwrap();
        }
    }
}

enum Db {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

async fn bench(name: &str, db: Db, addr: SocketAddr, requests: usize, rounds: usize) {
    println!("\n### {name}\n");
    println!(
        "| workload | clients | route | requests/s | p50 ms | p99 ms | ratio to plain (min–max) | CPU µs/request: process, database server | duplicate effects |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    // SQLite runs in this process: its CPU time is in the process's.
    let database: fn() -> f64 = match db {
        Db::Postgres(_) => database_cpu_ms,
        Db::Sqlite(_) => || 0.0,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let routes: Vec<usize> = (0..ROUTES.len())
        .filter(|&i| selected(i) && i != BASELINE)
        .collect();
    for (workload, sends) in [("every key once", 1), ("every key twice", 2)] {
        // The chart: per clients, each route's ratio to plain.
        let mut groups = Vec::new();
        for clients in [1, 8, 32] {
            let mut runs: Vec<Vec<Run>> = ROUTES.iter().map(|_| Vec::new()).collect();
            let mut duplicates = [0i64; ROUTES.len()];
            for round in 0..rounds {
                let mut order: Vec<usize> = (0..ROUTES.len()).filter(|&i| selected(i)).collect();
                order.shuffle(&mut rng);
                for i in order {
                    reset(&db).await;
                    let prefix = format!("{}-{sends}-{clients}-{round}", ROUTES[i]);
                    let keys = requests / sends;
                    runs[i]
                        .push(run(addr, ROUTES[i], &prefix, keys, sends, clients, database).await);
                    let (written, distinct) = effects(&db, &prefix).await;
                    duplicates[i] += written - distinct;
                }
            }
            for (i, route) in ROUTES.iter().enumerate().filter(|(i, _)| selected(*i)) {
                let rps = median(runs[i].iter().map(|r| r.requests_per_second).collect());
                let p50 = median(runs[i].iter().map(|r| r.p50.as_secs_f64() * 1e3).collect());
                let p99 = median(runs[i].iter().map(|r| r.p99.as_secs_f64() * 1e3).collect());
                let ratios: Vec<f64> = (0..rounds)
                    .map(|r| runs[i][r].requests_per_second / runs[BASELINE][r].requests_per_second)
                    .collect();
                let (lo, hi) = ratios
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                let ok = runs[i].iter().all(|r| r.statuses_ok);
                let process_cpu = median(runs[i].iter().map(|r| r.process_cpu).collect());
                let database_cpu = median(runs[i].iter().map(|r| r.database_cpu).collect());
                let database_cpu = if database_cpu > 0.0 {
                    format!("{database_cpu:.0}")
                } else {
                    "–".to_owned()
                };
                println!(
                    "| {workload} | {clients} | {route} | {rps:.0} | {p50:.2} | {p99:.2} | {:.2} ({lo:.2}–{hi:.2}) | {process_cpu:.0}, {database_cpu} | {}{} |",
                    median(ratios.clone()),
                    duplicates[i],
                    if ok { "" } else { " (unexpected statuses)" }
                );
            }
            groups.push(chart::Group {
                name: chart::count(clients, "client"),
                bars: routes
                    .iter()
                    .map(|&i| {
                        let ratios: Vec<f64> = (0..rounds)
                            .map(|r| {
                                runs[i][r].requests_per_second
                                    / runs[BASELINE][r].requests_per_second
                            })
                            .collect();
                        Some(chart::Bar::of(ratios))
                    })
                    .collect(),
            });
        }
        let names: Vec<&str> = routes.iter().map(|&i| ROUTES[i]).collect();
        let svg = chart::bars(
            &format!("The Idempotency-Key layer, {name}: {workload}"),
            "requests/s / no idempotency",
            &names,
            &groups,
            1.0,
        );
        let db = chart::slug(name.split(' ').next().unwrap_or(name));
        chart::write(&format!("http-{db}-{}", chart::slug(workload)), &svg);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let requests = env_usize("IDEM_BENCH_REQUESTS", 2000);
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5);
    let effects_table = "CREATE TABLE effects (request_key TEXT NOT NULL, body TEXT NOT NULL)";
    if let Ok(url) = std::env::var("IDEM_BENCH_POSTGRES_URL") {
        let admin = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::raw_sql(
            "DROP SCHEMA IF EXISTS idem_bench_http CASCADE; CREATE SCHEMA idem_bench_http",
        )
        .execute(&admin)
        .await
        .unwrap();
        let separator = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{separator}options=-c%20search_path%3Didem_bench_http");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(40)
            .connect(&url)
            .await
            .unwrap();
        sqlx::query(effects_table).execute(&pool).await.unwrap();
        sqlx::query(KEY_TABLE).execute(&pool).await.unwrap();
        sqlx::query(KEY_TABLE_INDEX).execute(&pool).await.unwrap();
        let addr = on_postgres::serve(pool.clone()).await;
        bench("PostgreSQL", Db::Postgres(pool), addr, requests, rounds).await;
    }
    if std::env::var("IDEM_BENCH_SQLITE").as_deref() != Ok("0") {
        let path = std::env::temp_dir().join("idem-bench-http.db");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let options = idem::sqlite_options(&format!("sqlite:{}", path.display())).unwrap();
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query(effects_table).execute(&pool).await.unwrap();
        sqlx::query(KEY_TABLE).execute(&pool).await.unwrap();
        sqlx::query(KEY_TABLE_INDEX).execute(&pool).await.unwrap();
        let addr = on_sqlite::serve(pool.clone()).await;
        bench(
            "SQLite (a file, WAL, synchronous = FULL)",
            Db::Sqlite(pool),
            addr,
            requests,
            rounds,
        )
        .await;
    }
}
