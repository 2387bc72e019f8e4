//! [`DbError`]: what a handler answers when one of its statements failed.

use crate::http::problem::Problem;
use axum_core::body::Body;
use axum_core::response::IntoResponse;
use http::{Response, StatusCode};

/// A statement of the handler failed: answer with this (`?` on an `sqlx::Error` in a
/// handler returning `Result<_, DbError>`), and the client learns whether to retry.
///
/// A failure a retry may cure ([`is_transient`](crate::is_transient): a conflict lost to a
/// concurrent transaction, a lost connection, an exhausted pool) is a **503** with
/// `Retry-After: 1` — on a Galera cluster a statement of the handler fails with 1213 when a
/// write of the same key committed on another node first — and anything else a **500**.
/// Neither is stored (it does not come through [`Tx::commit`](super::Tx::commit): the
/// handler's writes roll back), so the retry with the same key runs again, or is replayed if
/// a concurrent request with that key committed.
///
/// ```
/// use axum::http::StatusCode;
/// use idem::http::{Committed, DbError, Tx};
///
/// async fn create_order(mut tx: Tx<sqlx::Postgres>)
///     -> Result<Committed<(StatusCode, String)>, DbError> {
///     sqlx::query("INSERT INTO orders (status) VALUES ('CREATED')")
///         .execute(&mut **tx)
///         .await?;
///     Ok(tx.commit((StatusCode::CREATED, "created".to_owned())))
/// }
/// ```
#[derive(Debug)]
pub struct DbError(pub sqlx::Error);

impl From<sqlx::Error> for DbError {
    fn from(error: sqlx::Error) -> Self {
        DbError(error)
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a statement of the handler failed: {}", self.0)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response<Body> {
        if crate::is_transient(&self.0) {
            tracing::warn!(error = %self.0, "idem: a statement of the handler failed; the client may retry");
            Problem::unavailable(
                "Database conflict",
                "the request lost a conflict with another one, or its connection; nothing was kept, retry with the same key",
            )
            .into_response()
        } else {
            tracing::error!(error = %self.0, "idem: a statement of the handler failed");
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Database error",
                "a statement of the request failed; nothing was kept",
            )
            .into_response()
        }
    }
}
