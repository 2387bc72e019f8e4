//! The inbox as a stage of a unit of work, and the plans of message handlers: the inbox
//! alone, and the inbox followed by a transition.

use super::counters::Counter;
use super::record::{self, Ended, Found, Stored};
use super::{Delivery, Inbox, MessageKey, fingerprint};
use crate::backend::{Backend, Param, insert_unless_taken};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::transition::outcome::Refusal;
use crate::transition::stage::{Moved, NotMoved, TransitionStage};
use crate::work::fast::CacheKey;
use crate::work::observe::Labels;
use crate::work::stored::{Codec, replay};
use crate::work::unit::{Entered, Entry, GaveUp, Kept, Lost, Plan, Sealed, no_body, stages_only};
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The inbox stage: records the delivery under its key in the unit of work's transaction.
pub struct InboxStage {
    inbox: Inbox,
    key: MessageKey,
    fingerprint: String,
    /// How long to wait for the writer's turn (SQLite) before giving up as in progress.
    patience: Option<Duration>,
    /// How long the record's insert waits for a concurrent delivery of the same key to end
    /// (PostgreSQL's `lock_timeout`) before giving up as in progress.
    lock_timeout: Option<Duration>,
    /// PostgreSQL: a concurrent delivery of the same key is in progress at once, without
    /// waiting for it (see `idem_sql::inbox::INSERT_UNLESS_BUSY`).
    unblocked: bool,
    /// Whether running out of `patience` is [`Error::Busy`] (the writer was busy with other
    /// keys) rather than [`Delivery::InProgress`].
    busy_is_an_error: bool,
    /// The optimistic form: nothing is written before the handler; the record is inserted
    /// with its result just before the commit (see [`InboxStage::at_commit`]).
    at_commit: bool,
    /// The age in milliseconds (the database's clock) of the processed record this
    /// delivery found, once it found one: a cache entry written for it lives no longer than
    /// the rest of the cache's TTL counted from the record's last change. `-1`: none found.
    found_age: AtomicI64,
}

/// A delivery recorded in the open transaction, waiting for the handler's result.
pub struct Recorded {
    inbox: Inbox,
    key: MessageKey,
    /// It took over an expired lease (counted once the delivery commits).
    takeover: bool,
    /// Recorded only at the commit, with its result (the optimistic form): the delivery's
    /// fingerprint, to insert the record with, or to compare with the record that took
    /// the key first.
    at_commit: Option<String>,
}

impl InboxStage {
    /// The stage recording `key` (with the fingerprint of `payload`) in `inbox`.
    pub fn new(inbox: &Inbox, key: &MessageKey, payload: &[u8]) -> Self {
        InboxStage::fingerprinted(inbox, key, fingerprint(payload))
    }

    /// The stage recording `key` with a fingerprint computed by the caller.
    pub(crate) fn fingerprinted(inbox: &Inbox, key: &MessageKey, fingerprint: String) -> Self {
        InboxStage {
            inbox: inbox.clone(),
            key: key.clone(),
            fingerprint,
            patience: inbox.lock_timeout,
            lock_timeout: inbox.lock_timeout,
            unblocked: false,
            busy_is_an_error: false,
            at_commit: false,
            found_age: AtomicI64::new(-1),
        }
    }

