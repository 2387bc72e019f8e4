//! The handler's side of the layer: [`Tx`], the transaction the key record was written in,
//! lent to the handler for the length of the request, and [`Committed`], the response the
//! handler gives back with it.

use super::problem::Problem;
use crate::backend::Backend;
use crate::inbox::Recorded;
use crate::work::unit::Work;
use axum_core::body::Body;
use axum_core::extract::FromRequestParts;
use axum_core::response::IntoResponse;
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
    marks: Arc<Marks>,
}

/// What the handler did with its [`Tx`], as the layer reads it once the response came.
#[derive(Default)]
struct Marks {
    /// It wrote (or read) through the transaction.
    used: AtomicBool,
}

/// The proof, in a response's extensions, that the handler of this request's [`Slot`]
/// returned it through [`Tx::commit`].
#[derive(Clone)]
struct CommitMark(Arc<Marks>);

/// How the handler's call ended, as its response and its transaction tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The response came out of the handler through [`Tx::commit`]: its writes commit with
    /// it (if the policy keeps its status).
    Committed,
    /// The handler used its transaction, but the response did not come through
    /// [`Tx::commit`]: the handler answered an error, forgot to commit, or did not finish (a
    /// layer inside answered for it, or turned its panic into a response).
    Uncommitted,
    /// The handler never used its transaction, and the response did not come through
    /// [`Tx::commit`].
    Unused,
}

impl<DB: Backend> Clone for Slot<DB> {
    fn clone(&self) -> Self {
        Slot {
            work: self.work.clone(),
            marks: self.marks.clone(),
        }
    }
}

impl<DB: Backend> Slot<DB> {
    pub(crate) fn new(work: RequestWork<DB>) -> Self {
        Slot {
            work: Arc::new(Mutex::new(Some(work))),
            marks: Arc::default(),
        }
    }

    /// The unit of work back from the handler, and how the handler ended, read from its
    /// response (whose proof of [`Tx::commit`] it removes). `None` if the handler still
    /// holds its [`Tx`] (moved it into a task that outlives the request): the work is rolled
    /// back when that lets go.
    pub(crate) fn take(
        &self,
        response: &mut http::response::Parts,
    ) -> Option<(RequestWork<DB>, Ending)> {
        let mut work = self.work.try_lock().ok()?;
        let work = work.take()?;
        let mark = response.extensions.remove::<CommitMark>();
        let ending = if mark.is_some_and(|CommitMark(marks)| Arc::ptr_eq(&marks, &self.marks)) {
            Ending::Committed
        } else if self.marks.used.load(Ordering::Acquire) {
            Ending::Uncommitted
        } else {
            Ending::Unused
        };
        Some((work, ending))
    }
}

/// The transaction of an idempotent request: the key record is written in it, the handler's
/// statements run in it, and the response the handler returns through
/// [`commit`](Self::commit) is stored and committed with them by the layer
/// ([`IdempotencyLayer`](super::IdempotencyLayer)) once the handler returns. Use it as
/// `&mut **tx` wherever sqlx takes an executor (`tx` derefs to the `sqlx::Transaction`, which
/// derefs to the connection), and pass it on to `#[idempotent]` handlers as `&mut *tx` (the
/// `&mut Transaction`; they run in a savepoint of it).
///
/// An extractor: take it as a handler argument, once. Only a route behind the layer has
/// one; elsewhere the extraction fails with a 500 naming the problem. Do not keep it past
/// the handler.
///
/// **The handler commits by returning its response through [`commit`](Self::commit)**: the
/// response then carries the proof that it came out of the handler, and the layer stores it
/// and commits the handler's writes with it. A response that did not come through `commit`
/// — the handler's error path, a handler that forgot it, or an answer the handler never
/// gave: a timeout inside the layer answering for it, a layer turning its panic into a 500 —
/// rolls the writes back and is sent unstored, so a retry of the request runs again. As with
/// a `sqlx::Transaction`, dropping the `Tx` rolls back.
///
/// ```
/// use axum::http::StatusCode;
/// use idem::http::{Committed, DbError, Tx};
/// use sqlx::Sqlite;
///
/// async fn create_order(mut tx: Tx<Sqlite>, body: String)
///     -> Result<Committed<(StatusCode, &'static str)>, DbError> {
///     sqlx::query("INSERT INTO orders (body) VALUES ($1)")
///         .bind(&body)
///         .execute(&mut **tx)
///         .await?; // an error answers without committing: nothing is kept
///     Ok(tx.commit((StatusCode::CREATED, "created")))
/// }
/// ```
pub struct Tx<DB: Backend> {
    guard: OwnedMappedMutexGuard<Option<RequestWork<DB>>, Transaction<'static, DB>>,
    marks: Arc<Marks>,
}

impl<DB: Backend> Deref for Tx<DB> {
    type Target = Transaction<'static, DB>;

    fn deref(&self) -> &Self::Target {
        self.marks.used.store(true, Ordering::Release);
        &self.guard
    }
}

impl<DB: Backend> DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.marks.used.store(true, Ordering::Release);
        &mut self.guard
    }
}

impl<DB: Backend> Tx<DB> {
    /// The handler's answer, with its writes to commit: returned from the handler, it tells
    /// the layer that the handler finished and that `response` is its own. The layer stores
    /// it and commits it with the writes in one transaction (if the layer's
    /// [`store_if`](super::IdempotencyLayer::store_if) keeps its status; otherwise both roll
    /// back), then sends it. The transaction goes back to the layer here: nothing more can
    /// be written through it.
    pub fn commit<R: IntoResponse>(self, response: R) -> Committed<R> {
        Committed {
            response,
            mark: CommitMark(self.marks.clone()),
        }
    }
}

/// A handler's response returned through [`Tx::commit`]: the handler finished, and its
/// writes commit with this response. An axum response (`IntoResponse`).
#[must_use = "return it from the handler: a response that does not carry it commits nothing"]
pub struct Committed<R> {
    response: R,
    mark: CommitMark,
}

impl<R> Committed<R> {
    /// The response inside.
    pub fn get_ref(&self) -> &R {
        &self.response
    }
}

impl<R: core::fmt::Debug> core::fmt::Debug for Committed<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Committed").field(&self.response).finish()
    }
}

impl<R: IntoResponse> IntoResponse for Committed<R> {
    fn into_response(self) -> Response<Body> {
        let mut response = self.response.into_response();
        response.extensions_mut().insert(self.mark);
        response
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
            marks: slot.marks,
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
