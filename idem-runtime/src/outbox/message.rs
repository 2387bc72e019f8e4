//! A message to stage: where it goes, what it carries, and what orders it.

use super::OutboxError;
use serde::Serialize;
use std::fmt;

/// The longest ordering key, in bytes (the column's size on MySQL).
pub const MAX_ORDERING_KEY_LEN: usize = 255;

/// The largest payload a message may carry, in bytes (8 MiB: under MariaDB's default
/// `max_allowed_packet` of 16 MiB, and far above what brokers take by default — NATS 1 MiB).
pub const MAX_PAYLOAD_LEN: usize = 8 * 1024 * 1024;

/// The longest id, destination, routing key or header name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The most a message's headers may take together, names and values, in bytes (64 KiB: a
/// header is metadata; NATS and RabbitMQ frame them with the payload, and a table row on
/// MariaDB must fit `max_allowed_packet`).
pub const MAX_HEADERS_LEN: usize = 64 * 1024;

/// Where a message goes: a subject (NATS), or an exchange and a routing key (AMQP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub(crate) name: String,
    pub(crate) routing_key: String,
}

impl Destination {
    /// A subject (NATS JetStream publishes to it; its stream must capture it).
    pub fn subject(subject: impl Into<String>) -> Destination {
        Destination {
            name: subject.into(),
            routing_key: String::new(),
        }
    }

    /// An exchange and a routing key (RabbitMQ; `""` is the default exchange, whose routing
    /// key is the queue's name).
    pub fn exchange(exchange: impl Into<String>, routing_key: impl Into<String>) -> Destination {
        Destination {
            name: exchange.into(),
            routing_key: routing_key.into(),
        }
    }

    /// The subject or the exchange.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The routing key (empty for a subject).
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }
}

/// A subject.
impl From<&str> for Destination {
    fn from(subject: &str) -> Destination {
        Destination::subject(subject)
    }
}

/// A subject.
impl From<String> for Destination {
    fn from(subject: String) -> Destination {
        Destination::subject(subject)
    }
}

/// The longest delay [`Message::deliver_after`] takes: 100 years, in milliseconds (the
/// database adds it to its now, in a 64-bit integer).
const MAX_DELAY_MILLIS: i64 = 100 * 366 * 24 * 3600 * 1000;

/// When a delayed message is due ([`Message::deliver_at`], [`Message::deliver_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// At this time, milliseconds since the epoch.
    At(i64),
    /// This many milliseconds after the staging statement's now.
    After(i64),
}

/// A message to stage with [`stage`](super::stage): built with [`Message::json`] or
/// [`Message::bytes`], then given headers, an ordering key or an id of its own.
///
/// ```
/// use idem::outbox::{Destination, Message};
///
/// #[derive(serde::Serialize)]
/// struct GrantCoupon { order_id: i64 }
///
/// let message = Message::json("coupon.grant", &GrantCoupon { order_id: 7 })
///     .header("content-type", "application/json");
/// let routed = Message::bytes(Destination::exchange("coupons", "grant"), b"7".to_vec());
/// # let _ = (message, routed);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    pub(crate) destination: Destination,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) id: Option<String>,
    /// When it is due, if delayed.
    pub(crate) due: Option<Due>,
    /// A problem found while building it, reported when it is staged.
    pub(crate) invalid: Option<String>,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("destination", &self.destination)
            .field("payload_len", &self.payload.len())
            .field("headers", &self.headers)
            .field("ordering_key", &self.ordering_key)
            .field("id", &self.id)
            .field("due", &self.due)
            .finish_non_exhaustive()
    }
}

impl Message {
    /// A message whose payload is `payload` as JSON. A value that does not serialize is
    /// reported when the message is staged.
    pub fn json<T: Serialize + ?Sized>(
        destination: impl Into<Destination>,
        payload: &T,
    ) -> Message {
        let (payload, invalid) = match serde_json::to_vec(payload) {
            Ok(json) => (json, None),
            Err(e) => (
                Vec::new(),
                Some(format!("its payload does not serialize: {e}")),
            ),
        };
        Message {
            invalid,
            ..Message::bytes(destination, payload)
        }
    }

