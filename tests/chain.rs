//! The coupon chain of `examples/chain.rs`, `examples/chain_kafka.rs` and
//! `examples/chain_rabbitmq.rs` as processes, each
//! killed with SIGKILL at its worst moment, on a SQLite file, PostgreSQL and MariaDB, over
//! NATS JetStream, Kafka and RabbitMQ:
//!
//! - the API after a commit and before its response (the 300th);
//! - a relay after publishing a batch and before marking it (its third batch), and another
//!   in the middle of a batch (after its 100th acknowledgement);
//! - the consumer after its commit and before its acknowledgement (JetStream and RabbitMQ:
//!   the 200th message) or its offset commit (Kafka: the 20th batch, whose partitions the group hands
//!   to the other members once the killed one's session times out);
//!
//! while every hop repeats: clients send each payment one to three times and retry every
//! failure with the same key, some published messages are marked unpublished again (a relay
//! that died after the broker's acknowledgement). On JetStream, the stream's duplicate window
//! is its shortest (100 ms, so re-publishes reach the consumer), and the first delivery of
//! every tenth order is nacked after its commit. On Kafka, the topic has six partitions, the
//! group three members (one killed, two more), the producer is idempotent (which does not
//! stop a relay's re-publish: a new send, under the same idem id). On RabbitMQ, the relay
//! publishes to a fanout exchange with confirms, to the consumers' queue and to a queue
//! nobody consumes (which counts every copy), and the first delivery of every tenth order
//! is nacked after its commit. At the end: exactly one coupon per order, no order without
//! its coupon, every message published and consumed.

use crate::brokers::{
    KAFKA_PARTITIONS, amqp_url, kafka_offsets, kafka_topic, kafka_url, nats_url, unique,
};
use crate::child::{self, ChildProcess, report};
use crate::common;

#[path = "../examples/chain/app.rs"]
mod app;
#[path = "../examples/chain/kafka.rs"]
mod kafka;
#[path = "../examples/chain/nats.rs"]
mod nats;
#[path = "../examples/chain/rabbitmq.rs"]
mod rabbitmq;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use idem::fault::FaultPoint;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const ORDERS: i64 = 500;
const CHILD: &str = "chain::chain_child";

/// The Any URL of a fresh database for the chain, or `None` without its server.
pub(crate) async fn database(backend: &str) -> Option<String> {
    let name = format!("chain_{backend}_{}", common::next_id());
    match backend {
        "sqlite" => {
            let path = common::scratch_file(&format!("{name}.db"));
            Some(format!("sqlite:{}?mode=rwc", path.display()))
        }
        "postgres" => {
            common::postgres(&name, 1).await?.close().await;
            let url = common::postgres_url()?;
            let join = if url.contains('?') { '&' } else { '?' };
            Some(format!(
                "{url}{join}options=-c%20search_path%3Didem_test_{name}"
            ))
        }
        _ => common::mysql_database(&name).await,
    }
}

pub(crate) async fn any_pool(url: &str, connections: u32) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::any::AnyPoolOptions::new()
        .max_connections(connections)
        .connect(url)
        .await
        .unwrap()
}

/// One role of the chain, as a child process; killed at `crash` (the point, and which
/// passing of it), if any.
fn spawn(
    broker: &Broker,
    role: &str,
    url: &str,
    stream: &str,
    port: u16,
    crash: Option<(FaultPoint, u64)>,
) -> ChildProcess {
    let mut env = vec![
        ("IDEM_CHAIN_BROKER", broker.name().to_owned()),
        ("IDEM_CHAIN_ROLE", role.to_owned()),
        ("IDEM_CHAIN_DB", url.to_owned()),
        ("IDEM_CHAIN_STREAM", stream.to_owned()),
        ("IDEM_CHAIN_PORT", port.to_string()),
    ];
    if let Some((point, nth)) = crash {
        env.push(("IDEM_CRASH_POINT", point.name().to_owned()));
        env.push(("IDEM_CRASH_NTH", nth.to_string()));
    }
    ChildProcess::spawn(CHILD, &env, &["IDEM_CRASH_POINT", "IDEM_CRASH_NTH"])
}

