//! Message keys: what makes two deliveries "the same message".

use crate::value::key::{KeyError, valid_text};
use core::fmt;

/// The key under which the inbox records a message, unique within a consumer group.
///
/// It must be the same on every delivery of the same message, retries, redeliveries and
/// replays included. Pick, in order of preference:
///
/// - a **business key** ([`MessageKey::business`]): the entity and the event, e.g.
///   `order:42:paid`. It survives replays and backfills that mint new message ids.
/// - the broker's or producer's **message id** ([`MessageKey::message_id`]), if the producer
///   sets it once and every retry reuses it.
/// - for the parts of a message you split, a **child key** ([`MessageKey::child`]): the
///   parent's key and the part's position, so every redelivery splits the same way.
///
/// Never a fresh random id per delivery (a new UUID in the consumer, a broker's delivery
/// tag): every redelivery would then look new, and the inbox would apply each one.
///
/// Keys are 1 to 255 bytes without control characters; hash longer identifiers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageKey(String);

impl MessageKey {
    /// A key taken as is.
    pub fn new(key: impl Into<String>) -> Result<MessageKey, KeyError> {
        valid_text(key.into()).map(MessageKey)
    }

    /// The message id the producer assigned once, reused by its retries.
    pub fn message_id(id: impl Into<String>) -> Result<MessageKey, KeyError> {
        MessageKey::new(id)
    }

    /// A business key: `entity:event`, e.g. `MessageKey::business("order:42", "paid")`.
    pub fn business(
        entity: impl fmt::Display,
        event: impl fmt::Display,
    ) -> Result<MessageKey, KeyError> {
        MessageKey::new(format!("{entity}:{event}"))
    }

    /// The key of part `position` of this message, split deterministically: `parent#position`.
    pub fn child(&self, position: usize) -> Result<MessageKey, KeyError> {
        MessageKey::new(format!("{}#{position}", self.0))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parameter usable as the `message = "…"` of an `#[idempotent]` message handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message key",
    label = "`message = \"…\"` names this parameter",
    note = "give the parameter the type `&idem::inbox::MessageKey` (or `MessageKey`); build it with `MessageKey::business`, `MessageKey::message_id` or `MessageKey::child`"
)]
pub trait AsMessageKey {
    /// The key.
    fn as_message_key(&self) -> &MessageKey;
}

impl AsMessageKey for MessageKey {
    fn as_message_key(&self) -> &MessageKey {
        self
    }
}

impl<T: AsMessageKey + ?Sized> AsMessageKey for &T {
    fn as_message_key(&self) -> &MessageKey {
        (**self).as_message_key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deterministic_and_bounded() {
        let parent = MessageKey::business("order:42", "paid").unwrap();
        assert_eq!(parent.as_str(), "order:42:paid");
        assert_eq!(parent.child(3).unwrap().as_str(), "order:42:paid#3");
        assert_eq!(parent.child(3), parent.child(3));
        assert_eq!(MessageKey::new(""), Err(KeyError::Empty));
        assert!(MessageKey::message_id("x".repeat(256)).is_err());
        assert!(MessageKey::new("a\u{0}b").is_err());
    }
}
