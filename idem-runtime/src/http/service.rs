//! The layer's service: key → body → unit of work (the key record as its stage) → the
//! handler in its transaction → the response stored and committed with the handler's
//! writes → the response sent.

use super::Config;
use super::extract::{Ending, RequestKey, Slot};
use super::fingerprint::{fingerprint, record_key};
use super::flight::Flight;
use super::key::{KeyProblem, request_key};
use super::problem::Problem;
use super::response::StoredResponse;
use super::token::form_field;
use crate::backend::Backend;
use crate::error::Error;
use crate::inbox::{Claimed, Delivery, InboxPlan, InboxStage, MessageKey, Recorded};
use crate::work::stored::MAX_RESULT_LEN;
use crate::work::stored::codec;
use crate::work::unit::{Begun, Entered, Entry, Plan, begin};
use axum_core::body::Body;
use bytes::Bytes;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Limited};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower_service::Service;

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around a handler.
pub struct IdempotencyService<S, DB: Backend> {
    pub(super) inner: S,
    pub(super) config: Arc<Config<DB>>,
}

impl<S: Clone, DB: Backend> Clone for IdempotencyService<S, DB> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, DB, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, DB>
where
    DB: Backend,
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: HttpBody<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready runs this request; its clone serves the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move { serve(&config, inner, request).await })
    }
}

/// One request, start to end.
async fn serve<S, DB, ReqBody, ResBody>(
    config: &Config<DB>,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response<Body>, S::Error>
where
    DB: Backend,
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send,
    S::Future: Send,
    ReqBody: HttpBody<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    if parts.method.is_safe() {
        // GET, HEAD, OPTIONS and TRACE change nothing by definition (RFC 9110, 9.2.1): their
        // key is not looked at and nothing is recorded, so a later GET reads fresh data
        // instead of a replay. The handler still gets its transaction.
        let request = Request::from_parts(parts, Body::new(body));
        return run(config, inner, request, &Unrecorded, None)
            .await
            .map(Ran::response);
    }
    let header_key = match request_key(&parts.headers) {
        Ok(key) => key,
        Err(problem) => return Ok(bad_key(&problem)),
    };
    if header_key.is_none() && config.tokens.is_none() {
        if config.required {
            return Ok(bad_key(&KeyProblem::Missing));
        }
        // No key on a route where it is optional: the handler still gets its
        // transaction, and nothing is recorded.
        let request = Request::from_parts(parts, Body::new(body));
        return run(config, inner, request, &Unrecorded, None)
            .await
            .map(Ran::response);
    }
    let scope = match &config.principal {
        Some(principal) => match principal(&parts) {
            Ok(scope) if scope.is_empty() => return Ok(no_principal()),
            Ok(scope) => scope,
            Err(refused) => return Ok(*refused),
        },
        None => String::new(),
    };
    let body = match read_body(&parts, body, config.max_request_body).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem.into_response()),
    };
    // A form's token, in its body when it is not in the header.
    let form_key = || {
        let tokens = config.tokens.as_ref()?;
        let form = is_media_type(
            parts.headers.get(header::CONTENT_TYPE),
            "application/x-www-form-urlencoded",
        );
        form.then(|| form_field(&body, tokens.field_name()))
            .flatten()
    };
    let Some(key) = header_key.or_else(form_key) else {
        if config.required {
            return Ok(bad_key(&KeyProblem::Missing));
        }
        let request = Request::from_parts(parts, Body::from(body));
        return run(config, inner, request, &Unrecorded, None)
            .await
            .map(Ran::response);
    };
    if let Some(Err(problem)) = config.tokens.as_ref().map(|tokens| tokens.check(&key)) {
        return Ok(Problem::new(
            StatusCode::BAD_REQUEST,
            "Invalid form token",
            problem.to_string(),
        )
        .into_response());
    }
    let record = record_key(&scope, &key);
    // 64 hex characters: always a valid message key.
    let Ok(message) = MessageKey::new(record.as_str()) else {
        return Ok(server_error("the record key could not be formed"));
    };
    let fingerprint = fingerprint(&parts, &config.compared_headers, &body);
    // The optimistic form runs a request again in the default form when the key's record
    // turns out, at the commit, to be one to take over: the request is kept for that.
    let again = config
        .optimistic
        .then(|| (parts.clone(), body.clone(), inner.clone()));
    let mut request = Request::from_parts(parts, Body::from(body));
    request.extensions_mut().insert(RequestKey(record.clone()));
    if config.leased {
        // The claim commits at once: the database answers a repeat, and after the lease a
        // repeat may take the key over. A repeat of a request still running in this process
        // waits for it first (at most `wait`), and then asks the database, which replays
        // the first response, or answers 409 with the lease's end if it still runs.
        let flight = match config.wait.is_zero() {
            true => None,
            false => config.in_flight.enter(&record, config.wait).await,
        };
        let answer = leased(config, inner, request, &message, fingerprint).await;
        drop(flight);
        return answer;
    }
    // A repeat of a request still running in this process: answered at once, or after
    // waiting for it (bounded), without queueing for the database.
    let Some(flight) = config.in_flight.enter(&record, config.wait).await else {
        return Ok(in_progress(None));
    };
    // A repeat that waited here for its first request runs in the default form: the first
    // most likely recorded the key, and the default form replays it without running the
    // handler again.
    let again = again.filter(|_| !flight.waited());
    // Waiting for the writer's turn (SQLite) is waiting for other keys: bounded by the
    // layer's `max_wait`, then a 503. On PostgreSQL a first request of this key still
    // running in another process makes this one in progress at once (a 409), without
    // waiting for it; on MySQL after waiting for it at most `max_wait`.
    let stage = |fingerprint| {
        InboxStage::fingerprinted(&config.inbox, &message, fingerprint).unblocked(config.max_wait)
    };
    let codec = codec::<Result<StoredResponse, Infallible>>;
    let Some((parts, body, again)) = again else {
        let plan = InboxPlan::new(stage(fingerprint), codec());
        return run(config, inner, request, &plan, Some(flight))
            .await
            .map(Ran::response);
    };
    let plan = InboxPlan::new(stage(fingerprint.clone()).at_commit(), codec());
    match run(config, inner, request, &plan, Some(flight)).await? {
        Ran::Done(response) => Ok(response),
        Ran::Again(flight) => {
            let mut request = Request::from_parts(parts, Body::from(body));
            request.extensions_mut().insert(RequestKey(record));
            let plan = InboxPlan::new(stage(fingerprint), codec());
            run(config, again, request, &plan, flight)
                .await
                .map(Ran::response)
        }
    }
}

