//! Exactly-once effects for at-least-once message consumers.
//!
//! Every broker delivers at least once. An [`Inbox`] records each message under a
//! [`MessageKey`] unique within a consumer group, by an atomic insert into a unique key (never
//! check-then-act), so a redelivery finds the record and is absorbed as a
//! [`Delivery::Duplicate`] that replays the first result.
//!
//! Two modes: **transactional**, [`Inbox::receive`] (the default), when the handler's effects
//! are all in this database — the record and the effects commit in one transaction; and
//! **leased**, [`Inbox::claim`], when the handler calls something outside it — a short
//! transaction claims the key with a lease, the work runs, a second one records its result.
//! Ack the broker only after the outcome is committed, on [`Delivery::should_ack`]. Records
//! are kept for a retention period, then [`Inbox::purge`] deletes them in bounded batches.
//!
//! The guide's inbox page, [`idem::guide::inbox`](https://docs.rs/idem/latest/idem/guide/inbox/index.html),
//! tells the whole story: a complete JetStream consumer, the attribute's form, the leased mode,
//! how to choose the retention, the table and its migrations, and what the tests prove.

mod admin;
mod batch;
mod cached;
mod clock;
mod counters;
pub(crate) mod delivery;
mod gather;
#[cfg(feature = "kafka")]
pub mod kafka;
mod key;
mod leased;
mod not_yet;
pub mod partitions;
pub(crate) mod record;
mod retention;
mod stage;

pub use crate::schema::{MYSQL_MIGRATION, POSTGRES_MIGRATION, SQLITE_MIGRATION, migrate};
pub use admin::{
    ActivityBucket, GroupActivity, GroupRecords, GroupSeries, InboxRecord, MAX_BUCKETS,
    RecordStatus, activity, activity_series, groups, records,
};
pub use batch::{BatchFuture, Incoming, Settled, settles_with_ack};
pub use clock::{Clock, ManualClock, SystemClock};
pub(crate) use clock::{millis, millis_up};
pub use counters::InboxCounters;
pub use delivery::Delivery;
pub use gather::gather;
pub use key::{AsMessageKey, MessageKey};
pub use not_yet::not_yet;
pub use stage::{ConsumerTransitionPlan, InboxPlan, InboxStage, Recorded};

use crate::backend::{Backend, Opened, Param};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::value::key::{KeyError, valid_text};
use crate::work::stored::{Codec, bounded, codec};
use crate::work::unit::{Begun, Work, begin, stages_only};
use counters::{Counter, Counters};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use sqlx::{Pool, Transaction};
use std::convert::Infallible;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering as AtomicOrdering};
use std::task::Poll;
use std::time::Duration;

