//! The chain's consumer over NATS JetStream: each `coupon.grant` through [`app::grant`]
//! (an inbox + transition, one message per unit of work), acked after its commit.

#![allow(dead_code)]

use super::app::{self, GrantCoupon};
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::AckKind;
use futures_util::StreamExt;
use idem::inbox::Inbox;
use idem::outbox;
use std::time::Duration;

/// Consumes `coupon.grant` messages for ever: each through [`app::grant`], acked after its
/// commit (a refusal is nacked to come back). With `redeliver_first`, the first delivery of
/// every tenth order is nacked after its commit, as a lost ack would have it: the broker
/// redelivers it, and the inbox absorbs the repeat.
pub async fn consume(
    pool: sqlx::AnyPool,
    consumer: PullConsumer,
    redeliver_first: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let inbox = Inbox::new("coupons")?.lock_timeout(Duration::from_secs(2));
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        let key = outbox::nats::message_key(&message)?;
        let GrantCoupon { order_id } = serde_json::from_slice(&message.payload)?;
        let delivery = app::grant(&pool, &inbox, &key, &message.payload, order_id).await?;
        let first = message
            .info()
            .map(|info| info.delivered == 1)
            .unwrap_or(false);
        if delivery.should_ack() && !(redeliver_first && first && order_id % 10 == 0) {
            message.ack().await?;
        } else {
            message
                .ack_with(AckKind::Nak(Some(Duration::from_millis(100))))
                .await?;
        }
    }
    Ok(())
}
