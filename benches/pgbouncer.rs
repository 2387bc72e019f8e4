//! What a pooler costs idem's calls, and what unnamed statements cost on their own, against
//! the same calls on the server directly with idem's default (named statements) in the same
//! run:
//!
//! - **direct, named**: the baseline; a pool on PostgreSQL itself, idem's statements named
//!   and cached per connection (the default);
//! - **direct, unnamed**: the same pool with `set_postgres_statements(Unnamed)`: a parse per
//!   statement, and the one-statement form between `BEGIN` and `COMMIT`;
//! - **pgbouncer, session pooling**: named statements, through a pgbouncer of the
//!   benchmark's own;
//! - **pgbouncer, transaction pooling**: unnamed statements, through a pgbouncer lending
//!   half as many server connections as the pool has client connections.
//!
//! Two works, each on `IDEM_BENCH_KEYS` orders (default 2,000) by 16 tasks on a pool of 16
//! connections: **a transition** (`CREATED` → `PAID`, its body inserting the payment, its
//! receipt stored), then **the one-statement form** (`PAID` → `SHIPPED`, no transaction of
//! its own). Every round runs the variants in a fresh random order, each on a fresh database
//! (and a fresh pgbouncer); the table shows medians of calls per second and the median of
//! per-round ratios to the baseline.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! cargo bench -p idem --bench pgbouncer
//! ```
//!
//! Needs Debian's `pgbouncer` (run as the user `postgres`). `IDEM_BENCH_KEYS` and
//! `IDEM_BENCH_ROUNDS` (default 5) scale it. pgbouncer shares the machine's cores with
//! PostgreSQL and the benchmark. The results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;
#[path = "../tests/common/pgbouncer.rs"]
mod pgbouncer;

/// What `pgbouncer.rs` asks of the tests' `common`: a missing binary skips.
mod common {
    pub fn require_servers() -> bool {
        false
    }
}

use chart::median;
use env::env_usize;
use idem::{Outcome, PostgresStatements};
use pgbouncer::{OwnPgbouncer, Pooling};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const TASKS: usize = 16;
const DATABASE: &str = "idem_bench_pgbouncer";

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<i64, sqlx::Error> {
    // Unnamed, as a transaction pooler needs: the same statement in every variant.
    sqlx::query_scalar("INSERT INTO payments (order_id) VALUES ($1) RETURNING id")
        .bind(order_id)
        .persistent(false)
        .fetch_one(&mut **tx)
        .await
}

#[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
async fn ship(pool: &PgPool, order_id: i64) -> Result<String, String> {
    Ok(format!("parcel {order_id}"))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    DirectNamed,
    DirectUnnamed,
    Session,
    Transaction,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::DirectNamed => "direct, named (default)",
            Variant::DirectUnnamed => "direct, unnamed",
            Variant::Session => "pgbouncer session pooling, named",
            Variant::Transaction => "pgbouncer transaction pooling, unnamed",
        }
    }
}

/// A fresh database holding the orders and idem's tables.
async fn prepare(url: &str, keys: usize) {
    let admin = PgPool::connect(url).await.unwrap();
    for statement in [
        format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"),
        format!("CREATE DATABASE {DATABASE}"),
    ] {
        sqlx::raw_sql(&statement).execute(&admin).await.unwrap();
    }
    admin.close().await;
    let options = PgConnectOptions::from_str(url).unwrap().database(DATABASE);
    let pool = PgPool::connect_with(options).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL);
         INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, {keys}) g;"
    ))
    .execute(&pool)
    .await
    .unwrap();
    idem::migrate(&pool).await.unwrap();
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    pool.close().await;
}

