//! What both chain examples (`chain.rs` over JetStream, `chain_kafka.rs` over Kafka) do
//! around the chain's parts: the database, the clients that pay every order (each payment
//! sent one to three times), the wait for every coupon, and the check at the end.

use super::app;
use std::time::{Duration, Instant};

pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The example's arguments: the broker's address (`broker`, or its `default`), the
/// database's URL, the number of orders.
pub struct Args {
    pub broker: String,
    pub database_url: Option<String>,
    pub orders: i64,
}

impl Args {
    /// `-- BROKER DATABASE_URL ORDERS`, each also read from the environment variable named.
    pub fn read(broker_var: &str, default: &str) -> Result<Args, Failure> {
        let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
        Ok(Args {
            broker: arg(1, broker_var).unwrap_or_else(|| default.into()),
            database_url: arg(2, "DATABASE_URL"),
            orders: arg(3, "ORDERS").map_or(Ok(200), |n| n.parse())?,
        })
    }
}

/// The chain's database (`database_url`, or a fresh SQLite file named `temp` in the temp
/// folder), with its tables and `orders` orders CREATED.
pub async fn database(
    database_url: Option<String>,
    temp: &str,
    orders: i64,
) -> Result<sqlx::AnyPool, Failure> {
    let database_url = match database_url {
        Some(url) => url,
        None => {
            let path = std::env::temp_dir().join(temp);
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
    Ok(pool)
}

/// Pays every order through the API at `addr`: each payment sent once, twice or three
/// times with the same key.
pub async fn pay_every_order(addr: std::net::SocketAddr, orders: i64) -> Result<(), Failure> {
    for order_id in 1..=orders {
        let key = format!("pay-{order_id}");
        for _ in 0..=(order_id % 3) {
            pay(addr, order_id, &key).await?;
        }
    }
    Ok(())
}

/// Waits (60 s at most) until every order has its coupon and every message is published;
/// where the chain stands then.
pub async fn until_rewarded(pool: &sqlx::AnyPool, orders: i64) -> Result<app::Report, Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = app::report(pool).await?;
        if report.rewarded == orders && report.pending == 0 || Instant::now() > deadline {
            println!("{report:?}");
            return Ok(report);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One payment, one message, one coupon per order, every message published.
pub fn check(report: app::Report, orders: i64) {
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
}

/// `POST /orders/{order_id}/pay` with `key` as its Idempotency-Key, on a connection of its
/// own (HTTP/1.1).
async fn pay(addr: std::net::SocketAddr, order_id: i64, key: &str) -> Result<(), Failure> {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr).await?;
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
