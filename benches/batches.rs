//! Batches of deliveries (`Inbox::batch`: many messages, one commit, each still once)
//! against the same messages one transaction each, on PostgreSQL with durable commits.
//!
//! `IDEM_BENCH_KEYS` messages (default 2,000), each delivered once, to a handler whose body
//! inserts the payment and returns its id (stored, and replayed to duplicates):
//!
//! - **one transaction each**: an `#[idempotent]` inbox handler from the pool, the
//!   baseline, with one consumer task and with eight (each its own share of the messages);
//! - **`Inbox::batch` of 1, 10 and 100**, with one consumer and with eight;
//! - **`Inbox::batch` of 100, nothing stored**: the handler returns `()`, for the cost of
//!   storing a result per message inside a batch;
//! - **100 calls in the caller's transaction**: the inbox handler called with a transaction
//!   the consumer owns (a savepoint each), committed once;
//! - **by hand, set-wise**: the records in one multi-row insert, the bodies, the results in
//!   one multi-row update, one commit: the ceiling, with none of idem's checks.
//!
//! Every round runs the variants in a fresh random order, each on a fresh schema; the table
//! shows medians of messages per second, of the per-round ratios to one transaction each
//! (with one consumer, or with eight for the eight-consumer variants), and the median p99 of
//! a message's latency (from its batch's start to its commit).
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
        .max_connections(10)
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

/// How a variant delivers its messages.
#[derive(Clone, Copy)]
enum Way {
    /// One transaction each, from the pool.
    Each,
    /// `Inbox::batch` of this size; `bool`: a result stored per message.
    Batch(usize, bool),
    /// Calls of the handler in a transaction of the consumer's, this many per commit.
    Savepoints(usize),
    /// Set-wise by hand, this many per commit.
    ByHand(usize),
}

/// The latency of every message of `messages` (seconds), delivered `way` by one consumer.
async fn consumer(pool: PgPool, messages: Vec<i64>, way: Way) -> Vec<f64> {
    let inbox = Inbox::new("bench").unwrap();
    let mut latencies = Vec::with_capacity(messages.len());
    let size = match way {
        Way::Each => 1,
        Way::Batch(size, _) | Way::Savepoints(size) | Way::ByHand(size) => size,
    };
    for chunk in messages.chunks(size) {
        let started = Instant::now();
        match way {
            Way::Each => {
                let m = chunk[0];
                let delivery = consume(&pool, &inbox, &key(m), &m.to_be_bytes(), m).await;
                assert!(matches!(delivery.unwrap(), Delivery::Processed(_)));
            }
            Way::Batch(_, stored) => {
                let batch: Vec<(MessageKey, Vec<u8>)> = chunk
                    .iter()
                    .map(|&m| (key(m), m.to_be_bytes().to_vec()))
                    .collect();
                if stored {
                    let settled = inbox
                        .batch(&pool, &batch, |tx, (_, payload)| {
                            Box::pin(pay(tx, order_of(payload)))
                        })
                        .await
                        .unwrap();
                    assert!(
                        settled
                            .iter()
                            .all(|s| matches!(s, Ok(Delivery::Processed(_))))
                    );
                } else {
                    let settled = inbox
                        .batch(&pool, &batch, |tx, (_, payload)| {
                            Box::pin(async move { pay(tx, order_of(payload)).await.map(drop) })
                        })
                        .await
                        .unwrap();
                    assert!(
                        settled
                            .iter()
                            .all(|s| matches!(s, Ok(Delivery::Processed(()))))
                    );
                }
            }
            Way::Savepoints(_) => {
                let mut tx = pool.begin().await.unwrap();
                for &m in chunk {
                    let delivery = consume(&mut tx, &inbox, &key(m), &m.to_be_bytes(), m).await;
                    assert!(matches!(delivery.unwrap(), Delivery::Processed(_)));
                }
                tx.commit().await.unwrap();
            }
            Way::ByHand(_) => by_hand(&pool, chunk).await,
        }
        let took = started.elapsed().as_secs_f64();
        latencies.extend(std::iter::repeat_n(took, chunk.len()));
    }
    latencies
}

