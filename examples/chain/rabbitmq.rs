//! The chain's consumer over RabbitMQ: each `coupon.grant` delivery through [`app::grant`]
//! (an inbox + transition, one message per unit of work), acked after its commit.

#![allow(dead_code)]

use super::app::{self, GrantCoupon};
use futures_util::StreamExt;
use idem::inbox::Inbox;
use idem::outbox;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use std::time::Duration;

/// Declares where the coupons go: a durable fanout exchange `name` (the relay publishes to
/// the subject `name`, an exchange) and the durable queue `name` bound to it.
pub async fn declare(channel: &lapin::Channel, name: &str) -> Result<(), lapin::Error> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            name.into(),
            lapin::ExchangeKind::Fanout,
            durable,
            FieldTable::default(),
        )
        .await?;
    bind_queue(channel, name, name).await
}

/// Declares the durable queue `queue` and binds it to the exchange `exchange`.
pub async fn bind_queue(
    channel: &lapin::Channel,
    exchange: &str,
    queue: &str,
) -> Result<(), lapin::Error> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// Consumes the queue `queue` for ever: each delivery through [`app::grant`], acked after
/// its commit (a refusal, or a message another delivery holds, is nacked to come back).
/// With `redeliver_first`, the first delivery of every tenth order is nacked after its
/// commit, as a lost ack would have it: the broker redelivers it, and the inbox absorbs the
/// repeat.
pub async fn consume(
    pool: sqlx::AnyPool,
    connection: &lapin::Connection,
    queue: &str,
    redeliver_first: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let inbox = Inbox::new("coupons")?.lock_timeout(Duration::from_secs(2));
    let channel = connection.create_channel().await?;
    channel.basic_qos(16, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "coupons".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let requeue = BasicNackOptions {
        requeue: true,
        ..Default::default()
    };
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let key = outbox::rabbitmq::message_key(&delivery)?;
        let GrantCoupon { order_id } = serde_json::from_slice(&delivery.data)?;
        let outcome = app::grant(&pool, &inbox, &key, &delivery.data, order_id).await?;
        if !outcome.should_ack() {
            // Back to the queue after a pause: it comes again.
            tokio::time::sleep(Duration::from_millis(100)).await;
            delivery.nack(requeue).await?;
        } else if redeliver_first && !delivery.redelivered && order_id % 10 == 0 {
            delivery.nack(requeue).await?;
        } else {
            delivery.ack(BasicAckOptions::default()).await?;
        }
    }
    Ok(())
}
