//! Kafka (feature `kafka`, on `rdkafka`): a consumer-group member whose offsets are
//! committed only after the database committed what it read ([`KafkaConsumer`]).
//!
//! Each round ([`KafkaConsumer::next`]) takes what the member polled within a wait (at most
//! a batch), splits it by partition, and runs each partition's messages, in offset order, as
//! one [`Inbox::batch`]: one transaction, one commit, each message applied once. Only then
//! does it commit each partition's next offset to Kafka, and only for a partition the member
//! still owns. So:
//!
//! - **a crash before the offset commit** reads the messages again, and the inbox absorbs
//!   them (a duplicate, answered with the first result);
//! - **a rebalance** (a member joins, leaves, or is thrown out for missing its session or its
//!   poll interval) hands a partition to another member, which resumes at the committed
//!   offset; what is read twice is absorbed the same way. A member never commits a partition
//!   it lost: it drops the commits of a partition revoked since it read the messages (Kafka
//!   accepts a live member's commit for a partition it no longer owns), and a commit Kafka
//!   refuses for a fenced generation (`UNKNOWN_MEMBER_ID`, `ILLEGAL_GENERATION`,
//!   `REBALANCE_IN_PROGRESS`) means someone else has it now, never a loss;
//! - **a partition's messages apply in their order**: the handlers run in offset order, and
//!   a message that needs another delivery — its handler failed, it came early
//!   ([`not_yet`](super::not_yet)), another delivery holds it (a rebalance's overlap) —
//!   holds back the partition's messages after it (they are not run, not recorded). Its
//!   partition's offset is committed up to it, the member seeks back to it and pauses the
//!   partition for the [`retry_delay`](KafkaConsumer::retry_delay), so it is read again,
//!   then the ones after it. A failed one is parked after the inbox's
//!   [`max_attempts`](Inbox::max_attempts) ([`Delivery::Dead`], its record keeping the last
//!   error) and the partition moves on; an early one spends no attempt and waits for what
//!   it waits for.
//!
//! Auto-commit is refused: a background commit of what was polled, before the database
//! committed it, loses messages on a crash.

use super::batch::{BatchFuture, Incoming, Order, Settled};
use super::{Delivery, Inbox, MessageKey};
use crate::backend::Backend;
use crate::error::Error;
use crate::value::key::KeyError;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Pool, Transaction};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the inbox records a Kafka message under.
#[derive(Clone)]
#[non_exhaustive]
pub enum KeyFrom {
    /// The id an idem relay published it under, the header `idem-message-id`
    /// ([`idem::outbox::kafka`](crate::outbox::kafka)): the default. The same message
    /// re-published (a relay that crashed after the broker's acknowledgement) has the same
    /// id, at another offset.
    Id,
    /// Its place in the log, `topic/partition/offset`: for a producer that sets no id. A
    /// message the producer sent twice sits at two offsets and is two messages to the
    /// inbox: only a redelivery of the same offset (a crash, a rebalance) is absorbed.
    Position,
    /// A key you derive from the message: a business key (`order:42:paid`) taken from its
    /// payload or headers, which the documents on idempotency call the sturdiest (an id can
    /// change on a replay or a backfill; the business event does not).
    Derive(DeriveKey),
}

/// A key derived from a message ([`KeyFrom::Derive`]).
pub type DeriveKey = Arc<dyn Fn(&OwnedMessage) -> Result<MessageKey, KeyError> + Send + Sync>;

impl fmt::Debug for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFrom::Id => f.write_str("Id"),
            KeyFrom::Position => f.write_str("Position"),
            KeyFrom::Derive(_) => f.write_str("Derive(..)"),
        }
    }
}

/// One message of a round, as the handler gets it: the message, and the key it is recorded
/// under.
#[derive(Debug)]
pub struct KafkaRecord {
    message: OwnedMessage,
    key: MessageKey,
    /// Why the message has no key of the chosen kind (it is recorded under its position,
    /// and fails until it is parked).
    unkeyed: Option<String>,
}

