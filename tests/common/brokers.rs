//! Real brokers for the integration tests, and the effect store their consumers write to.
//!
//! NATS (with JetStream) runs when `IDEM_TEST_NATS_URL` is set, RabbitMQ when
//! `IDEM_TEST_AMQP_URL` is set; with `IDEM_TEST_REQUIRE_SERVERS=1` (as in CI) an unset URL
//! is a failure, never a silent skip. Every test declares its own stream or queue under a
//! name unique to the process ([`unique`]) and deletes it when it ends, passed or failed
//! ([`cleanup_after`]).
//!
//! Include it next to `mod common;` with `#[path = "common/brokers.rs"] mod brokers;`.

#![allow(dead_code)]

use crate::common;
use futures_util::{Stream, StreamExt};
use idem::inbox::{Delivery, Inbox, MessageKey, Received, Settled};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::fmt::Debug;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::task::JoinSet;

fn require_servers() -> bool {
    std::env::var("IDEM_TEST_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

fn server_url(variable: &str, what: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if require_servers() => {
            panic!("{variable} is not set, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping")
        }
        _ => {
            eprintln!("skipped: set {variable} to run the {what} tests");
            None
        }
    }
}

/// The NATS URL (a server with JetStream), or `None` (test skipped).
pub fn nats_url() -> Option<String> {
    server_url("IDEM_TEST_NATS_URL", "NATS JetStream")
}

/// The AMQP URL (RabbitMQ), or `None` (test skipped).
pub fn amqp_url() -> Option<String> {
    server_url("IDEM_TEST_AMQP_URL", "RabbitMQ")
}

/// The Kafka bootstrap servers (`host:port`, comma-separated), or `None` (test skipped).
pub fn kafka_url() -> Option<String> {
    server_url("IDEM_TEST_KAFKA_URL", "Kafka")
}

/// Kafka's admin client on `url`.
fn kafka_admin(url: &str) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", url)
        .create()
        .unwrap()
}

/// The partitions of a test's Kafka topic.
pub const KAFKA_PARTITIONS: i32 = 6;

/// A member of the consumer group `group` as the tests run one: a 6 s session and 500 ms
/// heartbeats, so that a member killed or frozen hands its partitions over within seconds.
pub fn kafka_member(url: &str, group: &str) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", url)
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

