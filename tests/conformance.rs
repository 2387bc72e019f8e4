//! The broker conformance suite: the scenarios every broker idem consumes from must pass,
//! written once against a small trait of the tests' own ([`Broker`]: a fresh destination,
//! publish, consumers, "is everything settled", delete) and run against NATS JetStream,
//! RabbitMQ and Kafka, on SQLite, PostgreSQL and MariaDB.
//!
//! What only one broker has stays in its own file: JetStream's ack wait and `Nats-Msg-Id`
//! window (`nats.rs`), RabbitMQ's requeue on a dead connection and its confirms
//! (`rabbitmq.rs`), Kafka's rebalances, fenced commits and sessions (`inbox_kafka.rs`,
//! `kafka_faults.rs`). The coupon chain runs over JetStream, Kafka and RabbitMQ in `chain.rs`.
//!
//! **Retried messages.** A producer that retried: each of 1,000 messages published one to
//! three times under the same key and content, shuffled; the broker keeps every copy (about
//! 2,000 deliveries, so about 2,000 effects without the inbox). Four consumers take them
//! concurrently — JetStream's pull clients of one durable consumer, RabbitMQ's consumers on
//! channels of their own, Kafka's members of one group on a topic of six partitions —, one
//! delivery at a time or in batches of 1, 10 and 100 (`Inbox::batch`; a Kafka member always
//! runs its rounds as batches, `KafkaConsumer`). Every message has its effect exactly once,
//! every copy is absorbed, and every message ends acknowledged (Kafka: every partition's
//! offset committed to its end).
//!
//! **A poison message.** Three messages, the second one whose handler always fails, taken
//! in batches (`Inbox::batch` from JetStream and RabbitMQ, a `KafkaConsumer`'s rounds) with
//! three attempts allowed: the failing one is handed out again until its attempts are spent,
//! then parked (its record DEAD, keeping the error) and acknowledged; the other two are
//! applied once, and nothing is left unacknowledged.
//!
//! **A message that came early.** A "ship" whose order is not paid yet, taken in batches
//! (as the poison message) by an inbox allowing two attempts: its handler says
//! `idem::inbox::not_yet`, so it is handed out again and again (JetStream's and RabbitMQ's
//! nack, a Kafka partition held at it and read again after the consumer's retry delay)
//! without spending an attempt — tried at least eight times, its record FAILED with zero
//! attempts and the reason — and never parked. Once the payment is published (on Kafka on
//! another partition: an early message holds back its own), the payment applies, then the
//! ship, each once with one attempt, and nothing is left unacknowledged.
//!
//! **Per-key order through the relay.** Eight writers stage 25 messages each, one ordering
//! key per writer, while two relays publish them (idem's publisher for the broker): every
//! message reaches the destination, and a reader sees each key's messages in the order they
//! were staged.
//!
//! **A consumer killed.** One message; a consumer process killed with SIGKILL after its
//! database commit and before it tells the broker (its ack, or its offset's commit), or
//! before its commit, the effect written; then a new consumer process. The broker hands the
//! message over again (RabbitMQ at once, JetStream after its ack wait, Kafka once the dead
//! member's session ends); killed after the commit, the redelivery is absorbed as a
//! duplicate; killed before, it applies once. Either way one effect, one record, and the
//! message ends acknowledged.

use crate::brokers::{
    self, BrokerMessage, Db, KAFKA_PARTITIONS, Pause, Workers, kafka_member, kafka_offsets,
    kafka_topic, unique,
};
use crate::child::{ChildProcess, report};
use crate::{nats, rabbitmq};

use futures_util::{FutureExt, StreamExt};
use idem::inbox::kafka::{KafkaConsumer, KafkaRound};
use idem::inbox::{Delivery, Inbox};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

const MESSAGES: i64 = 1000;
const CONSUMERS: usize = 4;

/// A broker as the scenarios use it: one destination of the test's own.
trait Broker: Sized {
    /// Its name in the tests' messages.
    const NAME: &'static str;
    /// Whether its consumers may read a message again with no failure at all (a Kafka
    /// group's partitions moving while members join): more copies absorbed than published.
    const REREADS: bool;
    /// Whether the consumers start before the messages are published (a Kafka group
    /// settles its members first, so that each owns partitions when the messages come).
    const CONSUMERS_FIRST: bool;

    /// A fresh destination, or `None` when the broker's URL is not set (see
    /// `common/brokers.rs`). A delivery not acknowledged is handed out again after
    /// `redeliver_after` where the broker has such a setting (JetStream's ack wait).
    async fn fresh(prefix: &str, redeliver_after: Duration) -> Option<Self>;

