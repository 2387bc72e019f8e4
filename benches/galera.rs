//! What a multi-primary MariaDB Galera cluster costs idem's workload, against one node of
//! the same cluster measured in the same run (and a standalone MariaDB beside them):
//!
//! - **first deliveries**: `IDEM_BENCH_KEYS` messages (default 2,000), each once, to an
//!   inbox consumer whose body pays the order (a transition in the same transaction) and
//!   inserts its effect, by 32 tasks;
//! - **duplicates racing**: the same messages delivered 3 times each, the copies of a
//!   message side by side, so that on three nodes they meet on different nodes and the
//!   cluster refuses all but one at COMMIT (retried by the caller, answered as duplicates).
//!
//! Each runs on a standalone MariaDB (`IDEM_BENCH_MYSQL_URL`), on the Galera cluster with
//! every task on its first node, and with the tasks spread over its three nodes (task `t` on
//! node `t % 3`). Every round runs the variants in a fresh random order; the table shows
//! medians of deliveries per second and the median of per-round ratios to one Galera node.
//!
//! ```sh
//! scripts/galera start
//! IDEM_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//! IDEM_BENCH_GALERA_URLS=$(scripts/galera urls) cargo bench -p idem --bench galera
//! ```
//!
//! `IDEM_BENCH_KEYS` and `IDEM_BENCH_ROUNDS` (default 5) scale it. All the servers share
//! this machine's cores: three nodes cannot add capacity here, so the figures show what
//! replication and certification cost, not what more machines would give. The results are
//! in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use idem::inbox::{Delivery, Inbox, MessageKey};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySql, MySqlPool, Transaction};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TASKS: usize = 32;

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

const TABLES: &str = "
    CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, version BIGINT NOT NULL DEFAULT 0);
    CREATE TABLE payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL);
";

/// A consumer that is also a transition: the inbox record, the conditional UPDATE and the
/// effect in one transaction.
#[idem::idempotent(
    inbox = "inbox", message = "key", payload = "payload",
    machine = Order, key = "order_id", from = "CREATED", to = "PAID"
)]
async fn consume(
    tx: &mut Transaction<'_, MySql>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<i64, sqlx::Error> {
    let _ = payload;
    sqlx::query("INSERT INTO payments (order_id) VALUES (?)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(order_id)
}

/// A fresh database on the server of `url` (on a cluster, its first node), holding the
/// orders, idem's tables and `keys` orders to pay.
async fn prepare(url: &str, database: &str, keys: usize) {
    let mut admin: sqlx::MySqlConnection = sqlx::Connection::connect(url).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}; USE {database}; {TABLES}"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    for chunk in (1..=keys).collect::<Vec<_>>().chunks(1000) {
        let values: Vec<String> = chunk.iter().map(|k| format!("({k}, 'CREATED')")).collect();
        sqlx::raw_sql(&format!(
            "INSERT INTO orders (order_id, status) VALUES {}",
            values.join(",")
        ))
        .execute(&mut admin)
        .await
        .unwrap();
    }
    drop(admin);
    let pool = pool(&on_database(url, database)).await;
    idem::migrate(&pool).await.unwrap();
    pool.close().await;
}

fn on_database(url: &str, database: &str) -> String {
    let server = url.rsplit_once('/').map_or(url, |(server, _)| server);
    format!("{server}/{database}")
}

async fn pool(url: &str) -> MySqlPool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match MySqlPoolOptions::new()
            .max_connections(12)
            .connect(url)
            .await
        {
            Ok(pool) => return pool,
            // A node learns of the database a moment after the first made it.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{url}: {e}"),
        }
    }
}

