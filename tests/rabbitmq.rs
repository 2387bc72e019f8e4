//! The inbox against a real RabbitMQ: a consumer process killed (SIGKILL) in the middle of
//! a batch, before its commit or after it and before its acks; the whole batch is requeued,
//! each message's effect happens exactly once, and every message ends acked. A single
//! delivery killed, and producer retries to concurrent consumers, are the broker
//! conformance suite's (`conformance.rs`), run on every broker.
//!
//! Runs when `IDEM_TEST_AMQP_URL` is set (see `common/brokers.rs`); each test declares its
//! own queue and deletes it afterwards.
//!
//! The consumer process of the crash tests is this test binary itself, running only its
//! ignored test [`consumer_process`]: no extra binary target, nothing for `cargo install`.

use crate::brokers;
use crate::child;

use brokers::{
    BrokerMessage, Db, Pause, amqp_url, cleanup_after, outcome_name, poll_until, unique,
};
use child::{ChildProcess, report};
use idem::inbox::{Delivery, Inbox, MessageKey};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use std::sync::Arc;
use std::time::Duration;

pub(crate) async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to IDEM_TEST_AMQP_URL={url}: {e}"))
}

/// A fresh queue `name` (not exclusive: consumers in other processes use it), expiring on
/// its own if a killed test run leaves it behind.
pub(crate) async fn declare(channel: &Channel, name: &str) {
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    channel
        .queue_declare(name.into(), QueueDeclareOptions::default(), arguments)
        .await
        .unwrap();
}

/// (ready, consumers) of a queue: messages waiting for delivery, neither delivered nor
/// acked, and consumers attached.
pub(crate) async fn queue_state(channel: &Channel, name: &str) -> (u32, u32) {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare(name.into(), options, FieldTable::default())
        .await
        .unwrap();
    (queue.message_count(), queue.consumer_count())
}

/// Polls [`queue_state`] until it is `expected`, for at most 10 s.
async fn queue_state_becomes(channel: &Channel, name: &str, expected: (u32, u32)) -> (u32, u32) {
    let probe = move || queue_state(channel, name);
    poll_until(Duration::from_secs(10), probe, |state| *state == expected).await
}

pub(crate) async fn delete_queue(channel: &Channel, name: &str) {
    if let Err(e) = channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await
    {
        eprintln!("could not delete queue {name}: {e}");
    }
}

/// One test's queue: see [`on_fresh_queue`].
struct TestQueue {
    /// A channel with publisher confirms.
    channel: Channel,
    name: String,
}

/// Runs `test` on a fresh queue named after `name` (see [`declare`]); then deletes the
/// queue, passed or failed, and closes the connection. Skipped without RabbitMQ.
async fn on_fresh_queue<F>(name: &str, test: impl FnOnce(TestQueue) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(url) = amqp_url() else { return };
    let connection = Arc::new(connect(&url).await);
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let name = unique(name);
    declare(&channel, &name).await;
    let body = test(TestQueue {
        channel: channel.clone(),
        name: name.clone(),
    });
    cleanup_after(body, async || delete_queue(&channel, &name).await).await;
    let _ = connection.close(200, "done".into()).await;
}

/// Publishes a persistent message with the producer's message id; the broker's confirm is
/// the future returned.
pub(crate) async fn publish(
    channel: &Channel,
    queue: &str,
    key: &str,
    payload: &[u8],
) -> PublisherConfirm {
    let properties = BasicProperties::default()
        .with_message_id(key.into())
        .with_delivery_mode(2);
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            properties,
        )
        .await
        .unwrap()
}

impl BrokerMessage for lapin::message::Delivery {
    /// The producer's message id, and the payload's order.
    fn key_and_order(&self) -> (MessageKey, i64) {
        let id = self.properties.message_id().clone().expect("a message id");
        let payload: serde_json::Value = serde_json::from_slice(&self.data).unwrap();
        let order = payload["order"].as_i64().expect("an order");
        (MessageKey::message_id(id.as_str()).unwrap(), order)
    }

    fn payload(&self) -> &[u8] {
        &self.data
    }

