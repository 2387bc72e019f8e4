//! Kafka's refusals and outages, produced on demand on librdkafka's own test cluster
//! (`rdkafka::mocking::MockCluster`, a protocol-level broker in this process): what one real
//! node cannot be made to do when a test wants it. No server needed: these run in a plain
//! `cargo test`.
//!
//! - an offset commit refused for a fenced member (`ILLEGAL_GENERATION`,
//!   `REBALANCE_IN_PROGRESS`, `UNKNOWN_MEMBER_ID`): the round reports the partition lost,
//!   never an error, and the partition's next owner reads the batch again and absorbs it;
//! - an offset commit that fails otherwise (the coordinator refusing the group): the round
//!   fails and its messages are read again, absorbed;
//! - the broker down when the consumer starts: it waits, and consumes once the broker is up;
//! - the broker down when the relay starts: nothing is marked, and once it is up every
//!   message is published.

use crate::brokers::{kafka_member, kafka_offsets, kafka_produce, unique};
use crate::common;

use idem::inbox::kafka::{KafkaConsumer, KafkaRound};
use idem::inbox::{Delivery, Inbox};
use idem::outbox::{self, Message, Relay};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 2;

/// A one-broker test cluster with a topic of [`PARTITIONS`] partitions.
fn cluster(topic: &str) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, PARTITIONS, 1).unwrap();
    cluster
}

/// `n` messages, each with its idem id (`m-0`…), spread over the partitions by key.
async fn produce(servers: &str, topic: &str, n: usize) {
    let records: Vec<_> = (0..n)
        .map(|i| (format!("m-{i}"), Some(format!("m-{i}")), format!("m-{i}")))
        .collect();
    kafka_produce(servers, topic, &records).await;
}

