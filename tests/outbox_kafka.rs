//! The outbox's Kafka publisher on a real broker (`IDEM_TEST_KAFKA_URL`): the ordering key
//! as the Kafka key (one key, one partition, in order), the id in the `idem-message-id`
//! header, a re-publish kept by Kafka and absorbed by the next hop's inbox, a message over
//! the producer's size limit dead after its attempts without holding back another key, a
//! broker that does not answer. Two relays keeping each key's order are the broker
//! conformance suite's (`conformance.rs`).

use crate::brokers::{unique, with_kafka_topic};
use crate::common;

use idem::inbox::{Delivery, Inbox, Received};
use idem::outbox::kafka::{ID_HEADER, Kafka, KafkaConfigError};
use idem::outbox::{self, Message, Relay};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message as _};
use std::collections::HashMap;
use std::time::Duration;

/// One record as the consumer read it.
#[derive(Debug, Clone)]
struct Read {
    partition: i32,
    key: Option<String>,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
    message_key: Result<String, String>,
}

/// Reads `topic` from the start, in a group of its own, until `n` distinct message ids came
/// and nothing more for a second (a copy the relay published again after a failed attempt
/// whose message the broker had kept comes along).
async fn read(url: &str, topic: &str, n: usize) -> Vec<Read> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", url)
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut got: Vec<Read> = Vec::with_capacity(n);
    let mut ids = std::collections::HashSet::new();
    loop {
        let wait = if ids.len() < n {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(1)
        };
        let message = match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(message) => message.unwrap(),
            Err(_) if ids.len() >= n => return got,
            Err(_) => panic!("{} of {n} messages read in 30 s", ids.len()),
        };
        let headers = message.headers().map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        });
        let read = Read {
            partition: message.partition(),
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: message.payload().unwrap_or_default().to_vec(),
            headers,
            message_key: outbox::kafka::message_key(&message)
                .map(|k| k.as_str().to_owned())
                .map_err(|e| e.to_string()),
        };
        ids.insert(read.message_key.clone());
        got.push(read);
    }
}

/// The first copy of each message, in the order read.
fn firsts(records: &[Read]) -> Vec<&Read> {
    let mut seen = std::collections::HashSet::new();
    records
        .iter()
        .filter(|r| seen.insert(r.message_key.clone()))
        .collect()
}