/// How [`run`] ended.
enum Ran {
    /// With this response.
    Done(Response<Body>),
    /// The optimistic form's request found at the commit a record to take over (failed,
    /// or its lease expired) or still in progress: its writes were rolled back, and it is
    /// to run again in the default form (which takes the record over, or answers 409),
    /// still holding its turn among the requests of its key in this process.
    Again(Option<Flight>),
}

impl Ran {
    fn response(self) -> Response<Body> {
        match self {
            Ran::Done(response) => response,
            // Only the optimistic form's plan runs again, and its caller sees to it.
            Ran::Again(_) => in_progress(None),
        }
    }
}

/// Begins the unit of work of `plan`, runs the handler in it if its stages let it, and
/// stores the response (if the policy keeps it) and commits, or rolls back.
async fn run<S, DB, P, ResBody>(
    config: &Config<DB>,
    mut inner: S,
    mut request: Request<Body>,
    plan: &P,
    flight: Option<Flight>,
) -> Result<Ran, S::Error>
where
    DB: Backend,
    S: Service<Request<Body>, Response = Response<ResBody>> + Send,
    S::Future: Send,
    P: Answer<DB> + Plan<DB, Value = StoredResponse>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let work = match begin(&config.pool, plan).await {
        Begun::Run(work) => work,
        Begun::Done(done) => return Ok(Ran::Done(P::answer(done, Now::of(config)))),
    };
    let held = work.held();
    let slot = Slot::new(work.map_kept(P::slotted));
    request.extensions_mut().insert(slot.clone());
    let response = held.run(inner.call(request)).await?;
    let (mut parts, body) = response.into_parts();
    let Some((work, ending)) = slot.take(&mut parts) else {
        // The handler kept its transaction past the request: it rolls back whenever that
        // ends, so nothing can be stored now.
        drop(flight);
        return Ok(Ran::Done(server_error(
            "the handler kept its idem::http::Tx after it returned; nothing was committed",
        )));
    };
    if ending == Ending::Uncommitted && parts.status.is_success() {
        // Most likely a handler that forgot `tx.commit(…)`; an error path, or an answer a
        // layer inside gave for a handler that did not finish, is not a success.
        tracing::warn!(
            status = parts.status.as_u16(),
            "idem: a response that did not come through Tx::commit; the handler's writes were rolled back and nothing was stored"
        );
    }
    if ending != Ending::Committed || !(config.store_if)(parts.status) {
        // Not the handler's result to keep (it did not return it through `Tx::commit`: an
        // error, or an answer a layer inside gave for it), or not kept by the policy (a 5xx:
        // the retry runs again): nothing commits.
        drop(work);
        // In the optimistic form, a repeat's handler may fail because the first's writes
        // committed meanwhile: the first's response is the answer then.
        let recalled = plan.recall(&config.pool).await;
        drop(flight);
        return Ok(Ran::Done(match recalled {
            Some(done) => P::answer(done, Now::of(config)),
            None => Response::from_parts(parts, Body::new(body)),
        }));
    }
    let (body, stored) = match kept(config, &parts, body).await {
        Ok(kept) => kept,
        Err(failed) => {
            drop(work);
            return Ok(Ran::Done(failed));
        }
    };
    let finished = work.finish(plan, Ok::<_, Infallible>(stored)).await;
    Ok(Ran::Done(match finished {
        Ok(reply) if P::processed(&reply) => Response::from_parts(parts, body),
        // The optimistic form's request lost the key to a record it may not answer from.
        Ok(reply) if P::runs_again(&reply) => return Ok(Ran::Again(flight)),
        // The optimistic form's repeat: its writes rolled back at the commit, and it
        // answers as the request that took the key first.
        lost @ Ok(_) => P::answer(lost, Now::of(config)),
        Err(e) => commit_failed(&e),
    }))
}