async fn ledger() -> sqlx::SqlitePool {
    let pool = common::sqlite_file(&format!("kafka-faults-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE kafka_fault_effects (id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn round(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
) -> Result<KafkaRound<(), sqlx::Error>, idem::inbox::kafka::KafkaRoundError> {
    round_into(consumer, pool, "kafka_fault_effects").await
}

/// A round whose handler adds each message's id to `table`.
async fn round_into(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
    table: &'static str,
) -> Result<KafkaRound<(), sqlx::Error>, idem::inbox::kafka::KafkaRoundError> {
    consumer
        .next(pool, |tx, record| {
            Box::pin(async move {
                sqlx::query(&format!("INSERT INTO {table} (id) VALUES (?)"))
                    .bind(record.key().as_str())
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            })
        })
        .await
}

/// (rows, distinct ids) of the effects.
async fn effects(pool: &sqlx::SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM kafka_fault_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Each partition's committed offset for `group`, and its end.
async fn offsets(servers: &str, group: &str, topic: &str) -> Vec<(i64, i64)> {
    kafka_offsets(servers, group, topic, PARTITIONS).await
}

/// Rounds of a new member of `group` until nothing comes for 2 s: how many of its
/// deliveries were absorbed as copies.
async fn drain(servers: &str, group: &str, topic: &str, pool: &sqlx::SqlitePool) -> usize {
    let consumer = KafkaConsumer::new(
        kafka_member(servers, group),
        &[topic],
        Inbox::new("faults").unwrap(),
    )
    .unwrap()
    .batch(50, Duration::from_millis(100));
    let mut absorbed = 0;
    // The first message waits for the group's join (up to the old member's session, if it
    // did not leave); then rounds until nothing comes for 2 s. Waiting for a first message
    // is the one place a round may be cancelled.
    let mut wait = Duration::from_secs(20);
    while let Ok(next) = tokio::time::timeout(wait, round(&consumer, pool)).await {
        wait = Duration::from_secs(2);
        let round = next.unwrap();
        absorbed += round
            .settled
            .iter()
            .filter(|(_, s)| matches!(s, Ok(Delivery::Duplicate { .. })))
            .count();
    }
    absorbed
}

/// 20 messages on a test cluster's topic, a ledger, and a member to read them.
struct Twenty {
    cluster: MockCluster<'static, DefaultProducerContext>,
    servers: String,
    topic: String,
    group: String,
    pool: sqlx::SqlitePool,
    consumer: KafkaConsumer,
}

impl Twenty {
    async fn new(prefix: &str) -> Twenty {
        let topic = unique(prefix);
        let cluster = cluster(&topic);
        let servers = cluster.bootstrap_servers();
        produce(&servers, &topic, 20).await;
        let group = unique(&format!("{prefix}-group"));
        let consumer = KafkaConsumer::new(
            kafka_member(&servers, &group),
            &[&topic],
            Inbox::new("faults").unwrap(),
        )
        .unwrap()
        .batch(50, Duration::from_millis(300));
        Twenty {
            cluster,
            servers,
            topic,
            group,
            pool: ledger().await,
            consumer,
        }
    }
}

/// The first round's first offset commit is refused with `error`: that partition is
/// reported lost (the round itself is `Ok`, its messages applied), and a member that comes
/// after reads it again from the last commit, absorbing what the first applied: each
/// message once, every offset committed in the end.
async fn fenced_commit(error: RDKafkaRespErr) {
    let Twenty {
        cluster,
        servers,
        topic,
        group,
        pool,
        consumer,
    } = Twenty::new("fenced").await;
    cluster.request_errors(RDKafkaApiKey::OffsetCommit, &[error]);
    let first = round(&consumer, &pool)
        .await
        .unwrap_or_else(|e| panic!("a commit refused with {error:?} failed the round: {e}"));
    let applied = first
        .settled
        .iter()
        .filter(|(_, s)| matches!(s, Ok(Delivery::Processed(()))))
        .count();
    assert!(applied > 0, "the first round applied nothing");
    assert!(
        !first.lost.is_empty(),
        "a commit refused with {error:?} was not reported lost: committed {:?}",
        first.committed
    );
    let lost = first.lost.clone();
    drop(consumer);
    let absorbed = drain(&servers, &group, &topic, &pool).await;
    assert_eq!(effects(&pool).await, (20, 20), "each message applied once");
    // The lost partitions' messages of the first round were read again and absorbed.
    let lost_read: usize = first
        .settled
        .iter()
        .filter(|(position, _)| lost.contains(&(position.topic.clone(), position.partition)))
        .count();
    assert!(
        absorbed >= lost_read && lost_read > 0,
        "{absorbed} absorbed, {lost_read} read in the lost partitions"
    );
    let offsets = offsets(&servers, &group, &topic).await;
    for (committed, end) in offsets {
        assert_eq!(committed, end, "an offset was left behind");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_commit_refused_for_an_illegal_generation_loses_the_partition_not_the_messages() {
    fenced_commit(RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_commit_refused_for_a_rebalance_in_progress_loses_the_partition_not_the_messages() {
    fenced_commit(RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_commit_refused_for_an_unknown_member_loses_the_partition_not_the_messages() {
    fenced_commit(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID).await;
}

/// A commit refused for another reason (the group not authorized) fails the round as a
/// whole; its partitions are read again from their first message by the next round, which
/// absorbs what the database committed and commits every offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_commit_that_fails_otherwise_fails_the_round_and_its_messages_are_read_again() {
    let Twenty {
        cluster,
        servers,
        topic,
        group,
        pool,
        consumer,
    } = Twenty::new("commit-fails").await;
    cluster.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
    );
    let failed = round(&consumer, &pool).await;
    assert!(failed.is_err(), "the round did not fail: {failed:?}");
    let applied = effects(&pool).await.0;
    assert!(applied > 0, "nothing was applied before the commit failed");
    let mut absorbed = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while effects(&pool).await.1 < 20 || absorbed < applied as usize {
        assert!(
            Instant::now() < deadline,
            "after 30 s: {:?} effects, {absorbed} absorbed",
            effects(&pool).await
        );
        let round = round(&consumer, &pool).await.unwrap();
        absorbed += round
            .settled
            .iter()
            .filter(|(_, s)| matches!(s, Ok(Delivery::Duplicate { .. })))
            .count();
    }
    assert_eq!(effects(&pool).await, (20, 20), "each message applied once");
    let offsets = offsets(&servers, &group, &topic).await;
    for (committed, end) in offsets {
        assert_eq!(committed, end, "an offset was left behind");
    }
}

/// The broker is down when the member starts: its round waits (nothing polled, so it may be
/// cancelled), and once the broker is up the member joins and consumes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_consumer_started_while_the_broker_is_down_waits_then_consumes() {
    let topic = unique("down-at-start");
    let cluster = cluster(&topic);
    let servers = cluster.bootstrap_servers();
    produce(&servers, &topic, 10).await;
    cluster.broker_down(1).unwrap();
    let pool = ledger().await;
    let group = unique("down-group");
    let consumer = KafkaConsumer::new(
        kafka_member(&servers, &group),
        &[&topic],
        Inbox::new("faults").unwrap(),
    )
    .unwrap()
    .batch(50, Duration::from_millis(100));
    let waited = tokio::time::timeout(Duration::from_secs(3), round(&consumer, &pool)).await;
    assert!(
        waited.is_err(),
        "a round returned with the broker down: {waited:?}"
    );
    assert_eq!(effects(&pool).await, (0, 0));
    cluster.broker_up(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while effects(&pool).await.1 < 10 {
        assert!(
            Instant::now() < deadline,
            "after 30 s: {:?}",
            effects(&pool).await
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), round(&consumer, &pool)).await;
    }
    assert_eq!(effects(&pool).await, (10, 10));
}

/// The broker is down when the relay starts: every attempt fails (after the delivery
/// timeout), nothing is marked published; once it is up, every message is published and
/// read, with its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_relay_started_while_the_broker_is_down_holds_messages_back_until_it_is_up() {
    let topic = unique("relay-down");
    let cluster = cluster(&topic);
    let servers = cluster.bootstrap_servers();
    cluster.broker_down(1).unwrap();
    let pool = ledger().await;
    for i in 0..5 {
        let mut tx = pool.begin().await.unwrap();
        outbox::stage(
            &mut tx,
            Message::bytes(topic.as_str(), format!("{i}")).id(format!("r-{i}")),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &servers)
        .set("message.timeout.ms", "1000");
    let relay = Relay::new(
        pool.clone(),
        outbox::kafka::Kafka::from_config(config).unwrap(),
    )
    .batch_size(10)
    .publish_timeout(Duration::from_secs(5))
    .backoff(Duration::from_millis(100), Duration::from_millis(500));
    let relayed = relay.run_once().await.unwrap();
    assert_eq!(
        relayed.published, 0,
        "published with the broker down: {relayed:?}"
    );
    assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 5);
    cluster.broker_up(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox::backlog(&pool).await.unwrap().pending > 0 {
        assert!(
            Instant::now() < deadline,
            "after 30 s: {:?}",
            outbox::backlog(&pool).await
        );
        let _ = relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Read back: each id at least once.
    let reader: BaseConsumer = kafka_member(&servers, &unique("relay-down-reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[&topic]).unwrap();
    let mut ids = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ids.len() < 5 {
        assert!(Instant::now() < deadline, "after 30 s read {ids:?}");
        if let Some(Ok(message)) = reader.poll(Duration::from_millis(100)) {
            ids.insert(
                outbox::kafka::message_key(&message)
                    .unwrap()
                    .as_str()
                    .to_owned(),
            );
        }
    }
    assert_eq!(ids.len(), 5);
}

/// `records` (`(id, payload)`) on a one-partition topic of a test cluster, in this order.
async fn one_partition(
    records: &[(&str, &str)],
) -> (MockCluster<'static, DefaultProducerContext>, String) {
    let topic = unique("ordered");
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(&topic, 1, 1).unwrap();
    let records: Vec<_> = records
        .iter()
        .map(|(id, payload)| {
            (
                "one".to_owned(),
                Some((*id).to_owned()),
                (*payload).to_owned(),
            )
        })
        .collect();
    kafka_produce(&cluster.bootstrap_servers(), &topic, &records).await;
    (cluster, topic)
}

/// Rounds of `consumer` until `n` messages are applied; each applied message's id in the
/// order applied. A payload `fail-twice` fails its first two attempts.
async fn applied_in_order(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
    n: i64,
) -> Vec<String> {
    assert!(applied(pool).await.is_empty());
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM applied")
            .fetch_one(pool)
            .await
            .unwrap();
        if count >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 30 s, {count} of {n} applied"
        );
        let attempts = attempts.clone();
        consumer
            .next(pool, move |tx, record| {
                let attempts = attempts.clone();
                Box::pin(async move {
                    use rdkafka::Message as _;
                    if record.message().payload() == Some(b"fail-twice".as_slice())
                        && attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2
                    {
                        return Err("not yet".to_owned());
                    }
                    sqlx::query("INSERT INTO applied (id) VALUES (?)")
                        .bind(record.key().as_str())
                        .execute(&mut **tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                })
            })
            .await
            .unwrap();
    }
    applied(pool).await
}

/// A partition's messages apply in offset order, whatever their keys' order (here the
/// reverse of it): a round's batch runs its handlers in the order of its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_partition_applies_in_offset_order_not_in_key_order() {
    let (cluster, topic) = one_partition(&[("e-3", "3"), ("e-2", "2"), ("e-1", "1")]).await;
    let pool = ledger().await;
    let consumer = KafkaConsumer::new(
        kafka_member(&cluster.bootstrap_servers(), &unique("ordered-group")),
        &[&topic],
        Inbox::new("ordered").unwrap(),
    )
    .unwrap()
    .batch(10, Duration::from_millis(300));
    let applied = applied_in_order(&consumer, &pool, 3).await;
    assert_eq!(applied, ["e-3", "e-2", "e-1"]);
}

/// A message that fails (twice, then succeeds) holds back the messages after it in its
/// partition: they apply after it, never before, and each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_failed_message_holds_back_the_messages_after_it() {
    let (cluster, topic) =
        one_partition(&[("a", "a"), ("b", "fail-twice"), ("c", "c"), ("d", "d")]).await;
    let pool = ledger().await;
    let consumer = KafkaConsumer::new(
        kafka_member(&cluster.bootstrap_servers(), &unique("held-group")),
        &[&topic],
        Inbox::new("held").unwrap().max_attempts(5),
    )
    .unwrap()
    .batch(10, Duration::from_millis(300));
    let applied = applied_in_order(&consumer, &pool, 4).await;
    assert_eq!(applied, ["a", "b", "c", "d"], "applied out of order");
    let (status, attempts): (String, i64) =
        sqlx::query_as("SELECT status, attempts FROM idem_inbox WHERE message_key = 'b'")
            .fetch_one(&pool)
            .await
            .unwrap();
    // Its first round ran it twice (the batch's attempt without savepoints, rolled back
    // whole, then up to it with one): one failed attempt recorded; the second round's
    // succeeded.
    assert_eq!((status.as_str(), attempts), ("SUCCESS", 2));
}

/// A round whose handler adds each message's id to `applied`.
async fn applying_round(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
) -> KafkaRound<(), sqlx::Error> {
    round_into(consumer, pool, "applied").await.unwrap()
}

/// The ids applied so far, in the order applied (the table `applied`, made by the first
/// call).
async fn applied(pool: &sqlx::SqlitePool) -> Vec<String> {
    sqlx::query("CREATE TABLE IF NOT EXISTS applied (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT id FROM applied ORDER BY seq")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A message that came early (its handler says `not_yet`: it waits for what another
/// message brings) holds back its partition's messages after it for more rounds than the
/// inbox allows attempts, is never parked, and applies once unblocked, then the rest, in
/// order. Between two tries its partition waits the consumer's retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_message_that_came_early_holds_back_its_partition_and_spends_no_attempt() {
    use rdkafka::Message as _;
    use std::sync::{Arc, Mutex};
    let (cluster, topic) = one_partition(&[("a", "a"), ("b", "early"), ("c", "c")]).await;
    let pool = ledger().await;
    assert!(applied(&pool).await.is_empty());
    let delay = Duration::from_millis(200);
    let group = unique("early-group");
    let consumer = KafkaConsumer::new(
        kafka_member(&cluster.bootstrap_servers(), &group),
        &[&topic],
        Inbox::new("early").unwrap().max_attempts(2),
    )
    .unwrap()
    .batch(10, Duration::from_millis(300))
    .retry_delay(delay);
    // The rounds that found "b" early, and when each first ran its handler.
    let mut held = 0;
    let tries: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while applied(&pool).await.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "after 30 s: {:?}",
            applied(&pool).await
        );
        // Early for five rounds: more than the two attempts the inbox allows.
        let unblocked = held >= 5;
        let tries = tries.clone();
        let round_number = held;
        let round = consumer
            .next(&pool, move |tx, record| {
                let tries = tries.clone();
                Box::pin(async move {
                    if record.message().payload() == Some(b"early".as_slice()) {
                        let mut tries = tries.lock().unwrap();
                        if !tries.iter().any(|(round, _)| *round == round_number) {
                            tries.push((round_number, Instant::now()));
                        }
                        drop(tries);
                        if !unblocked {
                            return Err(idem::inbox::not_yet("waiting for its payment".to_owned()));
                        }
                    }
                    sqlx::query("INSERT INTO applied (id) VALUES (?)")
                        .bind(record.key().as_str())
                        .execute(&mut **tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                })
            })
            .await
            .unwrap();
        let b_early = round
            .settled
            .iter()
            .any(|(_, settled)| matches!(settled, Err(idem::Error::Handler(e)) if e.to_string().contains("payment")));
        if b_early {
            held += 1;
            assert_eq!(
                applied(&pool).await,
                ["a"],
                "a message ran before the one it waits behind"
            );
            let (status, attempts, error): (String, i64, Option<String>) = sqlx::query_as(
                "SELECT status, attempts, error FROM idem_inbox WHERE message_key = 'b'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(
                (status.as_str(), attempts),
                ("FAILED", 0),
                "an early message spends no attempt"
            );
            assert_eq!(
                error.as_deref(),
                Some("waiting for its payment"),
                "its reason kept"
            );
            let c: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox WHERE message_key = 'c'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(c, 0, "the message after it is not recorded while it waits");
        }
    }
    assert_eq!(applied(&pool).await, ["a", "b", "c"]);
    assert_eq!(held, 5);
    let (status, attempts): (String, i64) =
        sqlx::query_as("SELECT status, attempts FROM idem_inbox WHERE message_key = 'b'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), attempts),
        ("SUCCESS", 1),
        "never parked, one attempt"
    );
    let tries = tries.lock().unwrap().clone();
    assert_eq!(tries.len(), 6);
    for pair in tries.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(
            gap >= delay,
            "read again after {gap:?}, before the retry delay"
        );
    }
    assert_eq!(
        kafka_offsets(&cluster.bootstrap_servers(), &group, &topic, 1).await,
        [(3, 3)],
        "committed to the end"
    );
}

/// A message another delivery holds (a rebalance's overlap: the partition's old owner still
/// working on it; here a leased claim) holds back its partition's messages after it: they
/// are neither run nor recorded while it is held, and apply once it is settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_message_another_delivery_holds_holds_back_the_messages_after_it() {
    let (cluster, topic) = one_partition(&[("a", "a"), ("b", "b"), ("c", "c")]).await;
    let pool = ledger().await;
    assert!(applied(&pool).await.is_empty());
    let inbox = Inbox::new("held-elsewhere")
        .unwrap()
        .lease(Duration::from_secs(60));
    let key = idem::inbox::MessageKey::message_id("b").unwrap();
    let idem::inbox::Claimed::Work(lease) = inbox.claim::<_, ()>(&pool, &key, b"b").await.unwrap()
    else {
        panic!("the claim did not take the key");
    };
    let group = unique("held-elsewhere-group");
    let consumer = KafkaConsumer::new(
        kafka_member(&cluster.bootstrap_servers(), &group),
        &[&topic],
        inbox.clone(),
    )
    .unwrap()
    .batch(10, Duration::from_millis(300))
    .retry_delay(Duration::from_millis(100));
    // Rounds while "b" is held: "a" applies, "b" is in progress, "c" waits behind it.
    let mut in_progress = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_progress < 3 {
        assert!(
            Instant::now() < deadline,
            "after 30 s, b was in progress {in_progress} times"
        );
        let round = applying_round(&consumer, &pool).await;
        for (position, settled) in &round.settled {
            if matches!(settled, Ok(Delivery::InProgress { .. })) {
                assert_eq!(position.offset, 1, "{round:?}");
                in_progress += 1;
            }
            assert_ne!(
                position.offset, 2,
                "the message after the held one was run: {round:?}"
            );
        }
        assert_eq!(applied(&pool).await, ["a"]);
        let c: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox WHERE message_key = 'c'")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(c, 0, "the message after the held one was recorded");
    }
    // The other delivery finishes: "b" is a duplicate now, and "c" applies.
    let done = lease.complete(&pool, Ok::<_, String>(())).await.unwrap();
    assert!(done.is_processed());
    let deadline = Instant::now() + Duration::from_secs(30);
    while applied(&pool).await.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "after 30 s: {:?}",
            applied(&pool).await
        );
        applying_round(&consumer, &pool).await;
    }
    assert_eq!(applied(&pool).await, ["a", "c"]);
    assert_eq!(
        kafka_offsets(&cluster.bootstrap_servers(), &group, &topic, 1).await,
        [(3, 3)],
        "committed to the end"
    );
}