/// Delivers every message of `queue` with 32 tasks, task `t` on `pools[t % pools.len()]`,
/// retrying each conflict the cluster refused: deliveries per second, and conflicts.
async fn drain(pools: &[MySqlPool], queue: Vec<i64>) -> (f64, usize) {
    let total = queue.len();
    let queue = Arc::new(Mutex::new(queue));
    let conflicts = Arc::new(AtomicUsize::new(0));
    let inbox = Inbox::new("bench").unwrap();
    let started = Instant::now();
    let workers: Vec<_> = (0..TASKS)
        .map(|t| {
            let pool = pools[t % pools.len()].clone();
            let (queue, conflicts, inbox) = (queue.clone(), conflicts.clone(), inbox.clone());
            tokio::spawn(async move {
                loop {
                    let Some(order_id) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let key = MessageKey::business(format!("order:{order_id}"), "paid").unwrap();
                    let payload = order_id.to_be_bytes();
                    loop {
                        match consume(&pool, &inbox, &key, &payload, order_id).await {
                            Ok(Delivery::Processed(_) | Delivery::Duplicate { .. }) => break,
                            Ok(Delivery::InProgress { .. }) => {
                                tokio::time::sleep(Duration::from_millis(2)).await
                            }
                            Err(e) if e.is_conflict() || e.is_transient() => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    (
        total as f64 / started.elapsed().as_secs_f64(),
        conflicts.load(Ordering::Relaxed),
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Standalone,
    OneNode,
    ThreeNodes,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Standalone => "standalone MariaDB",
            Variant::OneNode => "Galera, every task on node 1",
            Variant::ThreeNodes => "Galera, tasks over 3 nodes",
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 2000);
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5);
    let Some(galera) = std::env::var("IDEM_BENCH_GALERA_URLS")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!(
            "skipped: start scripts/galera and set IDEM_BENCH_GALERA_URLS=$(scripts/galera urls)"
        );
        return;
    };
    let nodes: Vec<String> = galera.split(',').map(str::to_owned).collect();
    let standalone = std::env::var("IDEM_BENCH_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty());
    // One Galera node first: the baseline of the ratios.
    let mut variants = vec![Variant::OneNode, Variant::ThreeNodes];
    if standalone.is_some() {
        variants.push(Variant::Standalone);
    }
    println!("Galera: {keys} messages, {TASKS} tasks, {rounds} rounds");
    for (workload, copies) in [
        ("first deliveries", 1usize),
        ("duplicates racing (3 copies)", 3),
    ] {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut conflicts: Vec<Vec<usize>> = vec![Vec::new(); variants.len()];
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(
                round as u64 * 7 + copies as u64,
            ));
            let mut this_round = vec![0.0; variants.len()];
            for i in order {
                let database = "idem_bench_galera";
                let urls: Vec<String> = match variants[i] {
                    Variant::Standalone => vec![standalone.clone().unwrap()],
                    Variant::OneNode => vec![nodes[0].clone()],
                    Variant::ThreeNodes => nodes.clone(),
                };
                prepare(&urls[0], database, keys).await;
                let mut pools = Vec::new();
                for url in &urls {
                    pools.push(pool(&on_database(url, database)).await);
                }
                let mut queue: Vec<i64> = (1..=keys as i64).collect();
                queue.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round as u64));
                let queue: Vec<i64> = queue
                    .into_iter()
                    .flat_map(|k| std::iter::repeat_n(k, copies))
                    .collect();
                let (rate, refused) = drain(&pools, queue).await;
                let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments")
                    .fetch_one(&pools[0])
                    .await
                    .unwrap();
                assert_eq!(paid, keys as i64, "every order paid once");
                for pool in pools {
                    pool.close().await;
                }
                rates[i].push(rate);
                conflicts[i].push(refused);
                this_round[i] = rate;
            }
            let one = this_round[0];
            for (i, rate) in this_round.iter().enumerate() {
                ratios[i].push(rate / one);
            }
        }
        println!("\n{workload}");
        println!(
            "| variant | deliveries/s (median) | × one Galera node | conflicts retried (median) |"
        );
        println!("|---|---:|---:|---:|");
        for (i, variant) in variants.iter().enumerate() {
            let mut refused = conflicts[i].clone();
            refused.sort_unstable();
            println!(
                "| {} | {:.0} | {:.2} | {} |",
                variant.name(),
                median(rates[i].clone()),
                median(ratios[i].clone()),
                refused[refused.len() / 2]
            );
        }
    }
}
