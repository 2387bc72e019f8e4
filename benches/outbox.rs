//! The outbox's costs, each against a baseline measured in the same run:
//!
//! 1. **Staging.** A transition whose body inserts its effect and stages one message, against
//!    the same transition without the message, and with the message inserted by hand into a
//!    minimal outbox table (a sequence, a unique id, the payload); 1 and 8 tasks, on SQLite (a file, WAL,
//!    `synchronous = FULL`), PostgreSQL (with its NOTIFY, and without: `set_notify(false)`)
//!    and MariaDB.
//! 2. **Relaying.** Draining 5,000 staged messages (1,000 ordering keys, five each) to NATS
//!    JetStream, to RabbitMQ and to Kafka (a topic of 6 partitions) with idem's relay, against a relay loop written by hand on the
//!    same table (`SELECT … ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED`, publish the batch,
//!    await its acknowledgements, one `UPDATE` marking it — PostgreSQL: `seq = ANY($1)`,
//!    MariaDB: the `seq`s written into an `IN` list —, `COMMIT`), same batch size, same
//!    database and broker; on PostgreSQL and MariaDB. The loop by hand keeps no order per key,
//!    and on MariaDB its range claim's gap locks make concurrent staging wait (nothing stages
//!    while this part runs).
//! 3. **Latency.** From a message's commit to its acknowledgement by JetStream, 300 messages
//!    committed one every 10 ms, through a spawned relay on PostgreSQL woken by NOTIFY,
//!    against the same relay polling (every 1 s, the default, and every 100 ms).
//!
//! 4. **A dead head.** A relay's claim of 100 messages on 100 keys, with an acknowledging
//!    publisher that does nothing else: on an empty outbox, then behind a dead message with
//!    `IDEM_BENCH_HELD` (default 400,000) messages of its key staged behind it (held out of
//!    the claim's way, as idem keeps them), then with those messages released by hand (the
//!    claim walking past them, as before they were held); on PostgreSQL, MariaDB and SQLite.
//!    The three states run one after the other (making and unmaking them rewrites every
//!    row), each `3 × ROUNDS` times, after `VACUUM ANALYZE` (PostgreSQL), `ANALYZE` and
//!    InnoDB's purge (MariaDB: there the relay holds before each claim, so nothing is left
//!    unheld to measure), `ANALYZE` (SQLite).
//!
//! 5. **Delayed messages' lateness.** `IDEM_BENCH_DUE` (default 10,000) timeouts, one per
//!    order, due evenly within one second a few seconds after they are staged, published by
//!    a spawned relay (batches of 100) to an acknowledging publisher that does nothing else:
//!    each one's publication against its due time, and how many were published more than
//!    once; with the default poll interval (1 s), on PostgreSQL with and without NOTIFY, on
//!    MariaDB and on SQLite.
//!
//! Every cell runs its variants `ROUNDS` times in a fresh random order per round; tables show
//! medians, and the median of the per-round ratios.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//! IDEM_BENCH_NATS_URL=nats://127.0.0.1:4222 \
//! IDEM_BENCH_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//! IDEM_BENCH_KAFKA_URL=127.0.0.1:9092 cargo bench -p idem --bench outbox
//! ```
//!
//! `IDEM_BENCH_KEYS` (default 1000: transitions per cell) and `IDEM_BENCH_ROUNDS` (default 5)
//! scale it; `IDEM_BENCH_PARTS` (`staging,relay,latency,dead,delayed,lateness`) picks parts
//! (`delayed`: a claim with `IDEM_BENCH_DELAYED`, default 100,000, delayed messages waiting;
//! `lateness`: part 5); without a
//! URL its parts are skipped. The results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use futures_util::future::join_all;
use idem::StateMachine;
use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

/// A number no earlier call in this process returned.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn url(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|u| !u.is_empty())
}

const TABLES: &str =
    "CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL,
                                           version BIGINT NOT NULL DEFAULT 0);
                      CREATE TABLE payments (order_id BIGINT NOT NULL)";

/// The outbox a user would write by hand: a sequence, an id that dedups, the payload.
const HAND_OUTBOX_POSTGRES: &str = "CREATE TABLE hand_outbox (seq BIGSERIAL PRIMARY KEY, \
    id TEXT NOT NULL UNIQUE, payload BYTEA NOT NULL)";
const HAND_OUTBOX_SQLITE: &str = "CREATE TABLE hand_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
    id TEXT NOT NULL UNIQUE, payload BLOB NOT NULL)";
const HAND_OUTBOX_MYSQL: &str = "CREATE TABLE hand_outbox (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
    id VARCHAR(64) NOT NULL UNIQUE, payload LONGBLOB NOT NULL)";

