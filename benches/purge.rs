//! Retention under load: four inbox consumers deliver new messages while `Inbox::purge`
//! deletes 1,000,000 expired records. Their latency during the purge is compared with
//! their latency without it, measured just before and just after.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test cargo bench -p idem --bench purge
//! ```
//!
//! Without the URL only SQLite runs. `IDEM_BENCH_PURGE_ROWS` (default 1,000,000),
//! `IDEM_BENCH_PURGE_BATCH` (default 1,000) and `IDEM_BENCH_QUIET_SECS` (default 5) scale
//! it. The results and the machine are in BENCHMARKS.md.

use idem::inbox::{Clock, Inbox, MessageKey, Received, SystemClock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CONSUMERS: usize = 4;
const DAY: Duration = Duration::from_secs(86_400);

const EFFECTS: &str = "CREATE TABLE effects (message TEXT NOT NULL, amount BIGINT NOT NULL)";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Latencies of one phase, in microseconds, sorted.
struct Phase {
    name: &'static str,
    latencies: Vec<u64>,
    elapsed: Duration,
}

impl Phase {
    fn percentile(&self, p: f64) -> f64 {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i] as f64 / 1000.0
    }

    fn row(&self) -> String {
        format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            self.name,
            self.latencies.len(),
            self.latencies.len() as f64 / self.elapsed.as_secs_f64(),
            self.percentile(0.50),
            self.percentile(0.99),
            *self.latencies.last().unwrap() as f64 / 1000.0,
        )
    }
}

macro_rules! backend {
    ($module:ident, $db:ty, seed = $seed:expr) => {
        mod $module {
            use super::*;
            use sqlx::Pool;

            pub type P = Pool<$db>;

            /// One delivery of a new message: its record and its effect in one transaction.
            async fn deliver(pool: &P, inbox: &Inbox, key: &MessageKey) {
                match inbox.receive::<_, i64>(pool, key, b"{}").await.unwrap() {
                    Received::New(mut receipt) => {
                        let effect =
                            sqlx::query("INSERT INTO effects (message, amount) VALUES ($1, 1)")
                                .bind(key.as_str())
                                .execute(&mut **receipt.transaction())
                                .await
                                .map(|_| 1_i64);
                        let delivery = receipt.finish(effect).await.unwrap();
                        assert!(delivery.is_processed());
                    }
                    Received::Done(delivery) => panic!("a new message, got {delivery:?}"),
                }
            }

            /// Four consumers deliver new messages until `stop` (or for `quiet`, if no stop
            /// is given); their latencies.
            async fn consumers(
                pool: &P,
                inbox: &Inbox,
                name: &'static str,
                stop: Option<Arc<AtomicBool>>,
                quiet: Duration,
            ) -> Phase {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let started = Instant::now();
                let tasks: Vec<_> = (0..CONSUMERS)
                    .map(|_| {
                        let (pool, inbox, stop) = (pool.clone(), inbox.clone(), stop.clone());
                        tokio::spawn(async move {
                            let mut latencies = Vec::new();
                            loop {
                                let done = match &stop {
                                    Some(stop) => stop.load(Ordering::Relaxed),
                                    None => started.elapsed() >= quiet,
                                };
                                if done {
                                    break latencies;
                                }
                                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                                let key = MessageKey::new(format!("new-{n}")).unwrap();
                                let t = Instant::now();
                                deliver(&pool, &inbox, &key).await;
                                latencies.push(t.elapsed().as_micros() as u64);
                            }
                        })
                    })
                    .collect();
                let mut latencies = Vec::new();
                for task in tasks {
                    latencies.extend(task.await.unwrap());
                }
                latencies.sort_unstable();
                Phase {
                    name,
                    latencies,
                    elapsed: started.elapsed(),
                }
            }

            pub async fn run(pool: P, rows: u64, batch: u32, quiet: Duration) {
                let inbox = Inbox::new("bench").unwrap();
                let expired = SystemClock.now_millis() - 2 * DAY.as_millis() as i64;
                let seeded = Instant::now();
                sqlx::query($seed)
                    .bind(rows as i64)
                    .bind(expired)
                    .execute(&pool)
                    .await
                    .unwrap();
                eprintln!("seeded {rows} expired records in {:.1?}", seeded.elapsed());

                let before = consumers(&pool, &inbox, "without purge (before)", None, quiet).await;
                let stop = Arc::new(AtomicBool::new(false));
                let purging = {
                    let (pool, inbox, stop) = (pool.clone(), inbox.clone(), stop.clone());
                    tokio::spawn(async move {
                        let started = Instant::now();
                        let deleted = inbox.purge(&pool, DAY, batch).await.unwrap();
                        stop.store(true, Ordering::Relaxed);
                        (deleted, started.elapsed())
                    })
                };
                let during = consumers(&pool, &inbox, "during the purge", Some(stop), quiet).await;
                let (deleted, took) = purging.await.unwrap();
                let after = consumers(&pool, &inbox, "without purge (after)", None, quiet).await;
                assert_eq!(deleted, rows, "the purge deleted every expired record");

                println!(
                    "purge: {deleted} records in {:.1} s ({:.0} records/s), batches of {batch}\n",
                    took.as_secs_f64(),
                    deleted as f64 / took.as_secs_f64()
                );
                println!("| phase | deliveries | deliveries/s | p50 ms | p99 ms | max ms |");
                println!("|---|---:|---:|---:|---:|---:|");
                for phase in [&before, &during, &after] {
                    println!("{}", phase.row());
                }
                let quiet_p99 = (before.percentile(0.99) + after.percentile(0.99)) / 2.0;
                println!(
                    "\np99 during the purge / without it: {:.2}\n",
                    during.percentile(0.99) / quiet_p99
                );
            }
        }
    };
}

