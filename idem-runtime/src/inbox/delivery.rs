//! What became of a delivery ([`Delivery`]), and the return types of message handlers that
//! say so.

use crate::error::Error;
use crate::work::stored::Fallible;
use std::convert::Infallible;

/// What became of a delivery.
///
/// `R` is why a handler that is also a transition refused a message
/// ([`Refusal`](crate::Refusal)); for plain message handlers it is
/// [`Infallible`], and `match`es need no arm for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "ack the broker only on `should_ack()`"]
pub enum Delivery<T, R = Infallible> {
    /// This delivery ran the handler, and its record (and, in the transactional mode, its
    /// effects) committed.
    Processed(T),
    /// The message was processed before (or, for a handler that is also a transition, the
    /// transition had already happened): the first result, replayed. A replay carries the
    /// result only, never a state: the row may have moved on since.
    Duplicate {
        /// The first result; `None` if nothing was stored: it serialized to `null` (`()`),
        /// or the transition was done without a stored result.
        first_result: Option<T>,
    },
    /// The key was recorded with a different payload: the first effect stays, this
    /// delivery was not applied. A producer bug; alert.
    Conflict,
    /// Another delivery of the message is being processed (or, on SQLite with a lock
    /// timeout, the database's writer stayed busy past it). Nack with a delay.
    InProgress {
        /// When the other delivery's lease ends (milliseconds since the epoch), if leased.
        lease_until_millis: Option<i64>,
    },
    /// The message was parked after its last allowed attempt, for a person to look at.
    Dead {
        /// The attempts made.
        attempts: i64,
        /// The last attempt's error.
        last_error: Option<String>,
    },
    /// A handler that is also a transition refused the message: its row is not in the
    /// transition's source state. Nothing was recorded or applied, so a redelivery is
    /// evaluated again. Do **not** ack: on [`Refusal::NotYet`](crate::Refusal::NotYet) nack
    /// with a delay (the message came early); on
    /// [`Refusal::IllegalState`](crate::Refusal::IllegalState) alert, and let the broker
    /// dead-letter it after its redeliveries.
    Refused(R),
}

impl<T, R> Delivery<T, R> {
    /// Whether to ack the message: `true` when it needs no more deliveries — processed, a
    /// duplicate, a conflict or dead (redelivering those cannot change their fate).
    /// `false` while another delivery works on it ([`InProgress`](Delivery::InProgress))
    /// and when a transition refused it ([`Refused`](Delivery::Refused)): nack those.
    pub fn should_ack(&self) -> bool {
        !matches!(self, Delivery::InProgress { .. } | Delivery::Refused(_))
    }

    /// `true` only if this delivery ran the handler.
    pub fn is_processed(&self) -> bool {
        matches!(self, Delivery::Processed(_))
    }

    /// A short, stable name for the variant, for logs and metrics labels: `processed`,
    /// `duplicate`, `conflict`, `in_progress`, `dead`, `refused`.
    pub fn kind(&self) -> &'static str {
        match self {
            Delivery::Processed(_) => "processed",
            Delivery::Duplicate { .. } => "duplicate",
            Delivery::Conflict => "conflict",
            Delivery::InProgress { .. } => "in_progress",
            Delivery::Dead { .. } => "dead",
            Delivery::Refused(_) => "refused",
        }
    }
}

/// The return type of an `#[idempotent]` message handler (`inbox`, `message`, `payload`)
/// whose body returns `R` (`Result<T, E>`): `Result<Delivery<T>, Error<E>>`.
pub type Consumed<R> = Result<Delivery<<R as Fallible>::Ok>, Error<<R as Fallible>::Err>>;

/// The return type of an `#[idempotent]` handler that is both a message handler and a
/// transition of machine `M`: `Result<Delivery<T, Refusal<M>>, Error<E>>`.
///
/// [`Delivery::Processed`] when this delivery moved the row and ran the body;
/// [`Delivery::Duplicate`] with the transition's first result when the message, or the
/// transition, was done before; [`Delivery::Refused`] when the row is not in the source
/// state (not yet, illegal, not found, stale), with nothing recorded.
pub type ConsumedTransition<R, M> =
    Result<Delivery<<R as Fallible>::Ok, crate::Refusal<M>>, Error<<R as Fallible>::Err>>;
