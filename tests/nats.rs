//! The inbox against a real NATS JetStream server: redeliveries caused by an ack wait
//! shorter than the work, and producer retries to concurrent consumers, each produce their
//! effect exactly once, and every message ends acked.
//!
//! Runs when `IDEM_TEST_NATS_URL` is set (see `common/brokers.rs`); each test makes its own
//! stream and deletes it afterwards.

use crate::brokers;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::{self, Context, stream};
use brokers::{Db, Pause, cleanup_after, nats_url, outcome_name, unique};
use futures_util::StreamExt;
use idem::inbox::{Delivery, Inbox, MessageKey};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The header carrying the message key. The producer sets it once per message and every
/// retry reuses it. Deliberately not `Nats-Msg-Id`: JetStream would deduplicate on it
/// inside its window, and the duplicates must reach the consumers here.
const KEY_HEADER: &str = "Idem-Key";

async fn jetstream(url: &str) -> Context {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to IDEM_TEST_NATS_URL={url}: {e}"));
    jetstream::new(client)
}

/// A fresh in-memory stream on subjects `{name}.>`, and one durable pull consumer.
async fn stream_and_consumer(js: &Context, name: &str, ack_wait: Duration) -> PullConsumer {
    let stream = js
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::Memory,
            // A leftover from a killed test run expires on its own.
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    stream
        .create_consumer(pull::Config {
            durable_name: Some("consumers".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .unwrap()
}

async fn delete_stream(js: &Context, name: &str) {
    if let Err(e) = js.delete_stream(name).await {
        eprintln!("could not delete stream {name}: {e}");
    }
}

async fn publish(js: &Context, subject: String, key: &str, payload: String) {
    let mut headers = HeaderMap::new();
    headers.insert(KEY_HEADER, key);
    js.publish_with_headers(subject, headers, payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

fn key_of(message: &jetstream::Message) -> MessageKey {
    let headers = message.headers.as_ref().expect("headers");
    MessageKey::new(headers.get(KEY_HEADER).expect("a key header").as_str()).unwrap()
}

/// Acks a delivery only once its outcome is committed; a delivery turned away while
/// another one works on the message is nacked with a delay.
async fn settle(message: &jetstream::Message, delivery: &Delivery<i64>) {
    if delivery.should_ack() {
        message.ack().await.unwrap();
    } else {
        let nak = AckKind::Nak(Some(Duration::from_millis(200)));
        message.ack_with(nak).await.unwrap();
    }
}

/// Consumer info, polled until `done` holds (acks are asynchronous publishes) or 5 s.
async fn consumer_info_when(
    consumer: &mut PullConsumer,
    done: impl Fn(&async_nats::jetstream::consumer::Info) -> bool,
) -> async_nats::jetstream::consumer::Info {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = consumer.info().await.unwrap().clone();
        if done(&info) || Instant::now() > deadline {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Ack wait 1 s, handler 2.5 s.

const ACK_WAIT: Duration = Duration::from_secs(1);
const WORK: Duration = Duration::from_millis(2500);

/// Publishes one message, and consumes it with a 2.5 s handler (its transaction open all
/// that time), each delivery on a task of its own as it would be on several instances.
/// Consumes until every handler is done and no delivery came for 3 ack waits, so a
/// redelivery loop would show up. Returns the deliveries (when, JetStream's delivery count)
/// and their outcomes, and checks what always holds: the broker did redeliver during the
/// work, the effect happened once, and the message ends acked.
async fn consume_slowly(
    js: &Context,
    subject: String,
    mut consumer: PullConsumer,
    db: Db,
    inbox: Inbox,
) -> (Vec<(Duration, i64)>, Vec<Delivery<i64>>) {
    publish(js, subject, "order:7:paid", r#"{"order":7}"#.into()).await;
    let mut messages = consumer.messages().await.unwrap();
    let mut handlers = JoinSet::new();
    let (mut deliveries, mut outcomes) = (Vec::new(), Vec::new());
    let started = Instant::now();
    let mut quiet_until = Instant::now() + 3 * ACK_WAIT;
    loop {
        assert!(started.elapsed() < Duration::from_secs(30), "no end");
        tokio::select! {
            message = messages.next() => {
                let message = message.expect("the stream ends").unwrap();
                let info = message.info().unwrap();
                deliveries.push((started.elapsed(), info.delivered));
                let (db, inbox) = (db.clone(), inbox.clone());
                handlers.spawn(async move {
                    let key = key_of(&message);
                    let delivery = db
                        .deliver(&inbox, &key, &message.payload, 7, Pause::Sleep(WORK))
                        .await
                        .unwrap();
                    settle(&message, &delivery).await;
                    delivery
                });
            }
            Some(done) = handlers.join_next(), if !handlers.is_empty() => {
                outcomes.push(done.unwrap());
                quiet_until = Instant::now() + 3 * ACK_WAIT;
            }
            _ = tokio::time::sleep_until(quiet_until.into()), if handlers.is_empty() => break,
        }
    }
    let names: Vec<_> = outcomes.iter().map(outcome_name).collect();
    eprintln!("deliveries (elapsed, delivery count): {deliveries:?}\noutcomes: {names:?}");
    // The broker did redeliver while the first delivery worked: otherwise the test would
    // prove nothing.
    assert!(deliveries.len() >= 2, "no redelivery: {deliveries:?}");
    assert!(deliveries[1].0 < WORK, "redelivered during the work");
    // Exactly one delivery applied, and one effect. Without the inbox every delivery
    // would have run the handler: one effect per delivery.
    assert_eq!(outcomes.iter().filter(|d| d.is_processed()).count(), 1);
    assert_eq!(db.effects().await, 1, "exactly one effect");
    assert_eq!(inbox.counters().applied, 1);
    // Finally acked: nothing pending, nothing being redelivered, the ack floor at the
    // message.
    let info = consumer_info_when(&mut consumer, |i| i.num_ack_pending == 0).await;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(info.num_pending, 0, "{info:?}");
    assert_eq!(info.num_redelivered, 0, "{info:?}");
    assert_eq!(info.ack_floor.stream_sequence, 1, "{info:?}");
    (deliveries, outcomes)
}

/// JetStream redelivers the message every second while the first delivery still works on
/// it. Each redelivery's insert of the inbox record waits for the first transaction, then
/// finds the record committed and is absorbed as a duplicate with the first result.
async fn slow_handler_outlives_the_ack_wait(db: Db, name: &str) {
    let Some(url) = nats_url() else { return };
    let js = jetstream(&url).await;
    let stream_name = unique(name);
    let consumer = stream_and_consumer(&js, &stream_name, ACK_WAIT).await;
    let subject = format!("{stream_name}.payments");
    let body = async move {
        let inbox = Inbox::new("nats-slow").unwrap();
        let (deliveries, outcomes) =
            consume_slowly(&js, subject, consumer, db, inbox.clone()).await;
        // Bounded: about one redelivery per ack wait during the work (2.5 s / 1 s: the
        // deliveries at 0 s, 1 s and 2 s), one more allowed for a loaded machine.
        assert!(deliveries.len() <= 4, "redelivery loop: {deliveries:?}");
        // Every other delivery absorbed with the first result.
        let first_result = Delivery::Duplicate {
            first_result: Some(7),
        };
        let duplicates = outcomes.iter().filter(|d| **d == first_result).count();
        assert_eq!(duplicates, outcomes.len() - 1, "{outcomes:?}");
        assert_eq!(inbox.counters().duplicates, duplicates as u64);
    };
    let js = jetstream(&url).await;
    cleanup_after(body, async || delete_stream(&js, &stream_name).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_outlives_the_ack_wait_postgres() {
    let Some(db) = Db::postgres("nats_slow", 4).await else {
        return;
    };
    slow_handler_outlives_the_ack_wait(db, "idem-slow-pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_outlives_the_ack_wait_sqlite() {
    let db = Db::sqlite("nats_slow", 4).await;
    slow_handler_outlives_the_ack_wait(db, "idem-slow-sqlite").await;
}

/// The same with a 300 ms lock timeout: a redelivery no longer waits for the first
/// transaction; it gets `InProgress` and is nacked with a 200 ms delay, and JetStream
/// redelivers it after that delay, until the first delivery's ack ends it. More
/// deliveries, but still bounded, still one effect, still acked.
async fn slow_handler_with_a_lock_timeout(db: Db, name: &str) {
    let Some(url) = nats_url() else { return };
    let js = jetstream(&url).await;
    let stream_name = unique(name);
    let consumer = stream_and_consumer(&js, &stream_name, ACK_WAIT).await;
    let subject = format!("{stream_name}.payments");
    let body = async move {
        let inbox = Inbox::new("nats-slow")
            .unwrap()
            .lock_timeout(Duration::from_millis(300));
        let (deliveries, outcomes) =
            consume_slowly(&js, subject, consumer, db, inbox.clone()).await;
        let in_progress = outcomes.iter().filter(|d| !d.should_ack()).count();
        assert!(in_progress >= 1, "{outcomes:?}");
        assert_eq!(inbox.counters().in_progress, in_progress as u64);
        // Bounded: one delivery per 500 ms (300 ms waiting + 200 ms nack delay) at most
        // during the 2.5 s of work, plus slack.
        assert!(deliveries.len() <= 8, "redelivery loop: {deliveries:?}");
        let settled = outcomes
            .iter()
            .filter(|d| d.is_processed() || matches!(d, Delivery::Duplicate { .. }));
        assert_eq!(
            settled.count() + in_progress,
            outcomes.len(),
            "{outcomes:?}"
        );
    };
    let js = jetstream(&url).await;
    cleanup_after(body, async || delete_stream(&js, &stream_name).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_with_a_lock_timeout_nacks_the_redeliveries_postgres() {
    let Some(db) = Db::postgres("nats_slow_nack", 4).await else {
        return;
    };
    slow_handler_with_a_lock_timeout(db, "idem-slow-nack-pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handler_with_a_lock_timeout_nacks_the_redeliveries_sqlite() {
    let db = Db::sqlite("nats_slow_nack", 4).await;
    slow_handler_with_a_lock_timeout(db, "idem-slow-nack-sqlite").await;
}

// ---------------------------------------------------------------------------------------
// 1,000 messages, each published one to three times, to four consumers.

const MESSAGES: i64 = 1000;
const CONSUMERS: usize = 4;

/// A producer that retried: each of 1,000 messages published one to three times under the
/// same key (and the same content), shuffled. JetStream keeps every copy (no
/// `Nats-Msg-Id`), so the consumers really get about 2,000 deliveries; without the inbox
/// that is about 2,000 effects. Four pull clients of one durable consumer take them
/// concurrently, copies of the same message included.
async fn retried_messages_to_four_consumers(db: Db, name: &str) {
    let Some(url) = nats_url() else { return };
    let js = jetstream(&url).await;
    let stream_name = unique(name);
    let consumer = stream_and_consumer(&js, &stream_name, Duration::from_secs(10)).await;
    let subject = format!("{stream_name}.payments");
    let stream_name_ = stream_name.clone();
    let body = async move {
        let copies = brokers::retried_copies(MESSAGES, 11);
        let published = copies.len();
        let mut acks = Vec::with_capacity(published);
        for m in copies {
            let mut headers = HeaderMap::new();
            headers.insert(KEY_HEADER, format!("order:{m}:paid"));
            let payload = format!(r#"{{"order":{m}}}"#);
            let ack = js
                .publish_with_headers(subject.clone(), headers, payload.into())
                .await
                .unwrap();
            acks.push(ack);
        }
        for ack in acks {
            ack.await.unwrap();
        }
        let mut stream = js.get_stream(&stream_name_).await.unwrap();
        let kept = stream.info().await.unwrap().state.messages;
        assert_eq!(kept, published as u64, "JetStream kept every copy");

        let inbox = Inbox::new("nats-workers").unwrap();
        let handled = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut consumers = JoinSet::new();
        for _ in 0..CONSUMERS {
            let (db, inbox, handled) = (db.clone(), inbox.clone(), handled.clone());
            let consumer = consumer.clone();
            consumers.spawn(async move {
                let mut messages = consumer
                    .stream()
                    .max_messages_per_batch(25)
                    .messages()
                    .await
                    .unwrap();
                let (mut mine, mut processed) = (0, 0);
                while handled.load(Ordering::SeqCst) < published {
                    assert!(started.elapsed() < Duration::from_secs(40), "no end");
                    let next = tokio::time::timeout(Duration::from_millis(200), messages.next());
                    let Ok(Some(message)) = next.await else {
                        continue;
                    };
                    let message = message.unwrap();
                    let key = key_of(&message);
                    let order: i64 = key.as_str().split(':').nth(1).unwrap().parse().unwrap();
                    let delivery = db
                        .deliver(&inbox, &key, &message.payload, order, Pause::None)
                        .await
                        .unwrap();
                    settle(&message, &delivery).await;
                    if delivery.should_ack() {
                        handled.fetch_add(1, Ordering::SeqCst);
                    }
                    mine += 1;
                    processed += usize::from(delivery.is_processed());
                }
                (mine, processed)
            });
        }
        let (mut per_consumer, mut processed) = (Vec::new(), 0);
        while let Some(done) = consumers.join_next().await {
            let (mine, applied) = done.unwrap();
            per_consumer.push(mine);
            processed += applied;
        }
        eprintln!(
            "{published} deliveries of {MESSAGES} messages in {:?}, per consumer {per_consumer:?}",
            started.elapsed()
        );
        assert!(per_consumer.iter().all(|&n| n > 0), "{per_consumer:?}");
        assert_eq!(processed, MESSAGES as usize);
        assert_eq!(db.effects().await, MESSAGES, "exactly 1,000 effects");
        assert_eq!(db.distinct_effects().await, MESSAGES);
        let c = inbox.counters();
        assert_eq!(c.applied, MESSAGES as u64);
        assert_eq!(c.duplicates, (published as i64 - MESSAGES) as u64);
        // Every message acked, none left to deliver.
        let mut consumer = consumer;
        let info = consumer_info_when(&mut consumer, |i| {
            i.num_ack_pending == 0 && i.num_pending == 0
        })
        .await;
        assert_eq!(info.num_ack_pending, 0, "{info:?}");
        assert_eq!(info.num_pending, 0, "{info:?}");
        assert_eq!(info.ack_floor.stream_sequence, published as u64, "{info:?}");
    };
    let js = jetstream(&url).await;
    cleanup_after(body, async || delete_stream(&js, &stream_name).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_messages_to_four_consumers_postgres() {
    let Some(db) = Db::postgres("nats_workers", 8).await else {
        return;
    };
    retried_messages_to_four_consumers(db, "idem-workers-pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_messages_to_four_consumers_sqlite() {
    let db = Db::sqlite("nats_workers", 4).await;
    retried_messages_to_four_consumers(db, "idem-workers-sqlite").await;
}