    /// The optimistic form: the stage writes nothing before the handler runs, and the
    /// record is inserted with the handler's result as the last statement before the
    /// commit ([`Kept::seal`]). No statement is spent on recording the key first, and
    /// another delivery of the key never waits for the handler, only (at its own insert)
    /// for the other's commit. A repeat runs its handler too, and loses at the insert: its
    /// writes roll back and it replies with what became of the first ([`Plan::lost`]); a
    /// failed or expired record found there makes it in progress (its handler ran without
    /// taking the record over). Only for handlers whose every effect is in the
    /// transaction.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn at_commit(self) -> Self {
        InboxStage {
            at_commit: true,
            ..self
        }
    }

    /// Waits at most `wait` for the SQLite writer's turn (it is shared by every key; running
    /// out is [`Error::Busy`]) and on MySQL for a concurrent delivery of the same key (its
    /// lock timeout; running out is [`Delivery::InProgress`]), and on PostgreSQL does not
    /// wait for a concurrent delivery of the same key at all: it is in progress at once,
    /// with no statement spent on lock timeouts.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn unblocked(self, wait: Duration) -> Self {
        InboxStage {
            patience: Some(wait),
            lock_timeout: Some(self.lock_timeout.map_or(wait, |own| own.min(wait))),
            unblocked: true,
            busy_is_an_error: true,
            ..self
        }
    }

    /// Notes the age of a processed record the delivery found (see `found_age`).
    pub(crate) fn found(&self, ended: &Ended) {
        if let Some(age) = ended.duplicate_age() {
            let millis = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            self.found_age.store(millis, Ordering::Relaxed);
        }
    }

    /// The age of the processed record this delivery found, if it found one whose age the
    /// read returned.
    pub(crate) fn found_age(&self) -> Option<Duration> {
        u64::try_from(self.found_age.load(Ordering::Relaxed))
            .ok()
            .map(Duration::from_millis)
    }

    /// The reply of a delivery whose wait for the writer's turn ran out.
    fn gave_up<T, R>(&self) -> Result<Delivery<T, R>, Error<Infallible>> {
        match (self.busy_is_an_error, self.patience) {
            (true, Some(waited)) => Err(Error::Busy { waited }),
            _ => Ok(self.inbox.in_progress(None)),
        }
    }

    pub(crate) fn group(&self) -> &str {
        &self.inbox.group
    }

    pub(crate) fn key(&self) -> &MessageKey {
        &self.key
    }

    fn patience(&self) -> Option<Duration> {
        self.patience
    }

    /// The key of the message's first result in the fast path.
    fn cache_key(&self) -> Option<CacheKey> {
        Some(super::cached::key(&self.inbox.group, &self.key))
    }

    /// What the fast path keeps of the message processed with the first result `json`.
    fn cache_value(&self, json: &str) -> String {
        super::cached::value(&self.fingerprint, json)
    }

    /// The first result in `value`, if written for this delivery's payload.
    fn cached_result<T>(&self, value: &str, codec: Codec<T>) -> Option<Option<T>> {
        super::cached::first_result(value, &self.fingerprint, codec)
    }

    /// What the fast path keeps of `delivery`: a first result, or nothing.
    fn cache_delivery<T, R>(&self, delivery: &Delivery<T, R>, codec: Codec<T>) -> Option<String> {
        super::cached::of_delivery(&self.fingerprint, delivery, codec)
    }

    /// The consumer group and the message key, for the call's span and counters.
    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            key: Some(self.key.as_str()),
            ..Labels::default()
        }
    }

    /// Records the delivery: `Ok` if this delivery is to run the handler, otherwise what
    /// became of the message before.
    pub(crate) async fn enter<DB: Backend, T, R>(
        &self,
        conn: &mut DB::Connection,
        codec: Codec<T>,
    ) -> Result<Result<Recorded, Delivery<T, R>>, Error<Infallible>> {
        if self.at_commit {
            return Ok(Ok(Recorded {
                inbox: self.inbox.clone(),
                key: self.key.clone(),
                takeover: false,
                at_commit: Some(self.fingerprint.clone()),
            }));
        }
        let dialect = DB::dialect(conn)?;
        // An insert that gives way to a busy key at once needs no lock timeout.
        let waits = !(self.unblocked && dialect.inbox_insert(true).1);
        let timeout = self.lock_timeout.filter(|_| waits);
        let set = set_lock_timeout::<DB>(conn, dialect, timeout).await?;
        let recorded = self.record::<DB>(conn, dialect).await;
        let proceeding = matches!(recorded, Ok(Ok(_)));
        reset_lock_timeout::<DB>(conn, dialect, set, proceeding, recorded.is_err()).await?;
        let took_over = match recorded? {
            Ok(took_over) => took_over,
            Err(None) => return Ok(Err(self.inbox.in_progress(None))),
            Err(Some(ended)) => {
                self.found(&ended);
                return self.inbox.ended(codec, &self.key, ended).map(Err);
            }
        };
        reached(FaultPoint::Recorded);
        Ok(Ok(Recorded {
            inbox: self.inbox.clone(),
            key: self.key.clone(),
            takeover: took_over,
            at_commit: None,
        }))
    }

    /// The record of the delivery, inserted or taken over (`Ok(true)`: taken over from a
    /// delivery whose lease expired), or else the record of the message's end
    /// (`Err(None)`: another delivery is working on it). Nothing here holds the handler's
    /// result type: it waits for the lock timeout's reset before being decoded.
    async fn record<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        dialect: crate::backend::Dialect,
    ) -> Result<Result<bool, Option<Ended>>, Error<Infallible>> {
        let inbox = &self.inbox;
        // The time each statement judges by: the database's, unless a test clock was given.
        let now = inbox.at();
        let (group, message) = (Param::Text(&inbox.group), Param::Text(self.key.as_str()));
        let insert = [
            group,
            message,
            Param::Text(&self.fingerprint),
            Param::Text(record::SUCCESS),
            // no lease: the record commits with the handler's effects
            Param::Null,
            now,
        ];
        // Only the insert that gives way to a busy key can insert nothing and find no record.
        let (statement, unblocked) = dialect.inbox_insert(self.unblocked);
        let inserted = match insert_unless_taken::<DB>(conn, dialect, statement, &insert).await {
            Ok(n) => n,
            Err(e) if crate::backend::is_lock_timeout(&e) => return Ok(Err(None)),
            Err(e) => return Err(e.into()),
        };
        let mut took_over = false;
        if inserted != 1 {
            let found = inbox
                .found_if_any::<DB>(conn, &self.key, &self.fingerprint)
                .await?;
            let found = match found {
                Some(found) => found,
                // Not inserted, and no record: the insert found the key's advisory lock
                // held, by a delivery still working on it.
                None if unblocked => return Ok(Err(None)),
                None => return Err(inbox.vanished(&self.key)),
            };
            match found {
                Found::Retry { attempts, takeover } => {
                    if !inbox.retry::<DB>(conn, &self.key, attempts).await? {
                        // Another delivery retried it between the read and the update:
                        // it is working on the message.
                        return Ok(Err(None));
                    }
                    took_over = takeover;
                }
                Found::Ended(ended) => return Ok(Err(Some(ended))),
            }
        }
        Ok(Ok(took_over))
    }
}

