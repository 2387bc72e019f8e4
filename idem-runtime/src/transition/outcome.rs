//! What a call to an `#[idempotent]` handler did, and the handler's return type that says so.

use crate::error::Error;
use crate::work::stored::Fallible;

/// The return type of an `#[idempotent]` handler whose body returns `R`
/// (`Result<T, E>`): `Result<Outcome<T, M>, Error<E>>`.
pub type Handled<R, M> = Result<Outcome<<R as Fallible>::Ok, M>, Error<<R as Fallible>::Err>>;

/// The outcome of an idempotent transition. `S` is the machine's state enum.
///
/// | variant | meaning | what the caller usually does |
/// |---|---|---|
/// | [`Applied`](Outcome::Applied) | this call moved the row `from → to`, ran the body, and committed | ack / 200 |
/// | [`AlreadyDone`](Outcome::AlreadyDone) | the row is already in `to` or a state reachable from it: a duplicate | ack / replay the first result |
/// | [`NotYet`](Outcome::NotYet) | the row is in an earlier state that can still reach `from`: this call came early | retry later (a consumer nacks with a delay) |
/// | [`IllegalState`](Outcome::IllegalState) | the row is in a state from which `to` cannot be reached | alert: a data or workflow bug |
/// | [`NotFound`](Outcome::NotFound) | no row has this key | the caller's business |
/// | [`StaleVersion`](Outcome::StaleVersion) | the caller's expected version did not hold | re-read and decide |
/// | [`Superseded`](Outcome::Superseded) | an event older than the row (a handler with `watermark = "…"`) | ack and drop it |
///
/// Only `Applied` ran the handler's body. Every other outcome rolled back an empty
/// transaction: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an outcome tells a duplicate from a bug; match on it"]
pub enum Outcome<T, S> {
    /// This call performed the transition; the body's result, committed together with it.
    Applied(T),
    /// A duplicate: the transition had already happened.
    AlreadyDone {
        /// The row's current state: `to`, or a state reachable from `to`.
        current: S,
        /// The result the first successful call returned, replayed from storage.
        ///
        /// `None` when no result is stored for this key and transition: the first result
        /// serialized to `null` (`()`, `None`: nothing is stored), the row reached `to`
        /// some other way (another transition into the same state, a write outside idem),
        /// or the result was deleted.
        first_result: Option<T>,
    },
    /// The call came early: the row is in a state that can still reach `from` (say, a
    /// ship that overtook its pay), so the transition may become possible. Out-of-order
    /// delivery, not a bug: retry later.
    NotYet {
        /// The row's current state, from which `from` is reachable.
        current: S,
        /// The transition's source state.
        from: S,
        /// The transition's target state.
        to: S,
    },
    /// The row is in a state from which neither `from` nor `to` can be reached: a data or
    /// workflow bug.
    IllegalState {
        /// The row's current state.
        current: S,
        /// The transition's source state.
        from: S,
        /// The transition's target state.
        to: S,
    },
    /// No row has this key.
    NotFound,
    /// The row is in the transition's source state, but its version is not the one the
    /// caller expected.
    StaleVersion {
        /// The version the caller passed.
        expected: i64,
        /// The version in the database.
        actual: i64,
    },
    /// An event of a stream (a handler with `watermark = "…"`) older than the row: the
    /// row already took a later event's version, so this one would move it backwards.
    /// Nothing was written, and nothing ever will be for this event: ack it and drop it.
    /// (The event that gave the row its version, delivered again, is
    /// [`AlreadyDone`](Outcome::AlreadyDone) with its first result.)
    Superseded {
        /// The row's current state.
        current: S,
        /// The row's version: the latest event it took.
        version: i64,
        /// This event's version.
        event: i64,
    },
}

impl<T, S> Outcome<T, S> {
    /// `true` for [`Applied`](Outcome::Applied), [`AlreadyDone`](Outcome::AlreadyDone) and
    /// [`Superseded`](Outcome::Superseded): nothing is left to do for this call, whoever
    /// did it. A consumer acks on `true`.
    pub fn is_done(&self) -> bool {
        matches!(
            self,
            Outcome::Applied(_) | Outcome::AlreadyDone { .. } | Outcome::Superseded { .. }
        )
    }

    /// `true` only if this call performed the transition.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }

    /// The result of the transition: this call's, or the replayed first one.
    pub fn result(&self) -> Option<&T> {
        match self {
            Outcome::Applied(result) => Some(result),
            Outcome::AlreadyDone { first_result, .. } => first_result.as_ref(),
            _ => None,
        }
    }

    /// The result of the transition, consuming the outcome; see [`result`](Self::result).
    pub fn into_result(self) -> Option<T> {
        match self {
            Outcome::Applied(result) => Some(result),
            Outcome::AlreadyDone { first_result, .. } => first_result,
            _ => None,
        }
    }

