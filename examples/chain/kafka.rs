//! The chain's consumer over Kafka: a member of a consumer group whose rounds run each
//! partition's `coupon.grant` messages as one inbox batch, each through the transition
//! [`Order::reward`](app::Order::reward), and commit the partition's offset only after the
//! database committed them.

#![allow(dead_code)]

use super::app::{GrantCoupon, Order};
use idem::Outcome;
use idem::inbox::kafka::KafkaConsumer;
use idem::inbox::{Inbox, not_yet};
use rdkafka::Message as _;
use std::time::Duration;

/// The consumer group's settings: cooperative-sticky assignment (a member that joins or
/// leaves moves only the partitions that change hands), and a session of 6 s, so a member
/// that died hands its partitions over quickly.
pub fn member(bootstrap_servers: &str, group: &str) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", group)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

/// Consumes `topic` for ever as a member of `group`. A round that fails (the database or
/// the broker away) is read again from its first message.
pub async fn consume(
    pool: sqlx::AnyPool,
    bootstrap_servers: &str,
    group: &str,
    topic: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let inbox = Inbox::new("coupons")?.lock_timeout(Duration::from_secs(2));
    let consumer = KafkaConsumer::new(member(bootstrap_servers, group), &[topic], inbox)?
        .batch(50, Duration::from_millis(50));
    loop {
        let round = consumer
            .next(&pool, |tx, record| {
                Box::pin(async move {
                    let payload = record.message().payload().unwrap_or_default();
                    let GrantCoupon { order_id } =
                        serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                    match Order::reward(tx, order_id)
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        // Rewarded now, or already (a copy under another id): done either way.
                        Outcome::Applied(()) | Outcome::AlreadyDone { .. } => Ok(()),
                        // Not paid yet (it cannot be here: the payment stages the grant):
                        // read again later, no attempt spent, the partition held at it.
                        Outcome::NotYet { current, .. } => Err(not_yet(format!(
                            "order {order_id} is {current:?}, not paid yet"
                        ))),
                        // Failed: read again, parked after the inbox's attempts.
                        other => Err(format!("order {order_id} cannot be rewarded: {other:?}")),
                    }
                })
            })
            .await;
        if let Err(e) = round {
            eprintln!("chain consumer: {e}; reading the round again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
