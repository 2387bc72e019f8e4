//! Idempotent HTTP requests: an `Idempotency-Key` layer for tower and axum (feature `http`)
//! whose stored response commits in the same transaction as the handler's writes.
//!
//! ```no_run
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use idem::http::{Committed, DbError, IdempotencyLayer, Tx};
//! use idem::inbox::Inbox;
//! use sqlx::Sqlite;
//!
//! async fn create_order(mut tx: Tx<Sqlite>, Json(order): Json<serde_json::Value>)
//!     -> Result<Committed<(StatusCode, &'static str)>, DbError> {
//!     sqlx::query("INSERT INTO orders (body) VALUES ($1)")
//!         .bind(order.to_string())
//!         .execute(&mut **tx)
//!         .await?;
//!     // The response, and the writes to commit with it.
//!     Ok(tx.commit((StatusCode::CREATED, "created")))
//! }
//!
//! /// The tenant your authentication put in the request's extensions.
//! #[derive(Clone)]
//! struct Tenant(String);
//!
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! idem::migrate(&pool).await?;
//! let keys = IdempotencyLayer::new(pool.clone(), Inbox::new("orders-api")?)
//!     .principal(|parts| match parts.extensions.get::<Tenant>() {
//!         Some(Tenant(tenant)) => Ok(tenant.clone()),
//!         None => Err(axum::http::StatusCode::UNAUTHORIZED),
//!     });
//! let app: Router = Router::new().route("/orders", post(create_order).layer(keys));
//! # Ok(()) }
//! ```
//!
//! A request's key is recorded, scoped by its caller ([`IdempotencyLayer::principal`], or
//! [`IdempotencyLayer::unscoped`] knowingly), in the transaction the handler writes through
//! ([`Tx`]); the response the handler returns through [`Tx::commit`] is stored and committed
//! with those writes, then sent (any other response — an error, or an answer a layer inside
//! gave for a handler that did not finish — rolls them back and is not stored). A repeat gets
//! the first response with `Idempotent-Replayed: true`, the same key with another request a
//! 422, a repeat while the first runs a 409. [`IdempotencyLayer::leased`] serves handlers that
//! call an outside service; [`IdempotencyLayer::optimistic`] records the key with the response
//! in one statement at the end, for handlers whose effects are all in the database;
//! [`FormTokens`] makes HTML forms safe to submit twice.
//!
//! The guide's HTTP page, [`idem::guide::http`](https://docs.rs/idem/latest/idem/guide/http/index.html),
//! has every answer the layer gives and why, the leased mode, the optimistic form, form tokens,
//! retention, and a session against `examples/http_orders.rs`.

mod db_error;
mod extract;
mod fingerprint;
mod flight;
mod key;
mod problem;
mod response;
mod scope;
mod service;
pub(crate) mod token;

pub use db_error::DbError;
pub use extract::{Committed, RequestKey, Tx};
pub use key::{IDEMPOTENCY_KEY, KeyProblem, MAX_HTTP_KEY_LEN, request_key};
pub use response::IDEMPOTENT_REPLAYED;
pub use scope::{KeyScope, PerPrincipal, ScopeUnset, Shared};
pub use service::IdempotencyService;
pub use token::{FormTokens, MIN_SECRET_LEN, TokenProblem, WeakSecret};

use crate::backend::Backend;
use crate::inbox::Inbox;
use axum_core::body::Body;
use axum_core::response::IntoResponse;
use flight::InFlight;
use http::request::Parts;
use http::{HeaderName, Response, StatusCode, header};
use sqlx::Pool;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// How long records are kept by default: 24 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request waits for the database by default before a 503: 10 seconds
/// ([`IdempotencyLayer::max_wait`]).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// The principal of a request, or the response refusing it (boxed: it is the rare path).
type Principal = dyn Fn(&Parts) -> Result<String, Box<Response<Body>>> + Send + Sync;

/// The layer's settings, shared by its services.
pub(crate) struct Config<DB: Backend> {
    pool: Pool<DB>,
    inbox: Inbox,
    required: bool,
    principal: Option<Arc<Principal>>,
    compared_headers: Vec<HeaderName>,
    replayed_headers: Vec<HeaderName>,
    max_request_body: usize,
    max_stored_body: usize,
    store_if: fn(StatusCode) -> bool,
    wait: Duration,
    max_wait: Duration,
    retention: Duration,
    /// The leased mode ([`IdempotencyLayer::leased`]).
    leased: bool,
    /// The optimistic form ([`IdempotencyLayer::optimistic`]).
    optimistic: bool,
    /// One-time form tokens ([`IdempotencyLayer::form_tokens`]).
    tokens: Option<FormTokens>,
    in_flight: Arc<InFlight>,
}