/// Bounds how long the statements that follow wait for a lock held by another delivery of
/// the same message, to `timeout` (PostgreSQL, MySQL); whether a bound was set.
pub(crate) async fn set_lock_timeout<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: crate::backend::Dialect,
    timeout: Option<Duration>,
) -> Result<bool, sqlx::Error> {
    let Some(set) = timeout.and_then(|t| dialect.set_lock_timeout(super::clock::millis(t))) else {
        return Ok(false);
    };
    DB::execute(conn, &set, &[]).await.map(|_| true)
}

/// Puts back the lock timeout [`set_lock_timeout`] bounded (`set`). It is for waiting on
/// another delivery of a message, not for the handler's own statements: back to the
/// session's setting before a handler runs (`proceeding`), and on MySQL, where the setting
/// is the session's and outlives the transaction, whatever happened (after an error,
/// `failed`, as far as the connection still can, and without an error of its own).
pub(crate) async fn reset_lock_timeout<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: crate::backend::Dialect,
    set: bool,
    proceeding: bool,
    failed: bool,
) -> Result<(), sqlx::Error> {
    let due = set && (proceeding || dialect.lock_timeout_outlives_transaction());
    let Some(reset) = dialect.reset_lock_timeout().filter(|_| due) else {
        return Ok(());
    };
    let done = DB::execute(conn, reset, &[]).await.map(drop);
    if failed { Ok(()) } else { done }
}