/// The two handlers of part 1, on one backend.
macro_rules! handlers {
    ($module:ident, $db:ty, $insert:literal, $message:literal) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            pub async fn plain(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query($insert)
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            pub async fn staged(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query($insert)
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                outbox::stage(tx, Message::json("bench.paid", &order_id)).await?;
                Ok(())
            }

            /// Pays orders `1..=keys` with `tasks` tasks, staging or not: transitions per second.
            /// The same message inserted by hand into a minimal outbox table (an id, a
            /// payload): the floor any outbox pays.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            pub async fn by_hand(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query($insert)
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query($message)
                    .bind(format!("paid-{order_id}"))
                    .bind(serde_json::to_vec(&order_id).unwrap())
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Pays orders `1..=keys` with `tasks` tasks, with no message (`variant` 0),
            /// idem's (1) or one by hand (2): transitions per second.
            pub async fn run(pool: &sqlx::Pool<$db>, keys: i64, tasks: i64, variant: usize) -> f64 {
                let started = Instant::now();
                let workers: Vec<_> = (0..tasks)
                    .map(|t| {
                        let pool = pool.clone();
                        tokio::spawn(async move {
                            for order_id in (1..=keys).filter(|k| k % tasks == t) {
                                let outcome = match variant {
                                    0 => plain(&pool, order_id).await,
                                    1 => staged(&pool, order_id).await,
                                    _ => by_hand(&pool, order_id).await,
                                };
                                assert!(outcome.unwrap().is_applied());
                            }
                        })
                    })
                    .collect();
                for worker in workers {
                    worker.await.unwrap();
                }
                keys as f64 / started.elapsed().as_secs_f64()
            }
        }
    };
}

handlers!(
    on_sqlite,
    sqlx::Sqlite,
    "INSERT INTO payments (order_id) VALUES ($1)",
    "INSERT INTO hand_outbox (id, payload) VALUES ($1, $2)"
);
handlers!(
    on_postgres,
    sqlx::Postgres,
    "INSERT INTO payments (order_id) VALUES ($1)",
    "INSERT INTO hand_outbox (id, payload) VALUES ($1, $2)"
);
handlers!(
    on_mysql,
    sqlx::MySql,
    "INSERT INTO payments (order_id) VALUES (?)",
    "INSERT INTO hand_outbox (id, payload) VALUES (?, ?)"
);

/// Empty tables and `keys` orders CREATED, through `$pool`.
macro_rules! reset {
    ($pool:expr, $keys:expr) => {{
        let pool = $pool;
        for table in [
            "orders",
            "payments",
            "idem_outbox",
            "idem_results",
            "hand_outbox",
        ] {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(pool)
                .await
                .unwrap();
        }
        let values: Vec<String> = (1..=$keys).map(|k| format!("({k}, 'CREATED')")).collect();
        for chunk in values.chunks(500) {
            let sql = format!(
                "INSERT INTO orders (order_id, status) VALUES {}",
                chunk.join(", ")
            );
            sqlx::query(&sql).execute(pool).await.unwrap();
        }
    }};
}

/// Part 1 on one backend: the rows of its table.
macro_rules! staging_cost {
    ($name:expr, $pool:expr, $module:ident, $keys:expr, $rounds:expr) => {{
        let pool = $pool;
        let mut rows = Vec::new();
        for tasks in [1i64, 8] {
            let mut rates: [Vec<f64>; 3] = Default::default();
            let (mut to_none, mut to_hand) = (Vec::new(), Vec::new());
            let mut rng = rand::rngs::StdRng::seed_from_u64(tasks as u64);
            for _ in 0..$rounds {
                let mut order = [0, 1, 2];
                order.shuffle(&mut rng);
                let mut round = [0.0; 3];
                for variant in order {
                    reset!(&pool, $keys);
                    round[variant] = $module::run(&pool, $keys, tasks, variant).await;
                }
                for (all, rate) in rates.iter_mut().zip(round) {
                    all.push(rate);
                }
                to_none.push(round[1] / round[0]);
                to_hand.push(round[1] / round[2]);
            }
            let range = |ratios: &[f64]| {
                let (low, high) = ratios
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(l, h), &r| (l.min(r), h.max(r)));
                format!("{:.2} ({low:.2}–{high:.2})", median(ratios.to_vec()))
            };
            let [none, idem, hand] = rates;
            rows.push(format!(
                "| {} | {tasks} | {:.0} | {:.0} | {:.0} | {} | {} |",
                $name,
                median(none),
                median(idem),
                median(hand),
                range(&to_none),
                range(&to_hand),
            ));
        }
        rows
    }};
}