/// The `Idempotency-Key` layer: see the [module documentation](self) for what it does with
/// each request. Apply it to the routes whose requests must run once
/// (`post(handler).layer(layer)`, or `Router::route_layer`); their handlers take [`Tx`].
///
/// Its second parameter says whose keys it keeps, and a layer is a tower `Layer` only once
/// that is said: [`principal`](Self::principal) scopes keys per caller
/// ([`PerPrincipal`], the default type), [`unscoped`](Self::unscoped) shares them across
/// all callers ([`Shared`]). A layer fresh from [`new`](Self::new) ([`ScopeUnset`]) is
/// refused at compile time where it is applied.
pub struct IdempotencyLayer<DB: Backend, Scope = PerPrincipal> {
    config: Config<DB>,
    scope: PhantomData<fn() -> Scope>,
}

impl<DB: Backend> IdempotencyLayer<DB, ScopeUnset> {
    /// A layer recording keys in `inbox`'s consumer group (its records live in idem's
    /// inbox table: run [`idem::migrate`](crate::migrate) first), in transactions of `pool`.
    /// Say next whose keys it keeps: [`principal`](Self::principal) or
    /// [`unscoped`](Self::unscoped).
    pub fn new(pool: Pool<DB>, inbox: Inbox) -> Self {
        IdempotencyLayer {
            scope: PhantomData,
            config: Config {
                pool,
                inbox,
                required: true,
                principal: None,
                compared_headers: vec![header::CONTENT_TYPE],
                replayed_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                max_request_body: 1024 * 1024,
                max_stored_body: 256 * 1024,
                store_if: kept_by_default,
                wait: Duration::ZERO,
                max_wait: DEFAULT_MAX_WAIT,
                retention: DEFAULT_RETENTION,
                leased: false,
                optimistic: false,
                tokens: None,
                in_flight: Arc::default(),
            },
        }
    }
}

impl<DB: Backend, Scope> IdempotencyLayer<DB, Scope> {
    /// Whether a request without a key is refused (400, the default) or runs without
    /// idempotency (`false`: it still gets its [`Tx`], and nothing is recorded).
    ///
    /// Requests of the safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`: RFC 9110, 9.2.1)
    /// are never recorded, whatever their key, which is not looked at: they change nothing,
    /// so a later `GET` reads fresh data instead of a replay. Their handlers still get a
    /// [`Tx`].
    pub fn required(mut self, required: bool) -> Self {
        self.config.required = required;
        self
    }

    /// Scopes keys per principal: `principal` names the request's tenant, API key or user
    /// (from its headers or extensions, as your authentication left them), and the same key
    /// from two principals is two records, never a replay of the other's response, nor a
    /// 422 telling one that the other used the key. Its `Err` is sent as the response
    /// (`Err(StatusCode::UNAUTHORIZED)`, say), and nothing runs. An empty principal
    /// (`Ok(String::new())`) names no one and is refused too, with a **401**: it would put
    /// every such caller in one scope, and sharing keys is [`unscoped`](Self::unscoped)'s to
    /// say.
    pub fn principal<R: IntoResponse>(
        self,
        principal: impl Fn(&Parts) -> Result<String, R> + Send + Sync + 'static,
    ) -> IdempotencyLayer<DB, PerPrincipal> {
        let mut config = self.config;
        config.principal = Some(Arc::new(move |parts: &Parts| {
            principal(parts).map_err(|refused| Box::new(refused.into_response()))
        }));
        IdempotencyLayer {
            config,
            scope: PhantomData,
        }
    }

    /// Shares keys across all callers: every request is in one scope, so a caller sending
    /// another's key with the same request gets the other's stored response, and with a
    /// different one a 422 (telling it the key was used). Only for routes whose callers are
    /// one party (a single internal client) or whose keys no caller can guess (the server's
    /// own [`form_tokens`](Self::form_tokens)); otherwise scope keys with
    /// [`principal`](Self::principal).
    pub fn unscoped(self) -> IdempotencyLayer<DB, Shared> {
        let mut config = self.config;
        config.principal = None;
        IdempotencyLayer {
            config,
            scope: PhantomData,
        }
    }