impl Kept for Recorded {
    /// Stores the handler's result (JSON, not `null`) in the record.
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        let params = [
            Param::Text(&self.inbox.group),
            Param::Text(self.key.as_str()),
            Param::Text(json),
        ];
        DB::execute(conn, &DB::dialect(conn)?.inbox().store_result, &params)
            .await
            .map(drop)
    }

    /// Stores the result; in the optimistic form, inserts the record with it, or finds the
    /// record that took the key first, which ends the call ([`Sealed::Lost`]).
    async fn seal<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: Option<&str>,
    ) -> Result<Sealed, Error<Infallible>> {
        let Some(fingerprint) = &self.at_commit else {
            if let Some(json) = json {
                self.store::<DB>(conn, json).await?;
            }
            return Ok(Sealed::Stored);
        };
        let inbox = &self.inbox;
        let dialect = DB::dialect(conn)?;
        let params = [
            Param::Text(&inbox.group),
            Param::Text(self.key.as_str()),
            Param::Text(fingerprint),
            json.map_or(Param::Null, Param::Text),
            inbox.at(),
        ];
        let statement = &dialect.inbox().insert_done;
        if insert_unless_taken::<DB>(conn, dialect, statement, &params).await? == 1 {
            reached(FaultPoint::Recorded);
            return Ok(Sealed::Stored);
        }
        // Taken: by a record committed before this transaction's insert (which waited for
        // the commit of one still open). Read as it is now, past the snapshot a MySQL
        // transaction took at its handler's first read.
        let statement = dialect.inbox_select_committed();
        let found = inbox
            .read_record::<DB>(conn, &self.key, fingerprint, statement)
            .await?;
        match found {
            Some(Found::Ended(ended)) => Ok(Sealed::Lost(Lost::new(ended))),
            // Failed, or its lease expired: a delivery takes such a record over before its
            // handler runs, and this one's ran without it (its writes roll back). It is
            // in progress to this call; the HTTP layer runs the request again in the
            // default form, which takes the record over.
            Some(Found::Retry { .. }) => Ok(Sealed::Lost(Lost::new(Ended::InProgress {
                lease_until: None,
            }))),
            // Taken, yet not to be seen: purged since, or committed after the snapshot of a
            // transaction at REPEATABLE READ or above (PostgreSQL). A fresh transaction
            // sees what there is: in progress here, and the HTTP layer runs the request
            // again in the default form.
            None => Ok(Sealed::Lost(Lost::new(Ended::InProgress {
                lease_until: None,
            }))),
        }
    }

    /// Counts a delivery whose handler ran and committed.
    fn committed(&self) {
        self.inbox.counters.add(Counter::Applied, 1);
        if self.takeover {
            self.inbox.counters.add(Counter::Takeovers, 1);
        }
    }
}

/// The plan of a message handler: one stage, the inbox; replies with a [`Delivery`].
pub struct InboxPlan<T> {
    pub(crate) stage: InboxStage,
    codec: Codec<T>,
}

impl<T> InboxPlan<T> {
    /// The plan recording `stage`'s delivery, with the result codec `codec`.
    pub fn new(stage: InboxStage, codec: Codec<T>) -> Self {
        InboxPlan { stage, codec }
    }
}

impl<DB: Backend, T> Plan<DB> for InboxPlan<T> {
    type Value = T;
    type Reply = Delivery<T>;
    type Kept = Recorded;

    fn patience(&self) -> Option<(Duration, GaveUp<Self, Delivery<T>>)> {
        let gave_up: GaveUp<Self, Delivery<T>> = |plan| plan.stage.gave_up();
        self.stage.patience().map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Delivery<T>, Recorded>, Error<Infallible>> {
        Ok(
            match self
                .stage
                .enter::<DB, T, Infallible>(tx, self.codec)
                .await?
            {
                Ok(recorded) => Entered::Run(recorded),
                Err(delivery) => Entered::Done {
                    reply: delivery,
                    commit: false,
                },
            },
        )
    }

    fn encode(&self, value: &T) -> Result<String, Error<Infallible>> {
        (self.codec.encode)(value).map_err(Error::Result)
    }

    fn applied(&self, value: T) -> Delivery<T> {
        Delivery::Processed(value)
    }

    fn lost(&self, lost: Lost) -> Result<Delivery<T>, Error<Infallible>> {
        let Some(ended) = lost.found::<Ended>() else {
            return Err(self.stage.inbox.corrupt(
                &self.stage.key,
                "the inbox's plan was told of a key another stage lost",
            ));
        };
        self.stage.found(&ended);
        self.stage.inbox.ended(self.codec, &self.stage.key, ended)
    }

    fn labels(&self) -> Labels<'_> {
        self.stage.labels()
    }