/// A broker for part 2 and 3: idem's publisher, and the same publish written by hand.
#[derive(Clone)]
enum Broker {
    Nats(async_nats::jetstream::Context, String),
    /// The channel the by-hand publishes use, idem's publisher (channels of its own on the
    /// same connection), and the queue.
    Rabbit(lapin::Channel, outbox::rabbitmq::Rabbit, String),
    /// The producer the by-hand publishes use (idempotent, `acks=all`, as idem's), idem's
    /// publisher (a producer of its own), the topic and the bootstrap servers.
    Kafka(
        rdkafka::producer::FutureProducer,
        outbox::kafka::Kafka,
        String,
        String,
    ),
}

impl Broker {
    fn name(&self) -> &'static str {
        match self {
            Broker::Nats(..) => "NATS JetStream",
            Broker::Rabbit(..) => "RabbitMQ",
            Broker::Kafka(..) => "Kafka",
        }
    }

    /// Where the messages go: a subject of the stream, or the queue (default exchange).
    fn destination(&self) -> outbox::Destination {
        match self {
            Broker::Nats(_, stream) => outbox::Destination::subject(format!("{stream}.m")),
            Broker::Rabbit(_, _, queue) => outbox::Destination::exchange("", queue.as_str()),
            Broker::Kafka(_, _, topic, _) => outbox::Destination::subject(topic.as_str()),
        }
    }

    /// Publishes a batch by hand, all at once, and awaits every acknowledgement.
    async fn publish_by_hand(&self, batch: &[(String, String, String, Vec<u8>)]) {
        match self {
            Broker::Nats(js, _) => {
                let acks = join_all(batch.iter().map(|(id, subject, _, payload)| async move {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    js.publish_with_headers(subject.clone(), headers, payload.clone().into())
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }));
                acks.await;
            }
            Broker::Rabbit(channel, _, _) => {
                let confirms = join_all(batch.iter().map(
                    |(id, exchange, routing_key, payload)| async move {
                        let properties = lapin::BasicProperties::default()
                            .with_message_id(id.as_str().into())
                            .with_delivery_mode(2);
                        channel
                            .basic_publish(
                                exchange.as_str().into(),
                                routing_key.as_str().into(),
                                lapin::options::BasicPublishOptions {
                                    mandatory: true,
                                    ..Default::default()
                                },
                                payload,
                                properties,
                            )
                            .await
                            .unwrap()
                            .await
                            .unwrap();
                    },
                ));
                confirms.await;
            }
            // Keyed by the id (the loop by hand keeps no per-key order), the id in the
            // header idem uses; every delivery report awaited.
            Broker::Kafka(producer, ..) => {
                let reports = join_all(batch.iter().map(|(id, topic, _, payload)| async move {
                    let headers =
                        rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                            key: outbox::kafka::ID_HEADER,
                            value: Some(id.as_bytes()),
                        });
                    let record = rdkafka::producer::FutureRecord::to(topic)
                        .key(id)
                        .payload(payload)
                        .headers(headers);
                    producer
                        .send(record, rdkafka::util::Timeout::After(Duration::ZERO))
                        .await
                        .unwrap();
                }));
                reports.await;
            }
        }
    }
}

impl Publisher for Broker {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        match self {
            Broker::Nats(js, _) => {
                outbox::nats::JetStream::new(js.clone())
                    .publish(message)
                    .await
            }
            Broker::Rabbit(_, rabbit, _) => rabbit.publish(message).await,
            Broker::Kafka(_, kafka, ..) => kafka.publish(message).await,
        }
    }
}

const MESSAGES: usize = 5000;
const BATCH: usize = 100;

/// Part 2 on one database: the relay loop by hand, on `$pool`, its placeholders `$n` or `?`.
macro_rules! by_hand {
    ($pool:expr, $broker:expr, $claim:expr, $mark:expr) => {{
        let (pool, broker) = ($pool, $broker);
        let started = Instant::now();
        let mut published = 0;
        loop {
            let mut tx = pool.begin().await.unwrap();
            let rows: Vec<(i64, String, String, String, Vec<u8>)> = sqlx::query_as($claim)
                .bind(BATCH as i64)
                .fetch_all(&mut *tx)
                .await
                .unwrap();
            if rows.is_empty() {
                tx.commit().await.unwrap();
                break;
            }
            let batch: Vec<(String, String, String, Vec<u8>)> = rows
                .iter()
                .map(|(_, id, d, r, p)| (id.clone(), d.clone(), r.clone(), p.clone()))
                .collect();
            broker.publish_by_hand(&batch).await;
            $mark(&mut tx, rows.iter().map(|r| r.0).collect::<Vec<i64>>()).await;
            tx.commit().await.unwrap();
            published += rows.len();
        }
        assert_eq!(published, MESSAGES);
        MESSAGES as f64 / started.elapsed().as_secs_f64()
    }};
}

