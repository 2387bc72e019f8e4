//! One unit of work: **begin → stages → body → finish**.
//!
//! Every call idem makes on a handler's behalf has this shape, whatever it combines:
//!
//! 0. **the fast path** (feature `redis`, a cache attached to the pool): a duplicate whose
//!    first result is in the cache is answered from there, and the call ends before any
//!    statement;
//! 1. **begin** — a write transaction from the pool (the SQLite writer's turn first, the
//!    inbox's lock timeout if it has one), or a savepoint in a transaction the caller owns;
//!    or, for a plan whose stages need no transaction on this backend (a handler without
//!    one, whose result already rides in its statement), a connection in autocommit;
//! 2. **stages**, in order, in that transaction — the inbox record, the transition's
//!    conditional UPDATE. Each either lets the call go on, or ends it with a reply (a
//!    duplicate, a refusal, …) that rolls back or commits what the stages wrote. A conflict
//!    lost here (serialization failure, deadlock, busy database), or at the COMMIT of what
//!    the stages wrote (a Galera certification failure), rolls back and begins again, with
//!    bounded backoff: the body has not run, so nothing can be duplicated;
//! 3. **the body**, only if every stage let the call go on, in the same transaction;
//! 4. **finish** — the body's result encoded once and bounded, stored by each stage that
//!    stores one, then COMMIT (or RELEASE of the savepoint), then the counters, then (from
//!    a pool with a cache) the first result written to the cache. A stage that records its
//!    key only here, with the result (the HTTP layer's optimistic form), may find the key
//!    taken by a call that committed first: then everything rolls back, the body's writes
//!    included, and the call replies as a repeat of that one.
//!
//! What a stage needs between its entry and the commit (where to store the result, what to
//! count once committed) is its [`Kept`]: the unit of work holds the plan's `Kept` (one
//! stage's, a tuple of several, or `()`) without knowing which stages it comes from, so a
//! new stage brings its own `Kept` and [`Work::finish`] stays as it is.
//!
//! A [`Plan`] is the list of stages of one kind of call and the shape of its reply; the
//! code `#[idempotent]` generates builds one, calls [`start`] where its [`Source`](crate::Source) says,
//! runs the body and calls [`Work::finish`], the same two calls for every combination.
//! The leased inbox's claim, completion and lease extension, and each batch of a purge, are
//! plans too, whose stage always ends the call (they have no body in the database), so they
//! share the begin, the conflict retry, the span and the once-only counting.

use crate::backend::{Backend, Database, Dialect, Opened, WriterGuard, holding, is_conflict};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::work::effect::{CallScope, within};
use crate::work::fast::{CacheKey, Fast};
use crate::work::observe::Labels;
use crate::work::retry::Backoff;
use crate::work::source::Origin;
use crate::work::stored::bounded;
use crate::work::unwind::{Panicked, unwound};
use core::future::Future;
use sqlx::{Connection, Pool, Transaction};
use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, Span};

/// What the stages of a call found.
pub enum Entered<R, K = ()> {
    /// Every stage lets the call go on: run the body, then [`Work::finish`] with what the
    /// stages keep until the commit.
    Run(K),
    /// The call ends here with `reply`; `commit` says whether the stages' writes are kept
    /// (an inbox record of a delivery that had nothing left to do) or rolled back.
    Done {
        /// What the caller gets.
        reply: R,
        /// Keep the stages' writes.
        commit: bool,
    },
}

/// What a stage keeps from its entry until the commit: it stores the body's result in the
/// unit of work's transaction, and hears that the transaction committed.
///
/// The unit of work holds it without naming it: each stage keeps its own (the
/// transition's `Moved`, the inbox's [`Recorded`](crate::inbox::Recorded)), a plan of
/// several stages keeps a tuple of theirs, and a plan whose stages keep nothing keeps `()`.
/// A new stage joins every form by implementing it; [`Work::finish`] does not change.
pub trait Kept: Send + Sync {
    /// Stores the body's result, serialized (never `null`), in the open transaction.
    fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Ends the stage's part before the commit: stores `json`, the body's result (`None`
    /// when it serializes to `null`: nothing to store), or finds that another call took the
    /// stage's key first (`Sealed::Lost`: a stage that records its key only here, with
    /// the result — the HTTP layer's optimistic form). A lost call's writes roll back and
    /// it replies with [`Plan::lost`]. The default: [`store`](Self::store) a result, never
    /// lost.
    fn seal<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: Option<&str>,
    ) -> impl Future<Output = Result<Sealed, Error<Infallible>>> + Send {
        async move {
            if let Some(json) = json {
                self.store::<DB>(conn, json).await?;
            }
            Ok(Sealed::Stored)
        }
    }

