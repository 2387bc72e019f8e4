//! The inbox's Kafka consumer against a hand-written rdkafka consumer with the same
//! discipline, and the chain's commit-to-consume latency, on PostgreSQL.
//!
//! **Throughput.** `IDEM_BENCH_KEYS` messages (default 3,000), each with an idem message id,
//! on a topic of 6 partitions, read by a fresh consumer group per variant from the start.
//! Every message's handler inserts a payment. Batches of 1, 10 and 100 (a round takes at
//! most that many messages, waiting at most 10 ms once the first came):
//!
//! - **idem**: [`KafkaConsumer`] — per partition, one `Inbox::batch` (the inbox record and
//!   the payment in one transaction), then the partition's offset committed;
//! - **by hand**: a `StreamConsumer` polled the same way, per partition one transaction
//!   holding, for each message, an insert into a dedup table (`ON CONFLICT DO NOTHING`) and
//!   the payment when the insert took, committed, then the partition's offset committed
//!   (synchronously, as idem does).
//!
//! Each variant is timed from its first message to its last offset's commit (the group's
//! join is left out: the same for both). Every round runs the variants in a fresh random
//! order on a fresh schema; the table shows the medians of messages per second and of the
//! per-round ratios to the hand-written consumer of the same batch.
//!
//! **Latency.** A relay ([`Relay`], its defaults but a 10 ms poll) publishes what a writer
//! stages (`IDEM_BENCH_LATENCY_KEYS` messages, default 1,000, at about 200 a second, each
//! carrying its stage time) to the topic, and a [`KafkaConsumer`] (batches of 100, 10 ms)
//! applies them: from the stage's commit to the consumer's, p50 and p99.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_KAFKA_URL=127.0.0.1:9092 \
//! cargo bench -p idem --bench kafka_consumer --all-features
//! ```
//!
//! `IDEM_BENCH_ROUNDS` (default 3) scales it; `IDEM_BENCH_PARTS=throughput` or `latency` runs
//! one part. The results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use idem::inbox::Inbox;
use idem::inbox::kafka::KafkaConsumer;
use idem::outbox::{self, Message, Relay};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SCHEMA: &str = "idem_bench_kafka";
const PARTITIONS: i32 = 6;
const WAIT: Duration = Duration::from_millis(10);

/// A pool on a fresh schema holding the payments, a dedup table and idem's tables.
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
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL);
         CREATE TABLE dedup (id TEXT PRIMARY KEY);
         CREATE TABLE latencies (micros BIGINT NOT NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();
    idem::migrate(&pool).await.unwrap();
    pool
}

fn admin(url: &str) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", url)
        .create()
        .unwrap()
}

async fn create_topic(url: &str, topic: &str) {
    let created = admin(url)
        .create_topics(
            &[rdkafka::admin::NewTopic::new(
                topic,
                PARTITIONS,
                rdkafka::admin::TopicReplication::Fixed(1),
            )],
            &rdkafka::admin::AdminOptions::new(),
        )
        .await
        .unwrap();
    for result in created {
        result.unwrap();
    }
}

/// `keys` messages, keyed by order (spread over the partitions), each with its idem id.
async fn produce(url: &str, topic: &str, keys: i64) {
    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", url)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut sends = Vec::new();
    for order in 1..=keys {
        let (key, id, payload) = (order.to_string(), format!("m-{order}"), order.to_string());
        let producer = producer.clone();
        let topic = topic.to_owned();
        sends.push(async move {
            let record = rdkafka::producer::FutureRecord::to(&topic)
                .key(&key)
                .payload(&payload)
                .headers(
                    rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                        key: outbox::kafka::ID_HEADER,
                        value: Some(id.as_bytes()),
                    }),
                );
            producer
                .send(
                    record,
                    rdkafka::util::Timeout::After(Duration::from_secs(30)),
                )
                .await
                .unwrap();
        });
    }
    futures_util::future::join_all(sends).await;
}

fn member(url: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", url)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    config
}

fn order_of(payload: Option<&[u8]>) -> i64 {
    std::str::from_utf8(payload.unwrap_or_default())
        .unwrap()
        .parse()
        .unwrap()
}

