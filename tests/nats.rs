//! The inbox against a real NATS JetStream server: redeliveries caused by an ack wait
//! shorter than the work produce their effect exactly once, and every message ends acked.
//! Producer retries to concurrent consumers are the broker conformance suite's
//! (`conformance.rs`).
//!
//! Runs when `IDEM_TEST_NATS_URL` is set (see `common/brokers.rs`); each test makes its own
//! stream and deletes it afterwards.

use crate::brokers;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::{self, Context, stream};
use brokers::{BrokerMessage, Db, Pause, cleanup_after, nats_url, outcome_name, unique};
use futures_util::StreamExt;
use idem::inbox::{Delivery, Inbox, MessageKey};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The header carrying the message key. The producer sets it once per message and every
/// retry reuses it. Deliberately not `Nats-Msg-Id`: JetStream would deduplicate on it
/// inside its window, and the duplicates must reach the consumers here.
const KEY_HEADER: &str = "Idem-Key";

pub(crate) async fn jetstream(url: &str) -> Context {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to IDEM_TEST_NATS_URL={url}: {e}"));
    jetstream::new(client)
}

/// A fresh in-memory stream on subjects `{name}.>`, and one durable pull consumer.
pub(crate) async fn stream_and_consumer(
    js: &Context,
    name: &str,
    ack_wait: Duration,
) -> PullConsumer {
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

pub(crate) async fn delete_stream(js: &Context, name: &str) {
    if let Err(e) = js.delete_stream(name).await {
        eprintln!("could not delete stream {name}: {e}");
    }
}

/// One test's stream: see [`on_fresh_stream`].
struct TestStream {
    js: Context,
    /// The subject the test publishes on.
    subject: String,
    consumer: PullConsumer,
}

/// Runs `test` on a fresh stream named after `name`, with its consumer (see
/// [`stream_and_consumer`]); then deletes the stream, passed or failed. Skipped without
/// NATS.
async fn on_fresh_stream<F>(name: &str, ack_wait: Duration, test: impl FnOnce(TestStream) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(url) = nats_url() else { return };
    let js = jetstream(&url).await;
    let name = unique(name);
    let consumer = stream_and_consumer(&js, &name, ack_wait).await;
    let subject = format!("{name}.payments");
    let body = test(TestStream {
        js,
        subject,
        consumer,
    });
    let js = jetstream(&url).await;
    cleanup_after(body, async || delete_stream(&js, &name).await).await;
}

/// Publishes `payload` under `key`; JetStream's ack is the future returned.
pub(crate) async fn publish(
    js: &Context,
    subject: String,
    key: &str,
    payload: String,
) -> PublishAckFuture {
    let mut headers = HeaderMap::new();
    headers.insert(KEY_HEADER, key);
    js.publish_with_headers(subject, headers, payload.into())
        .await
        .unwrap()
}

fn key_of(message: &jetstream::Message) -> MessageKey {
    let headers = message.headers.as_ref().expect("headers");
    MessageKey::new(headers.get(KEY_HEADER).expect("a key header").as_str()).unwrap()
}

impl BrokerMessage for jetstream::Message {
    /// The key header, `order:{order}:paid`.
    fn key_and_order(&self) -> (MessageKey, i64) {
        let key = key_of(self);
        let order = key.as_str().split(':').nth(1).unwrap().parse().unwrap();
        (key, order)
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Acks a delivery only once its outcome is committed; a delivery turned away while
    /// another one works on the message is nacked with a delay.
    async fn settle(&self, delivery: &Delivery<i64>) {
        if delivery.should_ack() {
            self.ack().await.unwrap();
        } else {
            let nak = AckKind::Nak(Some(Duration::from_millis(200)));
            self.ack_with(nak).await.unwrap();
        }
    }
}

/// Consumer info, polled until `done` holds (acks are asynchronous publishes) or 5 s.
pub(crate) async fn consumer_info_when(
    consumer: &PullConsumer,
    done: impl Fn(&async_nats::jetstream::consumer::Info) -> bool,
) -> async_nats::jetstream::consumer::Info {
    let probe = move || async move { consumer.get_info().await.unwrap() };
    brokers::poll_until(Duration::from_secs(5), probe, done).await
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
    stream: TestStream,
    db: Db,
    inbox: Inbox,
) -> (Vec<(Duration, i64)>, Vec<Delivery<i64>>) {
    let TestStream {
        js,
        subject,
        consumer,
        ..
    } = stream;
    let published = publish(&js, subject, "order:7:paid", r#"{"order":7}"#.into());
    published.await.await.unwrap();
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
                    message.settle(&delivery).await;
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
    let info = consumer_info_when(&consumer, |i| i.num_ack_pending == 0).await;
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
    on_fresh_stream(name, ACK_WAIT, |stream| async move {
        let inbox = Inbox::new("nats-slow").unwrap();
        let (deliveries, outcomes) = consume_slowly(stream, db, inbox.clone()).await;
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
    })
    .await;
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
    on_fresh_stream(name, ACK_WAIT, |stream| async move {
        let inbox = Inbox::new("nats-slow")
            .unwrap()
            .lock_timeout(Duration::from_millis(300));
        let (deliveries, outcomes) = consume_slowly(stream, db, inbox.clone()).await;
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
    })
    .await;
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

// Retried messages to four consumers (one at a time and in batches): the broker
// conformance suite, `conformance.rs`.