    /// The transaction committed (after the body ran): where a stage counts its success.
    fn committed(&self) {}
}

/// What [`Kept::seal`] found.
pub enum Sealed {
    /// The result is stored (or there was none to store): the unit of work commits.
    Stored,
    /// Another call recorded the key first, and committed: this call's writes roll back.
    Lost(Lost),
}

/// What a stage found of the call that took its key first (see [`Sealed::Lost`]), for
/// [`Plan::lost`] to reply with. The unit of work carries it without knowing what it is:
/// the stage that lost puts in what it read ([`Lost::new`]), and its plan takes it back
/// out ([`Lost::found`]).
pub struct Lost(Box<dyn Any + Send>);

impl Lost {
    /// What a stage read of the call that took its key.
    pub(crate) fn new<T: Any + Send>(found: T) -> Lost {
        Lost(Box::new(found))
    }

    /// What the stage put in, if it is a `T`: `None` for another stage's (a plan
    /// answering for a stage it does not have: idem's own bug).
    pub(crate) fn found<T: Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|found| *found)
    }
}

impl Kept for () {
    async fn store<DB: Backend>(&self, _: &mut DB::Connection, _: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

/// A stage's keep, or nothing.
impl<K: Kept> Kept for Option<K> {
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        match self {
            Some(kept) => kept.store::<DB>(conn, json).await,
            None => Ok(()),
        }
    }

    async fn seal<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: Option<&str>,
    ) -> Result<Sealed, Error<Infallible>> {
        match self {
            Some(kept) => kept.seal::<DB>(conn, json).await,
            None => Ok(Sealed::Stored),
        }
    }

    fn committed(&self) {
        if let Some(kept) = self {
            kept.committed();
        }
    }
}

/// Two stages' keeps, stored in order.
impl<A: Kept, B: Kept> Kept for (A, B) {
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        self.0.store::<DB>(conn, json).await?;
        self.1.store::<DB>(conn, json).await
    }

    async fn seal<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: Option<&str>,
    ) -> Result<Sealed, Error<Infallible>> {
        match self.0.seal::<DB>(conn, json).await? {
            Sealed::Stored => self.1.seal::<DB>(conn, json).await,
            lost => Ok(lost),
        }
    }

    fn committed(&self) {
        self.0.committed();
        self.1.committed();
    }
}

/// The `encode` and `applied` of a plan whose stages always end the call (`Value =
/// Infallible`: there is no body, so neither is ever called), replying with `$reply`.
macro_rules! no_body {
    ($reply:ty) => {
        fn encode(
            &self,
            value: &::std::convert::Infallible,
        ) -> Result<String, $crate::error::Error<::std::convert::Infallible>> {
            match *value {}
        }

        fn applied(&self, value: ::std::convert::Infallible) -> $reply {
            match value {}
        }
    };
}
pub(crate) use no_body;

/// Makes the reply of a call that gave up waiting for the writer's turn (or its error).
pub type GaveUp<P, R> = fn(&P) -> Result<R, Error<Infallible>>;

/// Where a plan's stages run, as far as what the transaction has already read goes.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// First in a transaction idem began, or in autocommit: nothing has read in it yet, so
    /// no snapshot exists (InnoDB takes a REPEATABLE READ snapshot at a transaction's first
    /// plain read).
    Fresh,
    /// Inside the caller's transaction (a savepoint), or after another stage: whatever ran
    /// before may have taken a snapshot.
    Nested,
}