    /// A message whose payload is `payload`, as it is.
    pub fn bytes(destination: impl Into<Destination>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            destination: destination.into(),
            payload: payload.into(),
            headers: Vec::new(),
            ordering_key: None,
            id: None,
            due: None,
            invalid: None,
        }
    }

    /// Adds a header (NATS headers, AMQP headers). Names are visible ASCII without `:`, at
    /// most 255 bytes; values hold no line break nor another control character but a tab;
    /// all the headers together take at most [`MAX_HEADERS_LEN`]. `Nats-Msg-Id` is the
    /// relay's to set.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The key whose messages are published in the order they were staged (at most 255
    /// bytes, no control character). By default the handler's: `machine/key` for a transition or a creation,
    /// `group/key` for an inbox handler or an HTTP request.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Message {
        self.ordering_key = Some(key.into());
        self
    }

    /// The message's id, instead of the one derived from the handler's effect: for code
    /// that stages outside a handler (it must then give one), or ids of your own scheme.
    /// At most 255 bytes, no control characters. Staging an id that is in the outbox
    /// already stages nothing.
    pub fn id(mut self, id: impl Into<String>) -> Message {
        self.id = Some(id.into());
        self
    }

    /// Publishes it at `at` (by the database's clock, not this machine's), not before: a
    /// timeout ("cancel the order if still unpaid at …"), a reminder. An instant already
    /// past is due at once. Until it is due it holds back nothing: the messages staged after
    /// it under its ordering key go on, and it takes its place in its key's order when it
    /// is due (a message that failed holds its key back through its retries, as ever). A
    /// spawned relay publishes it then: idle, it sleeps until the next message comes due,
    /// by the database's clock, if that is before its poll interval ends. Cancel it before
    /// then with [`cancel`](super::cancel).
    ///
    /// ```
    /// use idem::outbox::Message;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let reminder = Message::json("orders.reminder", &7)
    ///     .deliver_at(SystemTime::now() + Duration::from_secs(24 * 3600));
    /// # let _ = reminder;
    /// ```
    pub fn deliver_at(mut self, at: std::time::SystemTime) -> Message {
        let millis = match at.duration_since(std::time::UNIX_EPOCH) {
            // Due times are whole milliseconds: rounded up, never before `at`.
            Ok(since) => crate::inbox::millis_up(since),
            // Before the epoch: past, due at once.
            Err(_) => 0,
        };
        self.due = Some(Due::At(millis));
        self
    }

    /// Publishes it `delay` after it is staged, by the database's clock (the staging
    /// statement's now plus `delay`): see [`deliver_at`](Self::deliver_at). A delay over
    /// 100 years is refused when it is staged.
    ///
    /// ```
    /// use idem::outbox::Message;
    /// use std::time::Duration;
    ///
    /// // Staged with the order's creation: the order is cancelled if still unpaid then.
    /// let timeout = Message::json("order.timeout", &7).deliver_after(Duration::from_secs(30 * 60));
    /// # let _ = timeout;
    /// ```
    pub fn deliver_after(mut self, delay: std::time::Duration) -> Message {
        // Rounded up to whole milliseconds, as a due time is.
        let millis = crate::inbox::millis_up(delay);
        self.due = Some(Due::After(millis));
        self
    }

    /// Where it goes.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Checks what the message was built with.
    pub(crate) fn check(&self) -> Result<(), OutboxError> {
        let invalid = |problem: String| Err(OutboxError::InvalidMessage(problem));
        if let Some(problem) = &self.invalid {
            return invalid(problem.clone());
        }
        if let Some(Due::After(millis)) = self.due
            && millis > MAX_DELAY_MILLIS
        {
            return invalid(format!(
                "its delay of {millis} ms is over 100 years: give a time with deliver_at"
            ));
        }
        if self.payload.len() > MAX_PAYLOAD_LEN {
            return invalid(format!(
                "its payload is {} bytes, over the limit of {MAX_PAYLOAD_LEN}",
                self.payload.len()
            ));
        }
        let Destination { name, routing_key } = &self.destination;
        if routing_key.is_empty() && name.is_empty() {
            return invalid(
                "it has no destination: give a subject, or an exchange and a routing key"
                    .to_owned(),
            );
        }
        for (what, text) in [("destination", name), ("routing key", routing_key)] {
            if text.len() > MAX_NAME_LEN || text.chars().any(char::is_control) {
                return invalid(format!(
                    "its {what} {text:?} is over {MAX_NAME_LEN} bytes or holds a control character"
                ));
            }
        }
        if let Some(id) = &self.id
            && (id.is_empty() || id.len() > MAX_NAME_LEN || id.chars().any(char::is_control))
        {
            return invalid(format!(
                "its id {id:?} is empty, over {MAX_NAME_LEN} bytes or holds a control character"
            ));
        }
        if let Some(key) = &self.ordering_key
            && (key.is_empty() || key.len() > MAX_ORDERING_KEY_LEN)
        {
            return invalid(format!(
                "its ordering key is empty or over {MAX_ORDERING_KEY_LEN} bytes ({} bytes)",
                key.len()
            ));
        }
        if let Some(key) = &self.ordering_key
            && key.chars().any(char::is_control)
        {
            return invalid(format!(
                "its ordering key {key:?} holds a control character"
            ));
        }
        let headers_len: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        if headers_len > MAX_HEADERS_LEN {
            return invalid(format!(
                "its headers take {headers_len} bytes, over the limit of {MAX_HEADERS_LEN}"
            ));
        }
        for (name, value) in &self.headers {
            let visible = |c: char| c.is_ascii_graphic() && c != ':';
            if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(visible) {
                return invalid(format!(
                    "its header name {name:?} is not 1 to {MAX_NAME_LEN} visible ASCII characters without `:`"
                ));
            }
            if name.eq_ignore_ascii_case(super::ID_HEADER) {
                return invalid(format!(
                    "its header {name:?} is the relay's to set (the message's id): give an id with Message::id"
                ));
            }
            if value.contains(['\r', '\n']) {
                return invalid(format!("its header {name:?} has a line break in its value"));
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                return invalid(format!(
                    "its header {name:?} has a control character in its value"
                ));
            }
        }
        Ok(())
    }

    /// The headers, as stored: a JSON array of `[name, value]` pairs.
    pub(crate) fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(message: Message) -> String {
        match message.check() {
            Err(OutboxError::InvalidMessage(problem)) => problem,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_due_time_is_never_before_the_instant_asked() {
        let at = |nanos: u64| match Message::json("a", &1)
            .deliver_at(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos))
            .due
        {
            Some(Due::At(millis)) => millis,
            other => panic!("{other:?}"),
        };
        assert_eq!(at(1_000_000_000), 1000);
        assert_eq!(at(1_000_000_001), 1001);
        assert_eq!(at(1_000_999_999), 1001);
        assert_eq!(at(0), 0);
        let after = Message::json("a", &1).deliver_after(std::time::Duration::from_micros(1500));
        assert_eq!(after.due, Some(Due::After(2)));
    }

    #[test]
    fn bad_messages_are_refused_with_what_is_wrong() {
        assert!(Message::json("a.b", &1).check().is_ok());
        assert!(
            problem(Message::bytes("a", vec![0; MAX_PAYLOAD_LEN + 1])).contains("over the limit")
        );
        assert!(problem(Message::bytes("", vec![])).contains("no destination"));
        assert!(problem(Message::bytes("a", vec![]).id("")).contains("its id"));
        assert!(
            problem(Message::bytes("a", vec![]).ordering_key("k".repeat(256)))
                .contains("ordering key")
        );
        assert!(problem(Message::bytes("a", vec![]).header("a b", "v")).contains("header name"));
        assert!(problem(Message::bytes("a", vec![]).header("x", "a\r\nb")).contains("line break"));
        assert!(
            problem(Message::bytes("a", vec![]).header("x", "a\0b")).contains("control character")
        );
        assert!(
            problem(Message::bytes("a", vec![]).ordering_key("k\0")).contains("control character")
        );
        assert!(
            problem(Message::bytes("a", vec![]).header("x", "v".repeat(MAX_HEADERS_LEN)))
                .contains("over the limit")
        );
        assert!(
            Message::bytes("a", vec![])
                .header("x", "a\tb")
                .check()
                .is_ok()
        );
        assert!(
            problem(Message::bytes("a", vec![]).header("nats-msg-id", "1")).contains("Message::id")
        );
        let unserializable = std::collections::HashMap::from([((1, 2), 3)]);
        assert!(problem(Message::json("a", &unserializable)).contains("does not serialize"));
        assert!(
            Message::bytes(Destination::exchange("", "queue"), vec![])
                .check()
                .is_ok()
        );
    }

    #[test]
    fn headers_are_stored_as_pairs() {
        let message = Message::json("a", &1).header("k", "v").header("k", "w");
        assert_eq!(message.headers_json(), r#"[["k","v"],["k","w"]]"#);
    }
}
