//! A RabbitMQ consumer whose effects happen exactly once, however often a message is
//! delivered.
//!
//! A producer publishes five payments, retrying two of them (eight publications, each
//! retry with the message id of its first attempt); the consumer runs each delivery
//! through an idem inbox, writing the effect (a ledger row) in the transaction that
//! records the message, and acks only after that commit.
//!
//! ```text
//! cargo run -p idem --example consumer_rabbitmq                     # amqp://127.0.0.1:5672, SQLite temp file
//! cargo run -p idem --example consumer_rabbitmq -- AMQP_URL DATABASE_URL
//! ```
//!
//! Environment: `AMQP_URL`, `DATABASE_URL` (an SQLite URL).

#[path = "support/ledger.rs"]
mod ledger;

use futures_util::StreamExt;
use idem::inbox::{Inbox, MessageKey, Received};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::time::Duration;

const QUEUE: &str = "idem-example-payments";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |n: usize, var: &str| std::env::args().nth(n).or_else(|| std::env::var(var).ok());
    let amqp_url =
        arg(1, "AMQP_URL").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());

    // The database: idem's tables, and the ledger the handler appends to. An INSERT is not
    // idempotent by itself: a second delivery would book the payment twice.
    let pool = ledger::database(arg(2, "DATABASE_URL"), "idem-consumer-rabbitmq.db").await?;

    // The broker: a fresh queue.
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let _ = channel
        .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
        .await;
    channel
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;

    // The producer: orders 2 and 4 are published again, as a producer retrying after a
    // lost confirm would, under the message id it gave the first attempt.
    for order_id in [1, 2, 2, 3, 4, 4, 4, 5] {
        let properties = BasicProperties::default()
            .with_message_id(format!("payment-{order_id}").into())
            .with_delivery_mode(2); // persistent
        let body = format!("{{\"order_id\":{order_id},\"amount\":{}}}", 100 * order_id);
        let options = BasicPublishOptions::default();
        let confirm = channel.basic_publish(
            "".into(),
            QUEUE.into(),
            options,
            body.as_bytes(),
            properties,
        );
        confirm.await?.await?; // the broker has it
    }

    // The consumer. A lock timeout turns a delivery that would wait for another delivery of
    // the same message (on another instance) into `InProgress`, requeued after a delay.
    let inbox = Inbox::new("billing")?.lock_timeout(Duration::from_secs(2));
    channel.basic_qos(10, BasicQosOptions::default()).await?;
    let options = BasicConsumeOptions::default();
    let mut deliveries = channel
        .basic_consume(
            QUEUE.into(),
            "billing".into(),
            options,
            FieldTable::default(),
        )
        .await?;
    // Until the queue has been idle for a second.
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(1), deliveries.next()).await
    {
        let message = message?;
        // The producer's message id: set once, reused by every retry.
        let id = message
            .properties
            .message_id()
            .clone()
            .ok_or("a message without an id")?;
        let key = MessageKey::message_id(id.as_str())?;
        let payment: serde_json::Value = serde_json::from_slice(&message.data)?;
        let delivery = match inbox.receive::<_, i64>(&pool, &key, &message.data).await? {
            Received::New(mut receipt) => {
                // The effect, in the transaction that records the message.
                let booked = sqlx::query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)")
                    .bind(payment["order_id"].as_i64())
                    .bind(payment["amount"].as_i64())
                    .execute(&mut **receipt.transaction())
                    .await
                    .map(|done| done.last_insert_rowid());
                receipt.finish(booked).await?
            }
            Received::Done(delivery) => delivery,
        };
        println!("{key} (redelivered: {}): {delivery:?}", message.redelivered);
        // Ack only now, after the commit; a crash before this line requeues the message,
        // and the inbox absorbs it.
        if delivery.should_ack() {
            message.ack(BasicAckOptions::default()).await?;
        } else {
            // RabbitMQ has no delayed requeue: wait, then nack.
            tokio::time::sleep(Duration::from_secs(1)).await;
            message
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await?;
        }
    }

    let (rows, total) = ledger::summary(&pool, &inbox).await?;
    channel
        .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
        .await?;
    connection.close(200, "done".into()).await?;
    assert_eq!(
        (rows, total),
        (5, 1500),
        "every payment booked exactly once"
    );
    Ok(())
}