/// The stages of one kind of call, and the shape of its reply.
pub trait Plan<DB: Backend>: Sync {
    /// The body's success value.
    type Value;
    /// What the call returns when it does not fail.
    type Reply;
    /// What its stages keep until the commit (`()` for none).
    type Kept: Kept;

    /// Checks the call's input (its keys) before any statement runs. The default: nothing
    /// to check (a plan built from input checked already, or with none).
    fn check(&self) -> Result<(), Error<Infallible>> {
        Ok(())
    }

    /// Whether the stages need no transaction on `dialect`: from a pool, they then run on
    /// a connection in autocommit, each statement its own transaction, and must end the
    /// call (a body needs a transaction). The default: they need one.
    fn autocommit(&self, dialect: Dialect) -> bool {
        let _ = dialect;
        false
    }

    /// How long to wait for the writer's turn (SQLite), and the reply when that runs out.
    fn patience(&self) -> Option<(Duration, GaveUp<Self, Self::Reply>)> {
        None
    }

    /// Runs the stages in `tx`, at `entry`.
    fn enter<'a>(
        &'a self,
        tx: &'a mut DB::Connection,
        entry: Entry,
    ) -> impl Future<Output = Result<Entered<Self::Reply, Self::Kept>, Error<Infallible>>> + Send + 'a;

    /// The body's value, serialized (`"null"` for nothing to store).
    fn encode(&self, value: &Self::Value) -> Result<String, Error<Infallible>>;

    /// [`encode`](Self::encode), refused if larger than one stored result may be
    /// ([`MAX_RESULT_LEN`](crate::MAX_RESULT_LEN)). A plan whose value holds several
    /// results (a batch of deliveries) bounds each of them, and the whole here not at all.
    fn encode_bounded(&self, value: &Self::Value) -> Result<String, Error<Infallible>> {
        self.encode(value).and_then(bounded)
    }

    /// The reply of a call whose body ran and committed.
    fn applied(&self, value: Self::Value) -> Self::Reply;

    /// The reply of a call whose body ran, but whose stage found at the commit that
    /// another call had taken its key first (`Sealed::Lost`): its writes were rolled
    /// back. The default, for plans none of whose stages records its key that late: an
    /// error naming idem's own bug, never a guess.
    fn lost(&self, lost: Lost) -> Result<Self::Reply, Error<Infallible>> {
        let _ = lost;
        let labels = self.labels();
        Err(Error::CorruptRecord {
            group: labels.group.unwrap_or_default().to_owned(),
            key: labels.key.unwrap_or_default().to_owned(),
            problem:
                "a stage lost its key at the commit in a plan that records keys before its body"
                    .to_owned(),
        })
    }

    /// What the call is about, for its span and counters.
    fn labels(&self) -> Labels<'_>;

    /// The name of a reply, for the span's `idem.outcome` and the counters.
    fn outcome_name(reply: &Self::Reply) -> &'static str;

    /// Called once for a call that ended before its body, after its transaction ended
    /// (however many attempts it took) or from the cache: where a plan counts what
    /// happened.
    fn settled(&self, reply: &Self::Reply) {
        let _ = reply;
    }

    /// The key of this call's first result in the fast path (feature `redis`), if the
    /// cache may answer its duplicates; `None` (the default) for a kind of call it never
    /// answers.
    fn cache_key(&self) -> Option<CacheKey> {
        None
    }

    /// Whether [`begin`] asks the cache first (`false` for a plan whose caller asked it
    /// already, before a body that runs first).
    fn cache_reads(&self) -> bool {
        true
    }

    /// The reply to a duplicate, from `value` (what [`cache_value`](Self::cache_value) or
    /// [`cache_applied`](Self::cache_applied) wrote); `None` if it does not answer this
    /// call (another payload under the same key, a value that does not decode).
    fn cached_reply(&self, value: &str) -> Option<Self::Reply> {
        let _ = value;
        None
    }

    /// What to write to the cache for `reply`, which the database gave and which is now
    /// durable: the first result of a duplicate (or of a call whose stages committed it);
    /// `None` for anything else.
    fn cache_value(&self, reply: &Self::Reply) -> Option<String> {
        let _ = reply;
        None
    }

    /// What to write to the cache for the body's result `json` (`null` for nothing stored),
    /// just committed.
    fn cache_applied(&self, json: &str) -> Option<String> {
        let _ = json;
        None
    }

    /// How old the record was when the stages found it, if they found one whose first
    /// result [`cache_value`](Self::cache_value) writes: the entry then lives the cache's
    /// TTL counted from the record's last change, not from now, so that it never outlives
    /// the record's retention. `None`: from now (a record this call just wrote).
    fn cache_age(&self, reply: &Self::Reply) -> Option<Duration> {
        let _ = reply;
        None
    }
}