backend!(
    postgres,
    sqlx::Postgres,
    seed = "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, created_at, updated_at) \
            SELECT 'bench', 'old-' || g, repeat('0', 64), 'SUCCESS', 1, $2, $2 FROM generate_series(1, $1) g"
);

backend!(
    sqlite,
    sqlx::Sqlite,
    seed = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $1) \
            INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, created_at, updated_at) \
            SELECT 'bench', 'old-' || n, printf('%064d', 0), 'SUCCESS', 1, $2, $2 FROM g"
);

fn main() {
    let rows = env_number("IDEM_BENCH_PURGE_ROWS", 1_000_000);
    let batch = env_number("IDEM_BENCH_PURGE_BATCH", 1000) as u32;
    let quiet = Duration::from_secs(env_number("IDEM_BENCH_QUIET_SECS", 5));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("{rows} expired records, {CONSUMERS} consumers, batches of {batch}");

    if let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        println!("\n### PostgreSQL\n");
        runtime.block_on(async {
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "DROP SCHEMA IF EXISTS idem_bench_purge CASCADE; CREATE SCHEMA idem_bench_purge",
            )
            .execute(&admin)
            .await
            .unwrap();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(CONSUMERS as u32 + 1)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        sqlx::Executor::execute(conn, "SET search_path TO idem_bench_purge")
                            .await?;
                        Ok(())
                    })
                })
                .connect(&url)
                .await
                .unwrap();
            idem::migrate(&pool).await.unwrap();
            sqlx::query(EFFECTS).execute(&pool).await.unwrap();
            postgres::run(pool, rows, batch, quiet).await;
        });
    } else {
        eprintln!("PostgreSQL skipped: set IDEM_BENCH_POSTGRES_URL");
    }

    println!("\n### SQLite (a file, WAL)\n");
    let path = std::env::temp_dir().join("idem-bench-purge.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    runtime.block_on(async {
        let options = idem::sqlite_options(&format!("sqlite:{}", path.display())).unwrap();
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(CONSUMERS as u32 + 1)
            .connect_with(options)
            .await
            .unwrap();
        idem::migrate(&pool).await.unwrap();
        sqlx::query(EFFECTS).execute(&pool).await.unwrap();
        sqlite::run(pool, rows, batch, quiet).await;
    });
}