/// Calls `call` for every key by [`TASKS`] tasks: calls per second.
async fn drain<F, Fut>(pool: &PgPool, keys: &[i64], call: F) -> f64
where
    F: Fn(PgPool, i64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let queue = Arc::new(Mutex::new(keys.to_vec()));
    let started = Instant::now();
    let workers: Vec<_> = (0..TASKS)
        .map(|_| {
            let (pool, queue, call) = (pool.clone(), queue.clone(), call.clone());
            tokio::spawn(async move {
                loop {
                    let Some(k) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    assert!(call(pool.clone(), k).await, "order {k} applied");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    keys.len() as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 2000);
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5);
    let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: set IDEM_BENCH_POSTGRES_URL");
        return;
    };
    let server = PgConnectOptions::from_str(&url).unwrap();
    let variants = [
        Variant::DirectNamed,
        Variant::DirectUnnamed,
        Variant::Session,
        Variant::Transaction,
    ];
    let works = ["a transition (stored receipt)", "the one-statement form"];
    // rates[work][variant], ratios[work][variant]
    let mut rates = vec![vec![Vec::new(); variants.len()]; works.len()];
    let mut ratios = vec![vec![Vec::new(); variants.len()]; works.len()];
    println!("pgbouncer: {keys} orders, {TASKS} tasks on {TASKS} connections, {rounds} rounds");
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round as u64));
        let mut this_round = vec![vec![0.0; variants.len()]; works.len()];
        for i in order {
            let variant = variants[i];
            prepare(&url, keys).await;
            idem::set_postgres_statements(match variant {
                Variant::DirectNamed | Variant::Session => PostgresStatements::Named,
                Variant::DirectUnnamed | Variant::Transaction => PostgresStatements::Unnamed,
            });
            let upstream = (server.get_host(), server.get_port());
            let bouncer = match variant {
                Variant::Session => OwnPgbouncer::start(upstream, Pooling::Session),
                Variant::Transaction => {
                    OwnPgbouncer::start_with(upstream, Pooling::Transaction, TASKS as u32 / 2, None)
                }
                _ => None,
            };
            let options = match &bouncer {
                Some(bouncer) => PgConnectOptions::new()
                    .host("127.0.0.1")
                    .port(bouncer.port())
                    .username(server.get_username()),
                None if matches!(variant, Variant::Session | Variant::Transaction) => {
                    eprintln!("skipped: install pgbouncer");
                    return;
                }
                None => server.clone(),
            }
            .database(DATABASE);
            let pool = PgPoolOptions::new()
                .max_connections(TASKS as u32)
                .connect_with(options)
                .await
                .unwrap();
            let mut shuffled: Vec<i64> = (1..=keys as i64).collect();
            shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round as u64 + 1));
            this_round[0][i] = drain(&pool, &shuffled, |pool, k| async move {
                matches!(pay(&pool, k).await.unwrap(), Outcome::Applied(_))
            })
            .await;
            this_round[1][i] = drain(&pool, &shuffled, |pool, k| async move {
                matches!(ship(&pool, k).await.unwrap(), Outcome::Applied(_))
            })
            .await;
            pool.close().await;
            drop(bouncer);
        }
        for (w, rates_of_work) in this_round.iter().enumerate() {
            for (i, rate) in rates_of_work.iter().enumerate() {
                rates[w][i].push(*rate);
                ratios[w][i].push(rate / rates_of_work[0]);
            }
        }
    }
    idem::set_postgres_statements(PostgresStatements::Named);
    for (w, work) in works.iter().enumerate() {
        println!("\n{work}");
        println!("| variant | calls/s (median) | × direct, named (median of rounds) | range |");
        println!("|---|---:|---:|---|");
        for (i, variant) in variants.iter().enumerate() {
            let each = &ratios[w][i];
            let low = each.iter().copied().fold(f64::INFINITY, f64::min);
            let high = each.iter().copied().fold(0.0, f64::max);
            println!(
                "| {} | {:.0} | {:.2} | {low:.2}–{high:.2} |",
                variant.name(),
                median(rates[w][i].clone()),
                median(each.clone()),
            );
        }
    }
}