    /// The request headers that are part of its fingerprint, besides the method, the path
    /// and query and the body (by default `Content-Type`).
    pub fn compare_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.compared_headers = names.into_iter().collect();
        self
    }

    /// The response headers stored and replayed with the status and the body (by default
    /// `Content-Type` and `Location`). Others — `Set-Cookie`, say — are not replayed.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.replayed_headers = names.into_iter().collect();
        self
    }

    /// The largest request body read (by default 1 MiB); a longer one is refused with 413
    /// before anything runs.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.config.max_request_body = bytes;
        self
    }

    /// The largest response body kept for replays (by default 256 KiB). A longer one is
    /// sent but not kept (see the [module documentation](self)).
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.config.max_stored_body = bytes;
        self
    }

    /// Which statuses of the responses handlers return through [`Tx::commit`] are stored and
    /// committed with the handler's writes. By default every status below 500 but 408
    /// (Request Timeout) and 429 (Too Many Requests), answers that tell the client to try
    /// again and would, stored, be its key's answer for good: a status not kept rolls the
    /// handler's writes back and is not stored, so a retry runs again. `|_| true` keeps
    /// everything. (A response that does not come through `Tx::commit` is never stored; in
    /// the [`leased`](Self::leased) mode, which has no `Tx`, the policy alone decides, and a
    /// status it does not keep is a failed attempt.)
    pub fn store_if(mut self, keep: fn(StatusCode) -> bool) -> Self {
        self.config.store_if = keep;
        self
    }

    /// How long a repeat of a request still running in this process waits for it before
    /// the 409 (by default not at all). A repeat that gets its turn gets the first response.
    /// In every form: in the [`leased`](Self::leased) one, a repeat that waited in vain asks
    /// the database, which answers the 409 with the lease's end as its `Retry-After`. A
    /// repeat arriving at another process is answered by the database (see the module
    /// documentation).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// How long a request (its body already read) waits for the database before its key is
    /// recorded (by default [`DEFAULT_MAX_WAIT`], 10 s): on SQLite for the writer's turn,
    /// which every key shares, so a hung handler cannot queue every request of the process
    /// behind it — when it runs out the answer is **503** with `Retry-After`, and nothing ran;
    /// on MySQL for a first request of the same key still holding its record — then a
    /// **409**, as on PostgreSQL at once.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.config.max_wait = wait;
        self
    }

    /// The leased mode, for handlers that call something outside the database (a payment
    /// API): the key is claimed as PROCESSING with a lease of `lease` in a short transaction
    /// of its own, the handler runs (it has no [`Tx`]; it writes through the pool, and passes
    /// [`RequestKey::derive`] to the outside call as its idempotency key), and its response is
    /// recorded in a second transaction. While the handler runs, the layer extends the lease
    /// every third of it ([`Lease::keep_alive`](crate::inbox::Lease::keep_alive)), so a repeat
    /// gets a 409 whose `Retry-After` is the lease's end however long the handler takes;
    /// once the beats stop (the first request's process died, say) and the lease ends, a
    /// repeat takes the key over and runs the handler again, with the same derived key for
    /// the outside call. A status the policy does not keep (a 5xx, a 408, a 429) is recorded
    /// as a failed attempt: a repeat runs again, and after the inbox's
    /// [`max_attempts`](Inbox::max_attempts) the key is parked (a 500 saying so). Every
    /// response the policy keeps is stored, an extractor's rejection included, and an answer
    /// a layer inside gives for the handler: keep timeouts outside the layer (a timeout's
    /// 408 inside is a failed attempt under the default policy, not the key's answer).
    pub fn leased(mut self, lease: Duration) -> Self {
        self.config.inbox = self.config.inbox.clone().lease(lease);
        self.config.leased = true;
        self.config.optimistic = false;
        self
    }

    /// The optimistic form, for handlers whose every effect is in their [`Tx`]: the key is
    /// recorded together with the response, in one statement just before the commit,
    /// instead of before the handler and again after it. A first request then costs one
    /// statement more than the handler without idempotency (the default form costs two,
    /// and a lock).
    ///
    /// What changes for a repeat: it runs the handler too, in its own transaction. Its
    /// insert of the key waits for the first's commit (an instant: the first inserts its
    /// record last) and finds the key taken, so its writes roll back and it gets the first
    /// response (`Idempotent-Replayed: true`) — also when it reaches another instance while
    /// the first runs, which the default form answers with a 409. A repeat reaching the
    /// same instance meanwhile is a 409 in both forms, or, with [`wait`](Self::wait), waits
    /// for the first and then runs in the default form, which replays the first response
    /// without running the handler. The default form never runs a repeat's handler. A repeat whose handler
    /// answers with a status that is not stored (a 5xx, say, because its writes collided
    /// with the first's) still gets the first response if the key is recorded by then. The
    /// same key with another request is a 422, as always (after its handler ran and its
    /// writes rolled back). A key the leased form holds on the same inbox is a 409; one it
    /// failed, or whose lease ended, runs the request again in the default form, which
    /// takes the record over. Each request's writes commit at most once; effects outside the
    /// database would run again with every repeat: for those, [`leased`](Self::leased). The
    /// last of `optimistic` and `leased` called chooses the form. The guide's HTTP page
    /// shows the statement and every answer.
    pub fn optimistic(mut self) -> Self {
        self.config.optimistic = true;
        self.config.leased = false;
        self
    }

    /// One-time form tokens: the route's key is a token issued by `tokens` with the form
    /// ([`FormTokens::issue`]), sent back in the form's field ([`FormTokens::field`],
    /// `idem_token` by default, in an `application/x-www-form-urlencoded` body) or as the
    /// `Idempotency-Key`. A forged or expired token is a 400 and nothing runs; a valid one is
    /// the request's key, so the submit is consumed by the record's insert: a double submit
    /// runs once and the second gets the first response (with [`wait`](Self::wait), also
    /// when it arrives while the first still runs, as a double click does).
    ///
    /// # Panics
    ///
    /// If the tokens live longer than the layer's [`retention`](Self::retention): a token
    /// must expire before its record can be purged, or a resubmit after the purge would run
    /// again. Shorten the tokens' ttl or lengthen the retention (set before or after; the
    /// second of the two calls refuses it, when the layer is built).
    pub fn form_tokens(mut self, tokens: FormTokens) -> Self {
        Config::<DB>::refuse_outliving(&tokens, self.config.retention);
        self.config.tokens = Some(tokens);
        self
    }

    /// How long records are kept (by default 24 hours), for
    /// [`spawn_sweeper`](Self::spawn_sweeper) and [`purge`](Self::purge).
    ///
    /// # Panics
    ///
    /// If the layer's [`form_tokens`](Self::form_tokens) live longer than `retention` (see
    /// there).
    pub fn retention(mut self, retention: Duration) -> Self {
        if let Some(tokens) = &self.config.tokens {
            Config::<DB>::refuse_outliving(tokens, retention);
        }
        self.config.retention = retention;
        self
    }

    /// The retention.
    pub fn retention_period(&self) -> Duration {
        self.config.retention
    }

    /// Deletes the records older than the retention, in batches of at most `batch`; how
    /// many it deleted.
    pub async fn purge(&self, batch: u32) -> Result<u64, crate::Error<std::convert::Infallible>> {
        self.config
            .inbox
            .purge(&self.config.pool, self.config.retention, batch)
            .await
    }

    /// Runs [`purge`](Self::purge) every `every` on a background task, in batches of 1,000.
    /// Fails, starting nothing, outside a Tokio runtime or with a zero `every`.
    pub fn spawn_sweeper(
        &self,
        every: Duration,
    ) -> Result<tokio::task::JoinHandle<()>, crate::inbox::SweeperError> {
        self.config.inbox.spawn_sweeper(
            self.config.pool.clone(),
            self.config.retention,
            every,
            1000,
        )
    }
}

