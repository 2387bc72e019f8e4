//! The coupon chain over RabbitMQ: an HTTP payment, a staged message, a relay with publisher
//! confirms, a queue and a consumer, every hop repeated, and exactly one coupon per order at
//! the end.
//!
//! `POST /orders/{id}/pay` (with an Idempotency-Key, sent up to three times) moves the order
//! `CREATED → PAID` and stages `coupon.grant` in the same transaction; the relay publishes it
//! to a fanout exchange (some messages twice: RabbitMQ keeps both copies); the consumer
//! grants the coupon through an inbox + transition `PAID → REWARDED` (the first delivery of
//! every tenth order nacked after its commit, so the broker redelivers it).
//!
//! ```text
//! cargo run -p idem --example chain_rabbitmq               # amqp://guest:guest@127.0.0.1:5672/%2f, an SQLite temp file
//! cargo run -p idem --example chain_rabbitmq -- AMQP_URL DATABASE_URL [ORDERS]
//! ```
//!
//! `DATABASE_URL`: `sqlite:…`, `postgres://…` or `mysql://…` (a database of its own: the
//! example creates its tables). The exchange and the queue are the run's own, deleted at
//! the end. `tests/chain.rs` runs the same parts as processes and kills each with SIGKILL
//! mid-way.

#[path = "chain/app.rs"]
mod app;
#[path = "chain/demo.rs"]
mod demo;
#[path = "chain/rabbitmq.rs"]
mod rabbitmq;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};

#[tokio::main]
async fn main() -> Result<(), demo::Failure> {
    let args = demo::Args::read("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")?;
    let (amqp_url, orders) = (args.broker, args.orders);
    let pool = demo::database(args.database_url, "idem-chain-rabbitmq.db", orders).await?;

    // The broker: an exchange and a queue of this run's own.
    let name = format!(
        "idem.example.coupon.grant.{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    rabbitmq::declare(&channel, &name).await?;

    // The three parts.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api = app::api(pool.clone(), name.clone()).map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, api).await });
    let publisher = idem::outbox::rabbitmq::Rabbit::connect(&amqp_url).await?;
    let relay = app::relay(pool.clone(), publisher).spawn()?;
    let consuming = {
        let (pool, amqp_url, name) = (pool.clone(), amqp_url.clone(), name.clone());
        tokio::spawn(async move {
            let connection =
                Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
            rabbitmq::consume(pool, &connection, &name, true).await
        })
    };

    // The clients: each payment sent once, twice or three times with the same key.
    demo::pay_every_order(addr, orders).await?;
    // The relay publishes some messages again, as one that died after the broker's
    // confirm and before its mark would.
    sqlx::raw_sql("UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0")
        .execute(&pool)
        .await?;

    // Until every order has its coupon.
    let report = demo::until_rewarded(&pool, orders).await?;
    relay.stop().await;
    consuming.abort();
    channel
        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
        .await?;
    channel
        .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
        .await?;
    demo::check(report, orders);
    Ok(())
}