impl KafkaRecord {
    /// The message (topic, partition, offset, key, payload, headers).
    pub fn message(&self) -> &OwnedMessage {
        &self.message
    }

    /// The key it is recorded under.
    pub fn key(&self) -> &MessageKey {
        &self.key
    }
}

impl Incoming for KafkaRecord {
    fn key(&self) -> &MessageKey {
        &self.key
    }

    fn payload(&self) -> &[u8] {
        self.message.payload().unwrap_or_default()
    }
}

/// The error of a message's handling: the handler's, or the message had no key.
#[derive(Debug)]
pub enum KafkaHandlerError<E> {
    /// The handler failed.
    Handler(E),
    /// The message carries no key of the kind the consumer records (no `idem-message-id`
    /// header, a derivation that failed): it is recorded under its position and parked
    /// after its attempts, with this error.
    NoKey(String),
}

impl<E: fmt::Display> fmt::Display for KafkaHandlerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaHandlerError::Handler(e) => e.fmt(f),
            KafkaHandlerError::NoKey(why) => write!(f, "the message has no key: {why}"),
        }
    }
}

/// What one round did ([`KafkaConsumer::next`]).
#[derive(Debug)]
pub struct KafkaRound<T, E> {
    /// Each message read, in the order read, with what became of it.
    pub settled: Vec<(Position, Settled<T, KafkaHandlerError<E>>)>,
    /// The offsets committed: each partition's next offset to read.
    pub committed: Vec<Position>,
    /// Partitions whose commit was dropped or refused because the member no longer owns
    /// them: another member reads them again from their last committed offset.
    pub lost: Vec<(String, i32)>,
}

/// A place in a topic's log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// Why a [`KafkaConsumer`] was not made.
#[derive(Debug)]
#[non_exhaustive]
pub enum KafkaConsumerError {
    /// The configuration turns auto-commit on (`enable.auto.commit=true`): offsets would be
    /// committed in the background, before the database committed what they cover.
    AutoCommit,
    /// It names no consumer group (`group.id`).
    NoGroup,
    /// librdkafka refused the configuration or the subscription.
    Client(KafkaError),
}

impl fmt::Display for KafkaConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaConsumerError::AutoCommit => f.write_str(
                "the Kafka consumer sets `enable.auto.commit=true`: offsets would be committed \
                 before the database commits what they cover, and a crash would lose those \
                 messages; remove it (idem commits each offset after its transaction)",
            ),
            KafkaConsumerError::NoGroup => f.write_str(
                "the Kafka consumer has no `group.id`: idem's consumer is a group member, whose \
                 committed offsets say where a restart resumes",
            ),
            KafkaConsumerError::Client(e) => write!(f, "the Kafka consumer was not made: {e}"),
        }
    }
}

impl std::error::Error for KafkaConsumerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KafkaConsumerError::Client(e) => Some(e),
            _ => None,
        }
    }
}

/// Which partitions the member owns, and since when: a revocation or a new assignment of a
/// partition moves its epoch on, so a commit for messages read in an earlier epoch is
/// dropped.
#[derive(Default)]
struct Ownership {
    epoch: u64,
    /// The owned partitions, each with the epoch it was assigned in.
    owned: HashMap<(String, i32), u64>,
}

/// The consumer's context: it follows the rebalances.
struct Tracker {
    ownership: Mutex<Ownership>,
}

impl ClientContext for Tracker {}

