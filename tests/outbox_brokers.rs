//! The outbox's publishers on real brokers: NATS JetStream (the id in `Nats-Msg-Id`, a
//! re-publish acknowledged as a duplicate and dropped by the stream, a broker that is down
//! and comes back) and RabbitMQ (publisher confirms, the id in `message_id`, an unroutable
//! message a failure), and the consuming side's keys. Two relays keeping each key's order
//! are the broker conformance suite's (`conformance.rs`).

use crate::brokers::{amqp_url, cleanup_after, nats_url, poll_until, unique};
use crate::common;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use idem::inbox::{Delivery, Inbox, Received};
use idem::outbox::{self, Message, Relay, nats::JetStream, rabbitmq::Rabbit};
use std::collections::HashSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Stages `n` messages on `subject`, ids `{prefix}-{i}`, one ordering key each.
async fn stage_many(
    pool: &sqlx::SqlitePool,
    destination: outbox::Destination,
    prefix: &str,
    n: usize,
) {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let message = Message::json(destination.clone(), &i)
            .id(id.clone())
            .header("x-test", "1");
        outbox::stage(&mut tx, message).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn stream_on(js: &jetstream::Context, name: &str) -> jetstream::stream::Stream {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(600),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The relay publishes every message once into the stream; marked unpublished again (a
/// relay that died after the PubAck), the re-publish is acknowledged as a duplicate and the
/// stream still holds each once; the consumer's inbox keys each by its id.
#[tokio::test]
async fn jetstream_holds_each_message_once_and_the_consumer_keys_it_by_its_id() {
    let Some(url) = nats_url() else { return };
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let name = unique("outbox");
    let stream = stream_on(&js, &name).await;
    let js2 = js.clone();
    let name2 = name.clone();
    cleanup_after(
        async move {
            let pool = common::sqlite_file(&format!("outbox-js-{}", common::next_id()), 2).await;
            idem::migrate(&pool).await.unwrap();
            let subject = outbox::Destination::subject(format!("{name2}.coupon"));
            stage_many(&pool, subject, "m", 20).await;
            let relay = Relay::new(pool.clone(), JetStream::new(js2.clone()));
            let first = relay.run_once().await.unwrap();
            assert_eq!((first.claimed, first.published, first.failed), (20, 20, 0));
            sqlx::query("UPDATE idem_outbox SET published_at = NULL")
                .execute(&pool)
                .await
                .unwrap();
            let again = relay.run_once().await.unwrap();
            assert_eq!(again.published, 20, "a duplicate PubAck is a success");
            let mut stream = stream;
            assert_eq!(stream.info().await.unwrap().state.messages, 20);
            // The next hop: an inbox keyed by the relay's ids.
            let consumer = stream
                .create_consumer(pull::Config {
                    durable_name: Some("next-hop".into()),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                })
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            let inbox = Inbox::new("next-hop").unwrap();
            let mut ids = HashSet::new();
            for _ in 0..20 {
                let message = messages.next().await.unwrap().unwrap();
                let key = outbox::nats::message_key(&message).unwrap();
                let headers = message.headers.as_ref().unwrap();
                assert_eq!(headers.get("x-test").map(|v| v.as_str()), Some("1"));
                let delivery = match inbox
                    .receive::<_, ()>(&pool, &key, &message.payload)
                    .await
                    .unwrap()
                {
                    Received::New(receipt) => receipt.finish(Ok::<(), ()>(())).await.unwrap(),
                    Received::Done(done) => done,
                };
                assert_eq!(delivery, Delivery::Processed(()));
                ids.insert(key.as_str().to_owned());
                message.ack().await.unwrap();
            }
            assert_eq!(ids, (0..20).map(|i| format!("m-{i}")).collect());
        },
        async || {
            let _ = js.delete_stream(&name).await;
        },
    )
    .await;
}

/// Rows whose headers are JSON but not NATS headers (written by hand, outside `stage`): a
/// name with `:`, a value with a line break. Each is a failed attempt naming what is wrong,
/// never a panic; the relay's next message is published.
#[tokio::test]
async fn jetstream_headers_nats_cannot_carry_fail_their_message() {
    let Some(url) = nats_url() else { return };
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let name = unique("outbox-headers");
    let _stream = stream_on(&js, &name).await;
    let js2 = js.clone();
    let name2 = name.clone();
    cleanup_after(
        async move {
            let pool = common::sqlite_file(&format!("outbox-hdr-{}", common::next_id()), 2).await;
            idem::migrate(&pool).await.unwrap();
            let subject = || outbox::Destination::subject(format!("{name2}.h"));
            stage_many(&pool, subject(), "bad", 2).await;
            for (id, headers) in [
                ("bad-0", r#"[["bad name:", "v"]]"#),
                ("bad-1", r#"[["x-fine", "line\r\nbreak"]]"#),
            ] {
                sqlx::query("UPDATE idem_outbox SET headers = ? WHERE id = ?")
                    .bind(headers)
                    .bind(id)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            stage_many(&pool, subject(), "good", 1).await;
            let relay = Relay::new(pool.clone(), JetStream::new(js2.clone())).max_attempts(1);
            let relayed = relay.run_once().await.unwrap();
            assert_eq!(
                (relayed.claimed, relayed.published, relayed.dead),
                (3, 1, 2)
            );
            let dead = outbox::dead(&pool, 10).await.unwrap();
            let errors: Vec<&str> = dead
                .iter()
                .filter_map(|d| d.last_error.as_deref())
                .collect();
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains("header name \"bad name:\"")),
                "{errors:?}"
            );
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains("header x-fine has a value NATS refuses")),
                "{errors:?}"
            );
        },
        async || {
            let _ = js.delete_stream(&name).await;
        },
    )
    .await;
}

/// A NATS server of this test's own, on a free port, with its JetStream store in a
/// directory that outlives a kill.
struct OwnNats {
    port: u16,
    store: PathBuf,
    child: Option<Child>,
}

impl OwnNats {
    fn start() -> OwnNats {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = common::scratch_file(&format!("nats-{}", common::next_id()));
        let mut nats = OwnNats {
            port,
            store,
            child: None,
        };
        nats.restart();
        nats
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn restart(&mut self) {
        let child = Command::new("nats-server")
            .current_dir(self.store.parent().unwrap())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (it is installed on the test machine)");
        self.child = Some(child);
        // Up once it accepts connections.
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("nats-server did not start on port {}", self.port);
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The broker dies: messages accumulate, every attempt fails and backs off, none is lost
/// or marked; the broker comes back and the relay delivers every message once.
#[tokio::test]
async fn a_broker_that_is_down_holds_messages_back_until_it_returns() {
    // The machine's own NATS must be there for the server tests; this test runs its own.
    if nats_url().is_none() {
        return;
    }
    let mut nats = OwnNats::start();
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats.url())
        .await
        .unwrap();
    let js = jetstream::new(client);
    let name = unique("outbox-down");
    stream_on(&js, &name).await;
    let pool = common::sqlite_file(&format!("outbox-down-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    nats.kill();
    stage_many(
        &pool,
        outbox::Destination::subject(format!("{name}.m")),
        "d",
        10,
    )
    .await;
    let relay = Relay::new(pool.clone(), JetStream::new(js.clone()))
        .publish_timeout(Duration::from_millis(500))
        // At least a second before the first retry (jitter halves it at most): the check
        // that a failed message is not due at once must not race the clock. With 50 ms it
        // did under a loaded suite (a delay drawn near 25 ms had passed by the next claim).
        .backoff(Duration::from_secs(2), Duration::from_secs(3))
        .max_attempts(1000);
    let down = relay.run_once().await.unwrap();
    assert_eq!((down.claimed, down.published, down.failed), (10, 0, 10));
    let backlog = outbox::backlog(&pool).await.unwrap();
    assert_eq!((backlog.pending, backlog.dead), (10, 0));
    // Backed off: not due at once.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    nats.restart();
    let published = poll_until(
        Duration::from_secs(30),
        || async {
            relay.run_once().await.unwrap();
            outbox::backlog(&pool).await.unwrap().pending
        },
        |pending| *pending == 0,
    )
    .await;
    assert_eq!(
        published, 0,
        "every message delivered once the broker is back"
    );
    let mut stream = js.get_stream(&name).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 10);
    let _ = js.delete_stream(&name).await;
}

/// RabbitMQ: confirmed publishes with the id as `message_id`; a message no queue takes is
/// a failed attempt, never marked.
#[tokio::test]
async fn rabbitmq_confirms_each_message_and_an_unroutable_one_fails() {
    let Some(url) = amqp_url() else { return };
    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let queue = unique("outbox");
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                auto_delete: false,
                durable: false,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let channel2 = channel.clone();
    let queue2 = queue.clone();
    let url2 = url.clone();
    cleanup_after(
        async move {
            let pool = common::sqlite_file(&format!("outbox-amqp-{}", common::next_id()), 2).await;
            idem::migrate(&pool).await.unwrap();
            stage_many(
                &pool,
                outbox::Destination::exchange("", queue2.as_str()),
                "r",
                10,
            )
            .await;
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
            let lost = Message::json(
                outbox::Destination::exchange("", format!("{queue2}-nobody")),
                &0,
            )
            .id("lost");
            outbox::stage(&mut tx, lost).await.unwrap();
            tx.commit().await.unwrap();
            let relay =
                Relay::new(pool.clone(), Rabbit::connect(&url2).await.unwrap()).max_attempts(1);
            let relayed = relay.run_once().await.unwrap();
            assert_eq!(
                (relayed.claimed, relayed.published, relayed.failed),
                (11, 10, 1)
            );
            let dead = outbox::dead(&pool, 10).await.unwrap();
            assert_eq!(dead.len(), 1);
            assert!(
                dead[0]
                    .last_error
                    .as_deref()
                    .unwrap()
                    .contains("unroutable"),
                "{dead:?}"
            );
            let mut consumer = channel2
                .basic_consume(
                    queue2.as_str().into(),
                    "outbox-test".into(),
                    lapin::options::BasicConsumeOptions::default(),
                    lapin::types::FieldTable::default(),
                )
                .await
                .unwrap();
            let mut ids = HashSet::new();
            for _ in 0..10 {
                let delivery = consumer.next().await.unwrap().unwrap();
                ids.insert(
                    outbox::rabbitmq::message_key(&delivery)
                        .unwrap()
                        .as_str()
                        .to_owned(),
                );
                delivery
                    .ack(lapin::options::BasicAckOptions::default())
                    .await
                    .unwrap();
            }
            assert_eq!(ids, (0..10).map(|i| format!("r-{i}")).collect());
        },
        async || {
            let _ = channel
                .queue_delete(
                    queue.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        },
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
}

/// RabbitMQ: a message to an exchange that does not exist (the broker closes the channel it
/// was published on) fails its own attempts; the batch's other messages, and every later
/// one, are published.
#[tokio::test]
async fn rabbitmq_a_missing_exchange_fails_only_its_own_message() {
    let Some(url) = amqp_url() else { return };
    let connection = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let queue = unique("outbox-missing");
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let queue2 = queue.clone();
    // The publisher shares the test's connection: its channels are its own.
    let connection = std::sync::Arc::new(connection);
    let shared = connection.clone();
    cleanup_after(
        async move {
            let pool =
                common::sqlite_file(&format!("outbox-missing-{}", common::next_id()), 2).await;
            idem::migrate(&pool).await.unwrap();
            let good = || outbox::Destination::exchange("", queue2.as_str());
            stage_many(&pool, good(), "before", 5).await;
            let missing = outbox::Destination::exchange(unique("idem-no-such-exchange"), "k");
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
            outbox::stage(&mut tx, Message::json(missing, &0).id("misaddressed"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            let relay = Relay::new(pool.clone(), Rabbit::new(shared))
                .max_attempts(2)
                .backoff(Duration::from_millis(1), Duration::from_millis(1));
            let first = relay.run_once().await.unwrap();
            assert_eq!((first.claimed, first.published, first.failed), (6, 5, 1));
            for round in 0..2 {
                stage_many(&pool, good(), &format!("after-{round}"), 5).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                let later = relay.run_once().await.unwrap();
                let failed = usize::from(round == 0);
                assert_eq!(
                    (later.published, later.failed),
                    (5, failed),
                    "round {round}: the misaddressed message is retried once, alone in failing"
                );
            }
            let dead = outbox::dead(&pool, 10).await.unwrap();
            assert_eq!(dead.len(), 1, "{dead:?}");
            assert!(
                dead[0].last_error.as_deref().unwrap().contains("NOT_FOUND"),
                "{dead:?}"
            );
            let backlog = outbox::backlog(&pool).await.unwrap();
            assert_eq!((backlog.pending, backlog.dead), (1, 1), "{backlog:?}");
        },
        async || {
            let _ = channel
                .queue_delete(
                    queue.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        },
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
}

// Two relays keeping each key in order, on every broker: the broker conformance suite,
// `conformance.rs`.