/// An inbox for one consumer group. Cheap to clone; clones share counters.
///
/// ```
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), idem::Error<sqlx::Error>> {
/// use idem::inbox::{Delivery, Inbox, MessageKey, Received};
///
/// idem::migrate(&pool).await?;
/// let inbox = Inbox::new("billing").expect("a valid group name");
/// let key = MessageKey::business("order:42", "paid").expect("a valid key");
/// let payload = br#"{"order_id":42,"amount":1000}"#;
///
/// let delivery: Delivery<i64> = match inbox.receive(&pool, &key, payload).await.map_err(idem::Error::widen)? {
///     Received::New(mut receipt) => {
///         // The effect, in the same transaction as the inbox record.
///         let result = sqlx::query("INSERT INTO payments (order_id, amount) VALUES (42, 1000)")
///             .execute(&mut **receipt.transaction())
///             .await
///             .map(|done| done.last_insert_rowid());
///         receipt.finish(result).await?
///     }
///     Received::Done(delivery) => delivery,
/// };
/// if delivery.should_ack() { /* ack the broker now, after the commit */ }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Inbox {
    group: String,
    lease: Duration,
    max_attempts: i64,
    lock_timeout: Option<Duration>,
    /// `None`: the database's clock decides (the default).
    clock: Option<Arc<dyn Clock>>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("group", &self.group)
            .field("lease", &self.lease)
            .field("max_attempts", &self.max_attempts)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// An inbox for consumer group `group` (validated like a key), with a 30 s lease,
    /// 5 attempts, no lock timeout and the database's clock.
    pub fn new(group: impl Into<String>) -> Result<Inbox, KeyError> {
        let group = valid_text(group.into())?;
        Ok(Inbox {
            counters: Arc::new(Counters::new(&group)),
            group,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            lock_timeout: None,
            clock: None,
        })
    }

    /// How long a leased claim holds a message before another delivery may take it over.
    /// Run the work under [`Lease::keep_alive`], which extends it every third of it while
    /// the work runs, so work longer than the lease is never taken over while its process
    /// lives; the lease then bounds only how long a dead process's claim holds the key.
    pub fn lease(mut self, lease: Duration) -> Inbox {
        self.lease = lease;
        self
    }

    /// Attempts allowed in the leased mode before a message is parked as dead (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Inbox {
        self.max_attempts = i64::from(attempts.max(1));
        self
    }

    /// How long a delivery waits for a concurrent delivery of the same message (or, on
    /// SQLite, for the database's writer) before it gives up with
    /// [`Delivery::InProgress`]. Without it, it waits as long as the other takes, holding a
    /// pooled connection meanwhile.
    ///
    /// With a broker that redelivers after an ack deadline (JetStream's ack wait, SQS's
    /// visibility timeout), set it below that deadline: each redelivery of a slow message
    /// then gives up and is nacked with a delay instead of piling up on the pool. On
    /// PostgreSQL it applies to the inbox's own statements only; the handler's statements
    /// run with the session's setting.
    pub fn lock_timeout(mut self, timeout: Duration) -> Inbox {
        self.lock_timeout = Some(timeout);
        self
    }

    /// Replaces the database's clock for leases and retention with `clock`: for tests, a
    /// [`ManualClock`], so a replay "an hour later" or an expired lease needs no waiting.
    ///
    /// By default every lease end, `updated_at` and retention cutoff is read from the
    /// database's clock inside the statement that decides it, so the instances sharing a
    /// database agree on them whatever their own clocks say: an instance whose clock runs
    /// ahead neither takes over live leases nor purges records inside their retention.
    /// [`SystemClock`] here would make this instance's clock decide instead.
    pub fn clock(mut self, clock: impl Clock) -> Inbox {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The time as this instance sees it (the inbox's clock if one was given, else the
    /// system's), in milliseconds since the epoch: only for advice such as `Retry-After`,
    /// never for deciding a lease or a cutoff (the database does).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn local_now_millis(&self) -> i64 {
        match &self.clock {
            Some(clock) => clock.now_millis(),
            None => SystemClock.now_millis(),
        }
    }

    /// The time bound to a statement's `now` parameter: NULL, so the database's clock
    /// decides, unless a clock was given ([`Inbox::clock`]).
    pub(crate) fn at(&self) -> Param<'static> {
        match &self.clock {
            Some(clock) => Param::Int(clock.now_millis()),
            None => Param::Null,
        }
    }

    /// The time itself, for a unit of work that must know it (a lease's end): the given
    /// clock's, or the database's, read in the transaction.
    pub(crate) async fn now_in<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
    ) -> Result<i64, Error<Infallible>> {
        if let Some(clock) = &self.clock {
            return Ok(clock.now_millis());
        }
        let statement = &DB::dialect(conn)?.inbox().now;
        DB::fetch(conn, statement, &[Param::Null])
            .await?
            .and_then(|row| row.int("now"))
            .ok_or_else(|| self.corrupt(key, "the database returned no time"))
    }

    /// The lease, in milliseconds.
    pub(crate) fn lease_millis(&self) -> i64 {
        millis(self.lease)
    }

    /// What this inbox (and its clones) did so far.
    pub fn counters(&self) -> InboxCounters {
        self.counters.read()
    }

    /// Transactional mode: records the delivery in a new transaction, and returns it for
    /// the handler's effects ([`Received::New`]) or tells what became of the message
    /// before ([`Received::Done`], already rolled back).
    ///
    /// It fails only with database or record errors, never a handler's: hence
    /// `Error<Infallible>`, which converts into any `Error<E>` with [`Error::widen`] and
    /// into `Box<dyn std::error::Error>` with `?`.
    pub async fn receive<DB: Backend, T: Serialize + DeserializeOwned>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        payload: &[u8],
    ) -> Result<Received<DB, T>, Error<Infallible>> {
        self.receive_with(codec::<Result<T, Infallible>>(), pool, key, payload)
            .await
    }

    /// [`receive`](Self::receive) with the result codec given.
    async fn receive_with<DB: Backend, T>(
        &self,
        codec: Codec<T>,
        pool: &Pool<DB>,
        key: &MessageKey,
        payload: &[u8],
    ) -> Result<Received<DB, T>, Error<Infallible>> {
        let plan = InboxPlan::new(InboxStage::new(self, key, payload), codec);
        match begin(pool, &plan).await {
            Begun::Run(work) => Ok(Received::New(Receipt {
                work,
                stage: plan.stage,
            })),
            Begun::Done(done) => done.map(Received::Done),
        }
    }

    /// [`receive`](Self::receive) and finish in one call, for handlers written as an
    /// async closure over the transaction.
    ///
    /// The future of a call through an async closure is not `Send` on rustc 1.95; to
    /// spawn it, use `receive` and [`Receipt::finish`].
    pub async fn process<DB, T, E, F>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        payload: &[u8],
        handler: F,
    ) -> Result<Delivery<T>, Error<E>>
    where
        DB: Backend,
        T: Serialize + DeserializeOwned,
        F: AsyncFnOnce(&mut Transaction<'static, DB>) -> Result<T, E>,
    {
        match self
            .receive(pool, key, payload)
            .await
            .map_err(Error::widen)?
        {
            Received::New(mut receipt) => {
                let held = receipt.work.held();
                let result = held.run_unwound(handler(receipt.transaction())).await;
                let plan = InboxPlan::new(receipt.stage, codec::<Result<T, E>>());
                receipt.work.finish_unwound(&plan, result).await
            }
            Received::Done(delivery) => Ok(delivery),
        }
    }

    /// Leased mode: claims the message as PROCESSING for the inbox's lease, in a short
    /// transaction of its own. Do the work, then [`Lease::complete`].
    ///
    /// Fails only with database or record errors (see [`receive`](Self::receive)).
    pub async fn claim<DB: Backend, T: Serialize + DeserializeOwned>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        payload: &[u8],
    ) -> Result<Claimed<T>, Error<Infallible>> {
        self.claim_fingerprinted(pool, key, fingerprint(payload))
            .await
    }

    /// [`claim`](Self::claim), with a fingerprint computed by the caller.
    pub(crate) async fn claim_fingerprinted<DB: Backend, T: Serialize + DeserializeOwned>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        fingerprint: String,
    ) -> Result<Claimed<T>, Error<Infallible>> {
        let plan = leased::ClaimPlan {
            inbox: self,
            key,
            fingerprint,
            codec: codec::<Result<T, Infallible>>(),
        };
        stages_only(pool, &plan).await.map(|claim| claim.claimed)
    }

    /// Deletes this group's finished records (SUCCESS, FAILED) last touched more than
    /// `retention` ago, in transactions of at most `batch` rows, so live deliveries
    /// interleave. PROCESSING and DEAD records are never purged. Returns how many it deleted.
    ///
    /// Refused with [`Error::RetentionBelowCache`], deleting nothing, for a `retention`
    /// shorter than the TTL of the cache attached to `pool` (feature `redis`,
    /// [`idem::cache`](crate::cache)).
    pub async fn purge<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, Error<Infallible>> {
        if let Some(ttl) = crate::work::fast::attached_ttl(pool)
            && retention < ttl
        {
            return Err(Error::RetentionBelowCache { retention, ttl });
        }
        let retention = millis(retention);
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        let mut busy = 0;
        loop {
            let plan = retention::PurgePlan {
                inbox: self,
                retention,
                batch,
            };
            let Some(deleted) = stages_only(pool, &plan).await? else {
                // The writer's turn did not come within the lock timeout: live deliveries
                // go first, for a bounded number of turns.
                busy += 1;
                if busy >= MAX_BUSY_BATCHES {
                    let waited = self.lock_timeout.unwrap_or_default() * busy;
                    return Err(Error::Busy { waited });
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            busy = 0;
            total += deleted;
            if deleted < batch as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// The records of this group stuck in PROCESSING past their lease: a leased attempt
    /// whose worker died (or hangs) and whose message the broker has not redelivered yet. A
    /// redelivery takes each over; until then, nothing moves. With the feature `metrics` it
    /// sets the gauge `idem_inbox_stuck{consumer_group}` to the count it read (the sweeper
    /// reads it at each tick): alert when it stays above zero.
    pub async fn stuck<DB: Backend>(&self, pool: &Pool<DB>) -> Result<Stuck, sqlx::Error> {
        let mut opened = Opened::read(pool).await?;
        let conn = opened.connection();
        let statement = &DB::dialect(conn)?.inbox().stuck;
        let params = [Param::Text(&self.group), self.at()];
        let row = DB::fetch(conn, statement, &params)
            .await?
            .unwrap_or_default();
        opened.end(true).await?;
        let stuck = Stuck {
            count: row.int("stuck").map_or(0, |n| n.max(0) as u64),
            oldest_lease_until_millis: row.int("oldest"),
        };
        crate::work::observe::inbox_stuck(&self.group, stuck.count);
        Ok(stuck)
    }

    /// Runs [`purge`](Self::purge) every `every` on a background task, and reads
    /// [`stuck`](Self::stuck) (its gauge, with the feature `metrics`). A failed purge is
    /// logged (a warning), counted ([`InboxCounters::sweep_failures`]) and retried at the
    /// next tick; the task ends when the handle is aborted or dropped with the runtime.
    ///
    /// Fails, starting nothing, when called outside a Tokio runtime or with a zero
    /// `every` ([`SweeperError`]).
    pub fn spawn_sweeper<DB: Backend>(
        &self,
        pool: Pool<DB>,
        retention: Duration,
        every: Duration,
        batch: u32,
    ) -> Result<tokio::task::JoinHandle<()>, SweeperError> {
        if every.is_zero() {
            return Err(SweeperError::ZeroPeriod);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(SweeperError::NoRuntime)?;
        let inbox = self.clone();
        Ok(runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = inbox.purge(&pool, retention, batch).await {
                    inbox.counters.add(Counter::SweepFailures, 1);
                    tracing::warn!(
                        group = %inbox.group,
                        error = %e,
                        "idem: the inbox's sweeper could not purge; trying again at the next tick"
                    );
                }
                if let Err(e) = inbox.stuck(&pool).await {
                    tracing::warn!(
                        group = %inbox.group,
                        error = %e,
                        "idem: the inbox's sweeper could not count the stuck records"
                    );
                }
            }
        }))
    }

    fn in_progress<T, R>(&self, lease_until_millis: Option<i64>) -> Delivery<T, R> {
        Delivery::InProgress { lease_until_millis }
    }

    fn lease_of(&self, key: &MessageKey, fingerprint: &str, attempt: i64, until: i64) -> Lease {
        Lease {
            inbox: self.clone(),
            key: key.clone(),
            fingerprint: fingerprint.to_owned(),
            attempt,
            until: AtomicI64::new(until),
        }
    }

    fn corrupt<E>(&self, key: &MessageKey, problem: &str) -> Error<E> {
        Error::CorruptRecord {
            group: self.group.clone(),
            key: key.to_string(),
            problem: problem.to_owned(),
        }
    }
}

/// Records stuck in PROCESSING past their lease, see [`Inbox::stuck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stuck {
    /// How many.
    pub count: u64,
    /// When the oldest one's lease ended (milliseconds since the epoch), if any.
    pub oldest_lease_until_millis: Option<i64>,
}

