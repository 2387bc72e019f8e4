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

    /// This key dated with the day (UTC) of `at`, the message's own time: `~dYYYY-MM-DD/`
    /// before the key, e.g. `~d2026-12-05/order:42:paid`.
    ///
    /// For an inbox table partitioned by day ([`partitions`](crate::inbox::partitions)):
    /// the day names the partition the record lives in and is dropped with. It must be the
    /// same on every delivery of the message, producer retries included, so take it from
    /// the message itself (the event's time, the time the producer first sent it), never
    /// from the moment of a delivery. `Err` if the dated key is longer than 255 bytes.
    pub fn dated(&self, at: std::time::SystemTime) -> Result<MessageKey, KeyError> {
        let millis = match at.duration_since(std::time::UNIX_EPOCH) {
            Ok(since) => since.as_millis() as i64,
            Err(before) => -(before.duration().as_millis() as i64),
        };
        let day = crate::inbox::partitions::day_of(millis.div_euclid(86_400_000));
        MessageKey::new(format!(
            "{}{}",
            idem_sql::partition::day_prefix(&day),
            self.0
        ))
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

    #[test]
    fn a_dated_key_starts_with_its_day_in_utc() {
        use std::time::{Duration, UNIX_EPOCH};
        let key = MessageKey::business("order:42", "paid").unwrap();
        // 2026-12-05T23:59:59.999Z and a millisecond later.
        let late = UNIX_EPOCH + Duration::from_millis(1_796_515_199_999);
        assert_eq!(
            key.dated(late).unwrap().as_str(),
            "~d2026-12-05/order:42:paid"
        );
        let next = late + Duration::from_millis(1);
        assert_eq!(
            key.dated(next).unwrap().as_str(),
            "~d2026-12-06/order:42:paid"
        );
        assert_eq!(
            key.dated(UNIX_EPOCH - Duration::from_millis(1))
                .unwrap()
                .as_str(),
            "~d1969-12-31/order:42:paid"
        );
        assert!(
            MessageKey::new("x".repeat(250))
                .unwrap()
                .dated(late)
                .is_err()
        );
    }
}
