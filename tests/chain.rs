//! The coupon chain of `examples/chain.rs` as processes, each killed with SIGKILL at its
//! worst moment, on a SQLite file, PostgreSQL and MariaDB with NATS JetStream:
//!
//! - the API after a commit and before its response (the 300th);
//! - a relay after publishing a batch and before marking it (its third batch), and another
//!   in the middle of a batch (after its 100th acknowledgement);
//! - the consumer after its commit and before its ack (the 200th);
//!
//! while every hop repeats: clients send each payment one to three times and retry every
//! failure with the same key, some published messages are marked unpublished again (a relay
//! that died after the broker's acknowledgement), the stream's duplicate window is JetStream's
//! shortest (100 ms, so re-publishes reach the consumer), and the first delivery of every
//! tenth order is nacked after its commit. At the end: exactly one coupon per order, no order without its coupon, every
//! message published.

use crate::brokers::{nats_url, unique};
use crate::child::{self, ChildProcess, report};
use crate::common;

#[path = "../examples/chain/app.rs"]
mod app;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use idem::fault::FaultPoint;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const ORDERS: i64 = 1000;
const CHILD: &str = "chain::chain_child";

/// The Any URL of a fresh database for the chain, or `None` without its server.
async fn database(backend: &str) -> Option<String> {
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

async fn any_pool(url: &str, connections: u32) -> sqlx::AnyPool {
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
    role: &str,
    url: &str,
    stream: &str,
    port: u16,
    crash: Option<(FaultPoint, u64)>,
) -> ChildProcess {
    let mut env = vec![
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
    role: &str,
    url: &str,
    stream: &str,
    port: u16,
    crashes: &[(FaultPoint, u64)],
    after: usize,
) -> Vec<ChildProcess> {
    for &crash in crashes {
        let mut doomed = spawn(role, url, stream, port, Some(crash));
        doomed.step("ready").await;
        let step = tokio::time::timeout(Duration::from_secs(120), doomed.step("crash-point"))
            .await
            .unwrap_or_else(|_| panic!("the {role} never reached {}", crash.0.name()));
        assert_eq!(step, format!("crash-point {}", crash.0.name()));
        doomed.kill();
    }
    let mut running = Vec::new();
    for _ in 0..after {
        let mut child = spawn(role, url, stream, port, None);
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

async fn chain(backend: &str) {
    let Some(nats) = nats_url() else { return };
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
    let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
    let name = unique("chain");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            max_age: Duration::from_secs(600),
            // The shortest JetStream takes: a re-publish reaches the consumer, whose inbox absorbs it.
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();

    let api = crash_then_run("api", &url, &name, port, &[(FaultPoint::Committed, 300)], 1);
    let relays = crash_then_run(
        "relay",
        &url,
        &name,
        port,
        &[(FaultPoint::Published, 3), (FaultPoint::Acked, 100)],
        2,
    );
    let consumers = crash_then_run(
        "consumer",
        &url,
        &name,
        port,
        &[(FaultPoint::Committed, 200)],
        2,
    );
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
    let report = loop {
        let report = app::report(&pool).await.unwrap();
        let mut consumer = js
            .get_stream(&name)
            .await
            .unwrap()
            .get_consumer::<pull::Config>("coupons")
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        let settled = info.num_pending == 0 && info.num_ack_pending == 0;
        if report.rewarded == ORDERS && report.pending == 0 && settled || Instant::now() > deadline
        {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop((api, relays, consumers));
    // The repeats happened: the stream holds re-published copies, and the consumer was
    // handed more deliveries than the stream holds messages (redeliveries).
    let mut stream = js.get_stream(&name).await.unwrap();
    let in_stream = stream.info().await.unwrap().state.messages;
    let mut consumer = stream
        .get_consumer::<pull::Config>("coupons")
        .await
        .unwrap();
    let delivered = consumer.info().await.unwrap().delivered.consumer_sequence;
    let _ = js.delete_stream(&name).await;
    assert!(
        in_stream > ORDERS as u64,
        "no message was published twice: {in_stream}"
    );
    assert!(
        delivered > in_stream,
        "no message was delivered twice: {delivered} for {in_stream}"
    );
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
    chain("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_grants_one_coupon_per_order_on_postgres() {
    chain("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_grants_one_coupon_per_order_on_mysql() {
    chain("mysql").await;
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
        let js = jetstream::new(async_nats::connect(nats_url().unwrap()).await.unwrap());
        match role.as_str() {
            "api" => {
                let port: u16 = var("IDEM_CHAIN_PORT").parse().unwrap();
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                    .await
                    .unwrap();
                let api = app::api(pool, format!("{stream}.coupon.grant")).unwrap();
                report("ready");
                axum::serve(listener, api).await.unwrap();
            }
            "relay" => {
                let relay = app::relay(pool, js);
                report("ready");
                relay.run(std::future::pending()).await;
            }
            _ => {
                let consumer = js
                    .get_stream(&stream)
                    .await
                    .unwrap()
                    .get_consumer::<pull::Config>("coupons")
                    .await
                    .unwrap();
                report("ready");
                app::consume(pool, consumer, true).await.unwrap();
            }
        }
    });
}