/// A parameter usable as the `inbox = "…"` of an `#[idempotent]` message handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an inbox",
    label = "`inbox = \"…\"` names this parameter",
    note = "give the parameter the type `&idem::inbox::Inbox` (or `Inbox`, `Arc<Inbox>`), made once per consumer group with `Inbox::new(\"group\")`"
)]
pub trait AsInbox {
    /// The inbox.
    fn as_inbox(&self) -> &Inbox;
}

impl AsInbox for Inbox {
    fn as_inbox(&self) -> &Inbox {
        self
    }
}

impl AsInbox for Arc<Inbox> {
    fn as_inbox(&self) -> &Inbox {
        self
    }
}

impl<T: AsInbox + ?Sized> AsInbox for &T {
    fn as_inbox(&self) -> &Inbox {
        (**self).as_inbox()
    }
}

/// A transactional delivery: recorded or already handled.
// The receipt holds the open transaction; boxing it would cost an allocation per delivery.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Received<DB: Backend, T> {
    /// First delivery (or a retry of a failed one): run the handler in
    /// [`Receipt::transaction`], then [`Receipt::finish`].
    New(Receipt<DB>),
    /// Handled before, in progress elsewhere, conflicting or dead; nothing to do.
    Done(Delivery<T>),
}

/// A recorded delivery whose transaction waits for the handler's effects. Dropping it
/// rolls the record back: the next delivery will process the message.
pub struct Receipt<DB: Backend> {
    work: Work<'static, DB, Recorded>,
    stage: InboxStage,
}

