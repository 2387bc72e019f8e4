//! The inbox at the size the sources plan for: first deliveries and duplicates against a
//! table already holding 0, 10 million and 100 million records, on PostgreSQL and MariaDB.
//!
//! The sources size an idempotency store at 2,000 requests/s × 20 % needing a record ×
//! 86,400 s × 3 days ≈ 100 million records. For each size a schema is filled once with that
//! many records of the consumer group the traffic uses (PostgreSQL `generate_series`,
//! MariaDB's `seq_1_to_N`, a million per transaction, then `VACUUM ANALYZE` or `ANALYZE
//! TABLE`) and kept for the next run; then eight consumer tasks
//! deliver `IDEM_BENCH_KEYS` new messages (default 5,000) through an inbox handler whose body
//! inserts the payment, and deliver them all again (duplicates of recent messages, as
//! redeliveries are). Reported: messages per second and p99 latency of each phase, their
//! ratio to the empty table's, and the table's and its indexes' size per record.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_SIZES=0,10000000,100000000 cargo bench -p idem --bench dedup_size
//! IDEM_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//! IDEM_BENCH_SIZES=0,10000000 cargo bench -p idem --bench dedup_size
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
use std::time::{Duration, Instant};

const TASKS: usize = 8;
const FILL_CHUNK: i64 = 1_000_000;

fn key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

/// Messages per second and the p99 latency (milliseconds) of `latencies` over `elapsed`.
fn rate_and_p99(mut latencies: Vec<Duration>, elapsed: Duration) -> (f64, f64) {
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    latencies.sort();
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    (rate, p99.as_secs_f64() * 1000.0)
}

/// One backend: `$prepare_schema(url, records)` makes (or finds) the place of `records`
/// records and returns its pool and whether it must be filled; `$fill` fills rows
/// `$1..=$2`; `$analyze` refreshes statistics; `$payment` inserts the payment; `$sizes`
/// reads the table's and its indexes' bytes.
macro_rules! backend {
    ($module:ident, $db:ty, $pool:ty, $prepare_schema:path, fill = $fill:expr,
     analyze = $analyze:expr, payment = $payment:expr, sizes = $sizes:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn consume(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                sqlx::query($payment)
                    .bind(order_id)
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await
                    .map(|_| order_id)
            }

            pub async fn schema(url: &str, records: i64) -> $pool {
                let (pool, empty) = $prepare_schema(url, records, TASKS as u32 + 2).await;
                if empty {
                    fill(&pool, records).await;
                }
                pool
            }

            /// Fills a fresh place: payments, idem's tables, `records` finished records of
            /// the group `bench` (keys `order:-{i}:paid`, which the traffic never uses),
            /// each with its payload's fingerprint and a small result.
            async fn fill(pool: &$pool, records: i64) {
                sqlx::raw_sql(
                    "CREATE TABLE payments (id BIGINT NOT NULL, order_id BIGINT NOT NULL);
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
                    sqlx::query($fill)
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
                sqlx::raw_sql($analyze).execute(pool).await.unwrap();
                let filled = format!("INSERT INTO filled (records) VALUES ({records})");
                sqlx::raw_sql(&filled).execute(pool).await.unwrap();
                eprintln!("filled {records} records in {:?}", started.elapsed());
            }

            /// Delivers messages `first..first + keys` with [`TASKS`] tasks (`duplicates`:
            /// each must be a duplicate): messages per second and p99 (ms).
            pub async fn deliver(
                pool: &$pool,
                first: i64,
                keys: i64,
                duplicates: bool,
            ) -> (f64, f64) {
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
                            let delivery =
                                consume(&pool, &inbox, &key(m), m.to_string().as_bytes(), m)
                                    .await
                                    .unwrap();
                            latencies.push(begun.elapsed());
                            match (duplicates, delivery) {
                                (false, Delivery::Processed(_))
                                | (true, Delivery::Duplicate { .. }) => {}
                                (_, other) => panic!("message {m}: {other:?}"),
                            }
                            m += TASKS as i64;
                        }
                        latencies
                    }));
                }
                let mut latencies = Vec::new();
                for task in tasks {
                    latencies.extend(task.await.unwrap());
                }
                rate_and_p99(latencies, started.elapsed())
            }

            /// The next message number the traffic uses.
            pub async fn next(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COALESCE(MAX(order_id), 0) + 1 FROM payments")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            /// The table's bytes and its indexes', and its records.
            pub async fn sizes(pool: &$pool) -> (i64, i64, i64) {
                let (table, indexes): (i64, i64) =
                    sqlx::query_as($sizes).fetch_one(pool).await.unwrap();
                let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                (table, indexes, rows)
            }
        }
    };
}