    /// What a consumer process needs to find the destination (see [`consumer_process`]).
    fn child_env(&self) -> Vec<(&'static str, String)>;

    /// idem's publisher to this broker, for a relay.
    type Publisher: idem::outbox::Publisher + Clone;

    /// A publisher to the broker (a relay's).
    async fn publisher(&self) -> Self::Publisher;

    /// Where a staged message goes to reach the destination.
    fn destination(&self) -> idem::outbox::Destination;

    /// Reads the destination until `n` distinct payloads came: each payload's first copy,
    /// in the order read (a key's messages in the order the destination keeps them).
    async fn read_in_order(&self, n: usize) -> Vec<String>;

    /// Publishes each `(key, payload)`, and waits for the broker's acknowledgements.
    async fn publish(&self, messages: &[(String, String)]);

    /// Publishes each `(key, payload)` where it does not wait behind the ones before it:
    /// as [`publish`](Self::publish), but on Kafka each on the next partition (a message
    /// that came early holds back its partition, and must not hold back what it waits
    /// for).
    async fn publish_apart(&self, messages: &[(String, String)]) {
        self.publish(messages).await;
    }

    /// How many messages the destination holds (acknowledged ones included, where it keeps
    /// them).
    async fn held(&self) -> u64;

    /// Starts `consumers` consumers handing their deliveries to `workers`, one at a time or
    /// in batches of up to `batch`; each returns (deliveries taken, processed). A consumer
    /// that does not stop on its own stops when `stop` turns true.
    async fn consumers(
        &self,
        workers: &Workers,
        consumers: usize,
        batch: Option<usize>,
        stop: watch::Receiver<bool>,
    ) -> JoinSet<(usize, usize)>;

    /// Starts one consumer taking batches of up to 10 through `inbox`, each message's
    /// handler failing when its payload says `poison` (see [`poison_batch`]), until `stop`.
    async fn batch_consumer(
        &self,
        db: &Db,
        inbox: &Inbox,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()>;

    /// Whether every message is acknowledged (or its offset committed) and none waits.
    async fn settled(&self) -> bool;

    /// Whether nothing waits for a consumer, as far as the broker tells while consumers are
    /// live (RabbitMQ does not count a live consumer's unacknowledged deliveries).
    async fn nothing_waiting(&self) -> bool {
        self.settled().await
    }

    /// Removes the destination.
    async fn delete(&self);
}

/// Runs `scenario` on a fresh destination of `B`, then deletes it, passed or failed.
async fn on_fresh<B: Broker>(
    prefix: &str,
    redeliver_after: Duration,
    scenario: impl AsyncFnOnce(&B),
) {
    let Some(broker) = B::fresh(prefix, redeliver_after).await else {
        return;
    };
    let ran = std::panic::AssertUnwindSafe(scenario(&broker))
        .catch_unwind()
        .await;
    broker.delete().await;
    if let Err(panic) = ran {
        std::panic::resume_unwind(panic);
    }
}

/// See the [module](self): retried messages to four consumers, one delivery at a time
/// (`batch: None`) or in batches.
async fn retried_messages<B: Broker>(db: Db, batch: Option<usize>) {
    // Long enough that a delivery waiting in a consumer's buffer is not handed out again.
    on_fresh::<B>("conformance", Duration::from_secs(10), async |broker| {
        let copies = brokers::retried_copies(MESSAGES, 11);
        let published = copies.len();
        let messages: Vec<(String, String)> = copies
            .iter()
            .map(|m| (format!("order:{m}:paid"), format!(r#"{{"order":{m}}}"#)))
            .collect();
        let workers = Workers::new(db, Inbox::new("conformance").unwrap(), published);
        let (stop, stopped) = watch::channel(false);
        let mut consumers = None;
        if B::CONSUMERS_FIRST {
            consumers = Some(
                broker
                    .consumers(&workers, CONSUMERS, batch, stopped.clone())
                    .await,
            );
        }
        broker.publish(&messages).await;
        assert_eq!(
            broker.held().await,
            published as u64,
            "{} kept every copy",
            B::NAME
        );
        let consumers = match consumers {
            Some(consumers) => consumers,
            None => broker.consumers(&workers, CONSUMERS, batch, stopped).await,
        };
        if B::REREADS {
            // A group reads until every message is applied and every offset committed.
            let deadline = Instant::now() + Duration::from_secs(120);
            while workers.db().distinct_effects().await < MESSAGES || !broker.settled().await {
                assert!(
                    Instant::now() < deadline,
                    "{}: after 120 s, {} of {MESSAGES} applied",
                    B::NAME,
                    workers.db().distinct_effects().await
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            stop.send(true).unwrap();
        }
        workers
            .each_effect_once(consumers, MESSAGES, B::REREADS)
            .await;
        if let Some(max) = batch {
            // Batches formed: as large as allowed, or at least more than one delivery.
            let largest = workers.largest_batch();
            assert!(
                largest <= max && largest >= max.min(2),
                "{}: largest batch {largest} of {max}",
                B::NAME
            );
        }
        settles(broker).await;
    })
    .await;
}

/// Waits (at most 10 s) until every message of `broker`'s destination is acknowledged.
async fn settles<B: Broker>(broker: &B) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !broker.settled().await {
        assert!(
            Instant::now() < deadline,
            "{}: a message was left unacknowledged",
            B::NAME
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// See the [module](self): a poison message among good ones, taken in batches.
async fn poison_message<B: Broker>(db: Db) {
    on_fresh::<B>(
        "conformance-poison",
        Duration::from_secs(2),
        async |broker| {
            let messages: Vec<(String, String)> = vec![
                ("order:1:paid".into(), r#"{"order":1}"#.into()),
                ("order:2:paid".into(), r#"{"order":2,"poison":true}"#.into()),
                ("order:3:paid".into(), r#"{"order":3}"#.into()),
            ];
            let inbox = Inbox::new("conformance-poison").unwrap().max_attempts(3);
            let (stop, stopped) = watch::channel(false);
            let consumer = broker.batch_consumer(&db, &inbox, stopped).await;
            broker.publish(&messages).await;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let dead = db.record("order:2:paid").await;
                let parked = dead.as_ref().is_some_and(|(status, ..)| status == "DEAD");
                if parked && db.distinct_effects().await == 2 && broker.nothing_waiting().await {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}: after 60 s, the poison's record {dead:?}, {} effects",
                    B::NAME,
                    db.effects().await
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop.send(true).unwrap();
            consumer.await.unwrap();
            settles(broker).await;
            let (status, attempts, error) = db.record("order:2:paid").await.unwrap();
            assert_eq!((status.as_str(), attempts), ("DEAD", 3), "{}", B::NAME);
            assert!(
                error.as_deref().is_some_and(|e| e.contains("poison")),
                "{}: the parked record keeps no error: {error:?}",
                B::NAME
            );
            assert_eq!(
                db.effects().await,
                2,
                "{}: the good messages once each",
                B::NAME
            );
            assert_eq!(db.distinct_effects().await, 2);
        },
    )
    .await;
}

/// See the [module](self): a message that came early, left unacknowledged (and on Kafka
/// holding its partition) for more deliveries than the inbox allows attempts, then applied
/// once what it waits for came.
async fn came_early<B: Broker>(db: Db) {
    on_fresh::<B>(
        "conformance-early",
        Duration::from_secs(2),
        async |broker| {
            // An order of this run's own: the tries are counted per order, across tests.
            static NEXT: std::sync::atomic::AtomicI64 =
                std::sync::atomic::AtomicI64::new(1_000_000);
            let order = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (ship, pay) = (format!("order:{order}:ship"), format!("order:{order}:paid"));
            let inbox = Inbox::new("conformance-early").unwrap().max_attempts(2);
            let (stop, stopped) = watch::channel(false);
            let consumer = broker.batch_consumer(&db, &inbox, stopped).await;
            broker
                .publish_apart(&[(ship.clone(), format!(r#"{{"order":{order},"ship":true}}"#))])
                .await;
            // Tried again and again (each delivery's handler runs once or twice), and
            // never parked: no attempt is spent waiting.
            let deadline = Instant::now() + Duration::from_secs(60);
            while early_tries(order) < 8 {
                assert!(
                    Instant::now() < deadline,
                    "{}: after 60 s, the early message was tried {} times",
                    B::NAME,
                    early_tries(order)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let (status, attempts, error) = db.record(&ship).await.unwrap();
            assert_eq!((status.as_str(), attempts), ("FAILED", 0), "{}", B::NAME);
            assert_eq!(
                error.as_deref(),
                Some(format!("order {order} is not paid yet").as_str())
            );
            assert_eq!(db.effects().await, 0, "{}", B::NAME);
            // What it waits for comes: the payment applies, then the early message.
            broker
                .publish_apart(&[(pay.clone(), format!(r#"{{"order":{order}}}"#))])
                .await;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let shipped = db
                    .record(&ship)
                    .await
                    .is_some_and(|(status, ..)| status == "SUCCESS");
                if shipped && db.effects().await == 2 && broker.nothing_waiting().await {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}: after 60 s, the early message's record {:?}, {} effects",
                    B::NAME,
                    db.record(&ship).await,
                    db.effects().await
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop.send(true).unwrap();
            consumer.await.unwrap();
            settles(broker).await;
            assert_eq!(
                db.record(&ship).await.map(|(s, a, _)| (s, a)),
                Some(("SUCCESS".into(), 1)),
                "{}",
                B::NAME
            );
            assert_eq!(
                db.record(&pay).await.map(|(s, a, _)| (s, a)),
                Some(("SUCCESS".into(), 1)),
                "{}",
                B::NAME
            );
            assert_eq!(
                db.effects().await,
                2,
                "{}: paid once, shipped once",
                B::NAME
            );
            assert_eq!(db.distinct_effects().await, 1);
        },
    )
    .await;
}

/// See the [module](self): per-key order through two relays.
async fn relayed_in_order<B: Broker>(db: Db) {
    on_fresh::<B>(
        "conformance-order",
        Duration::from_secs(10),
        async |broker| {
            let publisher = broker.publisher().await;
            let destination = broker.destination();
            match &db {
                Db::Postgres(pool) => two_relays(pool, &publisher, &destination).await,
                Db::Sqlite(pool) => two_relays(pool, &publisher, &destination).await,
                Db::MySql(pool) => two_relays(pool, &publisher, &destination).await,
            }
            let read = broker.read_in_order(KEYS * PER_KEY).await;
            let mut per_key: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for id in read {
                let key = id.split('-').next().unwrap().to_owned();
                per_key.entry(key).or_default().push(id);
            }
            assert_eq!(per_key.len(), KEYS, "{}", B::NAME);
            for (key, seen) in per_key {
                let expected: Vec<String> = (0..PER_KEY).map(|i| format!("{key}-{i:02}")).collect();
                assert_eq!(
                    seen,
                    expected,
                    "{}: key {key} was read out of order",
                    B::NAME
                );
            }
        },
    )
    .await;
}

const KEYS: usize = 8;
const PER_KEY: usize = 25;

/// [`KEYS`] writers staging [`PER_KEY`] messages each (payload and id `k{key}-{i}`, one
/// ordering key per writer) while two relays publish, until nothing is pending.
async fn two_relays<DB: idem::Backend, P: idem::outbox::Publisher + Clone>(
    pool: &sqlx::Pool<DB>,
    publisher: &P,
    destination: &idem::outbox::Destination,
) {
    use idem::outbox::{self, Message, Relay};
    let writers: Vec<_> = (0..KEYS)
        .map(|k| {
            let (pool, destination) = (pool.clone(), destination.clone());
            tokio::spawn(async move {
                for i in 0..PER_KEY {
                    let mut tx = pool.begin().await.unwrap();
                    let id = format!("k{k}-{i:02}");
                    let message = Message::bytes(destination.clone(), id.clone())
                        .ordering_key(format!("k{k}"))
                        .id(id);
                    outbox::stage(&mut tx, message).await.unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    let relays: Vec<_> = (0..2)
        .map(|_| {
            Relay::new(pool.clone(), publisher.clone())
                .batch_size(5)
                .poll_interval(Duration::from_millis(10))
                .publish_timeout(Duration::from_secs(10))
                .spawn()
                .unwrap()
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox::backlog(pool).await.unwrap().pending > 0 {
        assert!(
            Instant::now() < deadline,
            "messages still pending after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for relay in relays {
        relay.stop().await;
    }
}

/// The first copy of each payload of `read`, in order.
fn firsts(read: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    read.into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

/// A message's effect in `effects`, in a handler's transaction `tx`: a payload that says
/// `poison` fails; one that says `ship` is refused as not yet (`idem::inbox::not_yet`) until
/// its order's payment is in, then ships; any other pays. The order's number.
macro_rules! effect {
    ($tx:expr, $key:expr, $payload:expr, $positional:expr) => {{
        let order = brokers::order_of($key);
        let payload: &[u8] = $payload;
        let has = |word: &[u8]| payload.windows(word.len()).any(|w| w == word);
        if has(b"poison") {
            return Err(format!("poison: order {order} is refused"));
        }
        let kind = if has(b"ship") { "ship" } else { "pay" };
        if kind == "ship" {
            let paid: i64 = sqlx::query_scalar(crate::common::placed(
                $positional,
                "SELECT COUNT(*) FROM effects WHERE order_id = $1 AND kind = 'pay'",
            ))
            .bind(order)
            .fetch_one(&mut **$tx)
            .await
            .map_err(|e| e.to_string())?;
            if paid == 0 {
                early_try(order);
                return Err(idem::inbox::not_yet(format!(
                    "order {order} is not paid yet"
                )));
            }
        }
        sqlx::query(crate::common::placed(
            $positional,
            "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 1)",
        ))
        .bind(order)
        .bind(kind)
        .execute(&mut **$tx)
        .await
        .map_err(|e| e.to_string())?;
        order
    }};
}

/// How many times each order's "ship" was tried before its payment ([`effect!`]).
static EARLY_TRIES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<i64, usize>>> =
    std::sync::LazyLock::new(Default::default);

fn early_try(order: i64) {
    *EARLY_TRIES.lock().unwrap().entry(order).or_default() += 1;
}

fn early_tries(order: i64) -> usize {
    EARLY_TRIES
        .lock()
        .unwrap()
        .get(&order)
        .copied()
        .unwrap_or(0)
}

/// A batch whose handler writes each message's effect ([`effect!`]).
macro_rules! poison_batch {
    ($pool:expr, $inbox:expr, $batch:expr, $positional:expr) => {
        $inbox
            .batch($pool, $batch, |tx, (key, payload)| {
                Box::pin(async move { Ok(effect!(tx, key, payload, $positional)) })
            })
            .await
            .unwrap()
    };
}

async fn poison_batch(
    db: &Db,
    inbox: &Inbox,
    batch: &[(idem::inbox::MessageKey, Vec<u8>)],
) -> Vec<idem::inbox::Settled<i64, String>> {
    match db {
        Db::Postgres(pool) => poison_batch!(pool, inbox, batch, false),
        Db::Sqlite(pool) => poison_batch!(pool, inbox, batch, false),
        Db::MySql(pool) => poison_batch!(pool, inbox, batch, true),
    }
}

/// A consumer of a broker that acknowledges message by message: up to 10 deliveries
/// gathered within 50 ms, one [`poison_batch`], then each acknowledged when settled for
/// good (applied, absorbed, parked) and handed back otherwise; until `stop`.
async fn batches_of<M: BrokerMessage, E: std::fmt::Debug>(
    mut messages: impl futures_util::Stream<Item = Result<M, E>> + Unpin,
    db: Db,
    inbox: Inbox,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let gathered = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            gathered = idem::inbox::gather(&mut messages, 10, Duration::from_millis(50)) => gathered,
        };
        let Some(gathered) = gathered else { return };
        let gathered: Vec<M> = gathered.into_iter().map(Result::unwrap).collect();
        let batch: Vec<_> = gathered
            .iter()
            .map(|m| (m.key_and_order().0, m.payload().to_vec()))
            .collect();
        let settled = poison_batch(&db, &inbox, &batch).await;
        for (message, settled) in gathered.iter().zip(settled) {
            let outcome = settled.unwrap_or(Delivery::InProgress {
                lease_until_millis: None,
            });
            message.settle(&outcome).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// NATS JetStream: a memory stream and one durable pull consumer, its pull clients the
// consumers. The key travels in a header of the tests' own, not `Nats-Msg-Id` (JetStream
// would drop the copies inside its window, and the copies must reach the consumers).

struct Nats {
    js: async_nats::jetstream::Context,
    name: String,
    consumer: async_nats::jetstream::consumer::PullConsumer,
}

impl Broker for Nats {
    const NAME: &'static str = "JetStream";
    const REREADS: bool = false;
    const CONSUMERS_FIRST: bool = false;

    async fn fresh(prefix: &str, redeliver_after: Duration) -> Option<Nats> {
        let url = brokers::nats_url()?;
        let js = nats::jetstream(&url).await;
        let name = unique(prefix);
        let consumer = nats::stream_and_consumer(&js, &name, redeliver_after).await;
        Some(Nats { js, name, consumer })
    }

    fn child_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_CONFORMANCE_BROKER", "nats".into()),
            ("IDEM_CONFORMANCE_DEST", self.name.clone()),
        ]
    }

    async fn publish(&self, messages: &[(String, String)]) {
        let mut acks = Vec::with_capacity(messages.len());
        for (key, payload) in messages {
            let subject = format!("{}.payments", self.name);
            acks.push(nats::publish(&self.js, subject, key, payload.clone()).await);
        }
        for ack in acks {
            ack.await.unwrap();
        }
    }

    async fn held(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    async fn consumers(
        &self,
        workers: &Workers,
        consumers: usize,
        batch: Option<usize>,
        _: watch::Receiver<bool>,
    ) -> JoinSet<(usize, usize)> {
        let mut set = JoinSet::new();
        for _ in 0..consumers {
            let (workers, consumer) = (workers.clone(), self.consumer.clone());
            set.spawn(async move {
                let messages = consumer
                    .stream()
                    .max_messages_per_batch(batch.unwrap_or(25).max(25))
                    .messages()
                    .await
                    .unwrap();
                match batch {
                    None => workers.consume(messages).await,
                    Some(max) => workers.consume_batches(messages, max).await,
                }
            });
        }
        set
    }

    type Publisher = idem::outbox::nats::JetStream;

    async fn publisher(&self) -> Self::Publisher {
        idem::outbox::nats::JetStream::new(self.js.clone())
    }

    fn destination(&self) -> idem::outbox::Destination {
        idem::outbox::Destination::subject(format!("{}.ordered", self.name))
    }

    async fn read_in_order(&self, n: usize) -> Vec<String> {
        let mut messages = self.consumer.messages().await.unwrap();
        let mut read = Vec::new();
        while firsts(read.clone()).len() < n {
            let next = tokio::time::timeout(Duration::from_secs(30), messages.next());
            let message = next
                .await
                .expect("30 s without a message")
                .unwrap()
                .unwrap();
            read.push(String::from_utf8(message.payload.to_vec()).unwrap());
            message.ack().await.unwrap();
        }
        firsts(read)
    }

    async fn batch_consumer(
        &self,
        db: &Db,
        inbox: &Inbox,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let messages = self.consumer.messages().await.unwrap();
        tokio::spawn(batches_of(messages, db.clone(), inbox.clone(), stop))
    }

    async fn settled(&self) -> bool {
        let info = nats::consumer_info_when(&self.consumer, |i| {
            i.num_ack_pending == 0 && i.num_pending == 0
        })
        .await;
        let held = self.held().await;
        info.num_ack_pending == 0 && info.num_pending == 0 && info.ack_floor.stream_sequence == held
    }

    async fn delete(&self) {
        nats::delete_stream(&self.js, &self.name).await;
    }
}

// ---------------------------------------------------------------------------------------
// RabbitMQ: a queue, a channel with publisher confirms to publish, and one channel per
// consumer (its prefetch at least the batch).

struct Rabbit {
    connection: Arc<lapin::Connection>,
    channel: lapin::Channel,
    queue: String,
}

impl Broker for Rabbit {
    const NAME: &'static str = "RabbitMQ";
    const REREADS: bool = false;
    const CONSUMERS_FIRST: bool = false;

    async fn fresh(prefix: &str, _: Duration) -> Option<Rabbit> {
        let url = brokers::amqp_url()?;
        let connection = Arc::new(rabbitmq::connect(&url).await);
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .unwrap();
        let queue = unique(prefix);
        rabbitmq::declare(&channel, &queue).await;
        Some(Rabbit {
            connection,
            channel,
            queue,
        })
    }

    fn child_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_CONFORMANCE_BROKER", "rabbit".into()),
            ("IDEM_CONFORMANCE_DEST", self.queue.clone()),
        ]
    }

    async fn publish(&self, messages: &[(String, String)]) {
        let mut confirms = Vec::with_capacity(messages.len());
        for (key, payload) in messages {
            confirms
                .push(rabbitmq::publish(&self.channel, &self.queue, key, payload.as_bytes()).await);
        }
        for confirm in confirms {
            assert!(confirm.await.unwrap().is_ack());
        }
    }

    async fn held(&self) -> u64 {
        // Before any consumer: every copy is ready in the queue.
        let (ready, _) = rabbitmq::queue_state(&self.channel, &self.queue).await;
        u64::from(ready)
    }

    async fn consumers(
        &self,
        workers: &Workers,
        consumers: usize,
        batch: Option<usize>,
        _: watch::Receiver<bool>,
    ) -> JoinSet<(usize, usize)> {
        use lapin::options::{BasicConsumeOptions, BasicQosOptions};
        let mut set = JoinSet::new();
        for n in 0..consumers {
            let channel = self.connection.create_channel().await.unwrap();
            let prefetch = batch.unwrap_or(20).max(20) as u16;
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
                .unwrap();
            let (workers, queue) = (workers.clone(), self.queue.clone());
            set.spawn(async move {
                let mut deliveries = channel
                    .basic_consume(
                        queue.as_str().into(),
                        format!("worker-{n}").into(),
                        BasicConsumeOptions::default(),
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let counts = match batch {
                    None => workers.consume(&mut deliveries).await,
                    Some(max) => workers.consume_batches(&mut deliveries, max).await,
                };
                // Closing the channel would requeue anything unacked. The consumer is
                // dropped after it: dropped before, lapin cancels it in the background,
                // and that cancel, meeting the channel closing, failed the close.
                channel.close(200, "done".into()).await.unwrap();
                drop(deliveries);
                counts
            });
        }
        set
    }

    type Publisher = idem::outbox::rabbitmq::Rabbit;

    async fn publisher(&self) -> Self::Publisher {
        idem::outbox::rabbitmq::Rabbit::new(self.connection.clone())
    }

    fn destination(&self) -> idem::outbox::Destination {
        // The default exchange routes by the queue's name.
        idem::outbox::Destination::exchange("", self.queue.as_str())
    }

    async fn read_in_order(&self, n: usize) -> Vec<String> {
        use lapin::options::{BasicAckOptions, BasicConsumeOptions};
        let channel = self.connection.create_channel().await.unwrap();
        let mut deliveries = channel
            .basic_consume(
                self.queue.as_str().into(),
                "conformance-reader".into(),
                BasicConsumeOptions::default(),
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        let mut read = Vec::new();
        while firsts(read.clone()).len() < n {
            let next = tokio::time::timeout(Duration::from_secs(30), deliveries.next());
            let delivery = next
                .await
                .expect("30 s without a message")
                .unwrap()
                .unwrap();
            read.push(String::from_utf8(delivery.data.clone()).unwrap());
            delivery.ack(BasicAckOptions::default()).await.unwrap();
        }
        channel.close(200, "done".into()).await.unwrap();
        drop(deliveries);
        firsts(read)
    }

    async fn batch_consumer(
        &self,
        db: &Db,
        inbox: &Inbox,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        use lapin::options::{BasicConsumeOptions, BasicQosOptions};
        let channel = self.connection.create_channel().await.unwrap();
        channel
            .basic_qos(10, BasicQosOptions::default())
            .await
            .unwrap();
        let deliveries = channel
            .basic_consume(
                self.queue.as_str().into(),
                "conformance-batches".into(),
                BasicConsumeOptions::default(),
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        let (db, inbox) = (db.clone(), inbox.clone());
        tokio::spawn(async move {
            let mut deliveries = deliveries;
            batches_of(&mut deliveries, db, inbox, stop).await;
            channel.close(200, "done".into()).await.unwrap();
            drop(deliveries);
        })
    }

    async fn settled(&self) -> bool {
        // The consumers' channels are closed once they end, so an unacknowledged delivery
        // would be back in the queue.
        rabbitmq::queue_state(&self.channel, &self.queue).await == (0, 0)
    }

    async fn nothing_waiting(&self) -> bool {
        // A live consumer's unacknowledged deliveries are not counted: they show once its
        // channel closes ([`Broker::settled`]).
        rabbitmq::queue_state(&self.channel, &self.queue).await.0 == 0
    }

    async fn delete(&self) {
        rabbitmq::delete_queue(&self.channel, &self.queue).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

// ---------------------------------------------------------------------------------------
// Kafka: a topic of six partitions; the consumers are members of one group
// (`KafkaConsumer`), whose rounds run each partition's messages as one `Inbox::batch` and
// commit the partition's offset after the database's commit. The key travels in the
// `idem-message-id` header, as an idem relay sends it.

struct Kafka {
    url: String,
    topic: String,
    group: String,
    /// The partition of the next message published apart ([`Broker::publish_apart`]).
    apart: std::sync::atomic::AtomicI32,
}

impl Kafka {
    fn member(&self) -> rdkafka::ClientConfig {
        kafka_member(&self.url, &self.group)
    }

    /// Each partition's committed offset and its end.
    async fn offsets(&self) -> Vec<(i64, i64)> {
        kafka_offsets(&self.url, &self.group, &self.topic, KAFKA_PARTITIONS).await
    }
}

/// One round of a member, each message's effect a row in `effects` ([`effect!`]), after
/// `pause` in its handler.
macro_rules! kafka_round {
    ($consumer:expr, $pool:expr, $positional:expr, $pause:expr) => {
        $consumer
            .next($pool, |tx, record| {
                Box::pin(async move {
                    use rdkafka::Message as _;
                    let payload = record.message().payload().unwrap_or_default();
                    let order = effect!(tx, record.key(), payload, $positional);
                    if let Pause::Forever(point) = $pause {
                        crate::child::report(&format!("crash-point {point}"));
                        std::future::pending::<()>().await;
                    }
                    Ok(order)
                })
            })
            .await
            .unwrap()
    };
}

async fn kafka_round(consumer: &KafkaConsumer, db: &Db) -> KafkaRound<i64, String> {
    kafka_round_paused(consumer, db, Pause::None).await
}

async fn kafka_round_paused(
    consumer: &KafkaConsumer,
    db: &Db,
    pause: Pause,
) -> KafkaRound<i64, String> {
    match db {
        Db::Postgres(pool) => kafka_round!(consumer, pool, false, pause),
        Db::Sqlite(pool) => kafka_round!(consumer, pool, false, pause),
        Db::MySql(pool) => kafka_round!(consumer, pool, true, pause),
    }
}

impl Broker for Kafka {
    const NAME: &'static str = "Kafka";
    const REREADS: bool = true;
    const CONSUMERS_FIRST: bool = true;

    async fn fresh(prefix: &str, _: Duration) -> Option<Kafka> {
        let url = brokers::kafka_url()?;
        let topic = kafka_topic(&url, prefix).await;
        let group = unique("conformance-group");
        Some(Kafka {
            url,
            topic,
            group,
            apart: Default::default(),
        })
    }

    fn child_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_CONFORMANCE_BROKER", "kafka".into()),
            ("IDEM_CONFORMANCE_DEST", self.topic.clone()),
            ("IDEM_CONFORMANCE_GROUP", self.group.clone()),
        ]
    }

    async fn publish(&self, messages: &[(String, String)]) {
        let records: Vec<_> = messages
            .iter()
            .map(|(key, payload)| (key.clone(), Some(key.clone()), payload.clone()))
            .collect();
        brokers::kafka_produce(&self.url, &self.topic, &records).await;
    }

    async fn publish_apart(&self, messages: &[(String, String)]) {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.url)
            .set("acks", "all")
            .create()
            .unwrap();
        for (key, payload) in messages {
            let partition = self
                .apart
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let headers = OwnedHeaders::new().insert(Header {
                key: idem::outbox::kafka::ID_HEADER,
                value: Some(key.as_bytes()),
            });
            let record = FutureRecord::to(&self.topic)
                .key(key)
                .payload(payload)
                .headers(headers)
                .partition(partition % KAFKA_PARTITIONS);
            producer
                .send(record, Duration::from_secs(30))
                .await
                .unwrap();
        }
    }

    async fn held(&self) -> u64 {
        self.offsets()
            .await
            .iter()
            .map(|(_, end)| *end as u64)
            .sum()
    }

    /// The members join before anything is published and are waited for, so that each
    /// owns a partition when the messages come: all of them take deliveries.
    async fn consumers(
        &self,
        workers: &Workers,
        consumers: usize,
        batch: Option<usize>,
        stop: watch::Receiver<bool>,
    ) -> JoinSet<(usize, usize)> {
        let members: Vec<Arc<KafkaConsumer>> = (0..consumers)
            .map(|_| {
                let member =
                    KafkaConsumer::new(self.member(), &[&self.topic], workers.inbox().clone())
                        .unwrap()
                        .batch(batch.unwrap_or(1), Duration::from_millis(50));
                Arc::new(member)
            })
            .collect();
        let mut set = JoinSet::new();
        for member in &members {
            let (member, workers, mut stop) = (member.clone(), workers.clone(), stop.clone());
            set.spawn(async move {
                let (mut mine, mut processed) = (0, 0);
                loop {
                    // Stopped only once every offset is committed: the round then waits
                    // for a first message, the one place it may be cancelled.
                    let round = tokio::select! {
                        _ = stop.wait_for(|stop| *stop) => break,
                        round = kafka_round(&member, workers.db()) => round,
                    };
                    workers.note_batch(round.settled.len());
                    mine += round.settled.len();
                    processed += round
                        .settled
                        .iter()
                        .filter(|(_, s)| matches!(s, Ok(Delivery::Processed(_))))
                        .count();
                }
                (mine, processed)
            });
        }
        // Every member owns a partition, and together they own the topic.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let owned: Vec<Vec<(String, i32)>> = members.iter().map(|m| m.assignment()).collect();
            let all: usize = owned.iter().map(Vec::len).sum();
            if owned.iter().all(|o| !o.is_empty()) && all == KAFKA_PARTITIONS as usize {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the group did not settle in 60 s: {owned:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        set
    }

    type Publisher = idem::outbox::kafka::Kafka;

    async fn publisher(&self) -> Self::Publisher {
        idem::outbox::kafka::Kafka::connect(&self.url).unwrap()
    }

    fn destination(&self) -> idem::outbox::Destination {
        idem::outbox::Destination::subject(self.topic.as_str())
    }

    /// A reader of its own group, from the start: each partition's messages in their
    /// order (a key's are on one partition).
    async fn read_in_order(&self, n: usize) -> Vec<String> {
        use rdkafka::Message as _;
        use rdkafka::consumer::{Consumer, StreamConsumer};
        let mut config = kafka_member(&self.url, &unique("conformance-reader"));
        config.set("auto.offset.reset", "earliest");
        let reader: StreamConsumer = config.create().unwrap();
        reader.subscribe(&[&self.topic]).unwrap();
        let mut read = Vec::new();
        while firsts(read.clone()).len() < n {
            let next = tokio::time::timeout(Duration::from_secs(30), reader.recv());
            let message = next.await.expect("30 s without a message").unwrap();
            read.push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
        }
        firsts(read)
    }

    async fn batch_consumer(
        &self,
        db: &Db,
        inbox: &Inbox,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let member = KafkaConsumer::new(self.member(), &[&self.topic], inbox.clone())
            .unwrap()
            .batch(10, Duration::from_millis(50))
            .retry_delay(Duration::from_millis(200));
        let db = db.clone();
        tokio::spawn(async move {
            loop {
                // Stopped once every offset is committed: waiting for a first message.
                tokio::select! {
                    _ = stop.wait_for(|stop| *stop) => return,
                    _ = kafka_round(&member, &db) => {}
                }
            }
        })
    }

    async fn settled(&self) -> bool {
        self.offsets()
            .await
            .iter()
            .all(|(committed, end)| committed == end)
    }

    async fn delete(&self) {
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &self.url)
                .create()
                .unwrap();
        let _ = admin
            .delete_topics(&[self.topic.as_str()], &rdkafka::admin::AdminOptions::new())
            .await;
    }
}

// ---------------------------------------------------------------------------------------
// A consumer killed: the scenario, and the consumer process it runs.

/// See the [module](self): one message, a consumer process killed at `crash_point`
/// (`after_commit`, `before_commit`), then another.
async fn killed_consumer<B: Broker>(db: Db, crash_point: &'static str) {
    on_fresh::<B>(
        "conformance-killed",
        Duration::from_secs(2),
        async |broker| {
            broker
                .publish(&[("order:7:paid".into(), r#"{"order":7}"#.into())])
                .await;
            let spawn = |crash: Option<&str>| {
                let mut env = broker.child_env();
                env.push(("IDEM_CHILD_DB", db.spec()));
                if let Some(point) = crash {
                    env.push(("IDEM_CRASH_POINT", point.to_owned()));
                }
                ChildProcess::spawn(
                    "conformance::consumer_process",
                    &env,
                    &[
                        "IDEM_CRASH_POINT",
                        "IDEM_CONFORMANCE_GROUP",
                        "IDEM_CRASH_NTH",
                    ],
                )
            };
            let mut first = spawn(Some(crash_point));
            first.step("ready").await;
            // A Kafka member first joins its group.
            let step = tokio::time::timeout(Duration::from_secs(60), first.step("crash-point"))
                .await
                .unwrap_or_else(|_| {
                    panic!("{}: the consumer never reached {crash_point}", B::NAME)
                });
            let committed = i64::from(crash_point == "after_commit");
            assert!(step.starts_with("crash-point"), "{step}");
            // The effect committed with its record, or neither.
            assert_eq!(
                db.effects().await,
                committed,
                "{}: at {crash_point}",
                B::NAME
            );
            assert_eq!(
                db.records().await,
                committed,
                "{}: at {crash_point}",
                B::NAME
            );
            first.kill();
            assert_eq!(db.effects().await, committed, "the kill changed nothing");

            let mut second = spawn(None);
            second.step("ready").await;
            let expected = match crash_point {
                "after_commit" => "outcome duplicate",
                _ => "outcome processed",
            };
            // After the broker hands the message over again: JetStream's ack wait, a Kafka
            // member's session.
            let outcome = tokio::time::timeout(Duration::from_secs(60), second.step("outcome"))
                .await
                .unwrap_or_else(|_| panic!("{}: the message never came again", B::NAME));
            assert_eq!(outcome, expected, "{}", B::NAME);
            second.step("done").await;
            second.exits_successfully().await;
            assert_eq!(db.effects().await, 1, "{}: exactly one effect", B::NAME);
            assert_eq!(db.records().await, 1);
            settles(broker).await;
        },
    )
    .await;
}

/// The consumer process of [`killed_consumer`] (the scenario runs this test binary with
/// `--ignored --exact conformance::consumer_process`): consumes one message from the broker
/// `IDEM_CONFORMANCE_BROKER`'s destination `IDEM_CONFORMANCE_DEST` through the inbox into
/// the database `IDEM_CHILD_DB`, printing `idem-child: …` steps: `ready`, then `outcome
/// <kind>` and `done`. With `IDEM_CRASH_POINT=before_commit` it stops in the handler, the
/// effect written and not committed; with `after_commit`, after the commit and before it
/// tells the broker (a fault hook at the commit). There it prints `crash-point …` and waits
/// for its SIGKILL.
#[test]
#[ignore = "the consumer process of the conformance suite, which runs it as a child"]
fn consumer_process() {
    let Ok(broker) = std::env::var("IDEM_CONFORMANCE_BROKER") else {
        eprintln!("consumer_process runs only as the child of a conformance scenario");
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let crash = std::env::var("IDEM_CRASH_POINT").ok();
    if crash.as_deref() == Some("after_commit") {
        crate::child::stop_at_nth(idem::fault::FaultPoint::Committed, 1);
    }
    let pause = match crash.as_deref() {
        Some("before_commit") => Pause::Forever("before_commit"),
        _ => Pause::None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let db = Db::connect(&var("IDEM_CHILD_DB")).await;
        let inbox = Inbox::new("conformance-killed").unwrap();
        let dest = var("IDEM_CONFORMANCE_DEST");
        let outcome = match broker.as_str() {
            "nats" => {
                let client = async_nats::connect(brokers::nats_url().unwrap())
                    .await
                    .unwrap();
                let js = async_nats::jetstream::new(client.clone());
                let consumer: async_nats::jetstream::consumer::PullConsumer = js
                    .get_stream(&dest)
                    .await
                    .unwrap()
                    .get_consumer("consumers")
                    .await
                    .unwrap();
                let mut messages = consumer.messages().await.unwrap();
                report("ready");
                let message = messages.next().await.unwrap().unwrap();
                let (key, order) = message.key_and_order();
                let outcome = db
                    .deliver(&inbox, &key, &message.payload, order, pause)
                    .await
                    .unwrap();
                message.settle(&outcome).await;
                // The ack is a publish: out before the process exits.
                client.flush().await.unwrap();
                outcome
            }
            "rabbit" => {
                use lapin::options::{BasicConsumeOptions, BasicQosOptions};
                let connection = rabbitmq::connect(&brokers::amqp_url().unwrap()).await;
                let channel = connection.create_channel().await.unwrap();
                channel
                    .basic_qos(1, BasicQosOptions::default())
                    .await
                    .unwrap();
                let mut deliveries = channel
                    .basic_consume(
                        dest.as_str().into(),
                        "conformance-child".into(),
                        BasicConsumeOptions::default(),
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .unwrap();
                report("ready");
                let delivery = deliveries.next().await.unwrap().unwrap();
                let (key, order) = delivery.key_and_order();
                let outcome = db
                    .deliver(&inbox, &key, &delivery.data, order, pause)
                    .await
                    .unwrap();
                delivery.settle(&outcome).await;
                channel.close(200, "done".into()).await.unwrap();
                drop(deliveries);
                connection.close(200, "done".into()).await.unwrap();
                outcome
            }
            _ => {
                let url = brokers::kafka_url().unwrap();
                let consumer = KafkaConsumer::new(
                    kafka_member(&url, &var("IDEM_CONFORMANCE_GROUP")),
                    &[&dest],
                    inbox,
                )
                .unwrap()
                .batch(1, Duration::from_millis(10));
                report("ready");
                let round = kafka_round_paused(&consumer, &db, pause).await;
                let (_, settled) = round.settled.into_iter().next().unwrap();
                assert_eq!(round.committed.len(), 1, "the offset was not committed");
                settled.unwrap()
            }
        };
        report(&format!("outcome {}", outcome.kind()));
        report("done");
    });
}

// ---------------------------------------------------------------------------------------
// The runs: each broker × each database, one delivery at a time and in batches.

/// The database of a run, or `None` without its server.
async fn database(backend: &str, name: &str) -> Option<Db> {
    match backend {
        "postgres" => Db::postgres(name, 8).await,
        "mysql" => Db::mysql(name, 8).await,
        _ => Some(Db::sqlite(name, 4).await),
    }
}

async fn one_at_a_time<B: Broker>(backend: &str) {
    let name = format!("conformance_{}_{backend}", B::NAME.to_lowercase());
    let Some(db) = database(backend, &name).await else {
        return;
    };
    retried_messages::<B>(db, None).await;
}

async fn in_batches<B: Broker>(backend: &str) {
    for size in [1, 10, 100] {
        let name = format!("conformance_{}_{backend}_{size}", B::NAME.to_lowercase());
        let Some(db) = database(backend, &name).await else {
            return;
        };
        retried_messages::<B>(db, Some(size)).await;
    }
}

async fn in_order<B: Broker>(backend: &str) {
    let name = format!("conformance_order_{}_{backend}", B::NAME.to_lowercase());
    let Some(db) = database(backend, &name).await else {
        return;
    };
    relayed_in_order::<B>(db).await;
}

async fn poison<B: Broker>(backend: &str) {
    let name = format!("conformance_poison_{}_{backend}", B::NAME.to_lowercase());
    let Some(db) = database(backend, &name).await else {
        return;
    };
    poison_message::<B>(db).await;
}

async fn early<B: Broker>(backend: &str) {
    let name = format!("conformance_early_{}_{backend}", B::NAME.to_lowercase());
    let Some(db) = database(backend, &name).await else {
        return;
    };
    came_early::<B>(db).await;
}

async fn killed<B: Broker>(backend: &str, crash_point: &'static str) {
    let name = format!(
        "conformance_killed_{}_{backend}_{crash_point}",
        B::NAME.to_lowercase()
    );
    let Some(db) = database(backend, &name).await else {
        return;
    };
    killed_consumer::<B>(db, crash_point).await;
}

macro_rules! runs {
    ($broker:ty, $prefix:ident) => {
        mod $prefix {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_to_four_consumers_postgres() {
                one_at_a_time::<$broker>("postgres").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_to_four_consumers_sqlite() {
                one_at_a_time::<$broker>("sqlite").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_to_four_consumers_mysql() {
                one_at_a_time::<$broker>("mysql").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_in_batches_of_1_10_100_postgres() {
                in_batches::<$broker>("postgres").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_in_batches_of_1_10_100_sqlite() {
                in_batches::<$broker>("sqlite").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retried_messages_in_batches_of_1_10_100_mysql() {
                in_batches::<$broker>("mysql").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_relays_deliver_each_key_in_order_postgres() {
                in_order::<$broker>("postgres").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_relays_deliver_each_key_in_order_sqlite() {
                in_order::<$broker>("sqlite").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_relays_deliver_each_key_in_order_mysql() {
                in_order::<$broker>("mysql").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_poison_message_is_parked_and_the_others_applied_postgres() {
                poison::<$broker>("postgres").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_poison_message_is_parked_and_the_others_applied_sqlite() {
                poison::<$broker>("sqlite").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_poison_message_is_parked_and_the_others_applied_mysql() {
                poison::<$broker>("mysql").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_message_that_came_early_waits_unacked_then_applies_postgres() {
                early::<$broker>("postgres").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_message_that_came_early_waits_unacked_then_applies_sqlite() {
                early::<$broker>("sqlite").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_message_that_came_early_waits_unacked_then_applies_mysql() {
                early::<$broker>("mysql").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_after_commit_before_telling_the_broker_the_redelivery_is_a_duplicate_postgres() {
                killed::<$broker>("postgres", "after_commit").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_after_commit_before_telling_the_broker_the_redelivery_is_a_duplicate_sqlite() {
                killed::<$broker>("sqlite", "after_commit").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_after_commit_before_telling_the_broker_the_redelivery_is_a_duplicate_mysql() {
                killed::<$broker>("mysql", "after_commit").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_before_commit_the_redelivery_applies_once_postgres() {
                killed::<$broker>("postgres", "before_commit").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_before_commit_the_redelivery_applies_once_sqlite() {
                killed::<$broker>("sqlite", "before_commit").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_before_commit_the_redelivery_applies_once_mysql() {
                killed::<$broker>("mysql", "before_commit").await;
            }
        }
    };
}

runs!(Nats, jetstream);
runs!(Rabbit, rabbit);
runs!(Kafka, kafka);
