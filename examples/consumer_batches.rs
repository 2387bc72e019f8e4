//! A NATS JetStream consumer that takes its messages in batches: each fetch of up to 100
//! messages (waiting at most 200 ms for them) is one `Inbox::batch`, one transaction and one
//! commit, every message still applied once, and each acked only after that commit.
//!
//! A producer publishes five payments, retrying two of them (eight publications, so the
//! first fetch holds copies of the same message); the handler books each payment in the
//! ledger. A message with a negative amount is refused by the handler every time: it is
//! nacked, redelivered, and parked as dead after its third attempt, without holding back
//! the messages fetched with it.
//!
//! ```text
//! cargo run -p idem --example consumer_batches                        # nats://127.0.0.1:4222, SQLite temp file
//! cargo run -p idem --example consumer_batches -- NATS_URL DATABASE_URL
//! ```
//!
//! The server needs JetStream (`nats-server -js`). Environment: `NATS_URL`,
//! `DATABASE_URL` (an SQLite URL).

#[path = "support/ledger.rs"]
mod ledger;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::{self, Message, stream};
use futures_util::StreamExt;
use idem::inbox::{Delivery, Inbox, Incoming, MessageKey, settles_with_ack};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const STREAM: &str = "IDEM_EXAMPLE_BATCHES";

#[derive(Serialize, Deserialize)]
struct Payment {
    order_id: i64,
    amount: i64,
}

/// A fetched message with its key: what `Inbox::batch` takes, the ack handle kept.
struct Fetched {
    key: MessageKey,
    payment: Payment,
    message: Message,
}

impl Incoming for Fetched {
    fn key(&self) -> &MessageKey {
        &self.key
    }

    fn payload(&self) -> &[u8] {
        &self.message.payload
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
    let nats_url = arg(1, "NATS_URL").unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let pool = ledger::database(arg(2, "DATABASE_URL"), "idem-consumer-batches.db").await?;

    let js = jetstream::new(async_nats::connect(&nats_url).await?);
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["idem.example.batches".into()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(10),
            ..Default::default()
        })
        .await?;

    // Orders 2 and 4 are published again, as a producer retrying after a lost publish ack
    // would; order 6 carries an amount the handler refuses.
    for order_id in [1, 2, 2, 3, 4, 4, 5, 6] {
        let amount = if order_id == 6 { -1 } else { 100 * order_id };
        let payment = serde_json::to_vec(&Payment { order_id, amount })?;
        js.publish("idem.example.batches", payment.into())
            .await?
            .await?;
    }

    let inbox = Inbox::new("billing")?.max_attempts(3);
    loop {
        // A batch: at most 100 messages, waiting at most 200 ms for them.
        let mut fetch = consumer
            .fetch()
            .max_messages(100)
            .expires(Duration::from_millis(200))
            .messages()
            .await?;
        let mut batch = Vec::new();
        while let Some(message) = fetch.next().await {
            let message = message?;
            let payment: Payment = serde_json::from_slice(&message.payload)?;
            let key = MessageKey::business(format!("order:{}", payment.order_id), "paid")?;
            batch.push(Fetched {
                key,
                payment,
                message,
            });
        }
        if batch.is_empty() {
            let info = consumer.clone().info().await?.clone();
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                break;
            }
            continue; // a nacked message, redelivered after its delay
        }
        // One transaction for the whole batch; the handler runs once per message to apply.
        let settled = inbox
            .batch(&pool, &batch, |tx, fetched| {
                Box::pin(async move {
                    let Payment { order_id, amount } = fetched.payment;
                    if amount < 0 {
                        return Err(format!("order {order_id}: a negative amount"));
                    }
                    sqlx::query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)")
                        .bind(order_id)
                        .bind(amount)
                        .execute(&mut **tx)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(order_id)
                })
            })
            .await?;
        // Acks only now, after the batch's commit.
        for (fetched, settled) in batch.iter().zip(&settled) {
            match settled {
                Ok(Delivery::Dead { attempts, .. }) => {
                    println!("{}: parked after {attempts} attempts", fetched.key)
                }
                Ok(delivery) => println!("{}: {}", fetched.key, delivery.kind()),
                Err(idem::Error::Handler(e)) => println!("{}: failed ({e}), nacked", fetched.key),
                Err(e) => println!("{}: {e}, nacked", fetched.key),
            }
            if settles_with_ack(settled) {
                fetched.message.ack().await?;
            } else {
                let later = AckKind::Nak(Some(Duration::from_millis(100)));
                fetched.message.ack_with(later).await?;
            }
        }
    }

    let (rows, total) = ledger::summary(&pool, &inbox).await?;
    js.delete_stream(STREAM).await?;
    assert_eq!(
        (rows, total),
        (5, 1500),
        "every payment booked exactly once"
    );
    assert_eq!(inbox.counters().dead, 1, "the refused payment parked");
    Ok(())
}
