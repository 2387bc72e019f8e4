//! Retention of one day's records on PostgreSQL: a day partition dropped
//! (`idem::inbox::partitions::maintain`) against the same records deleted in batches
//! (`Inbox::purge`), each while four consumers deliver new messages.
//!
//! Each variant gets a fresh schema with `IDEM_BENCH_RECORDS` records (default 1,000,000)
//! of a day past the window (the plain table: records last touched two days ago), filled
//! with `generate_series`, and `VACUUM ANALYZE`d. The consumers then deliver messages of
//! today for `IDEM_BENCH_QUIET_SECS` (default 3) without retention, then while the
//! retention runs; reported: how long the retention took and the consumers' p50/p99
//! latency before and during it.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test cargo bench -p idem --bench retention
//! ```
//!
//! The results are in BENCHMARKS.md.

#[path = "support/env.rs"]
mod env;

use env::env_usize;
use idem::inbox::{Delivery, Inbox, MessageKey, partitions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime};

const CONSUMERS: usize = 4;
const DAY_MS: i64 = 86_400_000;

#[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
async fn consume(
    tx: &mut Transaction<'_, Postgres>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<i64, sqlx::Error> {
    let _ = payload;
    sqlx::query_scalar("INSERT INTO payments (order_id) VALUES ($1) RETURNING id")
        .bind(order_id)
        .fetch_one(&mut **tx)
        .await
}

/// A fresh schema: payments, idem's tables (partitioned by day if asked, with today's
/// window and the day two days ago), and `records` finished records of two days ago.
async fn prepare(url: &str, records: i64, partitioned: bool) -> PgPool {
    let schema = "idem_bench_retention";
    let admin = PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(CONSUMERS as u32 + 2)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    if partitioned {
        partitions::partition(&pool).await.unwrap();
        partitions::maintain(&pool, 2, 1).await.unwrap();
    }
    // Two days ago, by the database's clock: its day's prefix (dated keys) and its time.
    let (prefix, then): (String, i64) = sqlx::query_as(
        "SELECT '~d' || to_char(CAST(now() AT TIME ZONE 'UTC' AS date) - 2, 'YYYY-MM-DD') || '/', \
         CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - 2 * 86400000",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut from = 1;
    while from <= records {
        let to = (from + 999_999).min(records);
        sqlx::query(
            "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, \
             result, created_at, updated_at) \
             SELECT 'bench', $1 || 'old:' || i, md5(CAST(i AS text)), 'SUCCESS', 1, '1', $2, $2 \
             FROM generate_series(CAST($3 AS BIGINT), CAST($4 AS BIGINT)) AS i",
        )
        .bind(&prefix)
        .bind(then)
        .bind(from)
        .bind(to)
        .execute(&pool)
        .await
        .unwrap();
        from = to + 1;
    }
    sqlx::raw_sql("VACUUM ANALYZE idem_inbox")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// Consumers delivering today's new messages until `stop`: each delivery's latency, in
/// microseconds, and when it ended (microseconds since `start`).
async fn consumers(pool: PgPool, stop: Arc<AtomicBool>, start: Instant) -> Vec<(u64, u64)> {
    let inbox = Inbox::new("bench").unwrap();
    let next = Arc::new(AtomicI64::new(1));
    let mut tasks = Vec::new();
    for _ in 0..CONSUMERS {
        let (pool, inbox, stop, next) = (pool.clone(), inbox.clone(), stop.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let m = next.fetch_add(1, Ordering::Relaxed);
                let key = MessageKey::business(format!("order:{m}"), "paid")
                    .unwrap()
                    .dated(SystemTime::now())
                    .unwrap();
                let begun = Instant::now();
                let delivery = consume(&pool, &inbox, &key, b"m", m).await.unwrap();
                assert!(matches!(delivery, Delivery::Processed(_)));
                seen.push((
                    begun.elapsed().as_micros() as u64,
                    start.elapsed().as_micros() as u64,
                ));
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

fn percentiles(mut latencies: Vec<u64>) -> (f64, f64) {
    latencies.sort_unstable();
    let at =
        |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let records = env_usize("IDEM_BENCH_RECORDS", 1_000_000) as i64;
    let quiet = Duration::from_secs(env_usize("IDEM_BENCH_QUIET_SECS", 3) as u64);
    let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: set IDEM_BENCH_POSTGRES_URL");
        return;
    };
    println!("retention: one day of {records} records, {CONSUMERS} consumers, PostgreSQL");
    println!(
        "| retention | took | records gone | consumers' p50 / p99 before, ms | during, ms | p99 × |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for partitioned in [false, true] {
        let pool = prepare(&url, records, partitioned).await;
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let live = tokio::spawn(consumers(pool.clone(), stop.clone(), start));
        tokio::time::sleep(quiet).await;
        let began = start.elapsed().as_micros() as u64;
        let took = Instant::now();
        let gone = if partitioned {
            let maintained = partitions::maintain(&pool, 1, 1).await.unwrap();
            assert_eq!(maintained.dropped.len(), 1, "{maintained:?}");
            records as u64
        } else {
            Inbox::new("bench")
                .unwrap()
                .purge(&pool, Duration::from_millis(DAY_MS as u64), 1000)
                .await
                .unwrap()
        };
        let took = took.elapsed();
        let ended = start.elapsed().as_micros() as u64;
        // As long again after, so the "during" window of a fast drop is not empty.
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.store(true, Ordering::Relaxed);
        let seen = live.await.unwrap();
        let before: Vec<u64> = seen.iter().filter(|s| s.1 < began).map(|s| s.0).collect();
        let during: Vec<u64> = seen
            .iter()
            .filter(|s| s.1 >= began && s.1 - s.0 <= ended.max(began + 50_000))
            .map(|s| s.0)
            .collect();
        let left: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox WHERE message_key LIKE '%old:%'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(left, 0, "every old record gone");
        let (b50, b99) = percentiles(before);
        let (d50, d99) = percentiles(during);
        println!(
            "| {} | {:.2} s | {gone} | {b50:.2} / {b99:.2} | {d50:.2} / {d99:.2} | {:.2} |",
            if partitioned {
                "a day partition dropped (`partitions::maintain`)"
            } else {
                "batched deletes of 1,000 (`Inbox::purge`)"
            },
            took.as_secs_f64(),
            d99 / b99
        );
        pool.close().await;
    }
}
