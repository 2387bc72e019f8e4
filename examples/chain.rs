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
#[path = "chain/demo.rs"]
mod demo;
#[path = "chain/nats.rs"]
mod nats;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use std::time::Duration;

const STREAM: &str = "IDEM_EXAMPLE_CHAIN";

#[tokio::main]
async fn main() -> Result<(), demo::Failure> {
    let args = demo::Args::read("NATS_URL", "nats://127.0.0.1:4222")?;
    let (nats_url, orders) = (args.broker, args.orders);
    let pool = demo::database(args.database_url, "idem-chain.db", orders).await?;

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
    demo::pay_every_order(addr, orders).await?;
    // The relay publishes some messages again, as one that died after the broker's
    // acknowledgement and before its mark would.
    sqlx::raw_sql("UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0")
        .execute(&pool)
        .await?;

    // Until every order has its coupon.
    let report = demo::until_rewarded(&pool, orders).await?;
    relay.stop().await;
    consuming.abort();
    js.delete_stream(STREAM).await?;
    demo::check(report, orders);
    Ok(())
}