    /// Maps the result (this call's or the replayed one), keeping the outcome.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U, S> {
        match self {
            Outcome::Applied(result) => Outcome::Applied(f(result)),
            Outcome::AlreadyDone {
                current,
                first_result,
            } => Outcome::AlreadyDone {
                current,
                first_result: first_result.map(f),
            },
            Outcome::NotYet { current, from, to } => Outcome::NotYet { current, from, to },
            Outcome::IllegalState { current, from, to } => {
                Outcome::IllegalState { current, from, to }
            }
            Outcome::NotFound => Outcome::NotFound,
            Outcome::StaleVersion { expected, actual } => {
                Outcome::StaleVersion { expected, actual }
            }
            Outcome::Superseded {
                current,
                version,
                event,
            } => Outcome::Superseded {
                current,
                version,
                event,
            },
        }
    }

    /// A short, stable name for the variant, for logs and metrics labels.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Applied(_) => OutcomeKind::Applied,
            Outcome::AlreadyDone { .. } => OutcomeKind::AlreadyDone,
            Outcome::NotYet { .. } => OutcomeKind::NotYet,
            Outcome::IllegalState { .. } => OutcomeKind::IllegalState,
            Outcome::NotFound => OutcomeKind::NotFound,
            Outcome::StaleVersion { .. } => OutcomeKind::StaleVersion,
            Outcome::Superseded { .. } => OutcomeKind::Superseded,
        }
    }
}

/// Why a transition did not apply, when it is not done either: what a message handler that
/// is also a transition replies with in [`Delivery::Refused`](crate::inbox::Delivery::Refused).
/// Nothing was recorded or changed, and the message is not acked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<S> {
    /// See [`Outcome::NotYet`]: the message came early; redeliver it later.
    NotYet {
        /// The row's current state.
        current: S,
        /// The transition's source state.
        from: S,
        /// The transition's target state.
        to: S,
    },
    /// See [`Outcome::IllegalState`]: a bug; alert.
    IllegalState {
        /// The row's current state.
        current: S,
        /// The transition's source state.
        from: S,
        /// The transition's target state.
        to: S,
    },
    /// See [`Outcome::NotFound`].
    NotFound,
    /// See [`Outcome::StaleVersion`].
    StaleVersion {
        /// The version the caller passed.
        expected: i64,
        /// The version in the database.
        actual: i64,
    },
}

impl<S> Refusal<S> {
    /// The same refusal as an [`Outcome`].
    pub fn into_outcome<T>(self) -> Outcome<T, S> {
        match self {
            Refusal::NotYet { current, from, to } => Outcome::NotYet { current, from, to },
            Refusal::IllegalState { current, from, to } => {
                Outcome::IllegalState { current, from, to }
            }
            Refusal::NotFound => Outcome::NotFound,
            Refusal::StaleVersion { expected, actual } => {
                Outcome::StaleVersion { expected, actual }
            }
        }
    }

    /// The variant's name, for logs and metrics labels.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Refusal::NotYet { .. } => OutcomeKind::NotYet,
            Refusal::IllegalState { .. } => OutcomeKind::IllegalState,
            Refusal::NotFound => OutcomeKind::NotFound,
            Refusal::StaleVersion { .. } => OutcomeKind::StaleVersion,
        }
    }

    /// `true` for [`IllegalState`](Refusal::IllegalState): a defect to alert on, which no
    /// redelivery will cure.
    pub fn is_illegal(&self) -> bool {
        matches!(self, Refusal::IllegalState { .. })
    }
}

/// The variant of an [`Outcome`] without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutcomeKind {
    /// See [`Outcome::Applied`].
    Applied,
    /// See [`Outcome::AlreadyDone`].
    AlreadyDone,
    /// See [`Outcome::NotYet`].
    NotYet,
    /// See [`Outcome::IllegalState`].
    IllegalState,
    /// See [`Outcome::NotFound`].
    NotFound,
    /// See [`Outcome::StaleVersion`].
    StaleVersion,
    /// See [`Outcome::Superseded`].
    Superseded,
}

impl OutcomeKind {
    /// The name used in logs and metrics: `applied`, `already_done`, `not_yet`, `illegal_state`,
    /// `not_found`, `stale_version`, `superseded`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Applied => "applied",
            OutcomeKind::AlreadyDone => "already_done",
            OutcomeKind::NotYet => "not_yet",
            OutcomeKind::IllegalState => "illegal_state",
            OutcomeKind::NotFound => "not_found",
            OutcomeKind::StaleVersion => "stale_version",
            OutcomeKind::Superseded => "superseded",
        }
    }
}

impl core::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_means_applied_or_duplicate() {
        let applied: Outcome<i32, ()> = Outcome::Applied(1);
        let duplicate: Outcome<i32, ()> = Outcome::AlreadyDone {
            current: (),
            first_result: Some(1),
        };
        let illegal: Outcome<i32, ()> = Outcome::IllegalState {
            current: (),
            from: (),
            to: (),
        };
        assert!(applied.is_done() && applied.is_applied());
        assert!(duplicate.is_done() && !duplicate.is_applied());
        assert!(!illegal.is_done() && !Outcome::<i32, ()>::NotFound.is_done());
        assert_eq!(applied.result(), duplicate.result());
        assert_eq!(illegal.result(), None);
        assert_eq!(duplicate.clone().into_result(), Some(1));
        assert_eq!(
            duplicate.map(|n| n * 2),
            Outcome::AlreadyDone {
                current: (),
                first_result: Some(2)
            }
        );
        assert_eq!(illegal.kind().as_str(), "illegal_state");
        assert_eq!(
            Outcome::<i32, ()>::StaleVersion {
                expected: 1,
                actual: 2
            }
            .kind()
            .to_string(),
            "stale_version"
        );
    }
}
