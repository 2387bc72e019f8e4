//! Finding a lost conflict (serialization failure, deadlock, busy database) inside any
//! error's source chain, so that [`retry_when`](crate::retry_when()) can call it again.

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
    carries(error, super::is_conflict)
}

/// Whether `error`, or any error in its source chain, is an `sqlx::Error` that passes `test`.
pub(crate) fn carries(error: &DynError, test: fn(&sqlx::Error) -> bool) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.downcast_ref::<sqlx::Error>().is_some_and(test) {
            return true;
        }
        next = error.source();
    }
    false
}
