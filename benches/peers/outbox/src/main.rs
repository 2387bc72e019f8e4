//! Relay throughput of Rust transactional-outbox crates, PostgreSQL -> NATS JetStream.
//!
//! Each round stages 5,000 messages (1,000 ordering keys, five messages each, small JSON) outside
//! the timed part, then times only the draining until every message is published (the crate's
//! own state says nothing is pending AND the stream holds 5,000 messages). 3 rounds, alternating
//! order. Needs PostgreSQL at $DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test) and
//! NATS JetStream at $NATS_URL (default nats://127.0.0.1:4222).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const N: u64 = 5_000;
const KEYS: u64 = 1_000;
const BATCH: u32 = 100;
const ROUNDS: usize = 3;
const POOL: u32 = 10;

#[derive(Serialize, Deserialize)]
struct Payload {
    n: u64,
    key: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Crate {
    Idem,
    Ruststream,
    Backbone,
}

impl Crate {
    fn stream(self) -> &'static str {
        match self {
            Crate::Idem => "IDEM",
            Crate::Ruststream => "RS",
            Crate::Backbone => "BB",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Crate::Idem => "idem (this repository)",
            Crate::Ruststream => "ruststream-sqlx",
            Crate::Backbone => "backbone-outbox",
        }
    }
    fn version(self) -> &'static str {
        match self {
            Crate::Idem => "0.1.0 (local)",
            Crate::Ruststream => "0.7.1 (+ ruststream-nats 0.7.1)",
            Crate::Backbone => "3.19.0",
        }
    }
}

struct Env {
    url: String,
    nats_url: String,
    js: jetstream::Context,
    rs_workers: usize,
}

async fn pool_in(url: &str, schema: &str) -> Result<PgPool, BoxError> {
    let admin = PgPool::connect(url).await?;
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&admin)
        .await?;
    admin.close().await;
    let options: PgConnectOptions = url.parse()?;
    let options = options.options([("search_path", schema)]);
    Ok(PgPoolOptions::new()
        .max_connections(POOL)
        .connect_with(options)
        .await?)
}

async fn fresh_stream(js: &jetstream::Context, name: &str) -> Result<(), BoxError> {
    let _ = js.delete_stream(name).await;
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    Ok(())
}

async fn stream_count(js: &jetstream::Context, name: &str) -> Result<u64, BoxError> {
    let mut s = js.get_stream(name).await?;
    Ok(s.info().await?.state.messages)
}

/// Reads the stream back and checks that every key's messages are in staging order, and that
/// the 5,000 messages are 5,000 distinct ones. Returns (in_order, distinct).
async fn check_order(js: &jetstream::Context, name: &str) -> Result<(bool, usize), BoxError> {
    let s = js.get_stream(name).await?;
    let consumer = s
        .create_consumer(consumer::pull::OrderedConfig::default())
        .await?;
    let mut messages = consumer.messages().await?;
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut in_order = true;
    let mut read = 0;
    while read < N {
        let msg = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await?
            .ok_or("stream ended")??;
        read += 1;
        let p: Payload = serde_json::from_slice(&msg.payload)?;
        if let Some(prev) = last.get(&p.key) {
            if *prev >= p.n {
                in_order = false;
            }
        }
        last.insert(p.key.clone(), p.n);
        seen.insert(p.n);
    }
    Ok((in_order, seen.len()))
}

struct RoundResult {
    secs: f64,
    in_order: bool,
    distinct: usize,
    passes: usize,
}

