//! Orders racing their timeouts, shared by `examples/order_timeouts.rs` and
//! `tests/order_timeouts.rs`: each order created stages its own `order.timeout`, delayed
//! (`Message::deliver_after`); its payment, coming at a random moment, moves it
//! `CREATED → PAID` and cancels the timeout (`outbox::cancel`); a timeout that comes first
//! (or whose cancel came too late) is consumed through an inbox + transition
//! `CREATED → CANCELLED`, which refuses an order already paid. Every order ends PAID or
//! CANCELLED, with one effect: a payment or a release of its stock, never both, never
//! neither.
//!
//! On `sqlx::Any`, so one code runs on SQLite, PostgreSQL and MariaDB. The broker is a
//! channel in the process, which hands every message out twice (a redelivery), for the
//! inbox to absorb.

#![allow(dead_code)]

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use idem::{Outcome, Refusal, StateMachine, idempotent};
use rand::{Rng, SeedableRng};
use sqlx::{Any, AnyPool, Transaction};
use std::time::Duration;
use tokio::sync::mpsc;

/// An order: paid, or cancelled by its timeout.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "timeout_orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID")]
    Paid,
    #[state(name = "CANCELLED")]
    Cancelled,
}

/// The effects table: one row per effect (`paid`, `released`), no unique key, so a second
/// effect would show.
pub async fn setup(pool: &AnyPool) -> Result<(), sqlx::Error> {
    idem::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE timeout_orders (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL,
                                      version BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE timeout_effects (order_id BIGINT NOT NULL, kind VARCHAR(16) NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Writes one effect of the order. Both values are the program's own (a number and one of
/// two words), written into the statement: no placeholder, so the same text on every
/// backend `sqlx::Any` reaches.
async fn effect(
    tx: &mut Transaction<'_, Any>,
    order_id: i64,
    kind: Effect,
) -> Result<(), sqlx::Error> {
    let kind = match kind {
        Effect::Paid => "paid",
        Effect::Released => "released",
    };
    let insert =
        format!("INSERT INTO timeout_effects (order_id, kind) VALUES ({order_id}, '{kind}')");
    sqlx::query(&insert).execute(&mut **tx).await?;
    Ok(())
}

/// An order's effect: its payment, or its stock released by its timeout.
#[derive(Clone, Copy)]
enum Effect {
    Paid,
    Released,
}

/// The id of an order's timeout message.
pub fn timeout_id(order_id: i64) -> String {
    format!("order:{order_id}:timeout")
}

impl Order {
    /// Creates the order and stages its timeout, `timeout` from now by the database's clock.
    #[idempotent(key = "order_id", create = "CREATED")]
    pub async fn open(
        tx: &mut Transaction<'_, Any>,
        order_id: i64,
        timeout: Duration,
    ) -> Result<(), sqlx::Error> {
        let message = Message::json("order.timeout", &order_id)
            .id(timeout_id(order_id))
            .deliver_after(timeout);
        outbox::stage(tx, message).await?;
        Ok(())
    }

    /// Pays the order and cancels its timeout, which is moot now (too late if it was
    /// published already: its consumer's transition refuses a paid order).
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    pub async fn pay(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<(), sqlx::Error> {
        outbox::cancel(tx, &timeout_id(order_id)).await?;
        effect(tx, order_id, Effect::Paid).await
    }
}

/// The timeout's consumer: the message recorded once (inbox) and the order cancelled if it
/// is still CREATED, its stock released.
#[idempotent(inbox = "inbox", message = "key", payload = "payload",
             machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
pub async fn expire(
    tx: &mut Transaction<'_, Any>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<(), sqlx::Error> {
    effect(tx, order_id, Effect::Released).await
}

/// A broker in the process: every message handed to the consumer twice.
#[derive(Clone)]
pub struct Channel(mpsc::UnboundedSender<Outgoing>);

impl Publisher for Channel {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        for _ in 0..2 {
            self.0
                .send(message.clone())
                .map_err(|_| PublishError::from("the consumer is gone"))?;
        }
        Ok(Published::Acked)
    }
}

/// What became of the orders.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub paid: i64,
    pub cancelled: i64,
    /// Orders with no terminal state, or whose effects do not match it (none, or two).
    pub wrong: i64,
    /// Payments that came after the timeout had cancelled the order (refused).
    pub late_payments: i64,
    /// Timeouts that came after the payment (their cancel too late): refused by the
    /// transition, acked.
    pub late_timeouts: i64,
}

/// `orders` orders, each with a timeout and a payment at random moments within `spread`;
/// returns once every order has ended and every timeout is published or cancelled.
pub async fn race(
    pool: &AnyPool,
    orders: i64,
    spread: Duration,
    seed: u64,
) -> Result<Report, Box<dyn std::error::Error + Send + Sync>> {
    let (sender, mut received) = mpsc::unbounded_channel();
    let relay = Relay::new(pool.clone(), Channel(sender))
        .poll_interval(Duration::from_millis(20))
        .spawn()?;
    let inbox = Inbox::new("timeouts")?;
    let consumer = {
        let (pool, inbox) = (pool.clone(), inbox.clone());
        tokio::spawn(async move {
            let mut late = 0;
            while let Some(message) = received.recv().await {
                let order_id: i64 = serde_json::from_slice(message.payload())?;
                let key = MessageKey::message_id(message.id())?;
                match expire(&pool, &inbox, &key, message.payload(), order_id).await? {
                    Delivery::Processed(()) | Delivery::Duplicate { .. } => {}
                    // Paid first: the timeout is moot, ack it.
                    Delivery::Refused(Refusal::IllegalState {
                        current: Order::Paid,
                        ..
                    }) => late += 1,
                    other => return Err(format!("order {order_id}: {other:?}").into()),
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(late)
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let millis = spread.as_millis() as u64;
    let mut payers = tokio::task::JoinSet::new();
    for order_id in 1..=orders {
        let timeout = Duration::from_millis(rng.random_range(0..=millis));
        let pay_at = Duration::from_millis(rng.random_range(0..=millis));
        let outcome = Order::open(pool, order_id, timeout).await?;
        if !matches!(outcome, idem::Creation::Created(())) {
            return Err(format!("order {order_id} not opened: {outcome:?}").into());
        }
        let pool = pool.clone();
        payers.spawn(async move {
            tokio::time::sleep(pay_at).await;
            Order::pay(&pool, order_id).await
        });
    }
    let mut late_payments = 0;
    while let Some(paid) = payers.join_next().await {
        match paid?? {
            Outcome::Applied(()) => {}
            Outcome::IllegalState {
                current: Order::Cancelled,
                ..
            } => late_payments += 1,
            other => return Err(format!("a payment: {other:?}").into()),
        }
    }
    // Every timeout published (and consumed) or cancelled.
    let deadline = std::time::Instant::now() + spread + Duration::from_secs(30);
    loop {
        let backlog = outbox::backlog(pool).await?;
        let created: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM timeout_orders WHERE status = 'CREATED'")
                .fetch_one(pool)
                .await?;
        if backlog.pending == 0 && created == 0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{created} orders still open, {} timeouts pending",
                backlog.pending
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The relay stopped drops its publisher: the consumer takes what is left, then ends.
    relay.stop().await;
    let late_timeouts = tokio::time::timeout(Duration::from_secs(30), consumer)
        .await
        .map_err(|_| "the consumer did not end")???;
    let count =
        |sql: &'static str| async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await };
    Ok(Report {
        paid: count("SELECT COUNT(*) FROM timeout_orders WHERE status = 'PAID'").await?,
        cancelled: count("SELECT COUNT(*) FROM timeout_orders WHERE status = 'CANCELLED'").await?,
        wrong: count(
            "SELECT COUNT(*) FROM timeout_orders o WHERE NOT (
                 (o.status = 'PAID' AND (SELECT COUNT(*) FROM timeout_effects e WHERE e.order_id = o.order_id AND e.kind = 'paid') = 1
                                    AND (SELECT COUNT(*) FROM timeout_effects e WHERE e.order_id = o.order_id AND e.kind = 'released') = 0)
              OR (o.status = 'CANCELLED' AND (SELECT COUNT(*) FROM timeout_effects e WHERE e.order_id = o.order_id AND e.kind = 'released') = 1
                                    AND (SELECT COUNT(*) FROM timeout_effects e WHERE e.order_id = o.order_id AND e.kind = 'paid') = 0))",
        )
        .await?,
        late_payments,
        late_timeouts,
    })
}