    fn outcome_name(reply: &Delivery<T>) -> &'static str {
        reply.kind()
    }

    fn settled(&self, reply: &Delivery<T>) {
        self.stage.inbox.count(reply, false);
    }

    fn cache_key(&self) -> Option<CacheKey> {
        self.stage.cache_key()
    }

    fn cached_reply(&self, value: &str) -> Option<Delivery<T>> {
        let first_result = self.stage.cached_result(value, self.codec)?;
        Some(Delivery::Duplicate { first_result })
    }

    fn cache_value(&self, reply: &Delivery<T>) -> Option<String> {
        self.stage.cache_delivery(reply, self.codec)
    }

    fn cache_applied(&self, json: &str) -> Option<String> {
        Some(self.stage.cache_value(json))
    }

    fn cache_age(&self, _: &Delivery<T>) -> Option<Duration> {
        self.stage.found_age()
    }
}

impl<T> InboxPlan<T> {
    /// After a handler of the optimistic form ([`InboxStage::at_commit`]) ended without
    /// its result committed (a failure, a status not kept, nothing written): what became
    /// of the delivery that took the key meanwhile, if one did and ended — the reply a
    /// repeat gets rather than its own handler's failure. `None` for the other forms,
    /// whose own record was rolled back with the handler.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) async fn recall<DB: Backend>(
        &self,
        pool: &sqlx::Pool<DB>,
    ) -> Option<Result<Delivery<T>, Error<Infallible>>> {
        if !self.stage.at_commit {
            return None;
        }
        stages_only(pool, &Recall(self)).await.transpose()
    }
}

/// The read of [`InboxPlan::recall`]: one statement, in autocommit where the backend allows.
struct Recall<'a, T>(&'a InboxPlan<T>);

impl<DB: Backend, T> Plan<DB> for Recall<'_, T> {
    type Value = Infallible;
    type Reply = Option<Delivery<T>>;
    type Kept = ();

    fn autocommit(&self, _: crate::backend::Dialect) -> bool {
        true
    }

    /// The delivery's own bound on waiting for the writer's turn (SQLite); past it, nothing
    /// to recall.
    fn patience(&self) -> Option<(Duration, GaveUp<Self, Self::Reply>)> {
        let gave_up: GaveUp<Self, Self::Reply> = |_| Ok(None);
        self.0.stage.patience().map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        conn: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Self::Reply>, Error<Infallible>> {
        let stage = &self.0.stage;
        let select = &DB::dialect(conn)?.inbox().select;
        let found = stage
            .inbox
            .read_record::<DB>(conn, &stage.key, &stage.fingerprint, select)
            .await?;
        let reply = match found {
            Some(Found::Ended(ended)) => {
                Some(stage.inbox.ended(self.0.codec, &stage.key, ended)?)
            }
            Some(Found::Retry { .. }) | None => None,
        };
        Ok(Entered::Done {
            reply,
            commit: false,
        })
    }

    no_body!(Option<Delivery<T>>);

    fn labels(&self) -> Labels<'_> {
        self.0.stage.labels()
    }

    fn outcome_name(reply: &Self::Reply) -> &'static str {
        reply.as_ref().map_or("none", Delivery::kind)
    }

    fn settled(&self, reply: &Self::Reply) {
        if let Some(reply) = reply {
            self.0.stage.inbox.count(reply, false);
        }
    }
}

/// The plan of a message handler that is also a transition: the inbox stage, then the
/// transition stage. Replies with a [`Delivery`] whose refusals are [`Refusal`]s.
///
/// - the row moved: the body runs; its result is stored with the transition and in the
///   record ([`Delivery::Processed`]);
/// - the transition had already happened (through another message or a direct call): the
///   record is kept with the transition's first result, which is replayed
///   ([`Delivery::Duplicate`], now and on every redelivery);
/// - not yet, illegal, not found, stale: the record is rolled back and the refusal
///   returned ([`Delivery::Refused`], not acked), so a redelivery is evaluated again.
pub struct ConsumerTransitionPlan<T, M> {
    inbox: InboxStage,
    transition: TransitionStage<M>,
    codec: Codec<T>,
}

impl<T, M> ConsumerTransitionPlan<T, M> {
    /// The plan recording `inbox`'s delivery, then attempting `transition`.
    pub fn new(inbox: InboxStage, transition: TransitionStage<M>, codec: Codec<T>) -> Self {
        ConsumerTransitionPlan {
            inbox,
            transition,
            codec,
        }
    }
}