/// The answer when the commit of a handler's writes and its response failed. A lost
/// connection or a lost conflict (a Galera certification failure, a serialization failure
/// at COMMIT) is worth a retry with the same key — a 503 with `Retry-After` — and the
/// first may well have committed (the connection was cut after the server got the COMMIT):
/// then the retry is replayed, never run twice. Any other error is a 500.
fn commit_failed(e: &Error<Infallible>) -> Response<Body> {
    tracing::error!(error = %e, "idem: the idempotent request's commit failed");
    if !e.is_transient() {
        return server_error(
            "the request's changes could not be committed; nothing was stored, retry with the same key",
        );
    }
    Problem::unavailable(
        "Commit not confirmed",
        "the database did not confirm the request's commit; retry with the same key: if it \
         committed, its response is replayed, and it never runs twice",
    )
    .into_response()
}

/// The response's body to send, and its stored form: with the body when it is kept, or
/// without (streamed, or too large: logged). `Err`: the body failed while being read.
async fn kept<DB: Backend, B>(
    config: &Config<DB>,
    parts: &http::response::Parts,
    body: B,
) -> Result<(Body, StoredResponse), Response<Body>>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (body, bytes) = if kept_length(parts, &body, config.max_stored_body) {
        // Read through the limit even so: a size hint is only a hint.
        match Limited::new(body, config.max_stored_body).collect().await {
            Ok(collected) => {
                let bytes = collected.to_bytes();
                (Body::from(bytes.clone()), Some(bytes))
            }
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(server_error(
                    "the handler's response body was longer than its size hint said; nothing was kept",
                ));
            }
            Err(_) => {
                return Err(server_error(
                    "the handler's response body failed; nothing was kept",
                ));
            }
        }
    } else {
        (Body::new(body), None)
    };
    let mut stored = StoredResponse::of(parts, &config.replayed_headers, bytes.as_ref());
    // Encoded once more only when it could exceed the bound (JSON escapes at most six bytes
    // per byte); a small response is encoded once, when it is stored.
    let could_exceed = bytes.as_ref().is_some_and(|b| {
        let headers: usize = stored
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 8)
            .sum();
        b.len() * 6 + headers + 256 > MAX_RESULT_LEN
    });
    let too_large = could_exceed
        && serde_json::to_string(&stored).is_ok_and(|json| json.len() > MAX_RESULT_LEN);
    if too_large {
        stored = StoredResponse::of(parts, &config.replayed_headers, None);
    }
    if bytes.is_none() || too_large {
        tracing::warn!(
            status = parts.status.as_u16(),
            limit = config.max_stored_body,
            "idem: the response body is streamed or larger than the layer keeps; a repeat replays its status and headers with an empty body"
        );
    }
    Ok((body, stored))
}