/// A call after its stages: either the body runs now in [`Work::transaction`], or the call
/// is over.
// Moved once per call, never stored: boxing the open transaction would cost an
// allocation per call.
#[allow(clippy::large_enum_variant)]
pub enum Begun<'c, DB: Backend, R, K = ()> {
    /// Run the body, then [`Work::finish`].
    Run(Work<'c, DB, K>),
    /// Nothing (more) to do: the reply, or the error. The transaction is already ended.
    Done(Result<R, Error<Infallible>>),
}

/// An open unit of work whose stages all let the call go on, waiting for the body's
/// result. Dropping it rolls everything back.
pub struct Work<'c, DB: Backend, K = ()> {
    tx: Transaction<'c, DB>,
    // Released after COMMIT or ROLLBACK, when the work is dropped.
    _writer: Option<WriterGuard>,
    kept: K,
    span: Span,
    /// What identifies the call's effect, for the ids its body derives (outbox messages).
    call: Option<Arc<CallScope>>,
    /// Where its first result goes once committed (feature `redis`).
    fast: Fast,
}

/// The writer turn a unit of work holds (SQLite), its span and its call scope, for its body.
pub struct Held(Option<Database>, Span, Option<Arc<CallScope>>);

impl Held {
    /// Runs `body` (the handler's body, in [`Work::transaction`]) in the call's span and
    /// scope (the messages it stages take their ids from the call's effect), as the holder
    /// of the turn: a handler it calls with the pool on the same SQLite database is refused
    /// at once instead of waiting for itself.
    pub async fn run<F: Future>(self, body: F) -> F::Output {
        within(self.2, holding(self.0, body))
            .instrument(self.1)
            .await
    }

    /// [`run`](Self::run), with a panic of `body` caught: `Err` with what it panicked with
    /// (the body is dropped there). End the work with [`Work::finish_unwound`].
    pub async fn run_unwound<F: Future>(self, body: F) -> Result<F::Output, Panicked> {
        unwound(self.run(body)).await
    }
}

/// Begins a unit of work where `origin` says.
pub async fn start<'c, DB: Backend, P: Plan<DB>>(
    origin: Origin<'c, DB>,
    plan: &P,
) -> Begun<'c, DB, P::Reply, P::Kept> {
    match origin {
        Origin::Pool(pool) => begin(&pool, plan).await,
        Origin::Within(conn) => begin_in(conn, plan).await,
    }
}

/// Begins a unit of work in a transaction of its own from `pool`, retrying the stages
/// while they lose conflicts (the body has not run yet).
pub async fn begin<'c, DB: Backend, P: Plan<DB>>(
    pool: &Pool<DB>,
    plan: &P,
) -> Begun<'c, DB, P::Reply, P::Kept> {
    let labels = plan.labels();
    let span = labels.span();
    let fast = Fast::of(pool, plan);
    if plan.cache_reads()
        && let Some(reply) = fast.answer(plan, &span).instrument(span.clone()).await
    {
        plan.settled(&reply);
        labels.ended::<Infallible>(&span, Ok(P::outcome_name(&reply)));
        return Begun::Done(Ok(reply));
    }
    let (begun, retries) = begin_retrying(pool, plan, &span, fast)
        .instrument(span.clone())
        .await;
    labels.retried(&span, retries);
    observed::<DB, P>(&labels, span, begun)
}

