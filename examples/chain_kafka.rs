//! The coupon chain over Kafka: an HTTP payment, a staged message, a relay to Kafka and a
//! consumer group, every hop repeated, and exactly one coupon per order at the end.
//!
//! `POST /orders/{id}/pay` (with an Idempotency-Key, sent up to three times) moves the order
//! `CREATED → PAID` and stages `coupon.grant` in the same transaction; the relay publishes it
//! to a topic of six partitions with the idempotent producer (some messages twice, as a relay
//! killed between the broker's acknowledgement and its mark would); a group of consumers
//! grants the coupon through an inbox + transition `PAID → REWARDED`, committing each
//! partition's offset after the database's commit. A second member joins half way: the
//! group rebalances, and what is read again is absorbed.
//!
//! ```text
//! cargo run -p idem --example chain_kafka                  # 127.0.0.1:9092, an SQLite temp file
//! cargo run -p idem --example chain_kafka -- BOOTSTRAP_SERVERS DATABASE_URL [ORDERS]
//! ```
//!
//! `DATABASE_URL`: `sqlite:…`, `postgres://…` or `mysql://…` (a database of its own: the
//! example creates its tables). The topic is the run's own, deleted at the end.
//! `tests/chain.rs` runs the same parts as processes and kills each with SIGKILL mid-way.

#[path = "chain/app.rs"]
mod app;
#[path = "chain/demo.rs"]
mod demo;
#[path = "chain/kafka.rs"]
mod kafka;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), demo::Failure> {
    let args = demo::Args::read("BOOTSTRAP_SERVERS", "127.0.0.1:9092")?;
    let (servers, orders) = (args.broker, args.orders);
    let pool = demo::database(args.database_url, "idem-chain-kafka.db", orders).await?;

    // The broker: a topic of this run's own, six partitions.
    let topic = format!(
        "idem.example.coupon.grant.{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &servers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for created in admin
        .create_topics(
            &[NewTopic::new(&topic, 6, TopicReplication::Fixed(1))],
            &options,
        )
        .await?
    {
        created.map_err(|(topic, e)| format!("topic {topic}: {e}"))?;
    }

    // The three parts: the API, the relay, and a first member of the consumer group.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api = app::api(pool.clone(), topic.clone()).map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, api).await });
    let relay = app::relay(pool.clone(), idem::outbox::kafka::Kafka::connect(&servers)?).spawn()?;
    let member = |pool: sqlx::AnyPool| {
        let (servers, topic) = (servers.clone(), topic.clone());
        tokio::spawn(async move { kafka::consume(pool, &servers, &topic, &topic).await })
    };
    let first = member(pool.clone());

    // The clients: each payment sent once, twice or three times with the same key.
    demo::pay_every_order(addr, orders).await?;
    // The relay publishes some messages again, as one that died after the broker's
    // acknowledgement and before its mark would; a second member joins the group.
    sqlx::raw_sql("UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0")
        .execute(&pool)
        .await?;
    let second = member(pool.clone());

    // Until every order has its coupon.
    let report = demo::until_rewarded(&pool, orders).await?;
    relay.stop().await;
    first.abort();
    second.abort();
    admin.delete_topics(&[topic.as_str()], &options).await?;
    demo::check(report, orders);
    Ok(())
}