/// The leased mode: the key is claimed as PROCESSING with a lease in a short transaction,
/// the handler runs outside any transaction of idem's (it calls something outside the
/// database), and its response is recorded in a second one.
async fn leased<S, DB, ResBody>(
    config: &Config<DB>,
    mut inner: S,
    request: Request<Body>,
    message: &MessageKey,
    fingerprint: String,
) -> Result<Response<Body>, S::Error>
where
    DB: Backend,
    S: Service<Request<Body>, Response = Response<ResBody>> + Send,
    S::Future: Send,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let claimed = config
        .inbox
        .claim_fingerprinted::<DB, StoredResponse>(&config.pool, message, fingerprint)
        .await;
    let lease = match claimed {
        Ok(Claimed::Work(lease)) => lease,
        Ok(Claimed::Done(delivery)) => {
            return Ok(delivered(Ok(delivery), Now::of(config)));
        }
        Err(e) => return Ok(database_error(&e)),
    };
    // The lease is extended while the handler runs (and while its response is read), so a
    // repeat gets a 409 however long it takes. If the process dies from here, the beats stop
    // and the record stays PROCESSING until its lease ends; then a repeat takes it over.
    let response = lease.keep_alive(&config.pool, inner.call(request)).await?;
    let (parts, body) = response.into_parts();
    if !(config.store_if)(parts.status) {
        // A failed attempt: recorded as FAILED, so a repeat runs again (and after the
        // inbox's last attempt the key is parked).
        let failure = format!("the handler answered {}", parts.status);
        if let Err(e) = lease
            .complete(&config.pool, Err::<StoredResponse, _>(failure))
            .await
            && !matches!(e, Error::Handler(_))
        {
            tracing::error!(error = %e, "idem: a failed attempt could not be recorded");
        }
        return Ok(Response::from_parts(parts, Body::new(body)));
    }
    let (body, stored) = match lease
        .keep_alive(&config.pool, kept(config, &parts, body))
        .await
    {
        Ok(kept) => kept,
        Err(failed) => return Ok(failed),
    };
    let completed = lease.complete(&config.pool, Ok::<_, String>(stored)).await;
    match completed {
        Ok(_) => Ok(Response::from_parts(parts, body)),
        Err(Error::LeaseLost { .. }) => {
            // The lease ran out and a repeat took the key over: it runs the handler (with
            // the same key for the outside call) and records its own response.
            tracing::warn!("idem: the request outlived its lease; its response was not recorded");
            Ok(Response::from_parts(parts, body))
        }
        Err(e) => {
            tracing::error!(error = %e, "idem: the leased request's response could not be recorded");
            Ok(server_error(
                "the request ran, but its response could not be recorded; retry with the same key once its lease ends",
            ))
        }
    }
}

/// Whether the response's body is to be kept: its length is known and within `limit`, and
/// it is not an event stream.
fn kept_length<B: HttpBody>(parts: &http::response::Parts, body: &B, limit: usize) -> bool {
    let streamed = is_media_type(parts.headers.get(header::CONTENT_TYPE), "text/event-stream");
    let hint = body.size_hint();
    !streamed && hint.upper().is_some_and(|n| n <= limit as u64)
}

