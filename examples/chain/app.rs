//! The coupon chain's parts, shared by `examples/chain.rs`, `examples/chain_kafka.rs` and
//! `tests/chain.rs`:
//!
//! 1. **the API**: `POST /orders/{id}/pay` behind the Idempotency-Key layer moves the order
//!    `CREATED → PAID` and stages a `coupon.grant` message, all in one transaction;
//! 2. **the relay**: publishes the outbox to the broker (NATS JetStream or Kafka);
//! 3. **the consumer** (`nats.rs`, `kafka.rs`): each `coupon.grant` through an inbox +
//!    transition `PAID → REWARDED` whose body grants the coupon, acknowledged (or its offset
//!    committed) after its commit.
//!
//! Every hop repeats (a client's retry, a relay's re-publish, a broker's redelivery), and
//! each repeat is absorbed where it lands: exactly one coupon per order.
//!
//! On `sqlx::Any`, so one code runs on SQLite, PostgreSQL and MariaDB.

#![allow(dead_code)]

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use idem::http::{IdempotencyLayer, Tx};
use idem::inbox::{Inbox, MessageKey};
use idem::outbox::{self, Message, Publisher, Relay};
use idem::{Outcome, StateMachine, idempotent};
use sqlx::{Any, AnyPool, Transaction};
use std::time::Duration;

/// An order, paid by the API and rewarded by the consumer.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "chain_orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID", to(Rewarded))]
    Paid,
    #[state(name = "REWARDED")]
    Rewarded,
}

/// What the API stages for the consumer.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct GrantCoupon {
    pub order_id: i64,
}

/// The chain's tables (idem's own come from `idem::migrate`), and `orders` orders CREATED.
pub async fn setup(pool: &AnyPool, orders: i64) -> Result<(), sqlx::Error> {
    idem::migrate(pool).await?;
    // No unique key on a coupon's order: a second grant would show as a second row.
    sqlx::raw_sql(
        "CREATE TABLE chain_orders (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL,
                                    version BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE chain_coupons (order_id BIGINT NOT NULL);",
    )
    .execute(pool)
    .await?;
    let mut tx = pool.begin().await?;
    for order_id in 1..=orders {
        sqlx::query(&placed(
            &tx,
            "INSERT INTO chain_orders (order_id, status) VALUES ($1, 'CREATED')",
        ))
        .bind(order_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// `sql` with `$n` placeholders as the connection's backend takes them (MySQL: `?`).
pub fn placed(conn: &sqlx::AnyConnection, sql: &str) -> String {
    if conn.backend_name().eq_ignore_ascii_case("mysql") {
        let mut placed = String::new();
        let mut chars = sql.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
                while chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                }
                placed.push('?');
            } else {
                placed.push(c);
            }
        }
        placed
    } else {
        sql.to_owned()
    }
}

impl Order {
    /// Pays the order and stages its coupon, in the transaction given (the HTTP layer's).
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    pub async fn pay(
        tx: &mut Transaction<'_, Any>,
        order_id: i64,
        subject: &str,
    ) -> Result<(), sqlx::Error> {
        outbox::stage(tx, Message::json(subject, &GrantCoupon { order_id })).await?;
        Ok(())
    }

    /// Rewards the order and grants its coupon, in the transaction given (the inbox's: the
    /// message's record commits with it).
    #[idempotent(key = "order_id", from = "PAID", to = "REWARDED")]
    pub async fn reward(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<(), sqlx::Error> {
        grant_coupon(tx, order_id).await
    }
}

/// The coupon itself (a row; no unique key, so a second grant would show).
async fn grant_coupon(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<(), sqlx::Error> {
    let insert = placed(tx, "INSERT INTO chain_coupons (order_id) VALUES ($1)");
    sqlx::query(&insert)
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Grants the coupon of a `coupon.grant` message, once: the inbox records the message and
/// the transition `PAID → REWARDED` guards the order, in one unit of work (the attribute's
/// form for a consumer that handles one message at a time, as `nats.rs` does).
#[idempotent(inbox = "inbox", message = "key", payload = "payload",
             machine = Order, key = "order_id", from = "PAID", to = "REWARDED")]
pub async fn grant(
    tx: &mut Transaction<'_, Any>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<(), sqlx::Error> {
    grant_coupon(tx, order_id).await
}

/// The API: `POST /orders/{id}/pay`, its coupons published on `subject`.
pub fn api(pool: AnyPool, subject: String) -> Result<axum::Router, Box<dyn std::error::Error>> {
    let keys = IdempotencyLayer::new(pool, Inbox::new("chain-api")?).unscoped();
    let route = post(move |Path(order_id): Path<i64>, mut tx: Tx<Any>| {
        let subject = subject.clone();
        async move {
            let answer = match Order::pay(&mut *tx, order_id, &subject).await {
                Ok(Outcome::Applied(())) => (StatusCode::OK, "paid"),
                Ok(Outcome::AlreadyDone { .. }) => (StatusCode::OK, "already paid"),
                Ok(Outcome::NotFound) => (StatusCode::NOT_FOUND, "no such order"),
                Ok(_) => (StatusCode::CONFLICT, "not payable"),
                // Not committed: a retry runs again.
                Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "failed").into_response(),
            };
            // The payment, its coupons' messages and this answer commit together.
            tx.commit(answer).into_response()
        }
    });
    Ok(axum::Router::new().route("/orders/{order_id}/pay", route.layer(keys)))
}

/// The relay to the broker `publisher` speaks to: small batches and a short poll, so the
/// chain moves quickly.
pub fn relay<P: Publisher>(pool: AnyPool, publisher: P) -> Relay<Any, P> {
    Relay::new(pool, publisher)
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .publish_timeout(Duration::from_secs(10))
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
}

/// Where the chain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Orders paid (PAID or REWARDED).
    pub paid: i64,
    /// Orders rewarded.
    pub rewarded: i64,
    /// Coupons granted.
    pub coupons: i64,
    /// Orders with more than one coupon.
    pub doubled: i64,
    /// Messages staged.
    pub staged: i64,
    /// Messages not yet published.
    pub pending: u64,
}

pub async fn report(pool: &AnyPool) -> Result<Report, sqlx::Error> {
    let count =
        |sql: &'static str| async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await };
    Ok(Report {
        paid: count("SELECT COUNT(*) FROM chain_orders WHERE status IN ('PAID', 'REWARDED')").await?,
        rewarded: count("SELECT COUNT(*) FROM chain_orders WHERE status = 'REWARDED'").await?,
        coupons: count("SELECT COUNT(*) FROM chain_coupons").await?,
        doubled: count(
            "SELECT COUNT(*) FROM (SELECT order_id FROM chain_coupons GROUP BY order_id HAVING COUNT(*) > 1) AS d",
        )
        .await?,
        staged: count("SELECT COUNT(*) FROM idem_outbox").await?,
        pending: outbox::backlog(pool).await?.pending,
    })
}
