//! NATS JetStream (feature `nats`): a [`Publisher`] that publishes each message with its id
//! in `Nats-Msg-Id` and waits for the stream's acknowledgement, and the consuming side's
//! [`message_key`].

use super::{ID_HEADER, IncomingKeyError, Outgoing, PublishError, Published, Publisher};
use crate::inbox::MessageKey;
use async_nats::jetstream::Context;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use std::str::FromStr;

/// Publishes to JetStream: the subject is the message's destination, its id goes in
/// `Nats-Msg-Id` (so the stream drops a re-publish inside its duplicate window), its headers
/// go along, and it counts as published once the stream's PubAck arrives (a PubAck marked
/// `duplicate` too: the stream had it already). A subject no stream captures has no
/// PubAck: the publish fails ("no responders") and is tried again later. A header NATS
/// cannot carry (a name with `:` or a control character, a value with a line break: a row
/// written outside [`stage`](super::stage)) fails the attempt, naming it.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = idem::outbox::nats::JetStream::new(async_nats::jetstream::new(client));
/// let relay = idem::outbox::Relay::new(pool, publisher).spawn()?;
/// # relay.stop().await; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct JetStream {
    context: Context,
}

impl JetStream {
    /// A publisher on `context`.
    pub fn new(context: Context) -> JetStream {
        JetStream { context }
    }
}

impl Publisher for JetStream {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        let mut headers = HeaderMap::new();
        for (name, value) in message.headers() {
            // Checked here, not by async-nats's conversions, which panic: a row written by
            // hand may hold anything, and it is one failed attempt.
            let name = HeaderName::from_str(name)
                .map_err(|e| format!("its header name {name:?} is not a NATS header's: {e}"))?;
            let value = HeaderValue::from_str(value)
                .map_err(|e| format!("its header {name} has a value NATS refuses: {e}"))?;
            headers.append(name, value);
        }
        headers.insert(ID_HEADER, message.id());
        let ack = self
            .context
            .publish_with_headers(
                message.destination().to_owned(),
                headers,
                message.payload().to_vec().into(),
            )
            .await?
            .await?;
        Ok(if ack.duplicate {
            Published::Duplicate
        } else {
            Published::Acked
        })
    }
}

/// The id a relay published `message` under (its `Nats-Msg-Id`), as the next hop's inbox
/// key: `inbox.receive(&pool, &idem::outbox::nats::message_key(&message)?, &message.payload)`.
pub fn message_key(message: &async_nats::Message) -> Result<MessageKey, IncomingKeyError> {
    let id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(ID_HEADER))
        .ok_or(IncomingKeyError::Missing)?;
    MessageKey::message_id(id.as_str()).map_err(IncomingKeyError::Invalid)
}