impl ConsumerContext for Tracker {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let mut ownership = self.ownership.lock().unwrap_or_else(|e| e.into_inner());
            ownership.epoch += 1;
            for element in partitions.elements() {
                ownership
                    .owned
                    .remove(&(element.topic().to_owned(), element.partition()));
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let mut ownership = self.ownership.lock().unwrap_or_else(|e| e.into_inner());
            ownership.epoch += 1;
            let epoch = ownership.epoch;
            for element in partitions.elements() {
                ownership
                    .owned
                    .insert((element.topic().to_owned(), element.partition()), epoch);
            }
            // A partition this member paused before it lost it starts unpaused if it comes
            // back: read from its committed offset, nothing to wait for.
            let _ = consumer.resume(partitions);
            // An eager assignment replaces the whole set: what it does not name is gone.
            if !matches!(
                consumer.rebalance_protocol(),
                rdkafka::consumer::RebalanceProtocol::Cooperative
            ) {
                let named: std::collections::HashSet<(String, i32)> = partitions
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                ownership
                    .owned
                    .retain(|partition, _| named.contains(partition));
            }
        }
    }
}

impl Tracker {
    /// The epoch `partition` was assigned in, if the member owns it.
    fn owned_since(&self, topic: &str, partition: i32) -> Option<u64> {
        let ownership = self.ownership.lock().unwrap_or_else(|e| e.into_inner());
        ownership.owned.get(&(topic.to_owned(), partition)).copied()
    }
}

/// A Kafka consumer-group member whose offsets follow the database: see the
/// [module](self).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::inbox::kafka::KafkaConsumer;
/// use idem::inbox::Inbox;
///
/// let mut config = rdkafka::ClientConfig::new();
/// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "coupons");
/// let consumer = KafkaConsumer::new(config, &["coupon.grant"], Inbox::new("coupons")?)?;
/// loop {
///     let round = consumer
///         .next(&pool, |tx, record| {
///             Box::pin(async move {
///                 let order: i64 = std::str::from_utf8(record.message().payload().unwrap_or_default())
///                     .unwrap_or("0")
///                     .parse()
///                     .unwrap_or(0);
///                 sqlx::query("INSERT INTO coupons (order_id) VALUES (?)")
///                     .bind(order)
///                     .execute(&mut **tx)
///                     .await?;
///                 Ok::<_, sqlx::Error>(())
///             })
///         })
///         .await?;
///     let _ = round.committed;
/// }
/// # }
/// # use rdkafka::Message as _;
/// ```
pub struct KafkaConsumer {
    consumer: Arc<StreamConsumer<Tracker>>,
    inbox: Inbox,
    key: KeyFrom,
    max: usize,
    wait: Duration,
    retry_delay: Duration,
    /// The partitions paused until a message of theirs is read again, with when.
    paused: Mutex<Vec<((String, i32), tokio::time::Instant)>>,
}

impl fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("inbox", &self.inbox)
            .field("key", &self.key)
            .field("max", &self.max)
            .field("wait", &self.wait)
            .field("retry_delay", &self.retry_delay)
            .finish_non_exhaustive()
    }
}

impl KafkaConsumer {
    /// A member of the group `config` names (`group.id`), subscribed to `topics`, recording
    /// its messages in `inbox`. `config` is yours (brokers, security, the assignment
    /// strategy — eager or `cooperative-sticky` —, session and poll timeouts), with
    /// `enable.auto.commit=false` and `enable.auto.offset.store=false` set by idem; one that
    /// turns auto-commit on is refused.
    pub fn new(
        mut config: ClientConfig,
        topics: &[&str],
        inbox: Inbox,
    ) -> Result<KafkaConsumer, KafkaConsumerError> {
        if config.get("enable.auto.commit") == Some("true") {
            return Err(KafkaConsumerError::AutoCommit);
        }
        if config.get("group.id").is_none_or(str::is_empty) {
            return Err(KafkaConsumerError::NoGroup);
        }
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if config.get("auto.offset.reset").is_none() {
            // A group without a committed offset starts at the beginning: nothing staged
            // before the first member joined is skipped.
            config.set("auto.offset.reset", "earliest");
        }
        let tracker = Tracker {
            ownership: Mutex::new(Ownership::default()),
        };
        let consumer: StreamConsumer<Tracker> = config
            .create_with_context(tracker)
            .map_err(KafkaConsumerError::Client)?;
        consumer
            .subscribe(topics)
            .map_err(KafkaConsumerError::Client)?;
        Ok(KafkaConsumer {
            consumer: Arc::new(consumer),
            inbox,
            key: KeyFrom::Id,
            max: 100,
            wait: Duration::from_millis(100),
            retry_delay: Duration::from_secs(1),
            paused: Mutex::new(Vec::new()),
        })
    }