/// Runs `role` killed at `crash`, then `after` copies of it to the end of the run; returns
/// the ones still running.
async fn crash_then_run(
    broker: &Broker,
    role: &str,
    url: &str,
    stream: &str,
    port: u16,
    crashes: &[(FaultPoint, u64)],
    after: usize,
) -> Vec<ChildProcess> {
    for &crash in crashes {
        let mut doomed = spawn(broker, role, url, stream, port, Some(crash));
        doomed.step("ready").await;
        let step = tokio::time::timeout(Duration::from_secs(120), doomed.step("crash-point"))
            .await
            .unwrap_or_else(|_| panic!("the {role} never reached {}", crash.0.name()));
        assert_eq!(step, format!("crash-point {}", crash.0.name()));
        doomed.kill();
    }
    let mut running = Vec::new();
    for _ in 0..after {
        let mut child = spawn(broker, role, url, stream, port, None);
        child.step("ready").await;
        running.push(child);
    }
    running
}

/// A client that pays `order` with `key`, retrying every failure (the API killed, a
/// conflict, a 409 while the first copy runs) until it gets its 200.
async fn pay(addr: SocketAddr, order: i64, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let reply =
            crate::http_client::try_post(addr, &format!("/orders/{order}/pay"), key, "").await;
        match reply {
            Ok(reply) if reply.status == 200 => return,
            _ if Instant::now() > deadline => panic!("order {order} was never paid: {reply:?}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The broker a chain runs over, with what the test needs of it.
enum Broker {
    Nats(String),
    Kafka(String),
    Rabbit(String),
}

impl Broker {
    /// The broker of `name` (`nats`, `kafka`, `rabbitmq`), or `None` without its server.
    fn of(name: &str) -> Option<Broker> {
        match name {
            "nats" => nats_url().map(Broker::Nats),
            "rabbitmq" => amqp_url().map(Broker::Rabbit),
            _ => kafka_url().map(Broker::Kafka),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::Kafka(_) => "kafka",
            Broker::Rabbit(_) => "rabbitmq",
        }
    }

    async fn amqp(url: &str) -> lapin::Connection {
        lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .unwrap()
    }

    /// The queue bound to the chain's exchange that nobody consumes: every message
    /// published stays in it, to be counted.
    fn tap(name: &str) -> String {
        format!("{name}.all")
    }

    async fn jetstream(url: &str) -> jetstream::Context {
        jetstream::new(async_nats::connect(url).await.unwrap())
    }

    /// A stream (and its durable consumer) or a topic of the test's own: its name.
    async fn prepare(&self) -> String {
        match self {
            Broker::Nats(url) => {
                let js = Broker::jetstream(url).await;
                let name = unique("chain");
                let stream = js
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{name}.>")],
                        max_age: Duration::from_secs(600),
                        // The shortest JetStream takes: a re-publish reaches the consumer,
                        // whose inbox absorbs it.
                        duplicate_window: Duration::from_millis(100),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                stream
                    .create_consumer(pull::Config {
                        durable_name: Some("coupons".into()),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(2),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                name
            }
            Broker::Kafka(url) => kafka_topic(url, "chain").await,
            Broker::Rabbit(url) => {
                let name = unique("chain");
                let channel = Broker::amqp(url).await.create_channel().await.unwrap();
                rabbitmq::declare(&channel, &name).await.unwrap();
                rabbitmq::bind_queue(&channel, &name, &Broker::tap(&name))
                    .await
                    .unwrap();
                name
            }
        }
    }

    /// Where the API stages its coupons for `name`.
    fn subject(&self, name: &str) -> String {
        match self {
            Broker::Nats(_) => format!("{name}.coupon.grant"),
            // A topic; RabbitMQ's exchange.
            Broker::Kafka(_) | Broker::Rabbit(_) => name.to_owned(),
        }
    }

    /// How many messages `name` holds, once every one of them was consumed (`None` while
    /// some wait for their acknowledgement or their offset's commit).
    async fn settled(&self, name: &str) -> Option<u64> {
        match self {
            Broker::Nats(url) => {
                let js = Broker::jetstream(url).await;
                let mut stream = js.get_stream(name).await.unwrap();
                let held = stream.info().await.unwrap().state.messages;
                let mut consumer = stream
                    .get_consumer::<pull::Config>("coupons")
                    .await
                    .unwrap();
                let info = consumer.info().await.unwrap();
                (info.num_pending == 0 && info.num_ack_pending == 0).then_some(held)
            }
            Broker::Kafka(url) => {
                // The group is named after the topic (see `kafka::consume`).
                let offsets = kafka_offsets(url, name, name, KAFKA_PARTITIONS).await;
                offsets
                    .iter()
                    .all(|(committed, end)| committed == end)
                    .then(|| offsets.iter().map(|(_, end)| *end as u64).sum())
            }
            Broker::Rabbit(url) => {
                let connection = Broker::amqp(url).await;
                let channel = connection.create_channel().await.unwrap();
                let (waiting, _) = crate::rabbitmq::queue_state(&channel, name).await;
                let (held, _) = crate::rabbitmq::queue_state(&channel, &Broker::tap(name)).await;
                let _ = connection.close(200, "done".into()).await;
                (waiting == 0).then_some(u64::from(held))
            }
        }
    }

    /// How many deliveries the consumers were handed, where the broker counts them.
    async fn delivered(&self, name: &str) -> Option<u64> {
        match self {
            Broker::Nats(url) => {
                let js = Broker::jetstream(url).await;
                let mut consumer = js
                    .get_stream(name)
                    .await
                    .unwrap()
                    .get_consumer::<pull::Config>("coupons")
                    .await
                    .unwrap();
                Some(consumer.info().await.unwrap().delivered.consumer_sequence)
            }
            // Kafka counts no deliveries (a group reads from offsets); RabbitMQ tells no
            // client how many it made.
            Broker::Kafka(_) | Broker::Rabbit(_) => None,
        }
    }

    async fn delete(&self, name: &str) {
        match self {
            Broker::Nats(url) => {
                let _ = Broker::jetstream(url).await.delete_stream(name).await;
            }
            Broker::Kafka(url) => {
                let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
                    rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", url)
                        .create()
                        .unwrap();
                let _ = admin
                    .delete_topics(&[name], &rdkafka::admin::AdminOptions::new())
                    .await;
            }
            Broker::Rabbit(url) => {
                let connection = Broker::amqp(url).await;
                let channel = connection.create_channel().await.unwrap();
                crate::rabbitmq::delete_queue(&channel, name).await;
                crate::rabbitmq::delete_queue(&channel, &Broker::tap(name)).await;
                let _ = channel
                    .exchange_delete(name.into(), Default::default())
                    .await;
                let _ = connection.close(200, "done".into()).await;
            }
        }
    }

    /// Where the consumer is killed: after its commit, before it tells the broker.
    fn consumer_crash(&self) -> (FaultPoint, u64) {
        match self {
            // One message per commit.
            Broker::Nats(_) | Broker::Rabbit(_) => (FaultPoint::Committed, 200),
            // A batch per partition and round.
            Broker::Kafka(_) => (FaultPoint::Committed, 20),
        }
    }
}

async fn chain(broker: &str, backend: &str) {
    let Some(broker) = Broker::of(broker) else {
        return;
    };
    let Some(url) = database(backend).await else {
        return;
    };
    let pool = any_pool(&url, 4).await;
    if backend == "sqlite" {
        sqlx::raw_sql("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await
            .unwrap();
    }
    app::setup(&pool, ORDERS).await.unwrap();
    let name = broker.prepare().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();

    let b = &broker;
    let api = crash_then_run(
        b,
        "api",
        &url,
        &name,
        port,
        &[(FaultPoint::Committed, 300)],
        1,
    );
    let relays = crash_then_run(
        b,
        "relay",
        &url,
        &name,
        port,
        &[(FaultPoint::Published, 3), (FaultPoint::Acked, 100)],
        2,
    );
    let consumer_crash = [b.consumer_crash()];
    let consumers = crash_then_run(b, "consumer", &url, &name, port, &consumer_crash, 2);
    let clients = async {
        let mut clients = tokio::task::JoinSet::new();
        for worker in 0..16 {
            clients.spawn(async move {
                for order in (1..=ORDERS).filter(|o| o % 16 == worker) {
                    let key = format!("pay-{order}");
                    for _ in 0..=(order % 3) {
                        pay(addr, order, &key).await;
                    }
                }
            });
        }
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
    };
    let (api, relays, consumers, ()) = tokio::join!(api, relays, consumers, clients);
    // Some messages again, as after a relay that died between the broker's acknowledgement
    // and its mark.
    sqlx::raw_sql(
        "UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0 AND published_at IS NOT NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (report, held) = loop {
        let report = app::report(&pool).await.unwrap();
        let held = broker.settled(&name).await;
        if report.rewarded == ORDERS && report.pending == 0 && held.is_some()
            || Instant::now() > deadline
        {
            break (report, held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop((api, relays, consumers));
    let delivered = broker.delivered(&name).await;
    broker.delete(&name).await;
    // The repeats happened: the broker holds re-published copies (every one of them
    // consumed), and where it counts deliveries, it handed out more than it holds.
    let held = held.expect("the broker still held messages not consumed after 120 s");
    assert!(
        held > ORDERS as u64,
        "no message was published twice: {held}"
    );
    if let Some(delivered) = delivered {
        assert!(
            delivered > held,
            "no message was delivered twice: {delivered} for {held}"
        );
    }
    assert_eq!(
        report,
        app::Report {
            paid: ORDERS,
            rewarded: ORDERS,
            coupons: ORDERS,
            doubled: 0,
            staged: ORDERS,
            pending: 0,
        },
        "one payment, one message, one coupon per order, every message published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_grants_one_coupon_per_order_on_sqlite() {
    chain("nats", "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_grants_one_coupon_per_order_on_postgres() {
    chain("nats", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_grants_one_coupon_per_order_on_mysql() {
    chain("nats", "mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_kafka_grants_one_coupon_per_order_on_sqlite() {
    chain("kafka", "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_kafka_grants_one_coupon_per_order_on_postgres() {
    chain("kafka", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_kafka_grants_one_coupon_per_order_on_mysql() {
    chain("kafka", "mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_rabbitmq_grants_one_coupon_per_order_on_sqlite() {
    chain("rabbitmq", "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_rabbitmq_grants_one_coupon_per_order_on_postgres() {
    chain("rabbitmq", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_over_rabbitmq_grants_one_coupon_per_order_on_mysql() {
    chain("rabbitmq", "mysql").await;
}

/// One role of the chain, run by [`chain`] as a child process.
#[test]
#[ignore = "the child process of the chain tests, which run it"]
fn chain_child() {
    let Ok(role) = std::env::var("IDEM_CHAIN_ROLE") else {
        eprintln!("chain_child runs only as the child of a chain test");
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    if let Ok(point) = std::env::var("IDEM_CRASH_POINT") {
        let point = FaultPoint::from_name(&point).expect("a fault point");
        child::stop_at_nth(point, var("IDEM_CRASH_NTH").parse().unwrap());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = any_pool(&var("IDEM_CHAIN_DB"), 4).await;
        let stream = var("IDEM_CHAIN_STREAM");
        let broker = Broker::of(&var("IDEM_CHAIN_BROKER")).expect("the broker's URL");
        match (role.as_str(), &broker) {
            ("api", _) => {
                let port: u16 = var("IDEM_CHAIN_PORT").parse().unwrap();
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                    .await
                    .unwrap();
                let api = app::api(pool, broker.subject(&stream)).unwrap();
                report("ready");
                axum::serve(listener, api).await.unwrap();
            }
            ("relay", Broker::Nats(url)) => {
                let js = Broker::jetstream(url).await;
                let relay = app::relay(pool, idem::outbox::nats::JetStream::new(js));
                report("ready");
                relay.run(std::future::pending()).await;
            }
            ("relay", Broker::Rabbit(url)) => {
                let publisher = idem::outbox::rabbitmq::Rabbit::connect(url).await.unwrap();
                let relay = app::relay(pool, publisher);
                report("ready");
                relay.run(std::future::pending()).await;
            }
            (_, Broker::Rabbit(url)) => {
                let connection = Broker::amqp(url).await;
                report("ready");
                rabbitmq::consume(pool, &connection, &stream, true)
                    .await
                    .unwrap();
            }
            ("relay", Broker::Kafka(url)) => {
                let relay = app::relay(pool, idem::outbox::kafka::Kafka::connect(url).unwrap());
                report("ready");
                relay.run(std::future::pending()).await;
            }
            (_, Broker::Kafka(url)) => {
                report("ready");
                kafka::consume(pool, url, &stream, &stream).await.unwrap();
            }
            (_, Broker::Nats(url)) => {
                let consumer = Broker::jetstream(url)
                    .await
                    .get_stream(&stream)
                    .await
                    .unwrap()
                    .get_consumer::<pull::Config>("coupons")
                    .await
                    .unwrap();
                report("ready");
                nats::consume(pool, consumer, true).await.unwrap();
            }
        }
    });
}
