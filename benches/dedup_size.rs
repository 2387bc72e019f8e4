//! The inbox at the size the sources plan for: first deliveries and duplicates against a
//! table already holding 0, 10 million and 100 million records, on PostgreSQL.
//!
//! The sources size an idempotency store at 2,000 requests/s × 20 % needing a record ×
//! 86,400 s × 3 days ≈ 100 million records. For each size a schema is filled once with that
//! many records of the consumer group the traffic uses (`generate_series`, a million per
//! transaction, then `VACUUM ANALYZE`) and kept for the next run; then eight consumer tasks
//! deliver `IDEM_BENCH_KEYS` new messages (default 5,000) through an inbox handler whose body
//! inserts the payment, and deliver them all again (duplicates of recent messages, as
//! redeliveries are). Reported: messages per second and p99 latency of each phase, their
//! ratio to the empty table's, and the table's and its indexes' size per record.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_SIZES=0,10000000,100000000 cargo bench -p idem --bench dedup_size
//! ```
//!
//! `IDEM_BENCH_SIZES` (default `0,1000000`), `IDEM_BENCH_KEYS`, `IDEM_BENCH_ROUNDS` (default
//! 3; each round new keys) scale it; `IDEM_BENCH_REFILL=1` fills the schemas again. A
//! schema of 100 million records takes about 25 GB and, on two cores, a long while to fill.
//! The results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use idem::inbox::{Delivery, Inbox, MessageKey};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use std::time::{Duration, Instant};

const TASKS: usize = 8;
const FILL_CHUNK: i64 = 1_000_000;

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

fn key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

/// The schema holding `records` records, filled if it is not (or if asked to).
async fn schema(url: &str, records: i64) -> PgPool {
    let schema = format!("idem_bench_size_{records}");
    let admin = PgPool::connect(url).await.unwrap();
    let filled: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT CAST(records AS BIGINT) FROM {schema}.filled"
    ))
    .fetch_optional(&admin)
    .await
    .unwrap_or(None);
    let refill = std::env::var("IDEM_BENCH_REFILL").is_ok_and(|v| v == "1");
    if refill || filled != Some(records) {
        sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        ))
        .execute(&admin)
        .await
        .unwrap();
    }
    admin.close().await;
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(TASKS as u32 + 2)
        .connect_with(options)
        .await
        .unwrap();
    if refill || filled != Some(records) {
        fill(&pool, records).await;
    }
    pool
}

/// Fills a fresh schema: the payments table, idem's tables, `records` finished records of
/// the group `bench` (message keys `order:-{i}:paid`, which the traffic never uses), each
/// with the fingerprint of its payload and a small result, then `VACUUM ANALYZE`.
async fn fill(pool: &PgPool, records: i64) {
    sqlx::raw_sql(
        "CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL);
         CREATE TABLE filled (records BIGINT NOT NULL);",
    )
    .execute(pool)
    .await
    .unwrap();
    idem::migrate(pool).await.unwrap();
    let started = Instant::now();
    let mut from = 1;
    while from <= records {
        let to = (from + FILL_CHUNK - 1).min(records);
        sqlx::query(
            "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, \
             result, created_at, updated_at) \
             SELECT 'bench', 'order:-' || i || ':paid', \
             encode(sha256(convert_to(CAST(i AS text), 'UTF8')), 'hex'), 'SUCCESS', 1, \
             CAST(i AS text), \
             CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - i, \
             CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - i \
             FROM generate_series(CAST($1 AS BIGINT), CAST($2 AS BIGINT)) AS i",
        )
        .bind(from)
        .bind(to)
        .execute(pool)
        .await
        .unwrap();
        from = to + 1;
        if to % (10 * FILL_CHUNK) == 0 {
            eprintln!("filled {to} of {records} in {:?}", started.elapsed());
        }
    }
    sqlx::raw_sql("VACUUM ANALYZE idem_inbox")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO filled (records) VALUES ($1)")
        .bind(records)
        .execute(pool)
        .await
        .unwrap();
    eprintln!("filled {records} records in {:?}", started.elapsed());
}

/// Delivers messages `first..first + keys` with [`TASKS`] tasks: messages per second and the
/// p99 latency (milliseconds); `expect` tells what each delivery must be.
async fn deliver(pool: &PgPool, first: i64, keys: i64, duplicates: bool) -> (f64, f64) {
    let inbox = Inbox::new("bench").unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS as i64 {
        let (pool, inbox) = (pool.clone(), inbox.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut m = first + t;
            while m < first + keys {
                let begun = Instant::now();
                let delivery = consume(&pool, &inbox, &key(m), m.to_string().as_bytes(), m)
                    .await
                    .unwrap();
                latencies.push(begun.elapsed());
                match (duplicates, delivery) {
                    (false, Delivery::Processed(_)) | (true, Delivery::Duplicate { .. }) => {}
                    (_, other) => panic!("message {m}: {other:?}"),
                }
                m += TASKS as i64;
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let rate = keys as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    (rate, p99.as_secs_f64() * 1000.0)
}

/// The inbox table's heap and its indexes, in bytes.
async fn sizes(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT pg_table_size('idem_inbox'), pg_indexes_size('idem_inbox')")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 5000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 3) as i64;
    let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: set IDEM_BENCH_POSTGRES_URL");
        return;
    };
    let sizes_wanted: Vec<i64> = std::env::var("IDEM_BENCH_SIZES")
        .unwrap_or_else(|_| "0,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("IDEM_BENCH_SIZES: numbers"))
        .collect();
    let mut pools = Vec::new();
    for &records in &sizes_wanted {
        pools.push(schema(&url, records).await);
    }
    println!("dedup_size: {keys} messages a round, {TASKS} tasks, {rounds} rounds, PostgreSQL");
    // Per size: first deliveries' and duplicates' rates and p99s, each round.
    let n = sizes_wanted.len();
    let mut first = vec![(Vec::new(), Vec::new()); n];
    let mut dup = vec![(Vec::new(), Vec::new()); n];
    for round in 0..rounds {
        // The sizes in turn, in a rotated order each round.
        for k in 0..n {
            let i = (k + round as usize) % n;
            let pool = &pools[i];
            let from: i64 =
                sqlx::query_scalar("SELECT COALESCE(MAX(order_id), 0) + 1 FROM payments")
                    .fetch_one(pool)
                    .await
                    .unwrap();
            let (rate, p99) = deliver(pool, from, keys, false).await;
            first[i].0.push(rate);
            first[i].1.push(p99);
            let (rate, p99) = deliver(pool, from, keys, true).await;
            dup[i].0.push(rate);
            dup[i].1.push(p99);
        }
    }
    println!(
        "| records in the table | first deliveries/s | × empty | p99 ms | duplicates/s | × empty | p99 ms | table + indexes per record |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base_first = median(first[0].0.clone());
    let base_dup = median(dup[0].0.clone());
    for (i, &records) in sizes_wanted.iter().enumerate() {
        let (table, indexes) = sizes(&pools[i]).await;
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
            .fetch_one(&pools[i])
            .await
            .unwrap();
        let per_record = if rows > 0 {
            format!("{} + {} B", table / rows, indexes / rows)
        } else {
            "—".into()
        };
        let (f, d) = (median(first[i].0.clone()), median(dup[i].0.clone()));
        println!(
            "| {records} | {f:.0} | {:.2} | {:.1} | {d:.0} | {:.2} | {:.1} | {per_record} |",
            f / base_first,
            median(first[i].1.clone()),
            d / base_dup,
            median(dup[i].1.clone()),
        );
    }
}