/// Runs `relay` until nothing is pending or due (a failed attempt, which an in-memory test
/// broker may answer now and then, is tried again after its backoff); the published count.
async fn drain<DB: idem::Backend>(relay: &Relay<DB, Kafka>, pool: &sqlx::Pool<DB>) -> usize {
    let mut published = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let round = relay.run_once().await.unwrap();
        published += round.published;
        let backlog = outbox::backlog(pool).await.unwrap();
        if backlog.pending == backlog.dead + backlog.held {
            return published;
        }
        assert!(std::time::Instant::now() < deadline, "{backlog:?}");
        if round.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Every message reaches the topic with its ordering key as the Kafka key (a key's messages
/// on one partition, in the order staged), its id in `idem-message-id` and its headers; a
/// re-publish (a relay that died after the acknowledgement) is kept by Kafka, and the next
/// hop's inbox, keyed by the id, absorbs it.
#[tokio::test]
async fn kafka_keys_each_message_by_its_ordering_key_and_the_inbox_absorbs_a_republish() {
    with_kafka_topic("outbox", |url, name| async move {
        let pool = common::sqlite_file(&format!("outbox-kafka-{}", common::next_id()), 2).await;
        idem::migrate(&pool).await.unwrap();
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for i in 0..20 {
            let message = Message::bytes(name.as_str(), format!("{i}"))
                .ordering_key(format!("order/{}", i % 4))
                .id(format!("m-{i}"))
                .header("x-test", "1");
            outbox::stage(&mut tx, message).await.unwrap();
        }
        tx.commit().await.unwrap();
        let relay = Relay::new(pool.clone(), Kafka::connect(&url).unwrap())
            .backoff(Duration::from_millis(10), Duration::from_millis(50));
        assert_eq!(drain(&relay, &pool).await, 20);
        let records = read(&url, &name, 20).await;
        let mut partition_of: HashMap<String, i32> = HashMap::new();
        let mut order: HashMap<String, Vec<usize>> = HashMap::new();
        for record in firsts(&records) {
            let i: usize = String::from_utf8(record.payload.clone())
                .unwrap()
                .parse()
                .unwrap();
            let key = format!("order/{}", i % 4);
            assert_eq!(record.key.as_deref(), Some(key.as_str()));
            assert_eq!(record.message_key.as_deref(), Ok(format!("m-{i}").as_str()));
            assert!(
                record.headers.contains(&("x-test".into(), "1".into())),
                "{:?}",
                record.headers
            );
            assert!(record.headers.iter().any(|(name, _)| name == ID_HEADER));
            let partition = *partition_of.entry(key.clone()).or_insert(record.partition);
            assert_eq!(partition, record.partition, "key {key} on two partitions");
            order.entry(key).or_default().push(i);
        }
        for (key, seen) in order {
            let mut staged = seen.clone();
            staged.sort_unstable();
            assert_eq!(seen, staged, "key {key} out of order");
        }
        // A relay that died after the acknowledgement, before its mark: the same
        // messages again. Kafka keeps both copies.
        sqlx::query("UPDATE idem_outbox SET published_at = NULL")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(drain(&relay, &pool).await, 20);
        let records = read(&url, &name, 20).await;
        assert!(records.len() >= 40, "{} records", records.len());
        let total = records.len();
        let inbox = Inbox::new("next-hop").unwrap();
        let (mut processed, mut duplicates) = (0, 0);
        for record in records {
            let key = idem::inbox::MessageKey::message_id(record.message_key.unwrap()).unwrap();
            let delivery = match inbox
                .receive::<_, ()>(&pool, &key, &record.payload)
                .await
                .unwrap()
            {
                Received::New(receipt) => receipt.finish(Ok::<(), ()>(())).await.unwrap(),
                Received::Done(done) => done,
            };
            match delivery {
                Delivery::Processed(()) => processed += 1,
                Delivery::Duplicate { .. } => duplicates += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((processed, duplicates), (20, total - 20));
    })
    .await;
}

/// A message over the producer's size limit fails every attempt, naming the size, and
/// dies; another key's messages are published meanwhile, and the dead one holds back only
/// its own key (the message behind it).
#[tokio::test]
async fn kafka_a_message_too_large_dies_and_holds_back_only_its_key() {
    with_kafka_topic("outbox-large", |url, name| async move {
        let pool = common::sqlite_file(&format!("outbox-kafka-{}", common::next_id()), 2).await;
        idem::migrate(&pool).await.unwrap();
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        // Over librdkafka's `message.max.bytes` (1,000,000 by default).
        let large = Message::bytes(name.as_str(), vec![b'x'; 2_000_000])
            .ordering_key("large")
            .id("large-0");
        outbox::stage(&mut tx, large).await.unwrap();
        let behind = Message::bytes(name.as_str(), "behind")
            .ordering_key("large")
            .id("large-1");
        outbox::stage(&mut tx, behind).await.unwrap();
        for i in 0..3 {
            let small = Message::bytes(name.as_str(), format!("small-{i}"))
                .ordering_key("small")
                .id(format!("small-{i}"));
            outbox::stage(&mut tx, small).await.unwrap();
        }
        tx.commit().await.unwrap();
        let relay = Relay::new(pool.clone(), Kafka::connect(&url).unwrap())
            .max_attempts(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(1));
        assert!(drain(&relay, &pool).await >= 3);
        let dead = outbox::dead(&pool, 10).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].id, "large-0");
        let error = dead[0].last_error.clone().unwrap_or_default();
        assert!(
            error.contains("too large") || error.contains("size"),
            "{error}"
        );
        let backlog = outbox::backlog(&pool).await.unwrap();
        assert_eq!((backlog.pending, backlog.dead), (2, 1), "{backlog:?}");
        let records = read(&url, &name, 3).await;
        let mut payloads: Vec<String> = firsts(&records)
            .iter()
            .map(|r| String::from_utf8(r.payload.clone()).unwrap())
            .collect();
        payloads.sort();
        assert_eq!(payloads, ["small-0", "small-1", "small-2"]);
    })
    .await;
}

/// No broker answers: each attempt fails after the delivery timeout, nothing is marked, and
/// the message waits for its next attempt.
#[tokio::test]
async fn kafka_a_broker_that_does_not_answer_holds_messages_back() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = common::sqlite_file(&format!("outbox-kafka-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox::stage(&mut tx, Message::bytes("nowhere", "x").id("x-0"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", format!("127.0.0.1:{port}"))
        .set("message.timeout.ms", "1000");
    let relay = Relay::new(pool.clone(), Kafka::from_config(config).unwrap())
        .backoff(Duration::from_millis(1), Duration::from_millis(1));
    let round = relay.run_once().await.unwrap();
    assert_eq!(
        (round.published, round.failed, round.dead),
        (0, 1, 0),
        "{round:?}"
    );
    let backlog = outbox::backlog(&pool).await.unwrap();
    assert_eq!((backlog.pending, backlog.dead), (1, 0));
}

/// A configuration that turns off what the relay relies on is refused, naming the
/// setting; idem's own settings are added to one that says nothing of them.
#[test]
fn kafka_refuses_a_producer_that_may_duplicate_or_lose() {
    for (setting, value) in [("enable.idempotence", "false"), ("acks", "1")] {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:9")
            .set(setting, value);
        match Kafka::from_config(config) {
            Err(e @ KafkaConfigError::Unsafe { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains(&format!("`{setting}={value}`")),
                    "{message}"
                );
            }
            other => panic!("{setting}={value}: {other:?}"),
        }
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", "127.0.0.1:9")
        .set("acks", "-1")
        .set("enable.idempotence", "true");
    assert!(Kafka::from_config(config).is_ok());
}

// Two relays keeping each key in order (a key on one partition, in order): the broker
// conformance suite, `conformance.rs`.
