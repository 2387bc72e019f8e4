//! Errors: the handler's own, the database's, and bad data or input; and whether a
//! handler's error carries a lost conflict.

use crate::value::column::ColumnProblem;
use crate::value::key::KeyError;
use core::any::Any;
use std::error::Error as StdError;

/// Why an `#[idempotent]` call did not produce an [`Outcome`](crate::Outcome).
///
/// In every case the transaction was rolled back: the row, the body's writes and the
/// stored result are as they were before the call, and a retry may apply.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The handler's body returned this error. The transition was rolled back with it.
    Handler(E),
    /// The handler's body panicked, with this message: a failed call, rolled back as a
    /// [`Handler`](Self::Handler) error is, and caught where idem ran the body so that it
    /// ends neither the consumer's loop nor the rest of a batch. In a batch
    /// ([`Inbox::batch`](crate::inbox::Inbox::batch)) it is a failed attempt of its message,
    /// recorded and, after the inbox's last attempt, parked.
    Panicked(String),
    /// The database failed (connection, constraint, serialization failure, …).
    Database(sqlx::Error),
    /// The transaction kept losing conflicts with concurrent ones (serialization
    /// failures, deadlocks, a busy database) and idem gave up after `attempts` tries.
    /// Nothing was applied; a later retry may succeed.
    Contention {
        /// The attempts made.
        attempts: u32,
        /// The last conflict.
        last: sqlx::Error,
    },
    /// The database stayed busy for all of `waited`: the writer's turn (SQLite, whose one
    /// writer every key shares) did not come. Nothing ran; a later retry may succeed (the
    /// HTTP layer answers 503 with `Retry-After`).
    Busy {
        /// How long the call waited.
        waited: std::time::Duration,
    },
    /// The key is not acceptable (empty, too long, control characters).
    InvalidKey(KeyError),
    /// A parameter's value cannot be bound to the column `set(…)` sets it to (an integer
    /// out of range, text holding NUL). Nothing ran. A value the column's type refuses is
    /// the database's error ([`Error::Database`]), and rolls back as well.
    InvalidColumn {
        /// The column.
        column: &'static str,
        /// What is wrong with the value.
        problem: ColumnProblem,
    },
    /// An event's version (`watermark = "…"`) that is no version: 0, negative, or beyond
    /// the 64-bit range. A row starts at version 0, so a stream's events count from 1.
    /// Nothing ran.
    InvalidWatermark {
        /// The value, as text.
        value: String,
    },
    /// The row holds data the machine cannot interpret: an undeclared state name, a NULL
    /// state or version. Nothing was changed; fix the row.
    CorruptRow {
        /// The machine (enum) name.
        machine: &'static str,
        /// The table.
        table: &'static str,
        /// The row's key, as text.
        key: String,
        /// What is wrong with it.
        problem: RowProblem,
    },
    /// A leased delivery tried to record its outcome after its lease had expired and
    /// another delivery took the message over. Nothing was recorded by this one; roll
    /// back whatever you did in the same transaction.
    LeaseLost {
        /// The consumer group.
        group: String,
        /// The message key.
        key: String,
    },
    /// An inbox record holds data idem cannot interpret (an unknown status, or a NULL
    /// status or fingerprint, which only a table made or altered by hand can hold). Nothing
    /// was changed; fix the record.
    CorruptRecord {
        /// The consumer group.
        group: String,
        /// The message key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The body's result serializes to more than [`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN)
    /// bytes, too large to store as the first result. Nothing was committed (in the leased
    /// inbox, the attempt is recorded as failed). Return something small, such as the id of
    /// a row holding the large data.
    ResultTooLarge {
        /// The serialized result's length, in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body's result could not be stored, or a stored result could not be read back
    /// as the handler's result type (the type changed incompatibly since it was stored).
    Result(serde_json::Error),
    /// A purge was asked to delete records younger than the entries of the cache attached
    /// to its pool (feature `redis`): the cache would then answer as duplicates keys the
    /// database no longer knows. Nothing was deleted. Keep records at least as long as the
    /// cache's TTL.
    RetentionBelowCache {
        /// The retention asked for.
        retention: std::time::Duration,
        /// The cache's TTL.
        ttl: std::time::Duration,
    },
}

/// What is wrong with a row, see [`Error::CorruptRow`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowProblem {
    /// The state column holds a name the machine does not declare.
    UnknownState(String),
    /// The state column is NULL.
    NullState,
    /// The version column is NULL.
    NullVersion,
    /// The transition updated the row but kept reporting a concurrent winner; the
    /// database is not giving idem a consistent view (should not happen).
    Unstable,
}

impl<E> Error<E> {
    /// The handler's own error, if that is what this is.
    pub fn handler(&self) -> Option<&E> {
        match self {
            Error::Handler(e) => Some(e),
            _ => None,
        }
    }

