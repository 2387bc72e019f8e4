//! RabbitMQ (feature `rabbitmq`, on `lapin`): a [`Publisher`] with publisher confirms, the
//! id in the AMQP `message_id`, and an unroutable message a failure; and the consuming
//! side's [`message_key`].

use super::{IncomingKeyError, Outgoing, PublishError, Published, Publisher};
use crate::inbox::MessageKey;
use lapin::Confirmation;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel};

/// Publishes to RabbitMQ on a channel in confirm mode: to the message's exchange with its
/// routing key, persistent (`delivery_mode` 2), `mandatory` (a message no queue takes comes
/// back, and counts as a failed attempt: it would be lost otherwise), with its id as
/// `message_id` and its headers as AMQP headers. It counts as published on the broker's
/// confirm; a nack is a failed attempt.
///
/// [`JetStream`](super::nats::JetStream)'s broker drops a re-published id; RabbitMQ keeps
/// both copies, and the next hop's inbox absorbs the second ([`message_key`]).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use lapin::{Connection, ConnectionProperties, options::ConfirmSelectOptions};
/// let connection =
///     Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", ConnectionProperties::default())
///         .await?;
/// let channel = connection.create_channel().await?;
/// channel.confirm_select(ConfirmSelectOptions::default()).await?;
/// let relay = idem::outbox::Relay::new(pool, idem::outbox::rabbitmq::Rabbit::new(channel)).spawn()?;
/// # relay.stop().await; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Rabbit {
    channel: Channel,
}

impl Rabbit {
    /// A publisher on `channel`, which must be in confirm mode (`confirm_select`): without
    /// confirms no publish is ever acknowledged, and each counts as failed.
    pub fn new(channel: Channel) -> Rabbit {
        Rabbit { channel }
    }
}

impl Publisher for Rabbit {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        let mut headers = FieldTable::default();
        for (name, value) in message.headers() {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(message.id().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmation = self
            .channel
            .basic_publish(
                message.destination().into(),
                message.routing_key().into(),
                options,
                message.payload(),
                properties,
            )
            .await?
            .await?;
        match confirmation {
            Confirmation::Ack(None) => Ok(Published::Acked),
            Confirmation::Ack(Some(returned)) => Err(format!(
                "unroutable: no queue is bound to exchange {:?} with routing key {:?} ({} {})",
                message.destination(),
                message.routing_key(),
                returned.reply_code,
                returned.reply_text
            )
            .into()),
            Confirmation::Nack(_) => Err("the broker nacked the message".into()),
            Confirmation::NotRequested => Err(
                "the channel is not in confirm mode: call confirm_select on it before Rabbit::new"
                    .into(),
            ),
        }
    }
}

/// The id a relay published `delivery` under (its AMQP `message_id`), as the next hop's
/// inbox key: `inbox.receive(&pool, &idem::outbox::rabbitmq::message_key(&delivery)?, &delivery.data)`.
pub fn message_key(delivery: &lapin::message::Delivery) -> Result<MessageKey, IncomingKeyError> {
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .ok_or(IncomingKeyError::Missing)?;
    MessageKey::message_id(id.as_str()).map_err(IncomingKeyError::Invalid)
}