impl<DB: Backend> fmt::Debug for Receipt<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("key", self.stage.key())
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Receipt<DB> {
    /// The transaction holding the inbox record: do the handler's effects in it.
    pub fn transaction(&mut self) -> &mut Transaction<'static, DB> {
        self.work.transaction()
    }

    /// The message key.
    pub fn key(&self) -> &MessageKey {
        self.stage.key()
    }

    /// The message's effect: what [`EffectKey::current`](crate::outbox::EffectKey::current)
    /// is in the body of [`Inbox::process`], the same for every redelivery of the message.
    /// Pass `receipt.effect_key().derive("charge")` to an outside API as its idempotency key.
    pub fn effect_key(&self) -> crate::outbox::EffectKey {
        match self.work.call() {
            Some(call) => call.effect(),
            None => crate::outbox::EffectKey::of_message(self.stage.group(), self.key().as_str()),
        }
    }

    /// Stages `message` in the record's transaction ([`idem::outbox::stage`](crate::outbox::stage)),
    /// its id derived from this message's effect (the group and the message key) and its
    /// position among the messages this delivery stages: published once the record commits.
    pub async fn stage(
        &mut self,
        message: crate::outbox::Message,
    ) -> Result<crate::outbox::MessageId, sqlx::Error> {
        let call = self.work.call();
        crate::outbox::stage_in::<DB>(self.work.transaction(), call.as_deref(), message).await
    }

    /// Commits the record with the handler's result and effects, or rolls everything back
    /// if the handler failed (the message stays unprocessed; redeliver it).
    pub async fn finish<T: Serialize + DeserializeOwned, E>(
        self,
        result: Result<T, E>,
    ) -> Result<Delivery<T>, Error<E>> {
        let plan = InboxPlan::new(self.stage, codec::<Result<T, E>>());
        self.work.finish(&plan, result).await
    }
}