    /// `true` for errors a retry of the same call may cure: serialization failures,
    /// deadlocks, a busy database, a dropped connection, a server shutting down or not yet
    /// serving (a failover; see [`is_transient`](crate::is_transient())) — in idem's own
    /// statements, or in a statement of the body (the connection cut while the body ran, a
    /// Galera node killed under it) where idem can see the `sqlx::Error` in the handler's
    /// error, as [`is_conflict`](Self::is_conflict) does. Everything was rolled back, so
    /// calling the handler again is safe. Other handler errors are the handler's to judge.
    pub fn is_transient(&self) -> bool
    where
        E: 'static,
    {
        match self {
            Error::Database(e) => crate::backend::is_transient(e),
            Error::Contention { .. } | Error::Busy { .. } => true,
            Error::Handler(e) => {
                handler_carries(e, crate::backend::is_transient, Error::is_transient)
            }
            _ => false,
        }
    }

    /// `true` if the transaction lost a conflict with a concurrent one — a serialization
    /// failure or deadlock (PostgreSQL 40001, 40P01; MySQL 1213), a busy SQLite database —
    /// after idem could no longer retry it alone: at COMMIT, or in a statement of the body.
    /// Everything was rolled back, so calling the handler again is safe and may apply;
    /// [`retry`] does that.
    ///
    /// A handler error counts when idem can see the `sqlx::Error` inside it without knowing
    /// its type: an `sqlx::Error` itself (the body's `?` on a statement), a boxed
    /// `dyn std::error::Error` (`Box<dyn Error + Send + Sync>`, …, whose `source()` chain is
    /// walked), or an `idem::Error<sqlx::Error>` (a handler called from another handler's
    /// body). For an error type of your own (a `thiserror` enum, `anyhow::Error`), use
    /// [`is_conflict_source`], which walks any error's chain, with [`retry_when`].
    ///
    /// [`retry`]: crate::retry()
    /// [`retry_when`]: crate::retry_when()
    /// [`is_conflict_source`]: crate::is_conflict_source()
    pub fn is_conflict(&self) -> bool
    where
        E: 'static,
    {
        match self {
            Error::Database(e) => crate::backend::is_conflict(e),
            Error::Handler(e) => {
                handler_carries(e, crate::backend::is_conflict, Error::is_conflict)
            }
            _ => false,
        }
    }

    /// Maps the handler's error type.
    pub fn map_handler<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        match self {
            Error::Handler(e) => Error::Handler(f(e)),
            Error::Panicked(message) => Error::Panicked(message),
            Error::Database(e) => Error::Database(e),
            Error::Contention { attempts, last } => Error::Contention { attempts, last },
            Error::Busy { waited } => Error::Busy { waited },
            Error::InvalidKey(e) => Error::InvalidKey(e),
            Error::InvalidColumn { column, problem } => Error::InvalidColumn { column, problem },
            Error::InvalidWatermark { value } => Error::InvalidWatermark { value },
            Error::CorruptRow {
                machine,
                table,
                key,
                problem,
            } => Error::CorruptRow {
                machine,
                table,
                key,
                problem,
            },
            Error::Result(e) => Error::Result(e),
            Error::ResultTooLarge { len, max } => Error::ResultTooLarge { len, max },
            Error::RetentionBelowCache { retention, ttl } => {
                Error::RetentionBelowCache { retention, ttl }
            }
            Error::LeaseLost { group, key } => Error::LeaseLost { group, key },
            Error::CorruptRecord {
                group,
                key,
                problem,
            } => Error::CorruptRecord {
                group,
                key,
                problem,
            },
        }
    }
}

impl Error<core::convert::Infallible> {
    /// The same error, typed for any handler error (it carries none): what the inbox's
    /// `receive` and `claim` return, widened to a handler's `Error<E>`.
    pub fn widen<E>(self) -> Error<E> {
        self.map_handler(|never| match never {})
    }
}

