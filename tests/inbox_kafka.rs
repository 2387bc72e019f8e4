//! The inbox's Kafka consumer on a real broker (`IDEM_TEST_KAFKA_URL`): offsets committed
//! only after the database's commit, copies absorbed, a poison message parked while its
//! partition moves on, a message without a key parked under its position, a rebalance
//! between two members losing and doubling nothing, and a configuration with auto-commit
//! refused.

use crate::brokers::{cleanup_after, kafka_url, unique};
use crate::common;

use idem::inbox::kafka::{KafkaConsumer, KafkaConsumerError, KafkaHandlerError, KeyFrom};
use idem::inbox::{Delivery, Inbox};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 6;

fn admin(url: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", url)
        .create()
        .unwrap()
}

async fn topic(url: &str, prefix: &str) -> String {
    let name = unique(prefix);
    for result in admin(url)
        .create_topics(
            &[NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap()
    {
        result.unwrap_or_else(|(topic, e)| panic!("topic {topic} was not created: {e}"));
    }
    name
}

async fn drop_topic(url: &str, name: &str) {
    let _ = admin(url)
        .delete_topics(&[name], &AdminOptions::new())
        .await;
}

/// Produces `(key, id, payload)` records; an id of `None` sends no `idem-message-id`.
async fn produce(url: &str, topic: &str, records: &[(String, Option<String>, String)]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", url)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for (key, id, payload) in records {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if let Some(id) = id {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: "idem-message-id",
                value: Some(id.as_bytes()),
            }));
        }
        producer
            .send(record, Timeout::After(Duration::from_secs(10)))
            .await
            .unwrap();
    }
}