/// A leased claim on a message, or what became of it before.
#[derive(Debug)]
pub enum Claimed<T> {
    /// This delivery holds the message: do the work, then [`Lease::complete`].
    Work(Lease),
    /// Nothing to do (see [`Delivery`]).
    Done(Delivery<T>),
}

/// A claim on a message, valid until its lease expires: run the work under
/// [`keep_alive`](Lease::keep_alive), which extends the lease while the work runs, then
/// [`complete`](Lease::complete).
#[derive(Debug)]
pub struct Lease {
    inbox: Inbox,
    key: MessageKey,
    /// The payload's digest, for the fast path's entry once it completes.
    fingerprint: String,
    attempt: i64,
    until: AtomicI64,
}

impl Lease {
    /// Which attempt this is (1 for the first delivery).
    pub fn attempt(&self) -> i64 {
        self.attempt
    }

    /// The message key: also the idempotency key to pass to outside services.
    pub fn key(&self) -> &MessageKey {
        &self.key
    }

    /// The message's effect, as a transactional handler of it would have
    /// ([`EffectKey::current`](crate::outbox::EffectKey::current) in
    /// [`Inbox::process`]): the same for every attempt, takeover and redelivery. Pass
    /// `lease.effect_key().derive("charge")` to an outside API as its idempotency key.
    pub fn effect_key(&self) -> crate::outbox::EffectKey {
        crate::outbox::EffectKey::of_message(&self.inbox.group, self.key.as_str())
    }

