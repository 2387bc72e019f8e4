//! The Redis fast path's effect, each against a baseline measured in the same run:
//!
//! 1. **A duplicate storm.** `IDEM_BENCH_KEYS` messages (default 1,000), each delivered 10
//!    times in a shuffled order by 32 tasks, to an inbox consumer whose body inserts its
//!    effect: deliveries per second with the fast path and without it, on PostgreSQL and
//!    MariaDB, and the database statements per delivery (sqlx's statement log, counted in
//!    a pass of its own, untimed: BEGIN and COMMIT count as statements).
//! 2. **First deliveries.** Every message delivered once, 8 tasks: what the extra Redis
//!    read (a miss) and the write after the commit cost.
//! 3. **A Redis-only store, Redis killed.** What the peers do (AWS Powertools,
//!    axum-idempotent, `idempotent`): the dedup record is `SET key NX` in Redis, and the
//!    effect is committed in the database on its own. The same storm with a `redis-server`
//!    of the benchmark's own SIGKILLed at a third and restarted empty 500 ms later:
//!    effects that ran twice, beside idem with its fast path on the same killed Redis.
//!
//! Every cell runs its variants `ROUNDS` times in a fresh random order per round; tables
//! show medians, and the median of the per-round ratios.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//! IDEM_BENCH_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem --bench cache
//! ```
//!
//! `IDEM_BENCH_KEYS` and `IDEM_BENCH_ROUNDS` (default 5) scale it; `IDEM_BENCH_PARTS`
//! (`storm,first,peer`) picks parts; without a database URL its rows are skipped, without
//! `IDEM_BENCH_REDIS_URL` parts 1 and 2 are. Part 3 starts its own `redis-server`. The
//! results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;
#[path = "../tests/common/statement_log.rs"]
mod statement_log;

use chart::median;
use env::env_usize;
use idem::cache::{self, Redis, redis};
use idem::inbox::{Inbox, MessageKey};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const COPIES: usize = 10;
const STORM_TASKS: usize = 32;
const FIRST_TASKS: usize = 8;

fn url(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|u| !u.is_empty())
}

const TABLES: &str = "CREATE TABLE payments (order_id BIGINT NOT NULL)";

fn message_key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

/// `keys` orders, each `copies` times, shuffled with `seed`.
fn deliveries(keys: i64, copies: usize, seed: u64) -> Vec<i64> {
    let mut all: Vec<i64> = (1..=keys)
        .flat_map(|k| std::iter::repeat_n(k, copies))
        .collect();
    all.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    all
}

/// What a delivery is given: an order to consume, and the count of those done.
type Queue = Arc<Mutex<Vec<i64>>>;