impl<DB: Backend, T, M> Plan<DB> for ConsumerTransitionPlan<T, M>
where
    M: Send + Sync,
{
    type Value = T;
    type Reply = Delivery<T, Refusal<M>>;
    type Kept = (Moved, Recorded);

    fn check(&self) -> Result<(), Error<Infallible>> {
        self.transition.check()
    }

    fn patience(&self) -> Option<(Duration, GaveUp<Self, Self::Reply>)> {
        let gave_up: GaveUp<Self, Self::Reply> = |plan| plan.inbox.gave_up();
        self.inbox.patience().map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Self::Reply, Self::Kept>, Error<Infallible>> {
        let recorded = match self
            .inbox
            .enter::<DB, T, Refusal<M>>(tx, self.codec)
            .await?
        {
            Ok(recorded) => recorded,
            Err(delivery) => {
                return Ok(Entered::Done {
                    reply: delivery,
                    commit: false,
                });
            }
        };
        Ok(
            match self.transition.enter::<DB>(tx, Entry::Nested).await? {
                Ok(moved) => Entered::Run((moved, recorded)),
                Err(NotMoved::AlreadyDone { first_result, .. }) => {
                    // Done before, by another message or call: this message is a duplicate
                    // of it. Keep the record, with the first result to replay.
                    if let Some(json) = &first_result {
                        recorded.store::<DB>(tx, json).await?;
                    }
                    Entered::Done {
                        reply: Delivery::Duplicate {
                            first_result: replay(self.codec, first_result)?,
                        },
                        commit: true,
                    }
                }
                Err(NotMoved::Refused(refusal)) => Entered::Done {
                    reply: Delivery::Refused(refusal),
                    commit: false,
                },
                // An event older than the row (a stage with a watermark; `#[idempotent]` does
                // not combine one with an inbox): nothing left to do for this message, ever.
                Err(NotMoved::Superseded { .. }) => Entered::Done {
                    reply: Delivery::Duplicate { first_result: None },
                    commit: true,
                },
            },
        )
    }

    fn encode(&self, value: &T) -> Result<String, Error<Infallible>> {
        (self.codec.encode)(value).map_err(Error::Result)
    }

    fn applied(&self, value: T) -> Self::Reply {
        Delivery::Processed(value)
    }

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.inbox.group),
            ..self.transition.labels()
        }
    }

    fn outcome_name(reply: &Self::Reply) -> &'static str {
        match reply {
            // Why it was refused says more: not_yet, illegal_state, …
            Delivery::Refused(refusal) => refusal.kind().as_str(),
            other => other.kind(),
        }
    }

    fn settled(&self, reply: &Self::Reply) {
        let illegal = matches!(reply, Delivery::Refused(refusal) if refusal.is_illegal());
        self.inbox.inbox.count(reply, illegal);
    }

    fn cache_key(&self) -> Option<CacheKey> {
        self.inbox.cache_key()
    }

    fn cached_reply(&self, value: &str) -> Option<Self::Reply> {
        let first_result = self.inbox.cached_result(value, self.codec)?;
        Some(Delivery::Duplicate { first_result })
    }

    fn cache_value(&self, reply: &Self::Reply) -> Option<String> {
        self.inbox.cache_delivery(reply, self.codec)
    }

    fn cache_applied(&self, json: &str) -> Option<String> {
        Some(self.inbox.cache_value(json))
    }
}