async fn round_idem(env: &Env, pool: &PgPool, round: usize) -> Result<RoundResult, BoxError> {
    use idem::outbox::{Destination, Message, Relay, nats::JetStream};
    sqlx::query("TRUNCATE idem_outbox").execute(pool).await?;
    fresh_stream(&env.js, "IDEM").await?;
    let run = format!("{}-{round}", std::process::id());
    let mut tx = pool.begin().await?;
    for i in 0..N {
        let key = format!("k{}", i % KEYS);
        idem::outbox::stage(
            &mut tx,
            Message::json(
                Destination::subject("IDEM.m"),
                &Payload {
                    n: i,
                    key: key.clone(),
                },
            )
            .ordering_key(key)
            .id(format!("m-{i}-{run}")),
        )
        .await?;
    }
    tx.commit().await?;
    let relay = Relay::new(pool.clone(), JetStream::new(env.js.clone())).batch_size(BATCH);
    let start = Instant::now();
    let mut passes = 0;
    loop {
        let r = relay.run_once().await?;
        passes += 1;
        if r.failed > 0 || r.dead > 0 {
            return Err(format!("idem: failures in a pass: {r:?}").into());
        }
        if r.claimed == 0 {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let backlog = idem::outbox::backlog(pool).await?;
    let count = stream_count(&env.js, "IDEM").await?;
    if backlog.pending != 0 || count != N {
        return Err(format!("idem: pending {} stream {count}", backlog.pending).into());
    }
    let (in_order, distinct) = check_order(&env.js, "IDEM").await?;
    Ok(RoundResult {
        secs,
        in_order,
        distinct,
        passes,
    })
}

const BB_SCHEMA: &str = "peers_backbone";

async fn round_backbone(env: &Env, pool: &PgPool) -> Result<RoundResult, BoxError> {
    use backbone_outbox::{OutboxError, OutboxRecord, outbox, relay};
    sqlx::query(&format!("TRUNCATE {BB_SCHEMA}.outbox_events"))
        .execute(pool)
        .await?;
    fresh_stream(&env.js, "BB").await?;
    let base = chrono::Utc::now();
    let company = uuid::Uuid::nil();
    let mut tx = pool.begin().await?;
    for i in 0..N {
        let key = format!("k{}", i % KEYS);
        let payload = serde_json::to_value(Payload {
            n: i,
            key: key.clone(),
        })?;
        // occurred_at strictly increasing: the relay drains ORDER BY occurred_at, id.
        let rec = OutboxRecord::new(
            "m",
            "bench",
            key,
            company,
            payload,
            base + chrono::Duration::microseconds(i as i64),
        );
        outbox::stage(&mut *tx, BB_SCHEMA, &rec).await?;
    }
    tx.commit().await?;
    let js = env.js.clone();
    // backbone-outbox has no broker publisher: its sink is a closure. This one publishes to
    // JetStream with the record id as Nats-Msg-Id and waits for the PubAck.
    let publish = move |rec: OutboxRecord| {
        let js = js.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", rec.id.to_string().as_str());
            let body = serde_json::to_vec(&rec.payload)
                .map_err(|e| OutboxError::Publish(e.to_string()))?;
            js.publish_with_headers("BB.m", headers, body.into())
                .await
                .map_err(|e| OutboxError::Publish(e.to_string()))?
                .await
                .map_err(|e| OutboxError::Publish(e.to_string()))?;
            Ok(())
        }
    };
    let start = Instant::now();
    let mut passes = 0;
    loop {
        let n = relay::drain_once(pool, BB_SCHEMA, BATCH as i64, &publish).await?;
        passes += 1;
        if n == 0 {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let pending = outbox::pending_count(pool, BB_SCHEMA).await?;
    let count = stream_count(&env.js, "BB").await?;
    if pending != 0 || count != N {
        return Err(format!("backbone: pending {pending} stream {count}").into());
    }
    let (in_order, distinct) = check_order(&env.js, "BB").await?;
    Ok(RoundResult {
        secs,
        in_order,
        distinct,
        passes,
    })
}

async fn round_ruststream(env: &Env, rs: &rs_relay::Rs) -> Result<RoundResult, BoxError> {
    rs.reset().await?;
    fresh_stream(&env.js, "RS").await?;
    // The relay is a running service: started first (connects, opens its subscription), idle on
    // an empty table, then the 5,000 rows commit in one transaction and the clock starts.
    let running = rs.start(&env.nats_url, "RS", env.rs_workers).await?;
    rs.stage(N, KEYS).await?;
    let start = Instant::now();
    let mut polls = 0;
    loop {
        polls += 1;
        if stream_count(&env.js, "RS").await? >= N && rs.pending().await? == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err("ruststream: not drained within 600 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    running.shutdown().await?;
    let count = stream_count(&env.js, "RS").await?;
    if count != N {
        return Err(format!("ruststream: stream {count}").into());
    }
    let (in_order, distinct) = check_order(&env.js, "RS").await?;
    Ok(RoundResult {
        secs,
        in_order,
        distinct,
        passes: polls,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let rs_workers: usize = std::env::var("RS_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let client = async_nats::connect(&nats_url).await?;
    let env = Env {
        url,
        nats_url,
        js: jetstream::new(client),
        rs_workers,
    };

    let idem_pool = pool_in(&env.url, "peers_idem").await?;
    idem::migrate(&idem_pool).await?;
    let bb_pool = pool_in(&env.url, BB_SCHEMA).await?;
    backbone_outbox::outbox::migrate(&bb_pool, BB_SCHEMA).await?;
    let rs = rs_relay::Rs::connect(&env.url, "peers_ruststream", POOL).await?;

    let orders = [
        [Crate::Idem, Crate::Ruststream, Crate::Backbone],
        [Crate::Backbone, Crate::Ruststream, Crate::Idem],
        [Crate::Ruststream, Crate::Idem, Crate::Backbone],
    ];
    let mut rates: HashMap<Crate, Vec<Option<f64>>> = HashMap::new();
    let mut notes: HashMap<Crate, Vec<String>> = HashMap::new();
    for round in 0..ROUNDS {
        for &c in &orders[round % orders.len()] {
            let result = match c {
                Crate::Idem => round_idem(&env, &idem_pool, round).await,
                Crate::Backbone => round_backbone(&env, &bb_pool).await,
                Crate::Ruststream => round_ruststream(&env, &rs).await,
            };
            match result {
                Ok(r) => {
                    let rate = N as f64 / r.secs;
                    eprintln!(
                        "round {round} {:<16} {:>8.3} s {:>9.0} msg/s  per-key order kept: {}  distinct: {}  passes/polls: {}",
                        c.stream(),
                        r.secs,
                        rate,
                        r.in_order,
                        r.distinct,
                        r.passes
                    );
                    rates.entry(c).or_default().push(Some(rate));
                    notes.entry(c).or_default().push(format!(
                        "r{round}: order kept={} distinct={}",
                        r.in_order, r.distinct
                    ));
                }
                Err(e) => {
                    eprintln!("round {round} {:<16} FAILED: {e}", c.stream());
                    rates.entry(c).or_default().push(None);
                    notes
                        .entry(c)
                        .or_default()
                        .push(format!("r{round}: failed: {e}"));
                }
            }
        }
    }
    for c in [Crate::Idem, Crate::Ruststream, Crate::Backbone] {
        let _ = env.js.delete_stream(c.stream()).await;
    }

    println!();
    println!(
        "5,000 messages, 1,000 ordering keys x 5, batch {BATCH}, PostgreSQL -> NATS JetStream (file storage), pool {POOL}, {ROUNDS} rounds; ruststream-sqlx workers_by_key({})",
        env.rs_workers
    );
    println!();
    println!(
        "| crate | version | messages/s (median) | per-round msg/s | ratio to idem (median, min–max) | per-key order in stream |"
    );
    println!("|---|---|---|---|---|---|");
    let idem_rates = rates.get(&Crate::Idem).cloned().unwrap_or_default();
    for c in [Crate::Idem, Crate::Ruststream, Crate::Backbone] {
        let rs = rates.get(&c).cloned().unwrap_or_default();
        let ok: Vec<f64> = rs.iter().flatten().copied().collect();
        let per_round: Vec<String> = rs
            .iter()
            .map(|r| r.map_or("failed".to_owned(), |v| format!("{v:.0}")))
            .collect();
        let mut ratios: Vec<f64> = rs
            .iter()
            .zip(idem_rates.iter())
            .filter_map(|(a, b)| Some((*a)? / (*b)?))
            .collect();
        let med = if ok.is_empty() {
            "n/a".to_owned()
        } else {
            format!("{:.0}", median(&mut ok.clone()))
        };
        let ratio = if ratios.is_empty() {
            "n/a".to_owned()
        } else {
            let lo = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} ({lo:.2}–{hi:.2})", median(&mut ratios))
        };
        let order = notes.get(&c).map(|n| n.join("; ")).unwrap_or_default();
        println!(
            "| {} | {} | {med} | {} | {ratio} | {order} |",
            c.name(),
            c.version(),
            per_round.join(", ")
        );
    }
    Ok(())
}