/// Runs a plan that has no body (its stages always end the call: the leased claim,
/// completion and extension, a purge batch) in a transaction of its own; its reply. A
/// stage that asked for a body anyway would be idem's own bug: it is rolled back and
/// reported, never guessed at.
pub(crate) async fn stages_only<DB: Backend, P: Plan<DB, Value = Infallible>>(
    pool: &Pool<DB>,
    plan: &P,
) -> Result<P::Reply, Error<Infallible>> {
    stages_only_at(Origin::Pool(pool.clone()), plan).await
}

/// [`stages_only`], where `origin` says: a pool, or a savepoint in the caller's transaction.
pub(crate) async fn stages_only_at<'c, DB: Backend, P: Plan<DB, Value = Infallible>>(
    origin: Origin<'c, DB>,
    plan: &P,
) -> Result<P::Reply, Error<Infallible>> {
    match start(origin, plan).await {
        Begun::Done(done) => done,
        Begun::Run(work) => {
            drop(work);
            let labels = plan.labels();
            Err(Error::CorruptRecord {
                group: labels.group.unwrap_or_default().to_owned(),
                key: labels.key.unwrap_or_default().to_owned(),
                problem: "a unit of work without a body asked for one".to_owned(),
            })
        }
    }
}

/// The reply (or error) of a call that ended before its body, recorded in its span; the
/// span, kept for the rest of one that goes on.
fn observed<'c, DB: Backend, P: Plan<DB>>(
    labels: &Labels<'_>,
    span: Span,
    begun: Begun<'c, DB, P::Reply, P::Kept>,
) -> Begun<'c, DB, P::Reply, P::Kept> {
    match begun {
        Begun::Run(mut work) => {
            work.span = span;
            Begun::Run(work)
        }
        Begun::Done(done) => {
            labels.ended(&span, done.as_ref().map(P::outcome_name));
            Begun::Done(done)
        }
    }
}

/// [`begin`]'s loop: the stages, retried while they lose conflicts; and the retries made.
async fn begin_retrying<'c, DB: Backend, P: Plan<DB>>(
    pool: &Pool<DB>,
    plan: &P,
    span: &Span,
    fast: Fast,
) -> (Begun<'c, DB, P::Reply, P::Kept>, u32) {
    if let Err(e) = plan.check() {
        return (Begun::Done(Err(e)), 0);
    }
    let autocommit = match DB::pool_dialect(pool) {
        Ok(dialect) => plan.autocommit(dialect),
        Err(e) => return (Begun::Done(Err(e.into())), 0),
    };
    let mut backoff = Backoff::default();
    loop {
        let patience = plan.patience();
        let entered = match Opened::open(pool, autocommit, patience.map(|(p, _)| p)).await {
            Ok(Some((mut opened, writer))) => {
                let conn = opened.connection();
                if let Ok(dialect) = DB::dialect(conn) {
                    span.record("db.system.name", dialect.system_name());
                }
                plan.enter(conn, Entry::Fresh)
                    .await
                    .map(|entered| (opened, writer, entered))
            }
            Ok(None) => {
                let gave_up = patience.map(|(_, gave_up)| gave_up);
                let reply = gave_up.expect("only a plan with patience runs out of it")(plan);
                if let Ok(reply) = &reply {
                    plan.settled(reply);
                }
                return (Begun::Done(reply), backoff.attempts());
            }
            Err(e) => Err(Error::from(e)),
        };
        let lost = match entered {
            Ok((Opened::Transaction(tx), writer, Entered::Run(kept))) => {
                let work = Work {
                    tx,
                    _writer: writer,
                    kept,
                    span: Span::none(),
                    call: CallScope::of(&plan.labels()),
                    fast,
                };
                return (Begun::Run(work), backoff.attempts());
            }
            Ok((Opened::Autocommit(_), _, Entered::Run(_))) => {
                // idem's own bug: a plan that needs no transaction asked for a body.
                let labels = plan.labels();
                let problem = "a unit of work in autocommit asked for a body".to_owned();
                let error = Error::CorruptRecord {
                    group: labels.group.unwrap_or_default().to_owned(),
                    key: labels.key.unwrap_or_default().to_owned(),
                    problem,
                };
                return (Begun::Done(Err(error)), backoff.attempts());
            }
            Ok((opened, _writer, Entered::Done { reply, commit })) => {
                match opened.end(commit).await {
                    Ok(()) => {
                        plan.settled(&reply);
                        if fast.is_on() {
                            fast.remember(plan.cache_value(&reply), plan.cache_age(&reply));
                        }
                        return (Begun::Done(Ok(reply)), backoff.attempts());
                    }
                    Err(e) => Error::from(e),
                }
            }
            Err(e) => e,
        };
        match lost {
            // Lost a conflict before any body ran (at BEGIN, a busy SQLite database, in a
            // stage, or at the COMMIT of the stages' own writes: a Galera certification
            // failure): the transaction is gone (dropped, so rolled back), nothing was
            // applied, and a fresh one may win.
            Error::Database(e) if is_conflict(&e) => {
                if !backoff.wait().await {
                    let attempts = backoff.attempts();
                    let gave_up = Error::Contention { attempts, last: e };
                    return (Begun::Done(Err(gave_up)), attempts);
                }
            }
            e => return (Begun::Done(Err(e)), backoff.attempts()),
        }
    }
}

