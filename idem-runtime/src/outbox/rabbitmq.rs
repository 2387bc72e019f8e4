//! RabbitMQ (feature `rabbitmq`, on `lapin`): a [`Publisher`] with publisher confirms, the
//! id in the AMQP `message_id`, and an unroutable message a failure; and the consuming
//! side's [`message_key`].

use super::{IncomingKeyError, Outgoing, PublishError, Published, Publisher};
use crate::inbox::MessageKey;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Mutex;

/// Publishes to RabbitMQ with publisher confirms: to the message's exchange with its
/// routing key, persistent (`delivery_mode` 2), `mandatory` (a message no queue takes comes
/// back, and counts as a failed attempt: it would be lost otherwise), with its id as
/// `message_id` and its headers as AMQP headers. It counts as published on the broker's
/// confirm; a nack is a failed attempt.
///
/// It opens a channel in confirm mode **per exchange**, on the connection it is given, and
/// opens it again when the broker closed it: a message to an exchange that does not exist
/// (the broker closes the channel with 404) fails its own attempts and nothing else, and
/// the next message to a good exchange is published as ever. Made with
/// [`connect`](Self::connect), it also connects again when the connection was lost.
///
/// [`JetStream`](super::nats::JetStream)'s broker drops a re-published id; RabbitMQ keeps
/// both copies, and the next hop's inbox absorbs the second ([`message_key`]).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let rabbit = idem::outbox::rabbitmq::Rabbit::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let relay = idem::outbox::Relay::new(pool, rabbit).spawn()?;
/// # relay.stop().await; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Rabbit {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where to connect again, when the publisher made its connection.
    uri: Option<String>,
    connection: Mutex<Arc<Connection>>,
    /// The open channel of each exchange.
    channels: Mutex<HashMap<String, Channel>>,
}

impl std::fmt::Debug for Rabbit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rabbit").finish_non_exhaustive()
    }
}

impl Rabbit {
    /// A publisher on `connection` (a `lapin::Connection`, or an `Arc` of one shared with
    /// the rest of the program). Its channels are its own; a lost connection is not made
    /// again (see [`connect`](Self::connect)): each publish fails until it is back.
    pub fn new(connection: impl Into<Arc<Connection>>) -> Rabbit {
        Rabbit::with(None, connection.into())
    }

    /// A publisher on a connection of its own to `uri`, made again whenever it is lost.
    pub async fn connect(uri: &str) -> Result<Rabbit, lapin::Error> {
        let connection = Connection::connect(uri, ConnectionProperties::default()).await?;
        Ok(Rabbit::with(Some(uri.to_owned()), Arc::new(connection)))
    }

    fn with(uri: Option<String>, connection: Arc<Connection>) -> Rabbit {
        Rabbit {
            inner: Arc::new(Inner {
                uri,
                connection: Mutex::new(connection),
                channels: Mutex::default(),
            }),
        }
    }

    /// The open channel in confirm mode for `exchange`: the one it had, or a new one.
    async fn channel(&self, exchange: &str) -> Result<Channel, PublishError> {
        let mut channels = self.inner.channels.lock().await;
        if let Some(channel) = channels.get(exchange)
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connection = self.connection().await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channels.insert(exchange.to_owned(), channel.clone());
        Ok(channel)
    }

    /// The connection, made again if it was lost and the publisher knows where to.
    async fn connection(&self) -> Result<Arc<Connection>, PublishError> {
        let mut connection = self.inner.connection.lock().await;
        if !connection.status().connected()
            && let Some(uri) = &self.inner.uri
        {
            *connection =
                Arc::new(Connection::connect(uri, ConnectionProperties::default()).await?);
        }
        Ok(connection.clone())
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
        let channel = self.channel(message.destination()).await?;
        let confirmation = channel
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
            // Every channel of its own is in confirm mode.
            Confirmation::NotRequested => Err("the channel is not in confirm mode".into()),
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
