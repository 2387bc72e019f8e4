//! A NATS JetStream consumer whose effects happen exactly once, however often a message
//! is delivered.
//!
//! A producer publishes five payments, retrying two of them (eight publications); the
//! consumer runs each delivery through an idem inbox, writing the effect (a ledger row)
//! in the transaction that records the message, and acks only after that commit.
//!
//! ```text
//! cargo run -p idem --example consumer_nats                         # nats://127.0.0.1:4222, SQLite temp file
//! cargo run -p idem --example consumer_nats -- NATS_URL DATABASE_URL
//! ```
//!
//! The server needs JetStream (`nats-server -js`). Environment: `NATS_URL`,
//! `DATABASE_URL` (an SQLite URL).

#[path = "support/ledger.rs"]
mod ledger;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use idem::inbox::{Inbox, MessageKey, Received};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const STREAM: &str = "IDEM_EXAMPLE_PAYMENTS";

#[derive(Serialize, Deserialize)]
struct Payment {
    order_id: i64,
    amount: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
    let nats_url = arg(1, "NATS_URL").unwrap_or_else(|| "nats://127.0.0.1:4222".into());

    // The database: idem's tables, and the ledger the handler appends to. An INSERT is not
    // idempotent by itself: a second delivery would book the payment twice.
    let pool = ledger::database(arg(2, "DATABASE_URL"), "idem-consumer-nats.db").await?;

    // The broker: a fresh stream and a durable pull consumer.
    let js = jetstream::new(async_nats::connect(&nats_url).await?);
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["idem.example.payments".into()],
            ..Default::default()
        })
        .await?;
    let mut consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(10),
            ..Default::default()
        })
        .await?;

    // The producer: orders 2 and 4 are published again, as a producer retrying after a
    // lost publish ack would. Each retry carries the same payment.
    for order_id in [1, 2, 2, 3, 4, 4, 4, 5] {
        let payment = serde_json::to_vec(&Payment {
            order_id,
            amount: 100 * order_id,
        })?;
        js.publish("idem.example.payments", payment.into())
            .await?
            .await?;
    }

    // The consumer. A lock timeout turns a delivery that would wait for another delivery of
    // the same message (on another instance) into `InProgress`, nacked with a delay.
    let inbox = Inbox::new("billing")?.lock_timeout(Duration::from_secs(2));
    loop {
        let mut batch = consumer.fetch().max_messages(100).messages().await?;
        let mut fetched = 0;
        while let Some(message) = batch.next().await {
            let message = message?;
            fetched += 1;
            let payment: Payment = serde_json::from_slice(&message.payload)?;
            // A business key: the same for every retry and every replay of this event.
            let key = MessageKey::business(format!("order:{}", payment.order_id), "paid")?;
            let delivery = match inbox
                .receive::<_, i64>(&pool, &key, &message.payload)
                .await?
            {
                Received::New(mut receipt) => {
                    // The effect, in the transaction that records the message.
                    let booked =
                        sqlx::query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)")
                            .bind(payment.order_id)
                            .bind(payment.amount)
                            .execute(&mut **receipt.transaction())
                            .await
                            .map(|done| done.last_insert_rowid());
                    receipt.finish(booked).await?
                }
                Received::Done(delivery) => delivery,
            };
            println!("{key}: {delivery:?}");
            // Ack only now, after the commit; a crash before this line redelivers the
            // message, and the inbox absorbs it.
            if delivery.should_ack() {
                message.ack().await?;
            } else {
                message
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await?;
            }
        }
        // Done when nothing was fetched and nothing waits for an ack or a redelivery.
        if fetched == 0 {
            let info = consumer.info().await?;
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await; // a nacked message, later
        }
    }

    let (rows, total) = ledger::summary(&pool, &inbox).await?;
    js.delete_stream(STREAM).await?;
    assert_eq!(
        (rows, total),
        (5, 1500),
        "every payment booked exactly once"
    );
    Ok(())
}