/// The default of [`IdempotencyLayer::store_if`]: every status below 500 but 408 (Request
/// Timeout) and 429 (Too Many Requests).
fn kept_by_default(status: StatusCode) -> bool {
    !status.is_server_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS
}

impl<DB: Backend, Scope> Clone for IdempotencyLayer<DB, Scope> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: self.config.clone(),
            scope: PhantomData,
        }
    }
}

impl<DB: Backend> Config<DB> {
    /// Refuses form tokens that outlive the records of their keys.
    fn refuse_outliving(tokens: &FormTokens, retention: Duration) {
        assert!(
            tokens.ttl() <= retention,
            "idem: the form tokens live {:?}, longer than the layer's retention of {:?}: a resubmit after its record is purged would run again; shorten the tokens' ttl or lengthen `.retention(…)`",
            tokens.ttl(),
            retention
        );
    }
}

impl<DB: Backend> Clone for Config<DB> {
    fn clone(&self) -> Self {
        Config {
            pool: self.pool.clone(),
            inbox: self.inbox.clone(),
            required: self.required,
            principal: self.principal.clone(),
            compared_headers: self.compared_headers.clone(),
            replayed_headers: self.replayed_headers.clone(),
            max_request_body: self.max_request_body,
            max_stored_body: self.max_stored_body,
            store_if: self.store_if,
            wait: self.wait,
            max_wait: self.max_wait,
            retention: self.retention,
            leased: self.leased,
            optimistic: self.optimistic,
            tokens: self.tokens.clone(),
            in_flight: self.in_flight.clone(),
        }
    }
}

impl<S, DB: Backend, Scope: KeyScope> tower_layer::Layer<S> for IdempotencyLayer<DB, Scope> {
    type Service = IdempotencyService<S, DB>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::new(self.config.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_keeps_no_answer_that_says_try_again() {
        for kept in [200, 201, 204, 303, 400, 404, 409, 422] {
            assert!(
                kept_by_default(StatusCode::from_u16(kept).unwrap()),
                "{kept}"
            );
        }
        for not_kept in [408, 429, 500, 502, 503, 504] {
            assert!(
                !kept_by_default(StatusCode::from_u16(not_kept).unwrap()),
                "{not_kept}"
            );
        }
    }
}