impl<E: core::fmt::Display> core::fmt::Display for Error<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Handler(e) => write!(f, "handler failed, transition rolled back: {e}"),
            Error::Panicked(message) => {
                write!(f, "handler panicked, transition rolled back: {message}")
            }
            Error::Database(e) => write!(f, "database error, transition rolled back: {e}"),
            Error::Contention { attempts, last } => write!(
                f,
                "gave up after {attempts} attempts lost to concurrent transactions; nothing was applied (last: {last})"
            ),
            Error::Busy { waited } => write!(
                f,
                "the database stayed busy for {waited:?} (its writer's turn did not come); nothing ran"
            ),
            Error::InvalidKey(e) => write!(f, "invalid key: {e}"),
            Error::InvalidColumn { column, problem } => write!(
                f,
                "invalid value for column `{column}`: {problem}; nothing was written"
            ),
            Error::InvalidWatermark { value } => write!(
                f,
                "invalid event version {value}: a stream's events count from 1 (a row starts at version 0); nothing was written"
            ),
            Error::CorruptRow {
                machine,
                table,
                key,
                problem,
            } => {
                write!(f, "row {key:?} of table `{table}` (machine `{machine}`) ")?;
                match problem {
                    RowProblem::UnknownState(s) => write!(
                        f,
                        "is in state {s:?}, which `{machine}` does not declare; nothing was changed"
                    ),
                    RowProblem::NullState => write!(f, "has a NULL state; nothing was changed"),
                    RowProblem::NullVersion => {
                        write!(f, "has a NULL version; nothing was changed")
                    }
                    RowProblem::Unstable => write!(
                        f,
                        "kept changing under concurrent transitions; nothing was changed"
                    ),
                }
            }
            Error::Result(e) => write!(f, "stored result does not match the handler's type: {e}"),
            Error::ResultTooLarge { len, max } => write!(
                f,
                "the result serializes to {len} bytes, over the {max}-byte limit for stored results; nothing was committed (return an id, keep large data in a table)"
            ),
            Error::RetentionBelowCache { retention, ttl } => write!(
                f,
                "a retention of {retention:?} is shorter than the {ttl:?} TTL of the cache attached to this pool: the cache would call keys duplicates that the database forgot; nothing was deleted (keep records longer, or shorten the cache's ttl)"
            ),
            Error::LeaseLost { group, key } => write!(
                f,
                "the lease on message {key:?} of consumer group {group:?} expired and another delivery took it over; this one recorded nothing"
            ),
            Error::CorruptRecord {
                group,
                key,
                problem,
            } => write!(
                f,
                "inbox record {key:?} of consumer group {group:?}: {problem}; nothing was changed"
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Handler(e) => Some(e),
            Error::Database(e) => Some(e),
            Error::Contention { last, .. } => Some(last),
            Error::InvalidKey(e) => Some(e),
            Error::InvalidColumn { problem, .. } => Some(problem),
            Error::Result(e) => Some(e),
            Error::CorruptRow { .. }
            | Error::Panicked(_)
            | Error::Busy { .. }
            | Error::InvalidWatermark { .. }
            | Error::LeaseLost { .. }
            | Error::CorruptRecord { .. }
            | Error::ResultTooLarge { .. }
            | Error::RetentionBelowCache { .. } => None,
        }
    }
}

impl<E> From<sqlx::Error> for Error<E> {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

/// Whether a handler's error of type `E` is, or carries, an `sqlx::Error` that passes
/// `test` (a lost conflict, a transient failure) — for the types idem can see into without
/// knowing them: `sqlx::Error`, boxed `dyn Error`s (their chain is walked), and
/// `idem::Error<sqlx::Error>` (a handler called from another's body, judged whole).
fn handler_carries<E: 'static>(
    error: &E,
    test: fn(&sqlx::Error) -> bool,
    nested: fn(&Error<sqlx::Error>) -> bool,
) -> bool {
    let any = error as &dyn Any;
    if let Some(e) = any.downcast_ref::<sqlx::Error>() {
        return test(e);
    }
    if let Some(e) = any.downcast_ref::<Error<sqlx::Error>>() {
        return nested(e);
    }
    boxed(any).is_some_and(|e| crate::backend::carries(e, test))
}

/// The `dyn Error` inside a boxed error of one of the usual shapes.
fn boxed(any: &dyn Any) -> Option<&(dyn StdError + 'static)> {
    if let Some(e) = any.downcast_ref::<Box<dyn StdError + Send + Sync>>() {
        return Some(e.as_ref());
    }
    if let Some(e) = any.downcast_ref::<Box<dyn StdError + Send>>() {
        return Some(e.as_ref());
    }
    any.downcast_ref::<Box<dyn StdError>>().map(AsRef::as_ref)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    /// A connection lost under a statement of the body reaches the caller as the handler's
    /// error: transient (a retry is safe), not a conflict.
    #[test]
    fn a_lost_connection_in_the_body_is_transient_where_idem_can_see_it() {
        let plain: Error<sqlx::Error> = Error::Handler(lost());
        assert!(plain.is_transient());
        assert!(!plain.is_conflict());
        let boxed: Error<Box<dyn StdError + Send + Sync>> = Error::Handler(Box::new(lost()));
        assert!(boxed.is_transient());
        let nested: Error<Error<sqlx::Error>> = Error::Handler(Error::Database(lost()));
        assert!(nested.is_transient());
        let contended: Error<Error<sqlx::Error>> = Error::Handler(Error::Busy {
            waited: std::time::Duration::from_secs(1),
        });
        assert!(contended.is_transient());
        assert!(
            !contended.is_conflict(),
            "a nested Busy is no conflict, as before"
        );
        let other: Error<sqlx::Error> = Error::Handler(sqlx::Error::RowNotFound);
        assert!(!other.is_transient());
        let own: Error<String> = Error::Handler("declined".into());
        assert!(!own.is_transient());
    }
}