/// The request body, read up to `limit` bytes.
async fn read_body<B>(parts: &http::request::Parts, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large",
            format!("an idempotent request's body may be at most {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(_) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "Unreadable request body",
            "the request body could not be read",
        )),
    }
}

/// The time as this instance sees it, for the advice of `Retry-After` only (a lease's end
/// is the database's time): a skewed clock makes the advice at worst 0 or one lease.
#[derive(Clone, Copy)]
struct Now {
    local: i64,
    lease: i64,
}

impl Now {
    fn of<DB: Backend>(config: &Config<DB>) -> Now {
        Now {
            local: config.inbox.local_now_millis(),
            lease: config.inbox.lease_millis(),
        }
    }

    /// Milliseconds until `until`, within 0 and one lease.
    fn until(self, until: i64) -> i64 {
        until.saturating_sub(self.local).clamp(0, self.lease.max(0))
    }
}

/// How a plan's early end becomes a response.
trait Answer<DB: Backend>: Plan<DB> {
    /// `now`: the time, for `Retry-After`.
    fn answer(done: Result<Self::Reply, Error<Infallible>>, now: Now) -> Response<Body>;

    /// What the stages keep, as the handler's slot holds it (a request with a key keeps its
    /// record; one without keeps nothing).
    fn slotted(kept: Self::Kept) -> Option<Recorded>;

    /// Whether the committed call's reply is its own handler's (not a repeat's answer).
    fn processed(reply: &Self::Reply) -> bool;

    /// Whether a call that lost its key at the commit is to run again in the default form
    /// (see [`Ran::Again`]).
    fn runs_again(reply: &Self::Reply) -> bool;

    /// What became of the request that took the key while this one's handler failed
    /// (see [`InboxPlan::recall`]).
    fn recall(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> impl Future<Output = Option<Result<Self::Reply, Error<Infallible>>>> + Send;
}

impl<DB: Backend> Answer<DB> for InboxPlan<StoredResponse> {
    fn slotted(kept: Recorded) -> Option<Recorded> {
        Some(kept)
    }

    fn processed(reply: &Delivery<StoredResponse>) -> bool {
        matches!(reply, Delivery::Processed(_))
    }

    fn runs_again(reply: &Delivery<StoredResponse>) -> bool {
        matches!(reply, Delivery::InProgress { .. })
    }

    async fn recall(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> Option<Result<Delivery<StoredResponse>, Error<Infallible>>> {
        InboxPlan::recall(self, pool).await
    }

    fn answer(
        done: Result<Delivery<StoredResponse>, Error<Infallible>>,
        now: Now,
    ) -> Response<Body> {
        delivered(done, now)
    }
}

/// The answer to a request whose key's record ended the call: a replay, a 422, a 409, …
fn delivered(
    done: Result<Delivery<StoredResponse>, Error<Infallible>>,
    now: Now,
) -> Response<Body> {
    match done {
            Ok(Delivery::Duplicate {
                first_result: Some(stored),
            }) => stored.replay().unwrap_or_else(damaged),
            Ok(Delivery::Conflict) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency-Key reused",
                "this Idempotency-Key was used for a different request (method, path, body or compared headers); the first request's response stays. Send a new request with a new key",
            )
            .into_response(),
            Ok(Delivery::InProgress { lease_until_millis }) => {
            in_progress(lease_until_millis.map(|until| now.until(until)))
        }
            Ok(Delivery::Dead { attempts, .. }) => server_error(&format!(
                "the request with this key failed on each of its {attempts} attempts and is parked; use a new key"
            )),
            Ok(Delivery::Processed(_) | Delivery::Duplicate { first_result: None }) => {
                server_error("the record of this key holds no response")
            }
            Ok(Delivery::Refused(never)) => match never {},
            // The record's response no longer decodes: the request ran before.
            Err(Error::Result(e)) => {
                tracing::error!(error = %e, "idem: a stored response does not decode");
                damaged()
            }
            Err(e) => database_error(&e),
        }
}

/// A 500 for a key whose stored response cannot be replayed (its record is damaged): the
/// request ran before, so this is not "nothing ran, retry".
fn damaged() -> Response<Body> {
    server_error(
        "the stored response of this key is damaged and cannot be replayed; the request ran before, so do not retry it under a new key without checking its effect",
    )
}

/// The plan of a request without a key on a route where it is optional: no stage, only
/// the transaction.
struct Unrecorded;

impl<DB: Backend> Plan<DB> for Unrecorded {
    type Value = StoredResponse;
    type Reply = ();
    type Kept = ();