    /// Acks only once the outcome is committed. RabbitMQ has no delayed nack: a delivery
    /// turned away while another one works on the message waits, then goes back to the
    /// queue.
    async fn settle(&self, outcome: &Delivery<i64>) {
        if outcome.should_ack() {
            self.ack(BasicAckOptions::default()).await.unwrap();
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            self.nack(requeue).await.unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The consumer process, killed at a crash point.

/// The consumer process of the crash tests (they run this test binary with
/// `--ignored --exact consumer_process`). It consumes `IDEM_CHILD_QUEUE` through the inbox
/// into the database `IDEM_CHILD_DB`, `IDEM_CHILD_BATCH` deliveries at a time as one
/// `Inbox::batch`, and prints what it does on stdout, one `idem-child: …` line per step.
/// With `IDEM_CRASH_POINT=before_commit` it stops inside the batch's first handler, effect
/// written and not committed; with `after_commit` it stops after the commit, before the
/// acks. At the crash point it prints `idem-child: crash-point <point>` and waits for its
/// SIGKILL. Without a crash point it exits after settling `IDEM_CHILD_MESSAGES` deliveries.
#[test]
#[ignore = "the consumer process of the crash tests, which run it as a child"]
fn consumer_process() {
    let Ok(queue) = std::env::var("IDEM_CHILD_QUEUE") else {
        eprintln!("consumer_process runs only as the child of a crash test");
        return;
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(consume(queue));
}

async fn consume(queue: String) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let url = amqp_url().expect("the parent test ran on RabbitMQ");
    let db = Db::connect(&var("IDEM_CHILD_DB")).await;
    let crash = std::env::var("IDEM_CRASH_POINT").ok();
    let expected: usize = var("IDEM_CHILD_MESSAGES").parse().unwrap();
    // Deliveries are taken `IDEM_CHILD_BATCH` at a time into one batch.
    let max: usize = var("IDEM_CHILD_BATCH").parse().unwrap();
    let connection = connect(&url).await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(max as u16, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "idem-child".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let inbox = Inbox::new("rabbit-crash").unwrap();
    let mut settled = 0;
    while settled < expected {
        settled += consume_batch(&db, &inbox, &mut deliveries, max, crash.as_deref()).await;
    }
    channel.close(200, "done".into()).await.unwrap();
    connection.close(200, "done".into()).await.unwrap();
    report("done");
}

/// One batch of the consumer process: up to `max` deliveries (gathered within 2 s), through
/// `Inbox::batch`, stopped at `crash` (`before_commit`: in the first handler, its effect
/// written; `after_commit`: after the batch's commit, before any ack). The deliveries it
/// settled with an ack.
async fn consume_batch(
    db: &Db,
    inbox: &Inbox,
    deliveries: &mut lapin::Consumer,
    max: usize,
    crash: Option<&str>,
) -> usize {
    let gathered = idem::inbox::gather(deliveries, max, Duration::from_secs(2));
    let gathered: Vec<lapin::message::Delivery> = gathered
        .await
        .expect("consumer cancelled")
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let batch: Vec<(MessageKey, Vec<u8>)> = gathered
        .iter()
        .map(|delivery| {
            let key = delivery.key_and_order().0;
            report(&format!(
                "delivered key={key} redelivered={}",
                delivery.redelivered
            ));
            (key, delivery.data.clone())
        })
        .collect();
    let pause = match crash {
        Some("before_commit") => Pause::Forever("before_commit"),
        _ => Pause::None,
    };
    let answers = db.deliver_batch(inbox, &batch, pause).await.unwrap();
    if crash == Some("after_commit") {
        report("crash-point after_commit");
        std::future::pending::<()>().await;
    }
    let mut acked = 0;
    for (delivery, answer) in gathered.iter().zip(answers) {
        let outcome = answer.unwrap();
        report(&format!(
            "outcome key={} redelivered={} {}",
            delivery.key_and_order().0,
            delivery.redelivered,
            outcome_name(&outcome)
        ));
        delivery.settle(&outcome).await;
        acked += usize::from(outcome.should_ack());
    }
    acked
}

/// A consumer process on `queue`, settling `messages` messages `batch` at a time, killed
/// at `crash_point`.
fn spawn_batch_consumer(
    queue: &str,
    db: &Db,
    crash_point: Option<&str>,
    messages: usize,
    batch: usize,
) -> ChildProcess {
    let mut env = vec![
        ("IDEM_CHILD_QUEUE", queue.to_owned()),
        ("IDEM_CHILD_DB", db.spec()),
        ("IDEM_CHILD_MESSAGES", messages.to_string()),
        ("IDEM_CHILD_BATCH", batch.to_string()),
    ];
    if let Some(point) = crash_point {
        env.push(("IDEM_CRASH_POINT", point.to_owned()));
    }
    let unset = ["IDEM_CRASH_POINT"];
    ChildProcess::spawn("rabbitmq::consumer_process", &env, &unset)
}

// One message, a consumer killed after its commit and before its ack, or before its
// commit: the broker conformance suite, `conformance.rs`, on every broker.

// Retried messages to four consumers (one at a time and in batches): the broker
// conformance suite, `conformance.rs`.

// ---------------------------------------------------------------------------------------
// A consumer process killed in the middle of a batch.

const BATCH: usize = 5;

/// Five messages taken as one batch by a consumer process killed at `crash_point` (in the
/// first handler, before the batch's commit; or after the commit, before any ack), then a
/// new consumer process taking them again as one batch.
///
/// Before the commit nothing of the batch is kept: the five effects and records went with
/// the transaction, and the redeliveries apply each once. After the commit all five are
/// kept, and every redelivery is a duplicate. Either way: five effects, and every message
/// ends acked.
async fn killed_batch_consumer(db: Db, crash_point: &'static str) {
    let name = format!("idem-batch-crash-{crash_point}");
    on_fresh_queue(&name, |fresh| async move {
        let TestQueue {
            channel,
            name: queue,
            ..
        } = fresh;
        for m in 1..=BATCH {
            let (key, payload) = (format!("order-{m}-paid"), format!(r#"{{"order":{m}}}"#));
            let confirm = publish(&channel, &queue, &key, payload.as_bytes());
            assert!(confirm.await.await.unwrap().is_ack());
        }

        let mut first = spawn_batch_consumer(&queue, &db, Some(crash_point), BATCH, BATCH);
        for _ in 0..BATCH {
            assert!(first.step("delivered").await.ends_with("redelivered=false"));
        }
        first.step(&format!("crash-point {crash_point}")).await;
        // At the crash point: all five delivered (none ready), none acked…
        assert_eq!(queue_state(&channel, &queue).await, (0, 1));
        // …and the batch's effects and records committed together, or none of them.
        let committed = if crash_point == "after_commit" {
            BATCH as i64
        } else {
            0
        };
        assert_eq!(db.effects().await, committed);
        assert_eq!(db.records().await, committed);
        first.kill();
        assert_eq!(
            queue_state_becomes(&channel, &queue, (BATCH as u32, 0)).await,
            (BATCH as u32, 0),
            "the broker requeued the whole batch"
        );
        assert_eq!(db.effects().await, committed, "the kill changed nothing");

        let mut second = spawn_batch_consumer(&queue, &db, None, BATCH, BATCH);
        for _ in 0..BATCH {
            assert!(second.step("delivered").await.ends_with("redelivered=true"));
        }
        let expected = match crash_point {
            "after_commit" => "redelivered=true duplicate",
            _ => "redelivered=true processed",
        };
        for _ in 0..BATCH {
            let outcome = second.step("outcome").await;
            assert!(outcome.ends_with(expected), "{outcome}");
        }
        second.step("done").await;
        second.exits_successfully().await;

        assert_eq!(db.effects().await, BATCH as i64, "exactly one effect each");
        assert_eq!(db.records().await, BATCH as i64);
        assert_eq!(queue_state(&channel, &queue).await, (0, 0));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_batch_before_commit_the_redeliveries_apply_once_postgres() {
    let Some(db) = Db::postgres("rabbit_batch_before_commit", 2).await else {
        return;
    };
    killed_batch_consumer(db, "before_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_batch_commit_before_its_acks_the_redeliveries_are_duplicates_postgres() {
    let Some(db) = Db::postgres("rabbit_batch_after_commit", 2).await else {
        return;
    };
    killed_batch_consumer(db, "after_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_batch_before_commit_the_redeliveries_apply_once_sqlite() {
    let db = Db::sqlite("rabbit_batch_before_commit", 2).await;
    killed_batch_consumer(db, "before_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_batch_commit_before_its_acks_the_redeliveries_are_duplicates_sqlite() {
    let db = Db::sqlite("rabbit_batch_after_commit", 2).await;
    killed_batch_consumer(db, "after_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_batch_before_commit_the_redeliveries_apply_once_mysql() {
    let Some(db) = Db::mysql("rabbit_batch_before_commit", 2).await else {
        return;
    };
    killed_batch_consumer(db, "before_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_batch_commit_before_its_acks_the_redeliveries_are_duplicates_mysql() {
    let Some(db) = Db::mysql("rabbit_batch_after_commit", 2).await else {
        return;
    };
    killed_batch_consumer(db, "after_commit").await;
}