macro_rules! consumers {
    ($module:ident, $db:ty, $insert:literal) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            pub async fn consume(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                sqlx::query($insert)
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id)
            }

            /// Consumes every delivery of `queue` with `tasks` tasks, counting each in
            /// `done`: deliveries per second.
            pub async fn drain(
                pool: &sqlx::Pool<$db>,
                queue: Queue,
                tasks: usize,
                done: Arc<AtomicUsize>,
            ) -> f64 {
                let inbox = Inbox::new("bench").unwrap();
                let total = queue.lock().unwrap().len();
                let started = Instant::now();
                let workers: Vec<_> = (0..tasks)
                    .map(|_| {
                        let (pool, inbox, queue, done) =
                            (pool.clone(), inbox.clone(), queue.clone(), done.clone());
                        tokio::spawn(async move {
                            loop {
                                let Some(order_id) = queue.lock().unwrap().pop() else {
                                    return;
                                };
                                let payload = order_id.to_be_bytes();
                                let key = message_key(order_id);
                                let delivery = consume(&pool, &inbox, &key, &payload, order_id)
                                    .await
                                    .unwrap();
                                assert!(delivery.should_ack(), "{delivery:?}");
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                    })
                    .collect();
                for worker in workers {
                    worker.await.unwrap();
                }
                total as f64 / started.elapsed().as_secs_f64()
            }

            /// The peers' way: `SET key NX` in Redis, then the effect in its own
            /// transaction (and `DEL` if it failed). Deliveries per second.
            pub async fn drain_redis_only(
                pool: &sqlx::Pool<$db>,
                redis: redis::aio::ConnectionManager,
                queue: Queue,
                done: Arc<AtomicUsize>,
            ) -> f64 {
                let total = queue.lock().unwrap().len();
                let started = Instant::now();
                let workers: Vec<_> = (0..STORM_TASKS)
                    .map(|_| {
                        let (pool, mut redis, queue, done) =
                            (pool.clone(), redis.clone(), queue.clone(), done.clone());
                        tokio::spawn(async move {
                            loop {
                                let Some(order_id) = queue.lock().unwrap().pop() else {
                                    return;
                                };
                                let key = format!("peer:order:{order_id}:paid");
                                // The store answers, or the delivery is retried (its broker
                                // redelivers it): a store that is down stops nothing
                                // from running, once it is back and empty.
                                loop {
                                    let claimed: Result<Option<String>, _> = redis::cmd("SET")
                                        .arg(&key)
                                        .arg("1")
                                        .arg("NX")
                                        .arg("PX")
                                        .arg(600_000)
                                        .query_async(&mut redis)
                                        .await;
                                    match claimed {
                                        Ok(None) => break,
                                        Ok(Some(_)) => {
                                            let mut tx = pool.begin().await.unwrap();
                                            sqlx::query($insert)
                                                .bind(order_id)
                                                .execute(&mut *tx)
                                                .await
                                                .unwrap();
                                            tx.commit().await.unwrap();
                                            break;
                                        }
                                        Err(_) => {
                                            tokio::time::sleep(Duration::from_millis(5)).await
                                        }
                                    }
                                }
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                    })
                    .collect();
                for worker in workers {
                    worker.await.unwrap();
                }
                total as f64 / started.elapsed().as_secs_f64()
            }

            /// Empty tables.
            pub async fn reset(pool: &sqlx::Pool<$db>) {
                for table in ["payments", "idem_inbox"] {
                    sqlx::query(&format!("DELETE FROM {table}"))
                        .execute(pool)
                        .await
                        .unwrap();
                }
            }

            /// Effects that ran more than once.
            pub async fn doubled(pool: &sqlx::Pool<$db>) -> i64 {
                let rows: Vec<(i64, i64)> = sqlx::query_as(
                    "SELECT order_id, COUNT(*) FROM payments GROUP BY order_id HAVING COUNT(*) > 1",
                )
                .fetch_all(pool)
                .await
                .unwrap();
                rows.iter().map(|(_, n)| n - 1).sum()
            }
        }
    };
}

consumers!(
    on_postgres,
    sqlx::Postgres,
    "INSERT INTO payments (order_id) VALUES ($1)"
);
consumers!(
    on_mysql,
    sqlx::MySql,
    "INSERT INTO payments (order_id) VALUES (?)"
);

/// The machine's Redis as the fast path, under a namespace no earlier run used.
fn fast_path(url: &str) -> Redis {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let namespace = format!("bench-{}-{n}", std::process::id());
    Redis::open(url, namespace).unwrap()
}

/// A `redis-server` of the benchmark's own, on a free port, without persistence.
struct OwnRedis {
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = OwnRedis { port, child: None };
        redis.restart();
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not start");
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills `redis` once `done` reaches a third of `total`, restarts it (empty) 500 ms later
/// (a store that is down stops the Redis-only consumers, so the restart cannot wait for
/// their progress).
fn kill_in_the_middle(mut redis: OwnRedis, done: Arc<AtomicUsize>, total: usize) {
    tokio::spawn(async move {
        while done.load(Ordering::Relaxed) < total / 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        redis.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.restart();
        // Kept running until the process ends.
        std::mem::forget(redis);
    });
}

/// One backend's rows of parts 1 and 2, and its row of part 3.
macro_rules! backend {
    ($name:expr, $pool:expr, $module:ident, $keys:expr, $rounds:expr, $redis:expr, $parts:expr) => {{
        let pool = $pool;
        let (keys, rounds): (i64, usize) = ($keys, $rounds);
        let part = |name: &str| $parts.split(',').any(|p| p == name);
        if let (Some(redis_url), true) = ($redis, part("storm") || part("first")) {
            for (label, copies, tasks) in [
                ("duplicate storm", COPIES, STORM_TASKS),
                ("first deliveries", 1, FIRST_TASKS),
            ] {
                if !part(if copies == 1 { "first" } else { "storm" }) {
                    continue;
                }
                let (mut off, mut on, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..rounds {
                    let mut order = [false, true];
                    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round as u64));
                    let mut pair = [0.0; 2];
                    for cached in order {
                        $module::reset(&pool).await;
                        let fast = fast_path(redis_url);
                        if cached {
                            fast.attach(&pool).await.unwrap();
                        } else {
                            cache::detach(&pool);
                        }
                        let queue = Arc::new(Mutex::new(deliveries(keys, copies, round as u64)));
                        let rate = $module::drain(&pool, queue, tasks, Arc::default()).await;
                        assert_eq!($module::doubled(&pool).await, 0);
                        if cached {
                            eprintln!("{} {label} round {round}: {:?}", $name, fast.stats());
                        }
                        pair[usize::from(cached)] = rate;
                    }
                    cache::detach(&pool);
                    off.push(pair[0]);
                    on.push(pair[1]);
                    ratios.push(pair[1] / pair[0]);
                }
                // Statements per delivery, in a pass of their own (untimed).
                let mut per_delivery = [0.0; 2];
                for cached in [false, true] {
                    $module::reset(&pool).await;
                    if cached {
                        fast_path(redis_url).attach(&pool).await.unwrap();
                    }
                    let counted = keys.min(200);
                    let queue = Arc::new(Mutex::new(deliveries(counted, copies, 99)));
                    statement_log::take_log();
                    statement_log::set_recording(true);
                    $module::drain(&pool, queue, tasks, Arc::default()).await;
                    statement_log::set_recording(false);
                    let statements = statement_log::take_log().len();
                    per_delivery[usize::from(cached)] =
                        statements as f64 / (counted as usize * copies) as f64;
                    cache::detach(&pool);
                }
                let low = ratios.iter().cloned().fold(f64::MAX, f64::min);
                let high = ratios.iter().cloned().fold(f64::MIN, f64::max);
                println!(
                    "| {} | {label} | {tasks} | {:.0} | {:.0} | **{:.2}** ({low:.2}–{high:.2}) | {:.2} | {:.2} |",
                    $name,
                    median(off),
                    median(on),
                    median(ratios),
                    per_delivery[0],
                    per_delivery[1],
                );
            }
        }
        if part("peer") {
            // idem with its fast path, and the Redis-only store, each on a Redis killed at
            // a third of the storm and restarted empty 500 ms later.
            let mut doubled = [0; 2];
            let mut rates = [0.0; 2];
            for peer in [false, true] {
                $module::reset(&pool).await;
                let redis = OwnRedis::start();
                let total = keys as usize * COPIES;
                let queue = Arc::new(Mutex::new(deliveries(keys, COPIES, 7)));
                let done = Arc::new(AtomicUsize::new(0));
                let url = redis.url();
                kill_in_the_middle(redis, done.clone(), total);
                rates[usize::from(peer)] = if peer {
                    let client = redis::Client::open(url).unwrap();
                    let config = redis::aio::ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(Duration::from_millis(250)))
                        .set_number_of_retries(1);
                    let conn = redis::aio::ConnectionManager::new_with_config(client, config)
                        .await
                        .unwrap();
                    $module::drain_redis_only(&pool, conn, queue, done).await
                } else {
                    Redis::open(&url, "peer-idem").unwrap().attach(&pool).await.unwrap();
                    let rate = $module::drain(&pool, queue, STORM_TASKS, done).await;
                    cache::detach(&pool);
                    rate
                };
                doubled[usize::from(peer)] = $module::doubled(&pool).await;
            }
            println!(
                "| {} | {keys} keys × {COPIES}, {STORM_TASKS} tasks | {} ({:.0}/s) | {} ({:.0}/s) |",
                $name, doubled[0], rates[0], doubled[1], rates[1]
            );
        }
    }};
}

#[tokio::main]
async fn main() {
    tracing::subscriber::set_global_default(statement_log::StatementLog).unwrap();
    statement_log::set_recording(false);
    let keys = env_usize("IDEM_BENCH_KEYS", 1000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5);
    let parts = std::env::var("IDEM_BENCH_PARTS").unwrap_or_else(|_| "storm,first,peer".into());
    let redis_url = url("IDEM_BENCH_REDIS_URL");
    let postgres = match url("IDEM_BENCH_POSTGRES_URL") {
        Some(url) => {
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "DROP SCHEMA IF EXISTS idem_bench_cache CASCADE; CREATE SCHEMA idem_bench_cache",
            )
            .execute(&admin)
            .await
            .unwrap();
            let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect_with(options.options([("search_path", "idem_bench_cache")]))
                .await
                .unwrap();
            sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
            idem::migrate(&pool).await.unwrap();
            Some(pool)
        }
        None => None,
    };
    let mysql = match url("IDEM_BENCH_MYSQL_URL") {
        Some(url) => {
            let admin = sqlx::MySqlPool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "DROP DATABASE IF EXISTS idem_bench_cache; CREATE DATABASE idem_bench_cache",
            )
            .execute(&admin)
            .await
            .unwrap();
            let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .connect_with(options.database("idem_bench_cache"))
                .await
                .unwrap();
            sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
            idem::migrate(&pool).await.unwrap();
            Some(pool)
        }
        None => None,
    };
    println!("## The fast path ({keys} messages, {rounds} rounds)\n");
    println!(
        "| backend | work | tasks | without, deliveries/s | with the fast path | with to without (range) | statements per delivery, without | with |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let only_12 = parts.replace("peer", "");
    if let Some(pool) = &postgres {
        backend!(
            "PostgreSQL",
            pool.clone(),
            on_postgres,
            keys,
            rounds,
            redis_url.as_deref(),
            only_12
        );
    }
    if let Some(pool) = &mysql {
        backend!(
            "MariaDB",
            pool.clone(),
            on_mysql,
            keys,
            rounds,
            redis_url.as_deref(),
            only_12
        );
    }
    if parts.split(',').any(|p| p == "peer") {
        println!("\n## Redis killed mid-storm: effects run twice\n");
        println!("| backend | storm | idem with its fast path | a Redis-only store |");
        println!("|---|---|---|---|");
        if let Some(pool) = &postgres {
            backend!(
                "PostgreSQL",
                pool.clone(),
                on_postgres,
                keys,
                rounds,
                None::<&str>,
                "peer"
            );
        }
        if let Some(pool) = &mysql {
            backend!(
                "MariaDB",
                pool.clone(),
                on_mysql,
                keys,
                rounds,
                None::<&str>,
                "peer"
            );
        }
    }
}
