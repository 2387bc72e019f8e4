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
#[path = "chain/kafka.rs"]
mod kafka;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
    let servers = arg(1, "BOOTSTRAP_SERVERS").unwrap_or_else(|| "127.0.0.1:9092".into());
    let orders: i64 = arg(3, "ORDERS").map_or(Ok(200), |n| n.parse())?;
    let database_url = match arg(2, "DATABASE_URL") {
        Some(url) => url,
        None => {
            let path = std::env::temp_dir().join("idem-chain-kafka.db");
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
    let client = Client(addr);
    for order_id in 1..=orders {
        let key = format!("pay-{order_id}");
        for _ in 0..=(order_id % 3) {
            client.pay(order_id, &key).await?;
        }
    }
    // The relay publishes some messages again, as one that died after the broker's
    // acknowledgement and before its mark would; a second member joins the group.
    sqlx::raw_sql("UPDATE idem_outbox SET published_at = NULL WHERE seq % 7 = 0")
        .execute(&pool)
        .await?;
    let second = member(pool.clone());

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
    first.abort();
    second.abort();
    admin.delete_topics(&[topic.as_str()], &options).await?;
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