    /// What the inbox records each message under ([`KeyFrom::Id`] by default).
    pub fn key_from(mut self, key: KeyFrom) -> KafkaConsumer {
        self.key = key;
        self
    }

    /// A round takes at most `max` messages (100 by default; at least 1), waiting at most
    /// `wait` (100 ms) once the first has come.
    pub fn batch(mut self, max: usize, wait: Duration) -> KafkaConsumer {
        self.max = max.max(1);
        self.wait = wait;
        self
    }

    /// How long a partition waits before its message that needs another delivery is read
    /// again (1 s by default): one whose handler failed with attempts left, one that came
    /// early ([`not_yet`](super::not_yet)), one another delivery holds. The partition is
    /// paused meanwhile (its messages after that one wait too: their order is kept); the
    /// member's other partitions go on. Zero reads it again at once.
    pub fn retry_delay(mut self, delay: Duration) -> KafkaConsumer {
        self.retry_delay = delay;
        self
    }

    /// The partitions this member owns now, as of the last rebalance it took part in (a
    /// member takes part while a round waits for messages), sorted: for health checks and
    /// logs, and to wait for a group to settle.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        let ownership = self
            .tracker()
            .ownership
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut owned: Vec<(String, i32)> = ownership.owned.keys().cloned().collect();
        owned.sort();
        owned
    }

    /// One round: waits for a message, takes what comes within the batch's wait (at most its
    /// size), runs each partition's messages as one [`Inbox::batch`] with `handler`, then
    /// commits each partition's next offset, or seeks back to its first message that needs
    /// another delivery and pauses that partition for the
    /// [`retry_delay`](Self::retry_delay). An `Err` is a failure of the database or of Kafka: the partitions
    /// the round did not commit are read again from their first message (sought back), and
    /// what the database committed of them is absorbed.
    ///
    /// While it waits for its first message, a broker down (or not up yet) does not end the
    /// round: librdkafka reconnects by itself, and the round logs what the client reported
    /// (a `tracing` warning) and keeps waiting. Only a fatal client error ends it.
    ///
    /// Do not cancel a round once a message came (a `select!` or a timeout around it):
    /// dropped half way, it leaves messages polled but neither applied nor committed, and a
    /// later round's commit would pass over them. Cancelling it while it still waits for
    /// its first message is safe (nothing was polled); otherwise drop the consumer with it:
    /// its partitions are read again from their committed offsets by whoever owns them next.
    pub async fn next<DB, T, E, F>(
        &self,
        pool: &Pool<DB>,
        mut handler: F,
    ) -> Result<KafkaRound<T, E>, KafkaRoundError>
    where
        DB: Backend,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
        F: for<'t> FnMut(
                &'t mut Transaction<'static, DB>,
                &'t KafkaRecord,
            ) -> BatchFuture<'t, T, E>
            + Send,
    {
        let polled = self.poll().await?;
        // Each partition's messages in offset order, with the epoch it was owned in when
        // they were read.
        let mut partitions: BTreeMap<(String, i32), (Option<u64>, Vec<KafkaRecord>)> =
            BTreeMap::new();
        for (message, epoch) in polled {
            let record = self.record(message);
            let slot = partitions
                .entry((
                    record.message.topic().to_owned(),
                    record.message.partition(),
                ))
                .or_insert((epoch, Vec::new()));
            slot.1.push(record);
        }
        let mut round = KafkaRound {
            settled: Vec::new(),
            committed: Vec::new(),
            lost: Vec::new(),
        };
        let mut partitions: Vec<_> = partitions.into_iter().collect();
        for (_, (_, records)) in &mut partitions {
            records.sort_by_key(|r| r.message.offset());
        }
        let mut pending = partitions.into_iter();
        while let Some(((topic, partition), (epoch, records))) = pending.next() {
            match self
                .partition(
                    pool,
                    &mut handler,
                    &topic,
                    partition,
                    epoch,
                    records,
                    &mut round,
                )
                .await
            {
                Ok(()) => {}
                Err((e, first)) => {
                    // Polled and not committed: read again from the first, here and in the
                    // round's partitions not run yet, or a later round's commit would pass
                    // over them.
                    self.rewind(&topic, partition, first).await;
                    for ((topic, partition), (_, records)) in pending {
                        if let Some(record) = records.first() {
                            self.rewind(&topic, partition, record.message.offset())
                                .await;
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(round)
    }

    /// Runs one partition's messages of a round and commits its offset; on a failure, the
    /// error and the partition's first offset, to read again from.
    #[allow(clippy::too_many_arguments)]
    async fn partition<DB, T, E, F>(
        &self,
        pool: &Pool<DB>,
        handler: &mut F,
        topic: &str,
        partition: i32,
        epoch: Option<u64>,
        records: Vec<KafkaRecord>,
        round: &mut KafkaRound<T, E>,
    ) -> Result<(), (KafkaRoundError, i64)>
    where
        DB: Backend,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
        F: for<'t> FnMut(
                &'t mut Transaction<'static, DB>,
                &'t KafkaRecord,
            ) -> BatchFuture<'t, T, E>
            + Send,
    {
        let first = records.first().map_or(0, |r| r.message.offset());
        let failed = |e: KafkaRoundError| (e, first);
        {
            // Kept order: a message that fails with attempts left holds back the partition's
            // messages after it, which are read again after it.
            let settled = self
                .inbox
                .batch_in(
                    pool,
                    &records,
                    |tx, record| match &record.unkeyed {
                        Some(why) => {
                            let why = why.clone();
                            Box::pin(async move { Err(KafkaHandlerError::NoKey(why)) })
                        }
                        None => {
                            let run = handler(tx, record);
                            Box::pin(async move { run.await.map_err(KafkaHandlerError::Handler) })
                        }
                    },
                    Order::Kept,
                )
                .await
                .map_err(|e| failed(e.into()))?;
            // The next offset to read: past every message settled for good, up to the first
            // that needs another delivery.
            let again = records
                .iter()
                .zip(&settled)
                .find(|(_, settled)| !settled_for_good(settled))
                .map(|(record, _)| record.message.offset())
                // Held back behind a failed message (not run, not answered).
                .or_else(|| records.get(settled.len()).map(|r| r.message.offset()));
            let last = records.last().map_or(0, |r| r.message.offset());
            let next = again.unwrap_or(last + 1);
            let still_owned =
                epoch.is_some() && self.tracker().owned_since(topic, partition) == epoch;
            if !still_owned {
                round.lost.push((topic.to_owned(), partition));
            } else if self
                .commit(topic, partition, next)
                .await
                .map_err(|e| failed(e.into()))?
            {
                round.committed.push(Position {
                    topic: topic.to_owned(),
                    partition,
                    offset: next,
                });
                if let Some(offset) = again {
                    self.seek(topic, partition, offset)
                        .await
                        .map_err(|e| (e.into(), offset))?;
                    self.pause(topic, partition);
                }
            } else {
                round.lost.push((topic.to_owned(), partition));
            }
            for (record, settled) in records.into_iter().zip(settled) {
                round.settled.push((
                    Position {
                        topic: topic.to_owned(),
                        partition,
                        offset: record.message.offset(),
                    },
                    settled,
                ));
            }
        }
        Ok(())
    }

    /// Reads `partition` again from `offset` after a failed round, as far as Kafka lets it
    /// (a partition lost meanwhile is its next owner's, from the committed offset).
    async fn rewind(&self, topic: &str, partition: i32, offset: i64) {
        if let Err(e) = self.seek(topic, partition, offset).await {
            tracing::warn!(
                topic,
                partition,
                offset,
                error = %e,
                "idem: a Kafka partition could not be read again after a failed round; \
                 drop this consumer, its partitions resume at their committed offsets"
            );
        }
    }

    fn tracker(&self) -> &Tracker {
        self.consumer.context()
    }

    /// The messages of a round, each with its partition's epoch at its reading.
    async fn poll(&self) -> Result<Vec<(OwnedMessage, Option<u64>)>, KafkaError> {
        let first = loop {
            let resumed = self.resume_due();
            let received = match resumed {
                // A paused partition is due later: wait for a message until then.
                Some(due) => match tokio::time::timeout_at(due, self.consumer.recv()).await {
                    Ok(received) => received,
                    Err(_) => continue,
                },
                None => self.consumer.recv().await,
            };
            match received {
                Ok(message) => break message,
                // librdkafka reports what it meets on the way (a broker down or not yet up,
                // a topic not created yet) and reconnects by itself: nothing was polled,
                // so the round keeps waiting. Only an error the client cannot get past
                // ends it.
                Err(e) => {
                    if let Some((code, reason)) = self.consumer.client().fatal_error() {
                        tracing::error!(
                            ?code,
                            reason,
                            "idem: the Kafka consumer met a fatal error"
                        );
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "idem: the Kafka consumer is waiting for its brokers");
                }
            }
        };
        let mut polled = vec![self.read(first.detach())];
        let deadline = tokio::time::Instant::now() + self.wait;
        while polled.len() < self.max {
            match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                Ok(Ok(message)) => polled.push(self.read(message.detach())),
                // What was polled is run and committed first; the error comes back on the
                // next poll if it lasts.
                Ok(Err(_)) | Err(_) => break,
            }
        }
        Ok(polled)
    }

    /// Pauses `partition` for the retry delay: its message to read again is not fetched
    /// before then (it was just sought back to).
    fn pause(&self, topic: &str, partition: i32) {
        if self.retry_delay.is_zero() {
            return;
        }
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        if let Err(e) = self.consumer.pause(&list) {
            // Not paused (revoked meanwhile): read again at once, or by its next owner.
            tracing::debug!(topic, partition, error = %e, "idem: a Kafka partition was not paused");
            return;
        }
        let due = tokio::time::Instant::now() + self.retry_delay;
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        paused.retain(|(p, _)| p.0 != topic || p.1 != partition);
        paused.push(((topic.to_owned(), partition), due));
    }

    /// Resumes the paused partitions whose delay is over; when the next one is due, if any
    /// is still paused.
    fn resume_due(&self) -> Option<tokio::time::Instant> {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if paused.is_empty() {
            return None;
        }
        let now = tokio::time::Instant::now();
        let mut list = TopicPartitionList::new();
        paused.retain(|((topic, partition), due)| {
            if *due > now {
                return true;
            }
            list.add_partition(topic, *partition);
            false
        });
        if list.count() > 0
            && let Err(e) = self.consumer.resume(&list)
        {
            // Revoked meanwhile: its next owner reads it, unpaused.
            tracing::debug!(error = %e, "idem: Kafka partitions were not resumed");
        }
        paused.iter().map(|(_, due)| *due).min()
    }

    fn read(&self, message: OwnedMessage) -> (OwnedMessage, Option<u64>) {
        let epoch = self
            .tracker()
            .owned_since(message.topic(), message.partition());
        (message, epoch)
    }

    /// The record of `message`: its key of the chosen kind, or its position with why it
    /// has none.
    fn record(&self, message: OwnedMessage) -> KafkaRecord {
        let position = || {
            MessageKey::message_id(format!(
                "{}/{}/{}",
                message.topic(),
                message.partition(),
                message.offset()
            ))
        };
        let chosen: Result<MessageKey, String> = match &self.key {
            KeyFrom::Position => position().map_err(|e| e.to_string()),
            KeyFrom::Id => id_of(&message),
            KeyFrom::Derive(derive) => derive(&message).map_err(|e| e.to_string()),
        };
        match chosen {
            Ok(key) => KafkaRecord {
                message,
                key,
                unkeyed: None,
            },
            Err(why) => {
                // A topic of up to 249 characters and two numbers: always a valid key.
                let key = position().expect("a position is a message key");
                KafkaRecord {
                    message,
                    key,
                    unkeyed: Some(why),
                }
            }
        }
    }

    /// Commits `offset` as `partition`'s next; `false` when Kafka refused it because the
    /// member no longer owns the partition (a fenced generation).
    async fn commit(&self, topic: &str, partition: i32, offset: i64) -> Result<bool, KafkaError> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        let consumer = self.consumer.clone();
        // A synchronous commit blocks its thread until the coordinator answers.
        let committed =
            tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
                .await
                .map_err(|_| KafkaError::Canceled)?;
        match committed {
            Ok(()) => Ok(true),
            Err(e) if fenced(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads `partition` again from `offset`.
    async fn seek(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError> {
        let consumer = self.consumer.clone();
        let topic = topic.to_owned();
        let sought = tokio::task::spawn_blocking(move || {
            consumer.seek(
                &topic,
                partition,
                Offset::Offset(offset),
                Duration::from_secs(10),
            )
        })
        .await
        .map_err(|_| KafkaError::Canceled)?;
        match sought {
            Ok(()) => Ok(()),
            // Revoked meanwhile: its next owner starts at the committed offset.
            Err(e) if fenced(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A message settled for good: applied, absorbed, or parked; not one to read again.
fn settled_for_good<T, E>(settled: &Settled<T, E>) -> bool {
    settled.as_ref().is_ok_and(Delivery::should_ack)
}

/// Whether Kafka refused for a member that lost its partitions.
fn fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::State
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::AssignmentLost
        )
    )
}

/// The id an idem relay published `message` under (the consuming side's own reading,
/// [`message_key`](crate::outbox::kafka::message_key)), or why it has none.
fn id_of(message: &OwnedMessage) -> Result<MessageKey, String> {
    crate::outbox::kafka::message_key(message).map_err(|e| e.to_string())
}

/// Why a round ([`KafkaConsumer::next`]) failed as a whole.
#[derive(Debug)]
#[non_exhaustive]
pub enum KafkaRoundError {
    /// The database (a batch's transaction, a cut connection): nothing of that batch was
    /// committed, to the database or to Kafka.
    Inbox(Error<Infallible>),
    /// Kafka (a poll, a commit the coordinator did not answer): what the database
    /// committed is absorbed when it is read again.
    Kafka(KafkaError),
}

impl From<Error<Infallible>> for KafkaRoundError {
    fn from(e: Error<Infallible>) -> Self {
        KafkaRoundError::Inbox(e)
    }
}

impl From<KafkaError> for KafkaRoundError {
    fn from(e: KafkaError) -> Self {
        KafkaRoundError::Kafka(e)
    }
}

impl fmt::Display for KafkaRoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaRoundError::Inbox(e) => write!(f, "the round's batch failed: {e}"),
            KafkaRoundError::Kafka(e) => write!(f, "Kafka failed the round: {e}"),
        }
    }
}

impl std::error::Error for KafkaRoundError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KafkaRoundError::Inbox(e) => Some(e),
            KafkaRoundError::Kafka(e) => Some(e),
        }
    }
}