/// Stages the messages of part 2 (outside the timing): 1,000 keys, five messages each.
macro_rules! stage_all {
    ($pool:expr, $broker:expr) => {{
        let pool = $pool;
        for table in ["idem_outbox"] {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(pool)
                .await
                .unwrap();
        }
        let mut tx = pool.begin().await.unwrap();
        for i in 0..MESSAGES {
            let message = Message::json($broker.destination(), &i)
                .ordering_key(format!("k{}", i % 1000))
                .id(format!("m-{}-{i}", unique()));
            outbox::stage(&mut tx, message).await.unwrap();
        }
        tx.commit().await.unwrap();
    }};
}

async fn drain<DB: idem::Backend>(relay: &Relay<DB, Broker>) -> f64 {
    let started = Instant::now();
    let mut published = 0;
    loop {
        let relayed = relay.run_once().await.unwrap();
        published += relayed.published;
        if relayed.claimed == 0 {
            break;
        }
    }
    assert_eq!(published, MESSAGES);
    MESSAGES as f64 / started.elapsed().as_secs_f64()
}

macro_rules! relay_cost {
    ($name:expr, $pool:expr, $brokers:expr, $rounds:expr, $claim:expr, $mark:expr) => {{
        let pool = $pool;
        let mut rows = Vec::new();
        for broker in $brokers {
            let relay = Relay::new(pool.clone(), broker.clone()).batch_size(BATCH as u32);
            let (mut idem_rates, mut hand_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..$rounds {
                let mut round_rates = [0.0; 2];
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for variant in order {
                    stage_all!(&pool, broker);
                    round_rates[variant] = if variant == 0 {
                        drain(&relay).await
                    } else {
                        by_hand!(&pool, &broker, $claim, $mark)
                    };
                }
                idem_rates.push(round_rates[0]);
                hand_rates.push(round_rates[1]);
                ratios.push(round_rates[0] / round_rates[1]);
            }
            rows.push(format!(
                "| {} | {} | {:.0} | {:.0} | {:.2} ({:.2}–{:.2}) |",
                $name,
                broker.name(),
                median(idem_rates),
                median(hand_rates),
                median(ratios.clone()),
                ratios.iter().cloned().fold(f64::MAX, f64::min),
                ratios.iter().cloned().fold(f64::MIN, f64::max),
            ));
        }
        rows
    }};
}

/// Acknowledges every message, and refuses those of the ordering key `poison`.
#[derive(Clone)]
struct AckAll;

impl Publisher for AckAll {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        if message.ordering_key() == "poison" {
            return Err("refused".into());
        }
        Ok(Published::Acked)
    }
}