/// Begins a unit of work in a savepoint of the caller's transaction. A refusal or an
/// error rolls back to the savepoint, so the caller's earlier work stays; the caller
/// commits. A conflict is not retried here (the caller's transaction is lost with it):
/// it is returned, and [`Error::is_conflict`] tells the caller to retry the whole of it.
pub async fn begin_in<'c, DB: Backend, P: Plan<DB>>(
    conn: &'c mut DB::Connection,
    plan: &P,
) -> Begun<'c, DB, P::Reply, P::Kept> {
    let labels = plan.labels();
    let span = labels.span();
    if let Ok(dialect) = DB::dialect(conn) {
        span.record("db.system.name", dialect.system_name());
    }
    let begun = savepoint_in(conn, plan).instrument(span.clone()).await;
    observed::<DB, P>(&labels, span, begun)
}

async fn savepoint_in<'c, DB: Backend, P: Plan<DB>>(
    conn: &'c mut DB::Connection,
    plan: &P,
) -> Begun<'c, DB, P::Reply, P::Kept> {
    if let Err(e) = plan.check() {
        return Begun::Done(Err(e));
    }
    let mut savepoint = match Connection::begin(conn).await {
        Ok(savepoint) => savepoint,
        Err(e) => return Begun::Done(Err(e.into())),
    };
    match plan.enter(&mut savepoint, Entry::Nested).await {
        Ok(Entered::Run(kept)) => Begun::Run(Work {
            tx: savepoint,
            _writer: None,
            kept,
            span: Span::none(),
            call: CallScope::of(&plan.labels()),
            fast: Fast::default(),
        }),
        Ok(Entered::Done { reply, commit }) => {
            let ended = if commit {
                savepoint.commit().await
            } else {
                savepoint.rollback().await
            };
            let done = ended.map(|()| reply).map_err(Error::from);
            if let Ok(reply) = &done {
                plan.settled(reply);
            }
            Begun::Done(done)
        }
        Err(e) => Begun::Done(Err(e)),
    }
}

