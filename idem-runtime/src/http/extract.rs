//! The handler's side of the layer: [`Tx`], the transaction the key record was written in,
//! lent to the handler for the length of the request.

use super::problem::Problem;
use crate::backend::Backend;
use crate::inbox::Recorded;
use crate::work::unit::Work;
use axum_core::body::Body;
use axum_core::extract::FromRequestParts;
use http::request::Parts;
use http::{Response, StatusCode};
use sqlx::Transaction;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Mutex, OwnedMappedMutexGuard};

/// The unit of work of a request: its record (none without a key) is what it keeps.
pub(crate) type RequestWork<DB> = Work<'static, DB, Option<Recorded>>;

/// Where the unit of work waits while the handler runs (a request extension).
pub(crate) struct Slot<DB: Backend> {
    work: Arc<Mutex<Option<RequestWork<DB>>>>,
    used: Arc<AtomicBool>,
}

impl<DB: Backend> Clone for Slot<DB> {
    fn clone(&self) -> Self {
        Slot {
            work: self.work.clone(),
            used: self.used.clone(),
        }
    }
}

impl<DB: Backend> Slot<DB> {
    pub(crate) fn new(work: RequestWork<DB>) -> Self {
        Slot {
            work: Arc::new(Mutex::new(Some(work))),
            used: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The unit of work back from the handler, and whether it used the transaction.
    /// `None` if the handler still holds its [`Tx`] (moved it into a task that outlives
    /// the request): the work is rolled back when that lets go.
    pub(crate) fn take(&self) -> Option<(RequestWork<DB>, bool)> {
        let mut work = self.work.try_lock().ok()?;
        let work = work.take()?;
        Some((work, self.used.load(Ordering::Acquire)))
    }
}

/// The transaction of an idempotent request: the key record is written in it, the handler's
/// statements run in it, and the response is stored and committed with them by the layer
/// ([`IdempotencyLayer`](super::IdempotencyLayer)) once the handler returns. Use it as
/// `&mut **tx` wherever sqlx takes an executor (`tx` derefs to the `sqlx::Transaction`, which
/// derefs to the connection), and pass it on to `#[idempotent]` handlers as `&mut *tx` (the
/// `&mut Transaction`; they run in a savepoint of it).
///
/// An extractor: take it as a handler argument, once. Only a route behind the layer has
/// one; elsewhere the extraction fails with a 500 naming the problem. Do not commit it, and
/// do not keep it past the handler: the layer commits it with the stored response.
///
/// A handler that answers without using the transaction (a validation error, say) is not
/// stored: nothing commits, and a repeat of the request runs again.
pub struct Tx<DB: Backend> {
    guard: OwnedMappedMutexGuard<Option<RequestWork<DB>>, Transaction<'static, DB>>,
    used: Arc<AtomicBool>,
}

impl<DB: Backend> Deref for Tx<DB> {
    type Target = Transaction<'static, DB>;

    fn deref(&self) -> &Self::Target {
        self.used.store(true, Ordering::Release);
        &self.guard
    }
}

impl<DB: Backend> DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.used.store(true, Ordering::Release);
        &mut self.guard
    }
}

impl<DB: Backend> core::fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

impl<S: Send + Sync, DB: Backend> FromRequestParts<S> for Tx<DB> {
    type Rejection = Response<Body>;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let no_transaction = |detail: &str| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No idempotent transaction",
                detail,
            )
            .into_response()
        };
        let Some(slot) = parts.extensions.get::<Slot<DB>>().cloned() else {
            return Err(no_transaction(
                "the route takes idem::http::Tx but is not behind idem's IdempotencyLayer in its transactional mode for this database",
            ));
        };
        // Never wait for the slot: its only other holder is this handler's own first `Tx`.
        let guard =
            slot.work.clone().try_lock_owned().map_err(|_| {
                no_transaction("the handler takes idem::http::Tx twice; take it once")
            })?;
        let guard = tokio::sync::OwnedMutexGuard::try_map(guard, |work| {
            work.as_mut().map(Work::transaction)
        })
        .map_err(|_| no_transaction("the transaction was already taken back by the layer"))?;
        Ok(Tx {
            guard,
            used: slot.used,
        })
    }
}

/// A deterministic key for the calls a request makes outside the database (a payment API,
/// an e-mail service): the same for every retry of the request and for a repeat that takes
/// its lease over, different for every principal and key, and not the client's key itself.
/// An extractor, on every route behind the layer whose request has a key.
///
/// ```
/// # fn charge(_: &str) {}
/// async fn pay(key: idem::http::RequestKey) -> &'static str {
///     charge(&key.derive("charge")); // pass it as the payment API's idempotency key
///     "paid"
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKey(pub(crate) String);

impl RequestKey {
    /// The request's record key: 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A key for one of the request's outside calls, named by `purpose` (`"charge"`,
    /// `"email"`): 64 hex digits, deterministic.
    pub fn derive(&self, purpose: &str) -> String {
        super::fingerprint::record_key(&self.0, purpose)
    }
}

impl core::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RequestKey {
    type Rejection = Response<Body>;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<RequestKey>().cloned().ok_or_else(|| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No idempotency key",
                "the route takes idem::http::RequestKey but is not behind idem's IdempotencyLayer (or the request had no key on an optional route)",
            )
            .into_response()
        })
    }
}
