//! Finding a lost conflict (serialization failure, deadlock, busy database) inside the
//! errors a handler returns, so that [`retry`](crate::retry()) can call it again.

use crate::error::Error;
use core::any::Any;
use std::error::Error as StdError;

type DynError = dyn StdError + 'static;

/// Whether `error`, or any error in its [`source`](StdError::source) chain, is a
/// [`sqlx::Error`] that lost a conflict with a concurrent transaction.
///
/// This is how idem looks inside error types it cannot name: a `thiserror` enum whose
/// variant wraps an `sqlx::Error` with `#[from]` or `#[source]`, an `anyhow::Error`
/// (`idem::is_conflict_source(err.as_ref())`), an `idem::Error` of a handler called from
/// another handler's body. Use it with [`retry_when`](crate::retry_when):
///
/// ```
/// # #[derive(Debug)] struct PayError(sqlx::Error);
/// # impl std::fmt::Display for PayError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("pay") } }
/// # impl std::error::Error for PayError { fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) } }
/// # async fn pay() -> Result<(), idem::Error<PayError>> { Ok(()) }
/// # async fn demo() -> Result<(), idem::Error<PayError>> {
/// // `idem::Error<PayError>` is an `std::error::Error` whose source is the `PayError`.
/// idem::retry_when(|e| idem::is_conflict_source(e), || pay()).await?;
/// # Ok(()) }
/// ```
pub fn is_conflict_source(error: &DynError) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error
            .downcast_ref::<sqlx::Error>()
            .is_some_and(crate::backend::is_conflict)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Whether a handler's error of type `E` is, or carries, a lost conflict — for the types
/// idem can see into without knowing them: `sqlx::Error`, boxed `dyn Error`s (their chain
/// is walked), and `idem::Error<sqlx::Error>` (a handler called from another's body).
pub(crate) fn handler_conflict<E: 'static>(error: &E) -> bool {
    let any = error as &dyn Any;
    if let Some(e) = any.downcast_ref::<sqlx::Error>() {
        return crate::backend::is_conflict(e);
    }
    if let Some(e) = any.downcast_ref::<Error<sqlx::Error>>() {
        return e.is_conflict();
    }
    boxed(any).is_some_and(is_conflict_source)
}

/// The `dyn Error` inside a boxed error of one of the usual shapes.
fn boxed(any: &dyn Any) -> Option<&DynError> {
    if let Some(e) = any.downcast_ref::<Box<dyn StdError + Send + Sync>>() {
        return Some(e.as_ref());
    }
    if let Some(e) = any.downcast_ref::<Box<dyn StdError + Send>>() {
        return Some(e.as_ref());
    }
    any.downcast_ref::<Box<dyn StdError>>().map(AsRef::as_ref)
}