impl<'c, DB: Backend, K: Kept> Work<'c, DB, K> {
    /// The transaction the body runs in.
    pub fn transaction(&mut self) -> &mut Transaction<'c, DB> {
        &mut self.tx
    }

    /// What its stages keep until the commit.
    pub(crate) fn kept(&self) -> &K {
        &self.kept
    }

    /// The same unit of work, keeping `f` of what its stages kept.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn map_kept<K2>(self, f: impl FnOnce(K) -> K2) -> Work<'c, DB, K2> {
        Work {
            tx: self.tx,
            _writer: self._writer,
            kept: f(self.kept),
            span: self.span,
            call: self.call,
            fast: self.fast,
        }
    }

    /// The call's scope, for the messages staged outside its body's scope
    /// ([`Receipt::stage`](crate::inbox::Receipt::stage)).
    pub(crate) fn call(&self) -> Option<Arc<CallScope>> {
        self.call.clone()
    }

    /// The writer turn this unit holds, to run the body under ([`Held::run`]).
    pub fn held(&self) -> Held {
        Held(
            self._writer.as_ref().map(|w| w.database().clone()),
            self.span.clone(),
            self.call.clone(),
        )
    }

    /// The writer turn and span this unit holds, with the call scope of `labels` (one
    /// message of a batch: the messages its handler stages take their ids from that
    /// message's effect, as they would in a delivery of its own).
    pub(crate) fn held_as(&self, labels: &Labels<'_>) -> Held {
        Held(
            self._writer.as_ref().map(|w| w.database().clone()),
            self.span.clone(),
            CallScope::of(labels),
        )
    }

    /// Ends the call with the body's result: stores it for every stage that keeps one and
    /// commits, or rolls everything back if the body failed.
    pub async fn finish<P: Plan<DB>, E>(
        self,
        plan: &P,
        result: Result<P::Value, E>,
    ) -> Result<P::Reply, Error<E>> {
        let span = self.span.clone();
        let done = self
            .store_and_commit(plan, result)
            .instrument(span.clone())
            .await;
        plan.labels()
            .ended(&span, done.as_ref().map(P::outcome_name));
        done
    }

    /// [`finish`](Self::finish) with the result of [`Held::run_unwound`]: a body that
    /// panicked is a failed call, rolled back and answered with [`Error::Panicked`].
    pub async fn finish_unwound<P: Plan<DB>, E>(
        self,
        plan: &P,
        result: Result<Result<P::Value, E>, Panicked>,
    ) -> Result<P::Reply, Error<E>> {
        let panicked = match result {
            Ok(result) => return self.finish(plan, result).await,
            Err(panicked) => panicked,
        };
        tracing::error!(
            panic = panicked.message(),
            "idem: a handler panicked; its call was rolled back"
        );
        match self.finish(plan, Err::<P::Value, _>(panicked)).await {
            Ok(reply) => Ok(reply),
            Err(Error::Handler(Panicked(message))) => Err(Error::Panicked(message)),
            Err(other) => Err(other.map_handler(|_| unreachable!("the handler's error is above"))),
        }
    }

    async fn store_and_commit<P: Plan<DB>, E>(
        mut self,
        plan: &P,
        result: Result<P::Value, E>,
    ) -> Result<P::Reply, Error<E>> {
        let value = match result {
            Ok(value) => value,
            Err(e) => {
                // The connection may be gone; the handler's error is the one to report,
                // and an unfinished transaction is rolled back by the server anyway.
                let _ = self.tx.rollback().await;
                return Err(Error::Handler(e));
            }
        };
        reached(FaultPoint::BodyDone);
        let json = plan.encode_bounded(&value).map_err(Error::widen)?;
        // A result that serializes to `null` (`()`, `None`) replays without storage.
        let stored = (json != "null").then_some(json.as_str());
        match self
            .kept
            .seal::<DB>(&mut self.tx, stored)
            .await
            .map_err(Error::widen)?
        {
            Sealed::Stored => self.tx.commit().await?,
            Sealed::Lost(lost) => {
                // Another call took the key and committed first: this one's writes (its
                // body's included) roll back, and it replies as a repeat of that call.
                self.tx.rollback().await?;
                let reply = plan.lost(lost).map_err(Error::widen)?;
                plan.settled(&reply);
                if self.fast.is_on() {
                    self.fast
                        .remember(plan.cache_value(&reply), plan.cache_age(&reply));
                }
                return Ok(reply);
            }
        }
        reached(FaultPoint::Committed);
        self.kept.committed();
        if self.fast.is_on() {
            self.fast.remember(plan.cache_applied(&json), None);
        }
        Ok(plan.applied(value))
    }
}

#[cfg(test)]
mod tests {
    use super::Lost;

    /// What a stage put in comes back out to its own plan, and to no other.
    #[test]
    fn a_lost_key_carries_what_its_stage_found() {
        #[derive(Debug, PartialEq)]
        struct Found(&'static str);
        assert_eq!(
            Lost::new(Found("taken")).found::<Found>(),
            Some(Found("taken"))
        );
        assert_eq!(Lost::new(Found("taken")).found::<String>(), None);
    }
}