/// For each of `topic`'s first `partitions` partitions, `group`'s committed offset (0 when
/// none) and the partition's end.
pub async fn kafka_offsets(
    url: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<(i64, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (config, topic) = (kafka_member(url, group), topic.to_owned());
    // librdkafka's calls block their thread.
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().unwrap();
        let mut list = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        (0..partitions)
            .map(|partition| {
                let committed = match committed
                    .find_partition(&topic, partition)
                    .unwrap()
                    .offset()
                {
                    rdkafka::Offset::Offset(n) => n,
                    _ => 0,
                };
                let (_, end) = consumer
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .unwrap();
                (committed, end)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Produces `(key, id, payload)` records to `topic`, in this order (a partition keeps
/// them so), and waits for every acknowledgement; an id of `None` sends no
/// `idem-message-id`. Not idempotent: the copies the tests need are sent on purpose.
pub async fn kafka_produce(url: &str, topic: &str, records: &[(String, Option<String>, String)]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", url)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        // A retried request never overtakes the next one.
        .set("max.in.flight.requests.per.connection", "1")
        .create()
        .unwrap();
    // Each send enqueues its record when first polled: in this order.
    let sends = records.iter().map(|(key, id, payload)| {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if let Some(id) = id {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: idem::outbox::kafka::ID_HEADER,
                value: Some(id.as_bytes()),
            }));
        }
        producer.send(record, Duration::from_secs(30))
    });
    for sent in futures_util::future::join_all(sends).await {
        sent.unwrap();
    }
}

/// A Kafka topic of the test's own (`{prefix}-…`), with [`KAFKA_PARTITIONS`] partitions.
pub async fn kafka_topic(url: &str, prefix: &str) -> String {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let name = unique(prefix);
    let created = kafka_admin(url)
        .create_topics(
            &[NewTopic::new(
                &name,
                KAFKA_PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    for result in created {
        result.unwrap_or_else(|(topic, e)| panic!("topic {topic} was not created: {e}"));
    }
    name
}

/// Runs `body` with the Kafka bootstrap servers and a topic of its own, then deletes the
/// topic, even if `body` panicked. Skipped (or failed, in CI) without `IDEM_TEST_KAFKA_URL`.
pub async fn with_kafka_topic<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(String, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(url) = kafka_url() else { return };
    let name = kafka_topic(&url, prefix).await;
    let run = body(url.clone(), name.clone());
    cleanup_after(run, async move || {
        let _ = kafka_admin(&url)
            .delete_topics(&[name.as_str()], &rdkafka::admin::AdminOptions::new())
            .await;
    })
    .await;
}

/// `{prefix}-{pid}-{start}-{n}`: a stream or queue name no other process (and no other
/// test of this one) uses. Letters, digits, `-` and `_` only, valid for every broker.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000_000
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{start}-{n}", std::process::id())
}

/// Runs `body` on its own task, then `cleanup` (even if `body` panicked), then re-raises
/// the panic: broker resources never outlive a failed test.
pub async fn cleanup_after<T: Send + 'static>(
    body: impl Future<Output = T> + Send + 'static,
    cleanup: impl AsyncFnOnce(),
) -> T {
    let result = tokio::spawn(body).await;
    cleanup().await;
    match result {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// `probe`'s answer once `done` holds it, or its last one after `within`: a broker's own
/// bookkeeping (acks, requeues) lags behind what the test did. Probed every 50 ms.
pub async fn poll_until<T, F: Future<Output = T>>(
    within: Duration,
    mut probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let answer = probe().await;
        if done(&answer) || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where a handler waits inside its transaction, after its effect and before the commit.
#[derive(Debug, Clone, Copy)]
pub enum Pause {
    /// Commit at once.
    None,
    /// Work this long (a slow handler).
    Sleep(Duration),
    /// Print `idem-child: crash-point <name>` and never commit: the process is killed here.
    Forever(&'static str),
}

/// The database a consumer writes its effects to: PostgreSQL, MySQL or an SQLite file,
/// holding [`common::TABLES`] (MySQL: [`common::MYSQL_TABLES`]) and idem's tables.
#[derive(Debug, Clone)]
pub enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

/// One delivery through the inbox, the effect being one row in `effects`; the result is
/// the effect's order id.
macro_rules! deliver {
    ($pool:expr, $inbox:expr, $key:expr, $payload:expr, $order:expr, $pause:expr, $positional:expr) => {
        match $inbox
            .receive($pool, $key, $payload)
            .await
            .map_err(idem::Error::widen)?
        {
            Received::New(mut receipt) => {
                let effect = sqlx::query($crate::common::placed(
                    $positional,
                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)",
                ))
                .bind($order)
                .execute(&mut **receipt.transaction())
                .await;
                match $pause {
                    Pause::None => {}
                    Pause::Sleep(work) => tokio::time::sleep(work).await,
                    Pause::Forever(point) => {
                        println!("idem-child: crash-point {point}");
                        std::future::pending::<()>().await;
                    }
                }
                receipt.finish(effect.map(|_| $order)).await
            }
            Received::Done(delivery) => Ok(delivery),
        }
    };
}

/// A batch of deliveries through the inbox (`Inbox::batch`), the effect of each being one
/// row in `effects`; the result is the effect's order id (the key's second part).
macro_rules! deliver_batch {
    ($pool:expr, $inbox:expr, $batch:expr, $pause:expr, $positional:expr) => {
        $inbox
            .batch($pool, $batch, move |tx, (key, _)| {
                Box::pin(async move {
                    let order = order_of(key);
                    sqlx::query($crate::common::placed(
                        $positional,
                        "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)",
                    ))
                    .bind(order)
                    .execute(&mut **tx)
                    .await?;
                    if let Pause::Forever(point) = $pause {
                        println!("idem-child: crash-point {point}");
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, sqlx::Error>(order)
                })
            })
            .await
    };
}

/// The order a test message's key is about: `order:{order}:paid` or `order-{order}-paid`.
pub fn order_of(key: &MessageKey) -> i64 {
    key.as_str()
        .split([':', '-'])
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

impl Db {
    /// A fresh PostgreSQL schema `idem_test_{name}` (see [`common::postgres`]), migrated;
    /// `None` when PostgreSQL is not configured.
    pub async fn postgres(name: &str, max_connections: u32) -> Option<Db> {
        let pool = common::postgres(name, max_connections).await?;
        idem::migrate(&pool).await.unwrap();
        Some(Db::Postgres(pool))
    }

    /// A fresh MySQL database `idem_test_{name}` (see [`common::mysql`]), migrated; `None`
    /// when MySQL is not configured.
    pub async fn mysql(name: &str, max_connections: u32) -> Option<Db> {
        let pool = common::mysql(name, max_connections).await?;
        idem::migrate(&pool).await.unwrap();
        Some(Db::MySql(pool))
    }

    /// A fresh SQLite file `{name}.db` (see [`common::sqlite_file`]), migrated.
    pub async fn sqlite(name: &str, max_connections: u32) -> Db {
        let pool = common::sqlite_file(name, max_connections).await;
        idem::migrate(&pool).await.unwrap();
        Db::Sqlite(pool)
    }

    /// How another process reaches this database: see [`Db::connect`].
    pub fn spec(&self) -> String {
        match self {
            Db::Postgres(pool) => {
                let options = pool.connect_options();
                format!("postgres:{}", options.get_application_name().unwrap())
            }
            Db::Sqlite(pool) => {
                let options = pool.connect_options();
                format!("sqlite:{}", options.get_filename().display())
            }
            Db::MySql(pool) => {
                let options = pool.connect_options();
                format!("mysql:{}", options.get_database().unwrap())
            }
        }
    }

    /// Connects to a database made by [`Db::postgres`] or [`Db::sqlite`] in another
    /// process, from its [`Db::spec`]; nothing is recreated.
    pub async fn connect(spec: &str) -> Db {
        if let Some(database) = spec.strip_prefix("mysql:") {
            let url = common::mysql_url().expect("the parent test ran on MySQL");
            let options = sqlx::mysql::MySqlConnectOptions::from_str(&url)
                .unwrap()
                .database(database);
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            return Db::MySql(pool);
        }
        if let Some(schema) = spec.strip_prefix("postgres:") {
            let url = common::postgres_url().expect("the parent test ran on PostgreSQL");
            let options = PgConnectOptions::from_str(&url)
                .unwrap()
                .options([("search_path", schema)])
                .application_name(schema);
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            Db::Postgres(pool)
        } else {
            let options = idem::sqlite_options(spec).unwrap().create_if_missing(false);
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            Db::Sqlite(pool)
        }
    }

    /// Handles one delivery of `order`'s message through `inbox`: the effect (a row in
    /// `effects`) and the inbox record commit together, after `pause`.
    pub async fn deliver(
        &self,
        inbox: &Inbox,
        key: &MessageKey,
        payload: &[u8],
        order: i64,
        pause: Pause,
    ) -> Result<Delivery<i64>, idem::Error<sqlx::Error>> {
        match self {
            Db::Postgres(pool) => deliver!(pool, inbox, key, payload, order, pause, false),
            Db::Sqlite(pool) => deliver!(pool, inbox, key, payload, order, pause, false),
            Db::MySql(pool) => deliver!(pool, inbox, key, payload, order, pause, true),
        }
    }

    /// Handles a batch of deliveries (key and payload each) through `inbox` in one
    /// transaction: each message's effect (a row in `effects`) commits with the batch, after
    /// `pause` in its handler.
    pub async fn deliver_batch(
        &self,
        inbox: &Inbox,
        batch: &[(MessageKey, Vec<u8>)],
        pause: Pause,
    ) -> Result<Vec<Settled<i64, sqlx::Error>>, idem::Error<std::convert::Infallible>> {
        match self {
            Db::Postgres(pool) => deliver_batch!(pool, inbox, batch, pause, false),
            Db::Sqlite(pool) => deliver_batch!(pool, inbox, batch, pause, false),
            Db::MySql(pool) => deliver_batch!(pool, inbox, batch, pause, true),
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        match self {
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Db::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        }
    }

    /// The effects committed: rows in `effects`.
    pub async fn effects(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM effects").await
    }

    /// The distinct orders with an effect.
    pub async fn distinct_effects(&self) -> i64 {
        self.count("SELECT COUNT(DISTINCT order_id) FROM effects")
            .await
    }

    /// The committed inbox records.
    pub async fn records(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idem_inbox").await
    }

    /// The status, attempts and error of the inbox record of `key`, if there is one.
    pub async fn record(&self, key: &str) -> Option<(String, i64, Option<String>)> {
        let sql = "SELECT status, attempts, error FROM idem_inbox WHERE message_key = ";
        match self {
            Db::Postgres(pool) => sqlx::query_as(&format!("{sql}$1"))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap(),
            Db::Sqlite(pool) => sqlx::query_as(&format!("{sql}?"))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap(),
            Db::MySql(pool) => sqlx::query_as(&format!("{sql}?"))
                .bind(key)
                .fetch_optional(pool)
                .await
                .unwrap(),
        }
    }
}

/// What a test reports about a delivery's outcome, in one word.
pub fn outcome_name<T>(delivery: &Delivery<T>) -> &'static str {
    delivery.kind()
}

/// What a producer that retried sends: each of `messages` messages one to three times,
/// shuffled (seeded, so a failure reproduces).
pub fn retried_copies(messages: i64, seed: u64) -> Vec<i64> {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut copies: Vec<i64> = (0..messages)
        .flat_map(|m| std::iter::repeat_n(m, rng.random_range(1..=3)))
        .collect();
    copies.shuffle(&mut rng);
    copies
}

/// A delivery as the tests' consumers handle it, whichever broker it came from.
pub trait BrokerMessage {
    /// Its message key, and the order the message is about.
    fn key_and_order(&self) -> (MessageKey, i64);
    /// Its payload, whose digest the inbox keeps.
    fn payload(&self) -> &[u8];
    /// Acks it once its outcome is committed; a delivery turned away while another one
    /// works on the message goes back to the broker, for later.
    fn settle(&self, outcome: &Delivery<i64>) -> impl Future<Output = ()> + Send;
}

/// The consumers of a test of retried messages: each takes deliveries from a stream of its
/// own and runs them through one inbox into one database, until every publication, of
/// every consumer, is settled.
#[derive(Clone)]
pub struct Workers {
    db: Db,
    inbox: Inbox,
    /// The publications to settle: copies of the messages included.
    published: usize,
    settled: Arc<AtomicUsize>,
    /// The largest batch a consumer delivered ([`Workers::consume_batches`]).
    largest: Arc<AtomicUsize>,
    started: Instant,
}

impl Workers {
    /// Consumers of `published` publications, starting now.
    pub fn new(db: Db, inbox: Inbox, published: usize) -> Workers {
        Workers {
            db,
            inbox,
            published,
            settled: Arc::new(AtomicUsize::new(0)),
            largest: Arc::new(AtomicUsize::new(0)),
            started: Instant::now(),
        }
    }

    /// One consumer: handles the deliveries of `messages` until every publication is
    /// settled (40 s at most). Returns how many deliveries it took, and how many of them it
    /// processed.
    pub async fn consume<M: BrokerMessage, E: Debug>(
        &self,
        mut messages: impl Stream<Item = Result<M, E>> + Unpin,
    ) -> (usize, usize) {
        let (mut mine, mut processed) = (0, 0);
        while self.settled.load(Ordering::SeqCst) < self.published {
            assert!(self.started.elapsed() < Duration::from_secs(40), "no end");
            let next = tokio::time::timeout(Duration::from_millis(200), messages.next());
            let Ok(Some(message)) = next.await else {
                continue;
            };
            let message = message.unwrap();
            let (key, order) = message.key_and_order();
            let outcome = self
                .db
                .deliver(&self.inbox, &key, message.payload(), order, Pause::None)
                .await
                .unwrap();
            message.settle(&outcome).await;
            self.settled
                .fetch_add(usize::from(outcome.should_ack()), Ordering::SeqCst);
            mine += 1;
            processed += usize::from(outcome.is_processed());
        }
        (mine, processed)
    }

    /// [`Workers::consume`], a batch at a time: up to `max` deliveries gathered within 50 ms
    /// ([`idem::inbox::gather`]), delivered with `Inbox::batch` in one transaction, and
    /// each settled once the batch committed.
    pub async fn consume_batches<M: BrokerMessage, E: Debug>(
        &self,
        mut messages: impl Stream<Item = Result<M, E>> + Unpin,
        max: usize,
    ) -> (usize, usize) {
        let (mut mine, mut processed) = (0, 0);
        while self.settled.load(Ordering::SeqCst) < self.published {
            assert!(self.started.elapsed() < Duration::from_secs(40), "no end");
            let gathered = idem::inbox::gather(&mut messages, max, Duration::from_millis(50));
            let Some(gathered) = gathered.await else {
                break;
            };
            let gathered: Vec<M> = gathered.into_iter().map(Result::unwrap).collect();
            if gathered.is_empty() {
                continue;
            }
            self.largest.fetch_max(gathered.len(), Ordering::SeqCst);
            let batch: Vec<(MessageKey, Vec<u8>)> = gathered
                .iter()
                .map(|m| (m.key_and_order().0, m.payload().to_vec()))
                .collect();
            let settled = self
                .db
                .deliver_batch(&self.inbox, &batch, Pause::None)
                .await
                .unwrap();
            for (message, settled) in gathered.iter().zip(settled) {
                // A handler's error (none here) would be nacked, as a delivery in progress.
                let outcome = settled.unwrap_or(Delivery::InProgress {
                    lease_until_millis: None,
                });
                message.settle(&outcome).await;
                self.settled
                    .fetch_add(usize::from(outcome.should_ack()), Ordering::SeqCst);
                mine += 1;
                processed += usize::from(outcome.is_processed());
            }
        }
        (mine, processed)
    }

    /// The largest batch a consumer delivered so far.
    pub fn largest_batch(&self) -> usize {
        self.largest.load(Ordering::SeqCst)
    }

    /// Notes a batch of `len` deliveries, of a consumer that batches on its own (a Kafka
    /// member's round).
    pub fn note_batch(&self, len: usize) {
        self.largest.fetch_max(len, Ordering::SeqCst);
    }

    /// The database the consumers write to.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The consumers' inbox (its clones share its counters).
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Waits for `consumers` (each one [`Workers::consume`]), and checks that each of the
    /// `messages` messages had its effect exactly once: every consumer took deliveries,
    /// one delivery of each message applied, every other copy was a duplicate. With
    /// `rereads` (a consumer group that reads a message again when its partitions move),
    /// at least every other copy.
    pub async fn each_effect_once(
        &self,
        mut consumers: JoinSet<(usize, usize)>,
        messages: i64,
        rereads: bool,
    ) {
        let (mut per_consumer, mut processed) = (Vec::new(), 0);
        while let Some(done) = consumers.join_next().await {
            let (mine, applied) = done.unwrap();
            per_consumer.push(mine);
            processed += applied;
        }
        let published = self.published;
        eprintln!(
            "{published} deliveries of {messages} messages in {:?}, per consumer {per_consumer:?}",
            self.started.elapsed()
        );
        assert!(per_consumer.iter().all(|&n| n > 0), "{per_consumer:?}");
        assert_eq!(processed, messages as usize);
        assert_eq!(
            self.db.effects().await,
            messages,
            "exactly {messages} effects"
        );
        assert_eq!(self.db.distinct_effects().await, messages);
        let c = self.inbox.counters();
        assert_eq!(c.applied, messages as u64);
        let copies = (published as i64 - messages) as u64;
        if rereads {
            assert!(
                c.duplicates >= copies,
                "{} duplicates of {copies} copies",
                c.duplicates
            );
        } else {
            assert_eq!(c.duplicates, copies);
        }
    }
}
