//! Kafka (feature `kafka`, on `rdkafka`, the binding of librdkafka): a [`Publisher`] on
//! the idempotent producer, with the message's ordering key as the Kafka key and its id in
//! a header; and the consuming side's [`message_key`].

use super::{IncomingKeyError, Outgoing, PublishError, Published, Publisher};
use crate::inbox::MessageKey;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The header the relay sets to the message's id: Kafka has no message id of its own.
pub const ID_HEADER: &str = "idem-message-id";

/// The producer settings idem needs, and the values it sets: the idempotent producer (a
/// retry inside the producer never writes a message twice), acknowledged by every in-sync
/// replica.
const REQUIRED: [(&str, &[&str]); 2] =
    [("enable.idempotence", &["true"]), ("acks", &["all", "-1"])];

/// How long librdkafka tries to deliver a message before it reports a failure, unless the
/// configuration says: under the relay's default publish timeout (10 s), so that a message
/// the relay gave up on is not delivered behind its back much later.
const DELIVERY_TIMEOUT_MS: &str = "9000";

/// Publishes to Kafka: the topic is the message's destination, the **Kafka key its
/// ordering key** (one key, one partition: the relay's per-key order holds to the
/// consumer), its id goes in the header [`ID_HEADER`] and its headers go along. It counts as
/// published once the broker acknowledged it (the delivery report), and a failed delivery
/// (an unknown topic, a message over the broker's size limit, a broker down past the
/// delivery timeout) is a failed attempt, retried by the relay and dead after its last.
///
/// The producer is librdkafka's **idempotent producer** (`enable.idempotence=true`,
/// `acks=all`): a retry inside the producer (a lost acknowledgement, a broker's restart)
/// never writes the message twice. It covers one producer's session only: a relay killed
/// after the broker's acknowledgement and before it marked the row publishes the message
/// again under a new producer id, and Kafka keeps both. The next hop's inbox absorbs the
/// second, by the id ([`message_key`]).
///
/// The routing key has no meaning in Kafka and is not used.
///
/// An idempotent producer that meets a fatal error (the broker lost its producer state, a
/// sequence it cannot accept) refuses every later message: the publisher then makes a new
/// producer from the same configuration, under a new producer id, and the failed message is
/// tried again on the relay's next attempt.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let kafka = idem::outbox::kafka::Kafka::connect("127.0.0.1:9092")?;
/// let relay = idem::outbox::Relay::new(pool, kafka).spawn()?;
/// # relay.stop().await; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Kafka {
    config: ClientConfig,
    producer: Arc<Mutex<FutureProducer>>,
}

impl fmt::Debug for Kafka {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kafka").finish_non_exhaustive()
    }
}

impl Kafka {
    /// A publisher to the cluster whose brokers are `bootstrap_servers` (`host:port`,
    /// comma-separated), with librdkafka's defaults otherwise.
    pub fn connect(bootstrap_servers: &str) -> Result<Kafka, KafkaConfigError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers);
        Kafka::from_config(config)
    }

    /// A publisher whose producer is made from `config` (security, compression, linger…),
    /// with the idempotent producer's settings set on it. Refused, naming the setting, when
    /// `config` sets `enable.idempotence` to anything but `true` or `acks` to anything but
    /// `all`: a producer without them may write a message twice, or lose one the broker
    /// acknowledged. `message.timeout.ms`, unless set, is 9 s: under the relay's
    /// [`publish_timeout`](super::Relay::publish_timeout), which should stay above it.
    pub fn from_config(mut config: ClientConfig) -> Result<Kafka, KafkaConfigError> {
        for (name, allowed) in REQUIRED {
            match config.get(name) {
                Some(value) if !allowed.contains(&value) => {
                    return Err(KafkaConfigError::Unsafe {
                        setting: name,
                        value: value.to_owned(),
                    });
                }
                Some(_) => {}
                None => {
                    config.set(name, allowed[0]);
                }
            }
        }
        if config.get("message.timeout.ms").is_none() {
            config.set("message.timeout.ms", DELIVERY_TIMEOUT_MS);
        }
        let producer = config.create().map_err(KafkaConfigError::Client)?;
        Ok(Kafka {
            config,
            producer: Arc::new(Mutex::new(producer)),
        })
    }

    /// The producer to send with (a clone shares its instance).
    fn producer(&self) -> FutureProducer {
        self.producer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces `failed` with a new producer if it is still the current one and it met a
    /// fatal error.
    fn renew_if_fatal(&self, failed: &FutureProducer) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        if !std::ptr::eq(current.client().native_ptr(), failed.client().native_ptr()) {
            return; // another publish renewed it already
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(%code, %reason, "idem: the Kafka producer met a fatal error; a new one takes over");
                *current = fresh;
            }
            Err(e) => {
                tracing::warn!(error = %e, "idem: the Kafka producer met a fatal error and no new one could be made");
            }
        }
    }
}

impl Publisher for Kafka {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        let mut headers = OwnedHeaders::new_with_capacity(message.headers().len() + 1);
        for (name, value) in message.headers() {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        headers = headers.insert(Header {
            key: ID_HEADER,
            value: Some(message.id().as_bytes()),
        });
        let record = FutureRecord::to(message.destination())
            .key(message.ordering_key())
            .payload(message.payload())
            .headers(headers);
        // Queued at once (a full local queue is an error, not a wait), then the delivery
        // report: the broker's acknowledgement, or why it never came.
        let producer = self.producer();
        match producer.send(record, Timeout::After(Duration::ZERO)).await {
            Ok(_) => Ok(Published::Acked),
            Err((e, _)) => {
                self.renew_if_fatal(&producer);
                Err(Box::new(e))
            }
        }
    }
}

/// Why a [`Kafka`] publisher was not made.
#[derive(Debug)]
#[non_exhaustive]
pub enum KafkaConfigError {
    /// The configuration turns off what idem needs: the idempotent producer
    /// (`enable.idempotence=true`) or the acknowledgement of every in-sync replica
    /// (`acks=all`).
    Unsafe {
        /// The setting.
        setting: &'static str,
        /// Its value in the configuration.
        value: String,
    },
    /// librdkafka refused the configuration.
    Client(rdkafka::error::KafkaError),
}

impl fmt::Display for KafkaConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaConfigError::Unsafe { setting, value } => write!(
                f,
                "the outbox's Kafka producer needs `enable.idempotence=true` and `acks=all`, \
                 and the configuration sets `{setting}={value}`: remove it (idem sets both)"
            ),
            KafkaConfigError::Client(e) => write!(f, "the Kafka producer was not made: {e}"),
        }
    }
}

impl std::error::Error for KafkaConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KafkaConfigError::Unsafe { .. } => None,
            KafkaConfigError::Client(e) => Some(e),
        }
    }
}

/// The id a relay published `message` under (its header [`ID_HEADER`]), as the next hop's
/// inbox key: `inbox.receive(&pool, &idem::outbox::kafka::message_key(&message)?, payload)`.
pub fn message_key(message: &impl rdkafka::Message) -> Result<MessageKey, IncomingKeyError> {
    let headers = message.headers().ok_or(IncomingKeyError::Missing)?;
    let id = headers
        .iter()
        .find(|header| header.key == ID_HEADER)
        .and_then(|header| header.value)
        .ok_or(IncomingKeyError::Missing)?;
    let id = std::str::from_utf8(id).map_err(|_| IncomingKeyError::NotText)?;
    MessageKey::message_id(id).map_err(IncomingKeyError::Invalid)
}