fn order_of(payload: &[u8]) -> i64 {
    i64::from_be_bytes(payload.try_into().unwrap())
}

/// The handler's body: the payment, and its id.
async fn pay(tx: &mut Transaction<'static, Postgres>, order_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO payments (order_id) VALUES ($1) RETURNING id")
        .bind(order_id)
        .fetch_one(&mut **tx)
        .await
}

/// One batch, set-wise, by hand.
async fn by_hand(pool: &PgPool, chunk: &[i64]) {
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

/// Delivers `messages` `way` with `consumers` tasks, each its own share: messages per second
/// and the p99 of a message's latency (milliseconds).
async fn deliver(pool: &PgPool, messages: &[i64], way: Way, consumers: usize) -> (f64, f64) {
    let started = Instant::now();
    let shares: Vec<Vec<i64>> = (0..consumers)
        .map(|c| {
            messages
                .iter()
                .copied()
                .skip(c)
                .step_by(consumers)
                .collect()
        })
        .collect();
    let tasks: Vec<_> = shares
        .into_iter()
        .map(|share| tokio::spawn(consumer(pool.clone(), share, way)))
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let rate = messages.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    (rate, p99 * 1000.0)
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
    // (name, way, consumers); each ratio is to the first variant with as many consumers.
    let variants: [(&str, Way, usize); 12] = [
        ("one transaction each", Way::Each, 1),
        ("`Inbox::batch` of 1", Way::Batch(1, true), 1),
        ("`Inbox::batch` of 10", Way::Batch(10, true), 1),
        ("`Inbox::batch` of 100", Way::Batch(100, true), 1),
        (
            "`Inbox::batch` of 100, nothing stored",
            Way::Batch(100, false),
            1,
        ),
        (
            "100 calls in the caller's transaction",
            Way::Savepoints(100),
            1,
        ),
        ("100 by hand, set-wise", Way::ByHand(100), 1),
        ("one transaction each, 8 consumers", Way::Each, 8),
        ("`Inbox::batch` of 1, 8 consumers", Way::Batch(1, true), 8),
        ("`Inbox::batch` of 10, 8 consumers", Way::Batch(10, true), 8),
        (
            "`Inbox::batch` of 100, 8 consumers",
            Way::Batch(100, true),
            8,
        ),
        (
            "`Inbox::batch` of 100, nothing stored, 8 consumers",
            Way::Batch(100, false),
            8,
        ),
    ];
    let baseline = |consumers: usize| {
        variants
            .iter()
            .position(|v| matches!(v.1, Way::Each) && v.2 == consumers)
            .unwrap()
    };
    let n = variants.len();
    let (mut rates, mut ratios, mut p99s) = (
        vec![Vec::new(); n],
        vec![Vec::new(); n],
        vec![Vec::new(); n],
    );
    println!("batches: {keys} messages, {rounds} rounds, PostgreSQL");
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round));
        let mut this_round = vec![0.0; n];
        for i in order {
            let pool = prepare(&url).await;
            let messages: Vec<i64> = (1..=keys).collect();
            let (_, way, consumers) = variants[i];
            let (rate, p99) = deliver(&pool, &messages, way, consumers).await;
            this_round[i] = rate;
            p99s[i].push(p99);
            let paid: (i64, i64) =
                sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM payments")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(paid, (keys, keys), "every message once");
            pool.close().await;
        }
        for (i, rate) in this_round.iter().enumerate() {
            rates[i].push(*rate);
            ratios[i].push(rate / this_round[baseline(variants[i].2)]);
        }
    }
    println!(
        "| variant | messages/s (median) | × one transaction each (median of rounds) | p99 latency, ms |"
    );
    println!("|---|---:|---:|---:|");
    for (i, (name, _, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} | {:.1} |",
            median(rates[i].clone()),
            median(ratios[i].clone()),
            median(p99s[i].clone())
        );
    }
}