/// A PostgreSQL schema `idem_bench_size_{records}`: its pool, and whether it is to be filled.
async fn postgres_schema(url: &str, records: i64, connections: u32) -> (sqlx::PgPool, bool) {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::str::FromStr;
    let schema = format!("idem_bench_size_{records}");
    let admin = sqlx::PgPool::connect(url).await.unwrap();
    let filled: Option<i64> = sqlx::query_scalar(&format!("SELECT records FROM {schema}.filled"))
        .fetch_optional(&admin)
        .await
        .unwrap_or(None);
    let refill = refill() || filled != Some(records);
    if refill {
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
        .max_connections(connections)
        .connect_with(options)
        .await
        .unwrap();
    (pool, refill)
}

/// A MariaDB database `idem_bench_size_{records}`: its pool, and whether it is to be filled.
async fn mysql_schema(url: &str, records: i64, connections: u32) -> (sqlx::MySqlPool, bool) {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    use std::str::FromStr;
    let database = format!("idem_bench_size_{records}");
    let admin = sqlx::MySqlPool::connect(url).await.unwrap();
    let filled: Option<i64> = sqlx::query_scalar(&format!("SELECT records FROM {database}.filled"))
        .fetch_optional(&admin)
        .await
        .unwrap_or(None);
    let refill = refill() || filled != Some(records);
    if refill {
        sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database};"
        ))
        .execute(&admin)
        .await
        .unwrap();
    }
    admin.close().await;
    let options = MySqlConnectOptions::from_str(url)
        .unwrap()
        .database(&database);
    let pool = MySqlPoolOptions::new()
        .max_connections(connections)
        .connect_with(options)
        .await
        .unwrap();
    (pool, refill)
}

fn refill() -> bool {
    std::env::var("IDEM_BENCH_REFILL").is_ok_and(|v| v == "1")
}

backend!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    postgres_schema,
    fill = "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, \
            result, created_at, updated_at) \
            SELECT 'bench', 'order:-' || i || ':paid', \
            encode(sha256(convert_to(CAST(i AS text), 'UTF8')), 'hex'), 'SUCCESS', 1, \
            CAST(i AS text), \
            CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - i, \
            CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - i \
            FROM generate_series(CAST($1 AS BIGINT), CAST($2 AS BIGINT)) AS i",
    analyze = "VACUUM ANALYZE idem_inbox",
    payment = "INSERT INTO payments (id, order_id) VALUES ($1, $2)",
    sizes = "SELECT pg_table_size('idem_inbox'), pg_indexes_size('idem_inbox')"
);
backend!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    mysql_schema,
    fill = "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, \
            result, created_at, updated_at) \
            SELECT 'bench', CONCAT('order:-', seq, ':paid'), SHA2(CAST(seq AS CHAR), 256), \
            'SUCCESS', 1, CAST(seq AS CHAR), \
            CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - seq, \
            CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - seq \
            FROM seq_1_to_1000000000 WHERE seq BETWEEN ? AND ?",
    analyze = "ANALYZE TABLE idem_inbox",
    payment = "INSERT INTO payments (id, order_id) VALUES (?, ?)",
    sizes = "SELECT CAST(data_length AS SIGNED), CAST(index_length AS SIGNED) \
             FROM information_schema.TABLES \
             WHERE table_schema = DATABASE() AND table_name = 'idem_inbox'"
);

/// Runs the sizes of one backend and prints its table.
macro_rules! run {
    ($module:ident, $name:expr, $url:expr, $sizes:expr, $keys:expr, $rounds:expr) => {{
        let mut pools = Vec::new();
        for &records in $sizes {
            pools.push($module::schema($url, records).await);
        }
        let n = $sizes.len();
        let mut first = vec![(Vec::new(), Vec::new()); n];
        let mut dup = vec![(Vec::new(), Vec::new()); n];
        for round in 0..$rounds {
            for k in 0..n {
                let i = (k + round) % n;
                let from = $module::next(&pools[i]).await;
                let (rate, p99) = $module::deliver(&pools[i], from, $keys, false).await;
                first[i].0.push(rate);
                first[i].1.push(p99);
                let (rate, p99) = $module::deliver(&pools[i], from, $keys, true).await;
                dup[i].0.push(rate);
                dup[i].1.push(p99);
            }
        }
        println!("\n### {}\n", $name);
        println!(
            "| records in the table | first deliveries/s | × empty | p99 ms | duplicates/s | × empty | p99 ms | table + indexes per record |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        let base_first = median(first[0].0.clone());
        let base_dup = median(dup[0].0.clone());
        for (i, &records) in $sizes.iter().enumerate() {
            let (table, indexes, rows) = $module::sizes(&pools[i]).await;
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
    }};
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 5000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 3);
    let sizes: Vec<i64> = std::env::var("IDEM_BENCH_SIZES")
        .unwrap_or_else(|_| "0,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("IDEM_BENCH_SIZES: numbers"))
        .collect();
    let url = |name: &str| std::env::var(name).ok().filter(|u| !u.is_empty());
    println!("dedup_size: {keys} messages a round, {TASKS} tasks, {rounds} rounds");
    if let Some(url) = url("IDEM_BENCH_POSTGRES_URL") {
        run!(postgres, "PostgreSQL", &url, &sizes, keys, rounds);
    }
    if let Some(url) = url("IDEM_BENCH_MYSQL_URL") {
        run!(mysql, "MariaDB", &url, &sizes, keys, rounds);
    }
}