    async fn enter(
        &self,
        _: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<()>, Error<Infallible>> {
        Ok(Entered::Run(()))
    }

    fn encode(&self, _: &StoredResponse) -> Result<String, Error<Infallible>> {
        // Nothing to store: no stage keeps a result.
        Ok("null".to_owned())
    }

    fn applied(&self, _: StoredResponse) {}

    fn labels(&self) -> crate::work::observe::Labels<'_> {
        crate::work::observe::Labels::default()
    }

    fn outcome_name(_: &()) -> &'static str {
        "processed"
    }
}

impl<DB: Backend> Answer<DB> for Unrecorded {
    fn slotted((): ()) -> Option<Recorded> {
        None
    }

    fn processed((): &()) -> bool {
        true
    }

    fn runs_again((): &()) -> bool {
        false
    }

    async fn recall(&self, _: &sqlx::Pool<DB>) -> Option<Result<(), Error<Infallible>>> {
        None
    }

    fn answer(done: Result<(), Error<Infallible>>, _: Now) -> Response<Body> {
        match done {
            Ok(()) => server_error("a request without a key ended before its handler"),
            Err(e) => database_error(&e),
        }
    }
}

/// Whether a `Content-Type` names `essence` (`type/subtype`, lowercase), whatever its
/// parameters, in any case (RFC 9110, 8.3.1: type and subtype are case-insensitive).
fn is_media_type(value: Option<&HeaderValue>, essence: &str) -> bool {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(essence))
}

/// A 401 for a request whose principal function named no one (an empty principal): keys are
/// scoped per caller, and an empty scope would be shared by every such caller.
fn no_principal() -> Response<Body> {
    tracing::warn!(
        "idem: the layer's principal function returned an empty principal; the request is refused (return Err for an unauthenticated caller, or scope the route with .unscoped() knowingly)"
    );
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "No principal",
        "the request names no caller, and this route keeps idempotency keys per caller",
    )
    .into_response()
}

fn bad_key(problem: &KeyProblem) -> Response<Body> {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "Invalid Idempotency-Key",
        problem.to_string(),
    )
    .into_response()
}

/// A 409: the key's first request still runs; retry after `remaining_millis` (its lease),
/// or in a second when that is not known.
fn in_progress(remaining_millis: Option<i64>) -> Response<Body> {
    let after = remaining_millis
        .map(|ms| Duration::from_millis(ms.max(0) as u64))
        .unwrap_or(Duration::from_secs(1));
    let mut problem = Problem::new(
        StatusCode::CONFLICT,
        "Request in progress",
        "a request with this Idempotency-Key is still being processed; retry after it ends to get its response",
    );
    problem.retry_after = Some(after);
    problem.into_response()
}

fn server_error(detail: &str) -> Response<Body> {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Idempotent request failed",
        detail,
    )
    .into_response()
}

/// A database error before the handler ran: nothing was recorded, so the same request may
/// be retried (a 503 when the database was only busy).
fn database_error(e: &Error<Infallible>) -> Response<Body> {
    tracing::error!(error = %e, "idem: the idempotency key could not be recorded");
    let detail = "the request's key could not be recorded; nothing ran, retry with the same key";
    if e.is_transient() {
        Problem::unavailable("Database busy", detail).into_response()
    } else {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Idempotent request failed",
            detail,
        )
        .into_response()
    }
}
