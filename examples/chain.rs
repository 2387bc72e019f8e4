//! The coupon chain: an HTTP payment, a staged message, a relay, a broker and a consumer,
//! every hop repeated, and exactly one coupon per order at the end.
//!
//! `POST /orders/{id}/pay` (with an Idempotency-Key, sent up to three times) moves the order
//! `CREATED → PAID` and stages `coupon.grant` in the same transaction; the relay publishes it
//! to NATS JetStream (some messages twice); the consumer grants the coupon through an inbox +
//! transition `PAID → REWARDED` (the first delivery of every tenth order nacked after its
//! commit, so the broker redelivers it).
//!
//! ```text
//! cargo run -p idem --example chain                      # nats://127.0.0.1:4222, an SQLite temp file
//! cargo run -p idem --example chain -- NATS_URL DATABASE_URL [ORDERS]
//! ```
//!
//! The server needs JetStream (`nats-server -js`). `DATABASE_URL`: `sqlite:…`, `postgres://…`
//! or `mysql://…` (a database of its own: the example creates its tables).
//! `tests/chain.rs` runs the same parts as processes and kills each with SIGKILL mid-way;
//! `examples/chain_kafka.rs` is the same chain over Kafka.

#[path = "chain/app.rs"]
mod app;
#[path = "chain/nats.rs"]
mod nats;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use std::time::Duration;

const STREAM: &str = "IDEM_EXAMPLE_CHAIN";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
    let nats_url = arg(1, "NATS_URL").unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let orders: i64 = arg(3, "ORDERS").map_or(Ok(200), |n| n.parse())?;
    let database_url = match arg(2, "DATABASE_URL") {
        Some(url) => url,
        None => {
            let path = std::env::temp_dir().join("idem-chain.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            format!("sqlite:{}?mode=rwc", path.display())
        }
    };
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(8)
        .connect(&database_url)
        .await?;
    if database_url.starts_with("sqlite:") {
        sqlx::raw_sql("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    app::setup(&pool, orders)
        .await
        .map_err(|e| format!("setup: {e}"))?;

    // The broker: a fresh stream for the coupons, and the consumer's durable pull consumer.
    let js = jetstream::new(async_nats::connect(&nats_url).await?);
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["idem.example.coupon.>".into()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("coupons".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(5),
            ..Default::default()
        })
        .await?;

    // The three parts.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api =
        app::api(pool.clone(), "idem.example.coupon.grant".into()).map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, api).await });
    let relay = app::relay(pool.clone(), idem::outbox::nats::JetStream::new(js.clone())).spawn()?;
    let consuming = tokio::spawn(nats::consume(pool.clone(), consumer, true));

    // The clients: each payment sent once, twice or three times with the same key.
    let client = Client(addr);
    for order_id in 1..=orders {
        let key = format!("pay-{order_id}");
        for _ in 0..=(order_id % 3) {
            client.pay(order_id, &key).await?;
        }
    }
    // The relay publishes some messages again, as one that died after the broker's
    // acknowledgement and before its mark would.
    sqlx::raw_sql("UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0")
        .execute(&pool)
        .await?;

    // Until every order has its coupon.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let report = loop {
        let report = app::report(&pool).await?;
        if report.rewarded == orders && report.pending == 0 || std::time::Instant::now() > deadline
        {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("{report:?}");
    relay.stop().await;
    consuming.abort();
    js.delete_stream(STREAM).await?;
    assert_eq!(
        (
            report.paid,
            report.rewarded,
            report.coupons,
            report.doubled,
            report.staged,
            report.pending
        ),
        (orders, orders, orders, 0, orders, 0),
        "one payment, one message, one coupon per order, every message published"
    );
    println!("{orders} orders: {orders} coupons, none twice, every message published");
    Ok(())
}

/// A client of the API: one HTTP/1.1 request per connection.
struct Client(std::net::SocketAddr);

impl Client {
    async fn pay(
        &self,
        order_id: i64,
        key: &str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        use http_body_util::{BodyExt, Empty};
        let stream = tokio::net::TcpStream::connect(self.0).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::post(format!("/orders/{order_id}/pay"))
            .header("host", "localhost")
            .header("idempotency-key", key)
            .body(Empty::<bytes::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let _ = response.into_body().collect().await?;
        if !status.is_success() {
            return Err(format!("order {order_id}: {status}").into());
        }
        Ok(())
    }
}