fn member_config(url: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", url)
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

/// Each partition's committed offset for `group`, and its end.
fn offsets(url: &str, group: &str, topic: &str) -> Vec<(i64, i64)> {
    let consumer: BaseConsumer = member_config(url, group).create().unwrap();
    let mut list = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        list.add_partition(topic, partition);
    }
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .unwrap();
    (0..PARTITIONS)
        .map(|partition| {
            let committed = match committed.find_partition(topic, partition).unwrap().offset() {
                Offset::Offset(n) => n,
                _ => 0,
            };
            let (_, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .unwrap();
            (committed, high)
        })
        .collect()
}

async fn ledger(name: &str) -> sqlx::SqlitePool {
    let pool = common::sqlite_file(&format!("{name}-{}", common::next_id()), 4).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE kafka_effects (id TEXT NOT NULL, payload TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// One round of `consumer`, recording each applied message in `kafka_effects` (after
/// `pause`); payloads that start with `poison` fail.
async fn round(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
    pause: Duration,
) -> idem::inbox::kafka::KafkaRound<(), String> {
    consumer
        .next(pool, |tx, record| {
            Box::pin(async move {
                tokio::time::sleep(pause).await;
                use rdkafka::Message as _;
                let payload =
                    String::from_utf8_lossy(record.message().payload().unwrap_or_default())
                        .into_owned();
                if payload.starts_with("poison") {
                    return Err(format!("refused {payload}"));
                }
                sqlx::query("INSERT INTO kafka_effects (id, payload) VALUES (?, ?)")
                    .bind(record.key().as_str())
                    .bind(payload)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            })
        })
        .await
        .unwrap()
}

async fn effects(pool: &sqlx::SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM kafka_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every message sent twice or three times: each applied once, the copies absorbed, and in
/// the end every partition's committed offset is its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_copies_are_absorbed_and_offsets_follow_the_database() {
    let Some(url) = kafka_url() else { return };
    let name = topic(&url, "inbox").await;
    let (url2, name2) = (url.clone(), name.clone());
    cleanup_after(
        async move {
            let (url, name) = (url2, name2);
            let mut records = Vec::new();
            for i in 0..60 {
                for _ in 0..(1 + i % 3) {
                    records.push((
                        format!("k{}", i % 10),
                        Some(format!("m-{i}")),
                        format!("{i}"),
                    ));
                }
            }
            produce(&url, &name, &records).await;
            let pool = ledger("inbox-kafka").await;
            let group = unique("group");
            let consumer = KafkaConsumer::new(
                member_config(&url, &group),
                &[&name],
                Inbox::new("kafka-copies").unwrap(),
            )
            .unwrap()
            .batch(50, Duration::from_millis(200));
            let (mut processed, mut duplicates) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(60);
            while processed + duplicates < records.len() && Instant::now() < deadline {
                let round = round(&consumer, &pool, Duration::ZERO).await;
                for (_, settled) in round.settled {
                    match settled {
                        Ok(Delivery::Processed(())) => processed += 1,
                        Ok(Delivery::Duplicate { .. }) => duplicates += 1,
                        other => panic!("{other:?}"),
                    }
                }
            }
            assert_eq!((processed, duplicates), (60, records.len() - 60));
            assert_eq!(effects(&pool).await, (60, 60));
            for (committed, end) in offsets(&url, &group, &name) {
                assert_eq!(
                    committed, end,
                    "a partition's offset was not committed to its end"
                );
            }
        },
        async move || drop_topic(&url, &name).await,
    )
    .await;
}

/// A message whose handler always fails is read again until its attempts are spent, then
/// parked; the messages after it in its partition are applied, and the partition's offset
/// goes past it. A message with no id is parked under its position, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_poison_message_and_one_without_a_key_are_parked_and_the_partition_moves_on() {
    let Some(url) = kafka_url() else { return };
    let name = topic(&url, "inbox-poison").await;
    let (url2, name2) = (url.clone(), name.clone());
    cleanup_after(
        async move {
            let (url, name) = (url2, name2);
            // One key: one partition, in this order.
            let records = vec![
                ("one".to_owned(), Some("a".to_owned()), "a".to_owned()),
                ("one".to_owned(), Some("p".to_owned()), "poison".to_owned()),
                ("one".to_owned(), None, "unkeyed".to_owned()),
                ("one".to_owned(), Some("b".to_owned()), "b".to_owned()),
            ];
            produce(&url, &name, &records).await;
            let pool = ledger("inbox-kafka-poison").await;
            let group = unique("group");
            let consumer = KafkaConsumer::new(
                member_config(&url, &group),
                &[&name],
                Inbox::new("kafka-poison").unwrap().max_attempts(3),
            )
            .unwrap()
            .batch(10, Duration::from_millis(200));
            let mut dead: HashMap<String, String> = HashMap::new();
            let mut failures = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            while dead.len() < 2 && Instant::now() < deadline {
                for (position, settled) in round(&consumer, &pool, Duration::ZERO).await.settled {
                    match settled {
                        Ok(Delivery::Dead { last_error, .. }) => {
                            dead.insert(position.to_string(), last_error.unwrap_or_default());
                        }
                        Err(idem::Error::Handler(KafkaHandlerError::Handler(_)))
                        | Err(idem::Error::Handler(KafkaHandlerError::NoKey(_))) => failures += 1,
                        _ => {}
                    }
                }
            }
            assert_eq!(dead.len(), 2, "{dead:?}");
            let errors: Vec<&String> = dead.values().collect();
            assert!(
                errors.iter().any(|e| e.contains("refused poison")),
                "{errors:?}"
            );
            assert!(
                errors.iter().any(|e| e.contains("idem-message-id")),
                "{errors:?}"
            );
            assert!(
                dead.keys().any(|p| p.starts_with(&format!("{name}/"))),
                "parked under its position: {dead:?}"
            );
            // Two attempts of each failed before the third parked it.
            assert!(failures >= 4, "{failures} failed attempts");
            assert_eq!(effects(&pool).await, (2, 2), "a and b, once each");
            let offsets = offsets(&url, &group, &name);
            assert!(
                offsets.iter().all(|(committed, end)| committed == end),
                "{offsets:?}"
            );
        },
        async move || drop_topic(&url, &name).await,
    )
    .await;
}

/// A second member joins while the first is consuming: the partitions are split between
/// them (a rebalance), each resumes where the other's commits left off, and every message
/// is applied once; messages really were read twice somewhere, or not, but never applied
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_rebalance_between_two_members_applies_each_message_once() {
    let Some(url) = kafka_url() else { return };
    let name = topic(&url, "inbox-rebalance").await;
    let (url2, name2) = (url.clone(), name.clone());
    cleanup_after(
        async move {
            let (url, name) = (url2, name2);
            const MESSAGES: usize = 300;
            let mut records = Vec::new();
            for i in 0..MESSAGES {
                for _ in 0..(1 + i % 2) {
                    records.push((
                        format!("k{}", i % 30),
                        Some(format!("m-{i}")),
                        format!("{i}"),
                    ));
                }
            }
            produce(&url, &name, &records).await;
            let pool = ledger("inbox-kafka-rebalance").await;
            let group = unique("group");
            let member = |pool: sqlx::SqlitePool, url: String, name: String, group: String| {
                tokio::spawn(async move {
                    let consumer = KafkaConsumer::new(
                        member_config(&url, &group),
                        &[&name],
                        Inbox::new("kafka-rebalance").unwrap(),
                    )
                    .unwrap()
                    .batch(20, Duration::from_millis(100));
                    let mut read = 0;
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while Instant::now() < deadline {
                        // A handler of 5 ms: the first member is still at work when the
                        // second joins.
                        let next = tokio::time::timeout(
                            Duration::from_secs(3),
                            round(&consumer, &pool, Duration::from_millis(5)),
                        );
                        match next.await {
                            Ok(round) => read += round.settled.len(),
                            // Nothing came for 3 s: done.
                            Err(_) => break,
                        }
                    }
                    read
                })
            };
            let first = member(pool.clone(), url.clone(), name.clone(), group.clone());
            // The second joins once the first has applied some.
            let deadline = Instant::now() + Duration::from_secs(30);
            while effects(&pool).await.0 < 50 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let second = member(pool.clone(), url.clone(), name.clone(), group.clone());
            let (first, second) = (first.await.unwrap(), second.await.unwrap());
            assert_eq!(effects(&pool).await, (MESSAGES as i64, MESSAGES as i64));
            assert!(
                first > 0 && second > 0,
                "both members read: {first} and {second} (the second got partitions)"
            );
            let read = first + second;
            assert!(read >= records.len(), "{read} read of {}", records.len());
            for (committed, end) in offsets(&url, &group, &name) {
                assert_eq!(committed, end);
            }
        },
        async move || drop_topic(&url, &name).await,
    )
    .await;
}

/// Auto-commit would commit offsets before the database commits what they cover: refused,
/// saying so; a consumer without a group is refused too.
#[test]
fn kafka_consumer_refuses_auto_commit_and_a_missing_group() {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", "127.0.0.1:9")
        .set("group.id", "g")
        .set("enable.auto.commit", "true");
    let refused = KafkaConsumer::new(config, &["t"], Inbox::new("g").unwrap()).unwrap_err();
    assert!(matches!(refused, KafkaConsumerError::AutoCommit));
    assert!(refused.to_string().contains("enable.auto.commit=true"));
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", "127.0.0.1:9");
    let refused = KafkaConsumer::new(config, &["t"], Inbox::new("g").unwrap()).unwrap_err();
    assert!(matches!(refused, KafkaConsumerError::NoGroup));
    let _ = KeyFrom::Position;
}