impl Inbox {
    /// Another attempt at `key`'s failed or expired record, in the open transaction, whose
    /// `attempts` were read just before: `false` if another delivery retried it in between
    /// (it is working on the message).
    pub(crate) async fn retry<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        attempts: i64,
    ) -> Result<bool, Error<Infallible>> {
        let params = [
            Param::Text(&self.group),
            Param::Text(key.as_str()),
            Param::Text(record::SUCCESS),
            // no lease: the record commits with the handler's effects
            Param::Null,
            self.at(),
            Param::Int(attempts),
        ];
        let retry = &DB::dialect(conn)?.inbox().retry;
        Ok(DB::execute(conn, retry, &params).await? == 1)
    }

    /// Counts a delivery that ended without running the handler, once.
    pub(crate) fn count<T, R>(&self, delivery: &Delivery<T, R>, illegal: bool) {
        let counter = match delivery {
            Delivery::Duplicate { .. } => Counter::Duplicates,
            Delivery::Conflict => Counter::Conflicts,
            Delivery::InProgress { .. } => Counter::InProgress,
            Delivery::Refused(_) => Counter::Refused,
            Delivery::Processed(_) | Delivery::Dead { .. } => return,
        };
        self.counters.add(counter, 1);
        if illegal {
            self.counters.add(Counter::Illegal, 1);
        }
    }

    /// What a delivery that found the message recorded replies (not counted: see
    /// [`count`](Self::count)).
    pub(crate) fn ended<T, R, E>(
        &self,
        codec: Codec<T>,
        key: &MessageKey,
        ended: Ended,
    ) -> Result<Delivery<T, R>, Error<E>> {
        Ok(match ended {
            Ended::Conflict => Delivery::Conflict,
            Ended::Duplicate(stored, _) => Delivery::Duplicate {
                first_result: replay(codec, stored)?,
            },
            Ended::Dead {
                attempts,
                last_error,
            } => Delivery::Dead {
                attempts,
                last_error,
            },
            Ended::InProgress { lease_until } => self.in_progress(lease_until),
            Ended::Corrupt(problem) => return Err(self.corrupt(key, &problem)),
        })
    }

    pub(crate) async fn found<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        fingerprint: &str,
    ) -> Result<Found, Error<Infallible>> {
        match self.found_if_any::<DB>(conn, key, fingerprint).await? {
            Some(found) => Ok(found),
            None => Err(self.vanished(key)),
        }
    }

    /// Inserted by nobody, yet the insert conflicted: the record was purged between the
    /// two statements. Reported rather than guessed at.
    pub(crate) fn vanished<E>(&self, key: &MessageKey) -> Error<E> {
        self.corrupt(key, "the record vanished during the delivery")
    }

    /// The key's record, classified, if there is one (committed, or this transaction's).
    pub(crate) async fn found_if_any<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        fingerprint: &str,
    ) -> Result<Option<Found>, Error<Infallible>> {
        // A plain read first: a repeat of a finished message (the common case) reads its
        // record and ends, without locking the row (on PostgreSQL a row lock is a write:
        // the row's page and the log). Only a record this delivery may go on to retry is
        // read again, locked, so that the retry (or the burial) acts on the record as it
        // is once no other delivery holds it (SQLite: inside `BEGIN IMMEDIATE`, already
        // locked).
        let found = self
            .read_record::<DB>(conn, key, fingerprint, &DB::dialect(conn)?.inbox().select)
            .await?;
        match found {
            Some(Found::Retry { .. }) => match DB::dialect(conn)?.inbox_locking_select() {
                Some(locking) => {
                    self.read_record::<DB>(conn, key, fingerprint, locking)
                        .await
                }
                None => Ok(found),
            },
            found => Ok(found),
        }
    }

    /// The key's record read by `statement`, classified, if there is one.
    async fn read_record<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        fingerprint: &str,
        statement: &str,
    ) -> Result<Option<Found>, Error<Infallible>> {
        let params = [
            Param::Text(&self.group),
            Param::Text(key.as_str()),
            self.at(),
        ];
        let Some(mut row) = DB::fetch(conn, statement, &params).await? else {
            return Ok(None);
        };
        let (stored, now) = self.stored(&mut row, key)?;
        Ok(Some(record::classify(stored, fingerprint, now)))
    }

    /// The record in `row` (read for `key`), and the time its lease is judged by, read with
    /// it (the database's clock). A NULL status or fingerprint is kept as one: `classify`
    /// refuses it.
    pub(crate) fn stored(
        &self,
        row: &mut crate::backend::Record,
        key: &MessageKey,
    ) -> Result<(Stored, i64), Error<Infallible>> {
        let Some(now) = row.int("now") else {
            return Err(self.corrupt(key, "the database returned no time with the record"));
        };
        let stored = Stored {
            status: row.take_text("status"),
            fingerprint: row.take_text("fingerprint"),
            attempts: row.int("attempts").unwrap_or(0),
            result: row.take_text("result"),
            error: row.take_text("error"),
            lease_until: row.int("lease_until"),
            updated_at: row.int("updated_at"),
        };
        Ok((stored, now))
    }
}