/// Stages `count` messages in transactions of 1,000, each its own key unless `key` is
/// given; returns nothing.
macro_rules! stage_many {
    ($pool:expr, $count:expr, $key:expr) => {{
        let mut left: usize = $count;
        while left > 0 {
            let n = left.min(1000);
            let mut tx = $pool.begin().await.unwrap();
            for _ in 0..n {
                let id = format!("dead-bench-{}", unique());
                let key: Option<&str> = $key;
                let key = key.map(str::to_owned).unwrap_or_else(|| id.clone());
                outbox::stage(
                    &mut tx,
                    Message::bytes("dead.bench", "x").id(id).ordering_key(key),
                )
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
            left -= n;
        }
    }};
}

/// Milliseconds of `rounds` claims of 100 messages on 100 keys (one `run_once` each, the
/// messages staged before each).
macro_rules! claim_times {
    ($pool:expr, $relay:expr, $rounds:expr) => {{
        let mut times = Vec::new();
        for _ in 0..$rounds {
            stage_many!($pool, 100, None);
            let started = Instant::now();
            let relayed = $relay.run_once().await.unwrap();
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(relayed.published, 100, "{relayed:?}");
        }
        times
    }};
}

/// One row: a claim's time on an empty outbox, behind a dead head holding `held` messages,
/// and with those messages not held.
macro_rules! dead_head_cost {
    ($name:expr, $pool:expr, $rounds:expr, $held:expr, $analyze:expr, $holds_on_claim:expr) => {{
        let pool = $pool;
        // Statistics brought up to date after a bulk change, as autovacuum or InnoDB would
        // soon.
        let settle = async || sqlx::raw_sql($analyze).execute(&pool).await.unwrap();
        sqlx::query("DELETE FROM idem_outbox")
            .execute(&pool)
            .await
            .unwrap();
        let relay = Relay::new(pool.clone(), AckAll)
            .batch_size(100)
            .max_attempts(1);
        // A round to warm the caches and the statements, not counted.
        claim_times!(pool, relay, 1);
        let empty = claim_times!(pool, relay, $rounds);
        stage_many!(pool, 1, Some("poison"));
        assert_eq!(relay.run_once().await.unwrap().dead, 1);
        stage_many!(pool, $held, Some("poison"));
        // Held by the staging, or on MariaDB before the next claim.
        relay.run_once().await.unwrap();
        let backlog = outbox::backlog(&pool).await.unwrap();
        assert_eq!(backlog.held as usize, $held, "{backlog:?}");
        settle().await;
        let held = claim_times!(pool, relay, $rounds);
        sqlx::query("UPDATE idem_outbox SET dead_at = NULL WHERE dead_at = 0")
            .execute(&pool)
            .await
            .unwrap();
        settle().await;
        // MariaDB's relay holds them again before its claim: there, no claim walks them.
        let unheld = if $holds_on_claim {
            None
        } else {
            Some(median(claim_times!(pool, relay, $rounds)))
        };
        let (empty, held) = (median(empty), median(held));
        let shown = |ms: Option<f64>, digits: usize| {
            ms.map_or("—".to_owned(), |ms| format!("{ms:.digits$}"))
        };
        format!(
            "| {} | {:.1} | {:.1} | {} | {:.2} | {} |",
            $name,
            empty,
            held,
            shown(unheld, 1),
            held / empty,
            shown(unheld.map(|ms| ms / empty), 1),
        )
    }};
}

/// One row: a claim's time on an empty outbox, and with `delayed` messages staged before
/// every due one and due in an hour (each its own key).
macro_rules! delayed_cost {
    ($name:expr, $pool:expr, $rounds:expr, $delayed:expr, $analyze:expr) => {{
        let pool = $pool;
        let settle = async || sqlx::raw_sql($analyze).execute(&pool).await.unwrap();
        sqlx::query("DELETE FROM idem_outbox")
            .execute(&pool)
            .await
            .unwrap();
        let relay = Relay::new(pool.clone(), AckAll).batch_size(100);
        claim_times!(pool, relay, 1);
        let empty = claim_times!(pool, relay, $rounds);
        let mut left: usize = $delayed;
        while left > 0 {
            let n = left.min(1000);
            let mut tx = pool.begin().await.unwrap();
            for _ in 0..n {
                let id = format!("delayed-bench-{}", unique());
                let later = Message::bytes("delayed.bench", "x")
                    .id(id.clone())
                    .ordering_key(id)
                    .deliver_after(Duration::from_secs(3600));
                outbox::stage(&mut tx, later).await.unwrap();
            }
            tx.commit().await.unwrap();
            left -= n;
        }
        settle().await;
        let delayed = claim_times!(pool, relay, $rounds);
        let (empty, delayed) = (median(empty), median(delayed));
        format!(
            "| {} | {:.1} | {:.1} | {:.2} |",
            $name,
            empty,
            delayed,
            delayed / empty
        )
    }};
}

const CLAIM_PG: &str = "SELECT seq, id, destination, routing_key, payload FROM idem_outbox \
    WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED";
/// The loop by hand marks its batch in one statement: on PostgreSQL with the batch's `seq`s
/// bound as one array.
async fn mark_pg(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, seqs: Vec<i64>) {
    sqlx::query(
        "UPDATE idem_outbox SET published_at = 1, attempts = attempts + 1 WHERE seq = ANY($1)",
    )
    .bind(seqs)
    .execute(&mut **tx)
    .await
    .unwrap();
}

/// On MySQL, which binds no arrays, with the `seq`s written into the statement.
async fn mark_mysql(tx: &mut sqlx::Transaction<'_, sqlx::MySql>, seqs: Vec<i64>) {
    let seqs: Vec<String> = seqs.iter().map(i64::to_string).collect();
    let sql = format!(
        "UPDATE idem_outbox SET published_at = 1, attempts = attempts + 1 WHERE seq IN ({})",
        seqs.join(", ")
    );
    sqlx::query(&sql).execute(&mut **tx).await.unwrap();
}
const CLAIM_MYSQL: &str = "SELECT seq, CAST(id AS CHAR), destination, routing_key, payload FROM idem_outbox \
    WHERE published_at IS NULL ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";

/// Records when the broker acknowledged each message.
#[derive(Clone)]
struct Timed {
    broker: Broker,
    acked: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Publisher for Timed {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        let published = self.broker.publish(message).await?;
        self.acked
            .lock()
            .unwrap()
            .insert(message.id().to_owned(), Instant::now());
        Ok(published)
    }
}

/// Part 3: commit-to-acknowledgement latencies (ms) through a spawned relay.
async fn latencies(pool: &sqlx::PgPool, broker: &Broker, listen: bool, poll: Duration) -> Vec<f64> {
    sqlx::query("DELETE FROM idem_outbox")
        .execute(pool)
        .await
        .unwrap();
    let timed = Timed {
        broker: broker.clone(),
        acked: Arc::default(),
    };
    let relay = Relay::new(pool.clone(), timed.clone())
        .notifications(listen)
        .poll_interval(poll)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let run = unique();
    let mut committed = HashMap::new();
    for i in 0..300 {
        let id = format!("l-{run}-{i}");
        let mut tx = pool.begin().await.unwrap();
        outbox::stage(
            &mut tx,
            Message::json(broker.destination(), &i).id(id.clone()),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        committed.insert(id, Instant::now());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while timed.acked.lock().unwrap().len() < committed.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    let acked = timed.acked.lock().unwrap();
    let mut ms: Vec<f64> = committed
        .iter()
        .map(|(id, at)| acked[id].saturating_duration_since(*at).as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// Records when each message was published, on the wall clock its due time is on.
#[derive(Clone, Default)]
struct Stamped(Arc<Mutex<HashMap<String, Vec<SystemTime>>>>);

impl Publisher for Stamped {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        let now = SystemTime::now();
        let mut seen = self.0.lock().unwrap();
        seen.entry(message.id().to_owned()).or_default().push(now);
        Ok(Published::Acked)
    }
}

/// Part 5: `count` timeouts due evenly within one second, staged ahead of it, published by
/// a spawned relay: each one's lateness against its due time (ms, sorted; negative if
/// early), and how many were published more than once.
async fn lateness<DB: idem::Backend>(
    pool: &sqlx::Pool<DB>,
    count: usize,
    listen: bool,
) -> (Vec<f64>, usize) {
    let stamped = Stamped::default();
    let relay = Relay::new(pool.clone(), stamped.clone())
        .notifications(listen)
        .spawn()
        .unwrap();
    let run = unique();
    let lead = Duration::from_secs(6);
    let first = SystemTime::now() + lead;
    let mut due = HashMap::new();
    let indexes: Vec<usize> = (0..count).collect();
    for chunk in indexes.chunks(500) {
        let mut tx = pool.begin().await.unwrap();
        for &i in chunk {
            let at = first + Duration::from_micros((1_000_000 * i / count) as u64);
            let id = format!("timeout-{run}-{i}");
            let message = Message::json("orders.timeout", &i)
                .id(id.clone())
                .ordering_key(format!("order-{run}-{i}"))
                .deliver_at(at);
            outbox::stage(&mut tx, message).await.unwrap();
            due.insert(id, at);
        }
        tx.commit().await.unwrap();
    }
    assert!(
        SystemTime::now() < first,
        "staging {count} messages took longer than {lead:?}: lateness would not be measured"
    );
    let deadline = Instant::now() + lead + Duration::from_secs(60);
    while stamped.0.lock().unwrap().len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    let seen = stamped.0.lock().unwrap();
    assert_eq!(seen.len(), count, "messages not published within a minute");
    let twice = seen.values().filter(|at| at.len() > 1).count();
    let mut ms: Vec<f64> = seen
        .iter()
        .map(|(id, at)| match at[0].duration_since(due[id]) {
            Ok(late) => late.as_secs_f64() * 1000.0,
            Err(early) => -early.duration().as_secs_f64() * 1000.0,
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (ms, twice)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn brokers() -> Vec<Broker> {
    let mut brokers = Vec::new();
    if let Some(url) = url("IDEM_BENCH_NATS_URL") {
        let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
        let name = format!("IDEM_BENCH_OUTBOX_{}", std::process::id());
        let _ = js.delete_stream(&name).await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
        brokers.push(Broker::Nats(js, name));
    }
    if let Some(url) = url("IDEM_BENCH_AMQP_URL") {
        let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .unwrap();
        let queue = format!("idem-bench-outbox-{}", std::process::id());
        channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        // The connection lives as long as the benchmark (idem's publisher holds it).
        let rabbit = outbox::rabbitmq::Rabbit::new(connection);
        brokers.push(Broker::Rabbit(channel, rabbit, queue));
    }
    if let Some(url) = url("IDEM_BENCH_KAFKA_URL") {
        let topic = format!("idem-bench-outbox-{}", std::process::id());
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &url)
                .create()
                .unwrap();
        let created = admin
            .create_topics(
                &[rdkafka::admin::NewTopic::new(
                    &topic,
                    6,
                    rdkafka::admin::TopicReplication::Fixed(1),
                )],
                &rdkafka::admin::AdminOptions::new(),
            )
            .await
            .unwrap();
        for result in created {
            result.unwrap();
        }
        let producer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &url)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .unwrap();
        let kafka = outbox::kafka::Kafka::connect(&url).unwrap();
        brokers.push(Broker::Kafka(producer, kafka, topic, url));
    }
    brokers
}

async fn cleanup(brokers: &[Broker]) {
    for broker in brokers {
        match broker {
            Broker::Nats(js, name) => {
                let _ = js.delete_stream(name).await;
            }
            Broker::Rabbit(channel, _, queue) => {
                let _ = channel
                    .queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await;
            }
            Broker::Kafka(_, _, topic, url) => {
                let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
                    rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", url)
                        .create()
                        .unwrap();
                let _ = admin
                    .delete_topics(&[topic.as_str()], &rdkafka::admin::AdminOptions::new())
                    .await;
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 1000) as i64;
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 5);
    sqlx::any::install_default_drivers();
    let postgres = match url("IDEM_BENCH_POSTGRES_URL") {
        Some(url) => {
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "DROP SCHEMA IF EXISTS idem_bench_outbox CASCADE; CREATE SCHEMA idem_bench_outbox",
            )
            .execute(&admin)
            .await
            .unwrap();
            let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(8)
                .connect_with(options.options([("search_path", "idem_bench_outbox")]))
                .await
                .unwrap();
            sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
            sqlx::raw_sql(HAND_OUTBOX_POSTGRES)
                .execute(&pool)
                .await
                .unwrap();
            idem::migrate(&pool).await.unwrap();
            Some(pool)
        }
        None => None,
    };
    let mysql = match url("IDEM_BENCH_MYSQL_URL") {
        Some(url) => {
            let admin = sqlx::MySqlPool::connect(&url).await.unwrap();
            sqlx::raw_sql(
                "DROP DATABASE IF EXISTS idem_bench_outbox; CREATE DATABASE idem_bench_outbox",
            )
            .execute(&admin)
            .await
            .unwrap();
            let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(8)
                .connect_with(options.database("idem_bench_outbox"))
                .await
                .unwrap();
            sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
            sqlx::raw_sql(HAND_OUTBOX_MYSQL)
                .execute(&pool)
                .await
                .unwrap();
            idem::migrate(&pool).await.unwrap();
            Some(pool)
        }
        None => None,
    };
    let path = std::env::temp_dir().join(format!("idem-bench-outbox-{}.db", std::process::id()));
    let sqlite = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(idem::sqlite_options(&format!("sqlite:{}", path.display())).unwrap())
        .await
        .unwrap();
    sqlx::raw_sql(TABLES).execute(&sqlite).await.unwrap();
    sqlx::raw_sql(HAND_OUTBOX_SQLITE)
        .execute(&sqlite)
        .await
        .unwrap();
    idem::migrate(&sqlite).await.unwrap();

    let parts = std::env::var("IDEM_BENCH_PARTS")
        .unwrap_or_else(|_| "staging,relay,latency,dead,delayed,lateness".into());
    let part = |name: &str| parts.split(',').any(|p| p == name);
    if part("staging") {
        println!("## Staging one message ({keys} transitions a cell, {rounds} rounds)\n");
        println!(
            "| backend | tasks | no message, transitions/s | idem's message | a message by hand | idem to none (range) | idem to by hand (range) |"
        );
        println!("|---|---|---|---|---|---|---|");
        for row in staging_cost!("SQLite (file)", sqlite.clone(), on_sqlite, keys, rounds) {
            println!("{row}");
        }
        if let Some(pool) = &postgres {
            for row in staging_cost!("PostgreSQL", pool.clone(), on_postgres, keys, rounds) {
                println!("{row}");
            }
            outbox::set_notify(false);
            for row in staging_cost!(
                "PostgreSQL, no NOTIFY",
                pool.clone(),
                on_postgres,
                keys,
                rounds
            ) {
                println!("{row}");
            }
            outbox::set_notify(true);
        }
        if let Some(pool) = &mysql {
            for row in staging_cost!("MariaDB", pool.clone(), on_mysql, keys, rounds) {
                println!("{row}");
            }
        }
    }
    let brokers = brokers().await;
    if part("relay") {
        let relay_rounds = rounds.min(3);
        println!("\n## Relaying {MESSAGES} messages, batches of {BATCH} ({relay_rounds} rounds)\n");
        println!("| database | broker | idem, messages/s | by hand | ratio (range) |");
        println!("|---|---|---|---|---|");
        if let Some(pool) = &postgres {
            for row in relay_cost!(
                "PostgreSQL",
                pool.clone(),
                brokers.clone(),
                relay_rounds,
                CLAIM_PG,
                mark_pg
            ) {
                println!("{row}");
            }
        }
        if let Some(pool) = &mysql {
            for row in relay_cost!(
                "MariaDB",
                pool.clone(),
                brokers.clone(),
                relay_rounds,
                CLAIM_MYSQL,
                mark_mysql
            ) {
                println!("{row}");
            }
        }
    }
    if part("latency")
        && let (Some(pool), Some(nats)) = (
            &postgres,
            brokers.iter().find(|b| matches!(b, Broker::Nats(..))),
        )
    {
        println!(
            "\n## Commit to acknowledgement, PostgreSQL to JetStream, 300 messages one every 10 ms\n"
        );
        println!("| wake-up | p50 ms | p99 ms | max ms |");
        println!("|---|---|---|---|");
        for (name, listen, poll) in [
            (
                "NOTIFY (poll 1 s as fallback)",
                true,
                Duration::from_secs(1),
            ),
            ("polling every 1 s", false, Duration::from_secs(1)),
            ("polling every 100 ms", false, Duration::from_millis(100)),
        ] {
            let ms = latencies(pool, nats, listen, poll).await;
            println!(
                "| {name} | {:.1} | {:.1} | {:.1} |",
                percentile(&ms, 0.5),
                percentile(&ms, 0.99),
                ms.last().copied().unwrap_or(0.0)
            );
        }
    }
    if part("dead") {
        let held = env_usize("IDEM_BENCH_HELD", 400_000);
        // Rounds are cheap here, and one state's rounds run together: more of them.
        let rounds = rounds * 3;
        println!(
            "\n## Claiming 100 messages behind a dead head holding {held} ({rounds} rounds)\n"
        );
        println!(
            "| database | empty outbox, ms | {held} held, ms | {held} not held, ms | held to empty | not held to empty |"
        );
        println!("|---|---|---|---|---|---|");
        if let Some(pool) = &postgres {
            println!(
                "{}",
                dead_head_cost!(
                    "PostgreSQL",
                    pool.clone(),
                    rounds,
                    held,
                    "VACUUM ANALYZE idem_outbox",
                    false
                )
            );
        }
        if let Some(pool) = &mysql {
            println!(
                "{}",
                dead_head_cost!(
                    "MariaDB",
                    pool.clone(),
                    rounds,
                    held,
                    // InnoDB's purge of the bulk change done first: it slows every query
                    // while it runs.
                    "ANALYZE TABLE idem_outbox; SET GLOBAL innodb_max_purge_lag_wait = 0",
                    true
                )
            );
        }
        println!(
            "{}",
            dead_head_cost!(
                "SQLite (file)",
                sqlite.clone(),
                rounds,
                held,
                "ANALYZE idem_outbox",
                false
            )
        );
    }
    if part("delayed") {
        let delayed = env_usize("IDEM_BENCH_DELAYED", 100_000);
        let rounds = rounds * 3;
        println!(
            "\n## Claiming 100 due messages with {delayed} delayed ones waiting ({rounds} rounds)\n"
        );
        println!("| database | empty outbox, ms | {delayed} delayed, ms | delayed to empty |");
        println!("|---|---|---|---|");
        if let Some(pool) = &postgres {
            let row = delayed_cost!(
                "PostgreSQL",
                pool.clone(),
                rounds,
                delayed,
                "VACUUM ANALYZE idem_outbox"
            );
            println!("{row}");
        }
        if let Some(pool) = &mysql {
            let row = delayed_cost!(
                "MariaDB",
                pool.clone(),
                rounds,
                delayed,
                "ANALYZE TABLE idem_outbox; SET GLOBAL innodb_max_purge_lag_wait = 0"
            );
            println!("{row}");
        }
        let row = delayed_cost!(
            "SQLite (file)",
            sqlite.clone(),
            rounds,
            delayed,
            "ANALYZE idem_outbox"
        );
        println!("{row}");
    }
    if part("lateness") {
        let count = env_usize("IDEM_BENCH_DUE", 10_000);
        println!(
            "\n## {count} delayed messages due within one second: publication against due time\n"
        );
        println!("| database, wake-up | p50 ms | p99 ms | max ms | min ms | published twice |");
        println!("|---|---|---|---|---|---|");
        let row = |name: &str, (ms, twice): (Vec<f64>, usize)| {
            format!(
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {twice} |",
                percentile(&ms, 0.5),
                percentile(&ms, 0.99),
                ms.last().copied().unwrap_or(0.0),
                ms.first().copied().unwrap_or(0.0),
            )
        };
        if let Some(pool) = &postgres {
            sqlx::query("DELETE FROM idem_outbox")
                .execute(pool)
                .await
                .unwrap();
            let notified = lateness(pool, count, true).await;
            println!("{}", row("PostgreSQL, NOTIFY", notified));
            let polled = lateness(pool, count, false).await;
            println!("{}", row("PostgreSQL, polling", polled));
        }
        if let Some(pool) = &mysql {
            sqlx::query("DELETE FROM idem_outbox")
                .execute(pool)
                .await
                .unwrap();
            println!(
                "{}",
                row("MariaDB, polling", lateness(pool, count, false).await)
            );
        }
        sqlx::query("DELETE FROM idem_outbox")
            .execute(&sqlite)
            .await
            .unwrap();
        println!(
            "{}",
            row(
                "SQLite (file), polling",
                lateness(&sqlite, count, false).await
            )
        );
    }
    cleanup(&brokers).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