/// idem's consumer, batches of `batch`, until `keys` messages are applied: messages per
/// second from the first message to the last offset's commit.
async fn idem_consumer(
    pool: &PgPool,
    url: &str,
    topic: &str,
    group: &str,
    batch: usize,
    keys: i64,
) -> f64 {
    let consumer = KafkaConsumer::new(member(url, group), &[topic], Inbox::new("bench").unwrap())
        .unwrap()
        .batch(batch, WAIT);
    let first = std::sync::OnceLock::new();
    let mut applied = 0;
    while applied < keys {
        let round = consumer
            .next(pool, |tx, record| {
                first.get_or_init(Instant::now);
                Box::pin(async move {
                    sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
                        .bind(order_of(record.message().payload()))
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            })
            .await
            .unwrap();
        applied += round.settled.len() as i64;
    }
    keys as f64 / first.get().unwrap().elapsed().as_secs_f64()
}

/// The hand-written consumer, batches of `batch`, until `keys` messages are applied.
async fn by_hand(
    pool: &PgPool,
    url: &str,
    topic: &str,
    group: &str,
    batch: usize,
    keys: i64,
) -> f64 {
    let consumer: StreamConsumer = member(url, group).create().unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut first = None;
    let mut applied = 0;
    while applied < keys {
        let mut polled = vec![consumer.recv().await.unwrap().detach()];
        first.get_or_insert_with(Instant::now);
        let deadline = tokio::time::Instant::now() + WAIT;
        while polled.len() < batch {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(Ok(message)) => polled.push(message.detach()),
                _ => break,
            }
        }
        let mut partitions: BTreeMap<i32, Vec<rdkafka::message::OwnedMessage>> = BTreeMap::new();
        for message in polled {
            partitions
                .entry(message.partition())
                .or_default()
                .push(message);
        }
        for (partition, messages) in partitions {
            let mut tx = pool.begin().await.unwrap();
            for message in &messages {
                let header = rdkafka::message::Headers::get(message.headers().unwrap(), 0);
                assert_eq!(header.key, outbox::kafka::ID_HEADER);
                let id = std::str::from_utf8(header.value.unwrap())
                    .unwrap()
                    .to_owned();
                let new = sqlx::query("INSERT INTO dedup (id) VALUES ($1) ON CONFLICT DO NOTHING")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .rows_affected();
                if new == 1 {
                    sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
                        .bind(order_of(message.payload()))
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
            }
            tx.commit().await.unwrap();
            let mut list = TopicPartitionList::new();
            let next = messages.last().unwrap().offset() + 1;
            list.add_partition_offset(topic, partition, Offset::Offset(next))
                .unwrap();
            consumer.commit(&list, CommitMode::Sync).unwrap();
            applied += messages.len() as i64;
        }
    }
    keys as f64 / first.unwrap().elapsed().as_secs_f64()
}

/// The relay and the consumer together: the p50 and p99 of the time from a message's
/// stage commit to its consumer's commit, milliseconds.
async fn latency(pool: &PgPool, url: &str, topic: &str, keys: i64) -> (f64, f64) {
    let relay = Relay::new(pool.clone(), outbox::kafka::Kafka::connect(url).unwrap())
        .poll_interval(Duration::from_millis(10))
        .spawn()
        .unwrap();
    // A fetch answered within 10 ms even when nothing came: the test broker holds an empty
    // fetch for its whole wait (500 ms by default) instead of answering when a message
    // arrives, as Kafka does; this measures idem's path, not that wait.
    let mut config = member(url, &format!("{topic}-latency"));
    config.set("fetch.wait.max.ms", "10");
    let consumer = KafkaConsumer::new(config, &[topic], Inbox::new("bench-latency").unwrap())
        .unwrap()
        .batch(100, WAIT);
    let consuming = {
        let pool = pool.clone();
        tokio::spawn(async move {
            loop {
                consumer
                    .next(&pool, |tx, record| {
                        Box::pin(async move {
                            let staged: i64 = order_of(record.message().payload());
                            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                            sqlx::query("INSERT INTO latencies (micros) VALUES ($1)")
                                .bind(now.as_micros() as i64 - staged)
                                .execute(&mut **tx)
                                .await?;
                            Ok::<_, sqlx::Error>(())
                        })
                    })
                    .await
                    .unwrap();
            }
        })
    };
    // One message first, so the group's join (a second or so) is not in the figures.
    let mut tx = pool.begin().await.unwrap();
    outbox::stage(
        &mut tx,
        Message::bytes(topic, b"0".to_vec()).id("latency-warm"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    while sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM latencies")
        .fetch_one(pool)
        .await
        .unwrap()
        == 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::query("DELETE FROM latencies")
        .execute(pool)
        .await
        .unwrap();
    for i in 0..keys {
        let mut tx = pool.begin().await.unwrap();
        // The stage time, taken just before the commit that makes the message relayable.
        let staged = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        outbox::stage(
            &mut tx,
            Message::bytes(topic, staged.as_micros().to_string().into_bytes())
                .id(format!("latency-{i}")),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM latencies")
            .fetch_one(pool)
            .await
            .unwrap();
        if n >= keys {
            break;
        }
        assert!(Instant::now() < deadline, "only {n} of {keys} consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consuming.abort();
    relay.stop().await;
    let mut micros: Vec<i64> = sqlx::query_scalar("SELECT micros FROM latencies")
        .fetch_all(pool)
        .await
        .unwrap();
    micros.sort_unstable();
    let at = |q: usize| micros[(micros.len() * q / 100).min(micros.len() - 1)] as f64 / 1000.0;
    (at(50), at(99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 3000) as i64;
    let latency_keys = env_usize("IDEM_BENCH_LATENCY_KEYS", 1000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 3) as u64;
    let url = |name: &str| std::env::var(name).ok().filter(|u| !u.is_empty());
    let (Some(postgres), Some(kafka)) =
        (url("IDEM_BENCH_POSTGRES_URL"), url("IDEM_BENCH_KAFKA_URL"))
    else {
        eprintln!("skipped: set IDEM_BENCH_POSTGRES_URL and IDEM_BENCH_KAFKA_URL");
        return;
    };
    let parts = std::env::var("IDEM_BENCH_PARTS").unwrap_or_else(|_| "throughput,latency".into());
    let run = format!("idem-bench-consumer-{}", std::process::id());
    let topic = format!("{run}-messages");
    if parts.contains("throughput") {
        create_topic(&kafka, &topic).await;
        produce(&kafka, &topic, keys).await;
        throughput(&postgres, &kafka, &topic, &run, keys, rounds).await;
    }
    if parts.contains("latency") {
        let pool = prepare(&postgres).await;
        let latency_topic = format!("{run}-latency");
        create_topic(&kafka, &latency_topic).await;
        let (p50, p99) = latency(&pool, &kafka, &latency_topic, latency_keys).await;
        println!(
            "commit-to-consume through the relay and the consumer ({latency_keys} messages): p50 {p50:.1} ms, p99 {p99:.1} ms"
        );
        pool.close().await;
        let _ = admin(&kafka)
            .delete_topics(
                &[latency_topic.as_str()],
                &rdkafka::admin::AdminOptions::new(),
            )
            .await;
    }
    let _ = admin(&kafka)
        .delete_topics(&[topic.as_str()], &rdkafka::admin::AdminOptions::new())
        .await;
}

/// The throughput table: each variant `rounds` times, in a fresh order each round.
async fn throughput(postgres: &str, kafka: &str, topic: &str, run: &str, keys: i64, rounds: u64) {
    // (name, idem's, batch); each ratio is to the hand-written consumer of the same batch.
    let variants: [(&str, bool, usize); 6] = [
        ("by hand, batches of 1", false, 1),
        ("idem, batches of 1", true, 1),
        ("by hand, batches of 10", false, 10),
        ("idem, batches of 10", true, 10),
        ("by hand, batches of 100", false, 100),
        ("idem, batches of 100", true, 100),
    ];
    let n = variants.len();
    let (mut rates, mut ratios) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    println!(
        "kafka consumer: {keys} messages on {PARTITIONS} partitions, {rounds} rounds, PostgreSQL"
    );
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(round));
        let mut this_round = vec![0.0; n];
        for i in order {
            let pool = prepare(postgres).await;
            let (_, idem, batch) = variants[i];
            let group = format!("{run}-{round}-{i}");
            let rate = if idem {
                idem_consumer(&pool, kafka, topic, &group, batch, keys).await
            } else {
                by_hand(&pool, kafka, topic, &group, batch, keys).await
            };
            this_round[i] = rate;
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
            // The hand-written consumer of the same batch is the variant before an idem one.
            let baseline = if variants[i].1 { i - 1 } else { i };
            ratios[i].push(rate / this_round[baseline]);
        }
    }
    println!("| variant | messages/s (median) | × by hand, same batch (median of rounds) |");
    println!("|---|---:|---:|");
    for (i, (name, _, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} (min {:.2}, max {:.2}) |",
            median(rates[i].clone()),
            median(ratios[i].clone()),
            ratios[i].iter().copied().fold(f64::INFINITY, f64::min),
            ratios[i].iter().copied().fold(0.0, f64::max),
        );
    }
}
