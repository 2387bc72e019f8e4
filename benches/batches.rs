//! Groundwork for batches of deliveries (one commit for many messages): what committing a
//! batch at a time gains today, with the handlers idem already has, against the same
//! messages one transaction each.
//!
//! One consumer task delivers `IDEM_BENCH_KEYS` messages (default 2,000), each once, to an
//! inbox handler whose body inserts the payment:
//!
//! - **one transaction each**: the handler from the pool (idem begins and commits);
//! - **batches of N in the caller's transaction**: the consumer begins a transaction, calls
//!   the same handler with it for N messages (a savepoint each: a failing body or a refusal
//!   rolls back its own message alone), and commits once;
//! - **batches of 100 by hand, set-wise**: the ceiling a batch stage could reach — the
//!   records of the whole batch in one multi-row insert, the bodies, the results in one
//!   multi-row update, one commit; no savepoints (a failing body would fail the batch).
//!
//! Every round runs the variants in a fresh random order, each on a fresh schema; the table
//! shows medians of messages per second and the median of per-round ratios to one
//! transaction each.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! cargo bench -p idem --bench batches
//! ```
//!
//! `IDEM_BENCH_KEYS` and `IDEM_BENCH_ROUNDS` (default 5) scale it. The results are in
//! BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use idem::inbox::{Delivery, Inbox, MessageKey};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use std::time::Instant;

const SCHEMA: &str = "idem_bench_batches";

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

/// A pool on a fresh schema holding the payments and idem's tables.
async fn prepare(url: &str) -> PgPool {
    let admin = PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .options([("search_path", SCHEMA)]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    pool
}

fn key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

/// Delivers every message in batches of `size`, set-wise, by hand: messages per second.
async fn by_hand(pool: &PgPool, messages: &[i64], size: usize) -> f64 {
    let started = Instant::now();
    for chunk in messages.chunks(size) {
        let mut tx = pool.begin().await.unwrap();
        let keys: Vec<String> = chunk.iter().map(|&m| key(m).as_str().to_owned()).collect();
        let new: Vec<String> = sqlx::query_scalar(
            "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, created_at, updated_at) \
             SELECT 'bench', k, 'f', 'SUCCESS', 1, 0, 0 FROM unnest($1::text[]) k \
             ON CONFLICT DO NOTHING RETURNING message_key",
        )
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        assert_eq!(new.len(), chunk.len());
        let mut results = Vec::new();
        for &m in chunk {
            let id: i64 =
                sqlx::query_scalar("INSERT INTO payments (order_id) VALUES ($1) RETURNING id")
                    .bind(m)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            results.push(id.to_string());
        }
        sqlx::query(
            "UPDATE idem_inbox SET result = v.r FROM unnest($1::text[], $2::text[]) v(k, r) \
             WHERE consumer_group = 'bench' AND message_key = v.k",
        )
        .bind(&keys)
        .bind(&results)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    messages.len() as f64 / started.elapsed().as_secs_f64()
}

/// Delivers every message, `batch` to a transaction (`None`: one transaction each, from the
/// pool): messages per second.
async fn deliver(pool: &PgPool, messages: &[i64], batch: Option<usize>) -> f64 {
    let inbox = Inbox::new("bench").unwrap();
    let started = Instant::now();
    match batch {
        None => {
            for &m in messages {
                let delivery = consume(pool, &inbox, &key(m), &m.to_be_bytes(), m).await;
                assert!(matches!(delivery.unwrap(), Delivery::Processed(_)));
            }
        }
        Some(size) => {
            for chunk in messages.chunks(size) {
                let mut tx = pool.begin().await.unwrap();
                for &m in chunk {
                    let delivery = consume(&mut tx, &inbox, &key(m), &m.to_be_bytes(), m).await;
                    assert!(matches!(delivery.unwrap(), Delivery::Processed(_)));
                }
                tx.commit().await.unwrap();
            }
        }
    }
    messages.len() as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 2000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5) as u64;
    let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: set IDEM_BENCH_POSTGRES_URL");
        return;
    };
    let variants: [(&str, Option<usize>); 5] = [
        ("one transaction each (from the pool)", None),
        ("batches of 1 (caller's transaction)", Some(1)),
        ("batches of 10", Some(10)),
        ("batches of 100", Some(100)),
        ("batches of 100 by hand, set-wise", Some(100)),
    ];
    let mut rates = vec![Vec::new(); variants.len()];
    let mut ratios = vec![Vec::new(); variants.len()];
    println!("batches: {keys} messages, one consumer, {rounds} rounds, PostgreSQL");
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round));
        let mut this_round = vec![0.0; variants.len()];
        for i in order {
            let pool = prepare(&url).await;
            let messages: Vec<i64> = (1..=keys).collect();
            this_round[i] = if i == 4 {
                by_hand(&pool, &messages, 100).await
            } else {
                deliver(&pool, &messages, variants[i].1).await
            };
            let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments")
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(paid, keys, "every message once");
            pool.close().await;
        }
        for (i, rate) in this_round.iter().enumerate() {
            rates[i].push(*rate);
            ratios[i].push(rate / this_round[0]);
        }
    }
    println!("| variant | messages/s (median) | × one transaction each (median of rounds) |");
    println!("|---|---:|---:|");
    for (i, (name, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} |",
            median(rates[i].clone()),
            median(ratios[i].clone())
        );
    }
}