    /// When the lease expires, in milliseconds since the epoch (as last claimed or
    /// extended).
    pub fn until_millis(&self) -> i64 {
        self.until.load(AtomicOrdering::Acquire)
    }

    /// Extends the lease to `by` from now, in a transaction of its own. `false` if it was
    /// lost (the lease expired and another delivery took the message over): stop the work
    /// if you can, its result will be refused.
    pub async fn extend<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        by: Duration,
    ) -> Result<bool, Error<Infallible>> {
        let plan = leased::ExtendPlan { lease: self, by };
        let extended = stages_only(pool, &plan).await?;
        if let Some(until) = extended {
            self.until.store(until, AtomicOrdering::Release);
        }
        Ok(extended.is_some())
    }

    /// Runs `work` while keeping the lease: every third of the inbox's
    /// [`lease`](Inbox::lease) the lease is extended to a whole lease from now, so work
    /// that runs longer than the lease is never taken over while this process lives. When
    /// the process dies the beats stop with it, and the lease ends at most one lease after
    /// the last beat. Returns the work's output; the beats end with it (nothing is left
    /// running).
    ///
    /// A beat that fails (the database unreachable) is logged and tried again at the next
    /// one. If the lease is lost anyway (no beat got through for a whole lease, and another
    /// delivery took the message over), the beats stop and the work runs on, but its
    /// [`complete`](Lease::complete) records nothing: the holder that lost its lease can
    /// never record.
    pub async fn keep_alive<DB: Backend, F: Future>(&self, pool: &Pool<DB>, work: F) -> F::Output {
        let lease = self.inbox.lease;
        let every = (lease / 3).max(Duration::from_millis(1));
        // Whether a beat's statement is in flight: the work's end waits for it rather than
        // cancel a transaction half way.
        let beating = AtomicBool::new(false);
        let beats = async {
            loop {
                tokio::time::sleep(every).await;
                beating.store(true, AtomicOrdering::Release);
                let extended = self.extend(pool, lease).await;
                beating.store(false, AtomicOrdering::Release);
                match extended {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            group = %self.inbox.group,
                            key = %self.key,
                            "idem: the lease was lost while its work ran; its outcome will not be recorded"
                        );
                        std::future::pending::<()>().await;
                    }
                    Err(e) => tracing::warn!(
                        group = %self.inbox.group,
                        key = %self.key,
                        error = %e,
                        "idem: the lease could not be extended; trying again at the next beat"
                    ),
                }
            }
        };
        let mut work = pin!(work);
        let mut beats = pin!(beats);
        let mut output = None;
        poll_fn(|cx| {
            if output.is_none()
                && let Poll::Ready(done) = work.as_mut().poll(cx)
            {
                output = Some(done);
            }
            if output.is_none() || beating.load(AtomicOrdering::Acquire) {
                // The beats never end: polled for their timer and statements, and after the
                // work's end only to finish a beat in flight.
                let _ = beats.as_mut().poll(cx);
            }
            match output.take() {
                Some(done) if !beating.load(AtomicOrdering::Acquire) => Poll::Ready(done),
                kept => {
                    output = kept;
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Records the work's outcome in a transaction of its own: SUCCESS with the result, or
    /// FAILED with the error (DEAD after the last attempt; the error is returned as
    /// [`Error::Handler`] so the consumer nacks). If another delivery took the message
    /// over meanwhile, nothing is recorded: a result is refused with [`Error::LeaseLost`],
    /// an error is returned as it is.
    pub async fn complete<DB: Backend, T: Serialize, E: fmt::Display>(
        self,
        pool: &Pool<DB>,
        result: Result<T, E>,
    ) -> Result<Delivery<T>, Error<E>> {
        reached(FaultPoint::WorkDone);
        // What to record: the result, or why there is none to keep. A result that cannot
        // be stored is a failed attempt, so the message is retried (and parked after the
        // last attempt), never lost.
        let encoded = match &result {
            Ok(value) => serde_json::to_string(value)
                .map_err(Error::Result)
                .and_then(bounded::<E>)
                .map(Some),
            Err(_) => Ok(None),
        };
        let failure = match (&result, &encoded) {
            (Err(e), _) => Some(e.to_string()),
            (Ok(_), Err(refused)) => Some(refused.to_string()),
            (Ok(_), Ok(_)) => None,
        };
        let outcome = match (&failure, &encoded) {
            (Some(error), _) => leased::Outcome::Failed(error),
            (None, Ok(Some(json))) if json != "null" => leased::Outcome::Succeeded(Some(json)),
            (None, _) => leased::Outcome::Succeeded(None),
        };
        // No lock timeout: only the lease's holder writes its record, so the wait is short,
        // and giving up would lose the outcome.
        let plan = leased::CompletePlan {
            lease: &self,
            outcome,
        };
        stages_only(pool, &plan).await.map_err(Error::widen)?;
        match (result, encoded) {
            (Ok(value), Ok(_)) => Ok(Delivery::Processed(value)),
            (Ok(_), Err(refused)) => Err(refused),
            (Err(e), _) => Err(Error::Handler(e)),
        }
    }

    fn lost<E>(&self) -> Error<E> {
        Error::LeaseLost {
            group: self.inbox.group.clone(),
            key: self.key.to_string(),
        }
    }
}

/// How many batches in a row a purge lets live deliveries go first (each after waiting the
/// inbox's lock timeout for the writer's turn) before it gives up with [`Error::Busy`].
const MAX_BUSY_BATCHES: u32 = 100;

/// Why [`Inbox::spawn_sweeper`] started nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum SweeperError {
    /// Called outside a Tokio runtime.
    NoRuntime(tokio::runtime::TryCurrentError),
    /// A period of zero: a sweeper would purge without pause.
    ZeroPeriod,
}

impl fmt::Display for SweeperError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SweeperError::NoRuntime(e) => write!(f, "the sweeper needs a Tokio runtime: {e}"),
            SweeperError::ZeroPeriod => {
                f.write_str("the sweeper's period is zero: give it one, every 10 minutes, say")
            }
        }
    }
}

impl std::error::Error for SweeperError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SweeperError::NoRuntime(e) => Some(e),
            SweeperError::ZeroPeriod => None,
        }
    }
}

/// The payload's SHA-256, hex: what "the same content" means.
pub(crate) fn fingerprint(payload: &[u8]) -> String {
    crate::value::hex::hex(&Sha256::digest(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_sha256_hex() {
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(fingerprint(b"abc"), fingerprint(b"abd"));
    }

    #[test]
    fn in_progress_and_refused_are_nacked() {
        assert!(Delivery::<_>::Processed(1).should_ack());
        assert!(Delivery::<i32>::Duplicate { first_result: None }.should_ack());
        assert!(Delivery::<i32>::Conflict.should_ack());
        assert!(
            !Delivery::<i32>::InProgress {
                lease_until_millis: None
            }
            .should_ack()
        );
        let refused: Delivery<i32, crate::Refusal<()>> =
            Delivery::Refused(crate::Refusal::NotYet {
                current: (),
                from: (),
                to: (),
            });
        assert!(!refused.should_ack());
        assert_eq!(refused.kind(), "refused");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn the_sweeper_needs_a_runtime_and_says_so() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let pool = runtime
            .block_on(sqlx::SqlitePool::connect("sqlite::memory:"))
            .unwrap();
        // Here, outside `block_on`, no runtime is current.
        let inbox = Inbox::new("sweeper").unwrap();
        let started = inbox.spawn_sweeper(pool, Duration::from_secs(1), Duration::from_secs(1), 10);
        assert!(
            matches!(started, Err(SweeperError::NoRuntime(_))),
            "outside a runtime the sweeper is refused, not a panic"
        );
        let inbox = Inbox::new("sweeper").unwrap();
        let pool = runtime
            .block_on(sqlx::SqlitePool::connect("sqlite::memory:"))
            .unwrap();
        let zero = runtime.block_on(async {
            inbox.spawn_sweeper(pool, Duration::from_secs(1), Duration::ZERO, 10)
        });
        assert!(
            matches!(zero, Err(SweeperError::ZeroPeriod)),
            "a zero period is refused, not a panicking task"
        );
    }
}
