//! Exactly-once effects for at-least-once message consumers.
//!
//! Every broker delivers at least once. An [`Inbox`] records each message under a
//! [`MessageKey`] unique within a consumer group, by an atomic insert into a unique key (never
//! check-then-act), so a redelivery finds the record and is absorbed as a
//! [`Delivery::Duplicate`] that replays the first result.
//!
//! # Two modes
//!
//! | mode | use when | how |
//! |---|---|---|
//! | transactional, [`Inbox::receive`] (the default) | the handler's effects are all in this database | the record and the effects commit in one transaction; a concurrent duplicate waits for the first (or, with [`Inbox::lock_timeout`], gets [`Delivery::InProgress`]) |
//! | leased, [`Inbox::claim`] | the handler calls something outside the database (a payment API, e-mail) | a short transaction claims the key as PROCESSING with a lease; the work runs; a second transaction records SUCCESS with the result, or FAILED with the error. An expired lease can be taken over; after [`Inbox::max_attempts`] the message is parked as DEAD |
//!
//! In the leased mode the outside call may run twice (a crash after it, before the
//! record): pass it a deterministic idempotency key, such as the message key, so the
//! outside service can deduplicate too.
//!
//! Ack the broker only after the outcome is committed: on
//! [`Delivery::should_ack`].
//!
//! # Retention
//!
//! Records are kept for a retention period, then [`Inbox::purge`] deletes them in bounded
//! batches (never one unbounded DELETE, never a PROCESSING record). A replay older than the
//! retention is **not** recognized: it applies again. Choose
//!
//! > retention ≥ broker retention + dead-letter queue retention + manual replay window + margin
//!
//! For example: a stream kept 7 days, a dead-letter queue kept 14 days, operators who may
//! replay up to 3 days after the DLQ expires, and a 4-day margin: 7 + 14 + 3 + 4 = 28 days.

mod clock;
mod counters;
mod key;
mod record;
mod sql;

pub use clock::{Clock, ManualClock, SystemClock};
pub use counters::InboxCounters;
pub use key::{AsMessageKey, MessageKey};
pub use sql::{POSTGRES_MIGRATION, SQLITE_MIGRATION};

use crate::backend::{
    Backend, Dialect, Param, WriterGuard, begin_write, begin_write_within, is_conflict,
};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::glue::{Codec, codec};
use crate::key::{Key, KeyError};
use crate::retry::Backoff;
use crate::stored::bounded;
use clock::millis;
use counters::{Counter, Counters};
use record::{Found, Stored};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use sqlx::{Pool, Transaction};
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "ack the broker only on `should_ack()`"]
pub enum Delivery<T> {
    /// This delivery ran the handler, and its record (and, in the transactional mode, its
    /// effects) committed.
    Processed(T),
    /// The message was processed before: the first result, replayed.
    Duplicate {
        /// The first result; `None` if it serialized to `null` or cannot be read back.
        first_result: Option<T>,
    },
    /// The key was recorded with a different payload: the first effect stays, this
    /// delivery was not applied. A producer bug; alert.
    Conflict,
    /// Another delivery of the message is being processed (or, on SQLite with a lock
    /// timeout, the database's writer stayed busy past it). Nack with a delay.
    InProgress {
        /// When the other delivery's lease ends (milliseconds since the epoch), if leased.
        lease_until_millis: Option<i64>,
    },
    /// The message was parked after its last allowed attempt, for a person to look at.
    Dead {
        /// The attempts made.
        attempts: i64,
        /// The last attempt's error.
        last_error: Option<String>,
    },
}

impl<T> Delivery<T> {
    /// Whether to ack the message: `true` unless another delivery is still working on it
    /// (redelivering a conflict or a dead message cannot change its fate).
    pub fn should_ack(&self) -> bool {
        !matches!(self, Delivery::InProgress { .. })
    }

    /// `true` only if this delivery ran the handler.
    pub fn is_processed(&self) -> bool {
        matches!(self, Delivery::Processed(_))
    }
}

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
    clock: Arc<dyn Clock>,
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
    /// 5 attempts, no lock timeout and the system clock.
    pub fn new(group: impl Into<String>) -> Result<Inbox, KeyError> {
        let group = match Key::text(group)? {
            Key::Text(group) => group,
            Key::Int(_) => unreachable!("Key::text makes text keys"),
        };
        Ok(Inbox {
            group,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            lock_timeout: None,
            clock: Arc::new(SystemClock),
            counters: Arc::default(),
        })
    }

    /// How long a leased claim holds a message before another delivery may take it over.
    /// Longer than the work takes; extend it with [`Lease::extend`] for long work.
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

    /// The clock for leases and retention (tests use a [`ManualClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Inbox {
        self.clock = Arc::new(clock);
        self
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
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

    /// [`receive`](Self::receive) with the result codec given (what `#[idempotent]` calls).
    #[doc(hidden)]
    pub async fn receive_with<DB: Backend, T, E>(
        &self,
        codec: Codec<T>,
        pool: &Pool<DB>,
        key: &MessageKey,
        payload: &[u8],
    ) -> Result<Received<DB, T>, Error<E>> {
        let fingerprint = fingerprint(payload);
        let mut backoff = Backoff::default();
        loop {
            match self.receive_once(codec, pool, key, &fingerprint).await {
                // Lost a conflict with a concurrent delivery (REPEATABLE READ,
                // SERIALIZABLE, a deadlock) before the handler ran: try again.
                Err(Error::Database(e)) if is_conflict(&e) => {
                    if !backoff.wait().await {
                        return Err(Error::Contention {
                            attempts: backoff.attempts(),
                            last: e,
                        });
                    }
                }
                other => return other,
            }
        }
    }

    async fn receive_once<DB: Backend, T, E>(
        &self,
        codec: Codec<T>,
        pool: &Pool<DB>,
        key: &MessageKey,
        fingerprint: &str,
    ) -> Result<Received<DB, T>, Error<E>> {
        let Some((mut tx, writer)) = self.begin(pool).await? else {
            return Ok(Received::Done(self.in_progress(None)));
        };
        let now = self.clock.now_millis();
        let (group, message) = (Param::Text(&self.group), Param::Text(key.as_str()));
        let insert = [
            group,
            message,
            Param::Text(fingerprint),
            Param::Text(record::SUCCESS),
            Param::Null,
            Param::Int(now),
        ];
        let inserted = match DB::execute(&mut tx, sql::INSERT, &insert).await {
            Ok(n) => n,
            Err(e) if lock_not_available(&e) => return Ok(Received::Done(self.in_progress(None))),
            Err(e) => return Err(e.into()),
        };
        let receipt = |tx| Receipt {
            tx,
            _writer: writer,
            inbox: self.clone(),
            key: key.clone(),
        };
        if inserted == 1 {
            self.end_lock_timeout(&mut tx).await?;
            reached(FaultPoint::Recorded);
            return Ok(Received::New(receipt(tx)));
        }
        match self.found(&mut tx, key, fingerprint).await? {
            Found::Retry { attempts, takeover } => {
                let params = [
                    group,
                    message,
                    Param::Text(record::SUCCESS),
                    Param::Null,
                    Param::Int(now),
                    Param::Int(attempts),
                ];
                DB::execute(&mut tx, sql::RETRY, &params).await?;
                if takeover {
                    self.counters.add(Counter::Takeovers, 1);
                }
                self.end_lock_timeout(&mut tx).await?;
                reached(FaultPoint::Recorded);
                Ok(Received::New(receipt(tx)))
            }
            found => {
                tx.rollback().await?;
                self.done(codec, key, found).map(Received::Done)
            }
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
                let result = handler(receipt.transaction()).await;
                receipt.finish(result).await
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
        let fingerprint = fingerprint(payload);
        let Some((mut tx, _writer)) = self.begin(pool).await? else {
            return Ok(Claimed::Done(self.in_progress(None)));
        };
        let now = self.clock.now_millis();
        let lease_until = now.saturating_add(millis(self.lease));
        let (group, message) = (Param::Text(&self.group), Param::Text(key.as_str()));
        let insert = [
            group,
            message,
            Param::Text(&fingerprint),
            Param::Text(record::PROCESSING),
            Param::Int(lease_until),
            Param::Int(now),
        ];
        let inserted = match DB::execute(&mut tx, sql::INSERT, &insert).await {
            Ok(n) => n,
            Err(e) if lock_not_available(&e) => return Ok(Claimed::Done(self.in_progress(None))),
            Err(e) => return Err(e.into()),
        };
        if inserted == 1 {
            tx.commit().await?;
            reached(FaultPoint::Claimed);
            return Ok(Claimed::Work(self.lease_of(key, 1, lease_until)));
        }
        match self.found(&mut tx, key, &fingerprint).await? {
            Found::Retry { attempts, .. } if attempts >= self.max_attempts => {
                // The last attempt died with its lease (a crash): park the message.
                DB::execute(&mut tx, sql::BURY, &[group, message, Param::Int(now)]).await?;
                tx.commit().await?;
                self.counters.add(Counter::Dead, 1);
                Ok(Claimed::Done(Delivery::Dead {
                    attempts,
                    last_error: Some("the lease of the last attempt expired".into()),
                }))
            }
            Found::Retry { attempts, takeover } => {
                let params = [
                    group,
                    message,
                    Param::Text(record::PROCESSING),
                    Param::Int(lease_until),
                    Param::Int(now),
                    Param::Int(attempts),
                ];
                DB::execute(&mut tx, sql::RETRY, &params).await?;
                tx.commit().await?;
                if takeover {
                    self.counters.add(Counter::Takeovers, 1);
                }
                reached(FaultPoint::Claimed);
                Ok(Claimed::Work(self.lease_of(key, attempts + 1, lease_until)))
            }
            found => {
                tx.rollback().await?;
                self.done(codec::<Result<T, Infallible>>(), key, found)
                    .map(Claimed::Done)
            }
        }
    }

    /// Deletes this group's finished records (SUCCESS, FAILED) last touched more than
    /// `retention` ago, in transactions of at most `batch` rows, so live deliveries
    /// interleave. PROCESSING and DEAD records are never purged. Returns how many it deleted.
    pub async fn purge<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, sqlx::Error> {
        let cutoff = self.clock.now_millis().saturating_sub(millis(retention));
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let Some((mut tx, writer)) = self.begin(pool).await? else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let statement = match DB::dialect(&tx) {
                Dialect::Postgres => sql::PURGE_POSTGRES,
                Dialect::Sqlite => sql::PURGE_SQLITE,
            };
            let params = [
                Param::Text(&self.group),
                Param::Int(cutoff),
                Param::Int(batch),
            ];
            let deleted = DB::execute(&mut tx, statement, &params).await?;
            tx.commit().await?;
            drop(writer);
            total += deleted;
            self.counters.add(Counter::Purged, deleted);
            if deleted < batch as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Runs [`purge`](Self::purge) every `every` on a background task. A failed purge is
    /// retried at the next tick; the task ends when the handle is aborted or dropped with
    /// the runtime.
    pub fn spawn_sweeper<DB: Backend>(
        &self,
        pool: Pool<DB>,
        retention: Duration,
        every: Duration,
        batch: u32,
    ) -> tokio::task::JoinHandle<()> {
        let inbox = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let _ = inbox.purge(&pool, retention, batch).await;
            }
        })
    }

    /// Opens a write transaction; `None` if the lock timeout ran out waiting for the
    /// SQLite writer queue.
    async fn begin<DB: Backend>(
        &self,
        pool: &Pool<DB>,
    ) -> Result<Option<(Transaction<'static, DB>, Option<WriterGuard>)>, sqlx::Error> {
        let (mut tx, writer) = match self.lock_timeout {
            None => begin_write(pool).await?,
            Some(patience) => match begin_write_within(pool, patience).await? {
                Some(begun) => begun,
                None => return Ok(None),
            },
        };
        if let (Some(timeout), Dialect::Postgres) = (self.lock_timeout, DB::dialect(&tx)) {
            // SET takes no parameters; the value is our own integer.
            let set = format!("SET LOCAL lock_timeout = '{}ms'", millis(timeout).max(1));
            DB::execute(&mut tx, &set, &[]).await?;
        }
        Ok(Some((tx, writer)))
    }

    /// The lock timeout is for waiting on another delivery of the message, not for the
    /// handler's own statements: back to the session's setting once the record is held.
    async fn end_lock_timeout<DB: Backend>(
        &self,
        tx: &mut Transaction<'static, DB>,
    ) -> Result<(), sqlx::Error> {
        if self.lock_timeout.is_some() && DB::dialect(tx) == Dialect::Postgres {
            DB::execute(tx, "SET LOCAL lock_timeout = DEFAULT", &[]).await?;
        }
        Ok(())
    }

    async fn found<DB: Backend, E>(
        &self,
        tx: &mut Transaction<'static, DB>,
        key: &MessageKey,
        fingerprint: &str,
    ) -> Result<Found, Error<E>> {
        let statement = match DB::dialect(tx) {
            Dialect::Postgres => sql::SELECT_FOR_UPDATE,
            Dialect::Sqlite => sql::SELECT,
        };
        let params = [Param::Text(&self.group), Param::Text(key.as_str())];
        let Some(mut row) = DB::fetch(tx, statement, &params).await? else {
            // Inserted by nobody, yet the insert conflicted: the record was purged between
            // the two statements. Report it rather than guess.
            return Err(self.corrupt(key, "the record vanished during the delivery"));
        };
        let stored = Stored {
            status: row.take_text("status").unwrap_or_default(),
            fingerprint: row.take_text("fingerprint").unwrap_or_default(),
            attempts: row.int("attempts").unwrap_or(0),
            result: row.take_text("result"),
            error: row.take_text("error"),
            lease_until: row.int("lease_until"),
        };
        Ok(record::classify(
            stored,
            fingerprint,
            self.clock.now_millis(),
        ))
    }

    fn done<T, E>(
        &self,
        codec: Codec<T>,
        key: &MessageKey,
        found: Found,
    ) -> Result<Delivery<T>, Error<E>> {
        Ok(match found {
            Found::Conflict => {
                self.counters.add(Counter::Conflicts, 1);
                Delivery::Conflict
            }
            Found::Duplicate(stored) => {
                self.counters.add(Counter::Duplicates, 1);
                let first_result = match stored {
                    Some(json) => Some((codec.decode)(&json).map_err(Error::Result)?),
                    None => (codec.decode)("null").ok(),
                };
                Delivery::Duplicate { first_result }
            }
            Found::Dead {
                attempts,
                last_error,
            } => Delivery::Dead {
                attempts,
                last_error,
            },
            Found::InProgress { lease_until } => self.in_progress(lease_until),
            Found::Corrupt(problem) => return Err(self.corrupt(key, &problem)),
            Found::Retry { .. } => unreachable!("retries are handled by the caller"),
        })
    }

    fn in_progress<T>(&self, lease_until_millis: Option<i64>) -> Delivery<T> {
        self.counters.add(Counter::InProgress, 1);
        Delivery::InProgress { lease_until_millis }
    }

    fn lease_of(&self, key: &MessageKey, attempt: i64, until: i64) -> Lease {
        Lease {
            inbox: self.clone(),
            key: key.clone(),
            attempt,
            until,
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
    tx: Transaction<'static, DB>,
    // Released after COMMIT or ROLLBACK, when the receipt is dropped.
    _writer: Option<WriterGuard>,
    inbox: Inbox,
    key: MessageKey,
}

impl<DB: Backend> fmt::Debug for Receipt<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receipt")
            .field("group", &self.inbox.group)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Receipt<DB> {
    /// The transaction holding the inbox record: do the handler's effects in it.
    pub fn transaction(&mut self) -> &mut Transaction<'static, DB> {
        &mut self.tx
    }

    /// The message key.
    pub fn key(&self) -> &MessageKey {
        &self.key
    }

    /// Commits the record with the handler's result and effects, or rolls everything back
    /// if the handler failed (the message stays unprocessed; redeliver it).
    pub async fn finish<T: Serialize + DeserializeOwned, E>(
        self,
        result: Result<T, E>,
    ) -> Result<Delivery<T>, Error<E>> {
        self.finish_with(codec::<Result<T, E>>(), result).await
    }

    /// [`finish`](Self::finish) with the result codec given (what `#[idempotent]` calls).
    #[doc(hidden)]
    pub async fn finish_with<T, E>(
        mut self,
        codec: Codec<T>,
        result: Result<T, E>,
    ) -> Result<Delivery<T>, Error<E>> {
        let result = match result {
            Ok(result) => result,
            Err(e) => {
                let _ = self.tx.rollback().await;
                return Err(Error::Handler(e));
            }
        };
        reached(FaultPoint::BodyDone);
        let json = bounded((codec.encode)(&result).map_err(Error::Result)?)?;
        if json != "null" {
            let params = [
                Param::Text(&self.inbox.group),
                Param::Text(self.key.as_str()),
                Param::Text(&json),
            ];
            DB::execute(&mut self.tx, sql::STORE_RESULT, &params).await?;
        }
        self.tx.commit().await?;
        reached(FaultPoint::Committed);
        self.inbox.counters.add(Counter::Applied, 1);
        Ok(Delivery::Processed(result))
    }
}

impl<DB: Backend> Receipt<DB> {
    /// Ends a delivery whose handler is also a state transition. `Applied` and
    /// `AlreadyDone` are recorded (a redelivery replays them); `IllegalState`, `NotFound`
    /// and `StaleVersion` roll the record back and are returned as they are, so a
    /// redelivery is evaluated again (the usual case: a message that arrived before the
    /// one it depends on).
    #[doc(hidden)]
    pub async fn finish_transition<T, M, E>(
        self,
        codec: Codec<crate::Outcome<T, M>>,
        outcome: crate::Outcome<T, M>,
    ) -> Result<Delivery<crate::Outcome<T, M>>, Error<E>> {
        match outcome {
            crate::Outcome::Applied(_) | crate::Outcome::AlreadyDone { .. } => {
                self.finish_with(codec, Ok(outcome)).await
            }
            refused => {
                self.tx.rollback().await?;
                Ok(Delivery::Processed(refused))
            }
        }
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

/// A claim on a message, valid until its lease expires.
#[derive(Debug)]
pub struct Lease {
    inbox: Inbox,
    key: MessageKey,
    attempt: i64,
    until: i64,
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

    /// When the lease expires, in milliseconds since the epoch.
    pub fn until_millis(&self) -> i64 {
        self.until
    }

    /// Extends the lease to `by` from now. `false` if it was lost (taken over).
    pub async fn extend<DB: Backend>(
        &mut self,
        pool: &Pool<DB>,
        by: Duration,
    ) -> Result<bool, sqlx::Error> {
        // No lock timeout: only the lease's holder writes its record, so the wait is short,
        // and giving up would lose the lease.
        let (mut tx, _writer) = begin_write(pool).await?;
        let now = self.inbox.clock.now_millis();
        let until = now.saturating_add(millis(by));
        let params = [
            Param::Text(&self.inbox.group),
            Param::Text(self.key.as_str()),
            Param::Int(until),
            Param::Int(now),
            Param::Int(self.attempt),
        ];
        let extended = DB::execute(&mut tx, sql::EXTEND, &params).await? == 1;
        tx.commit().await?;
        if extended {
            self.until = until;
        }
        Ok(extended)
    }

    /// Records the work's outcome in a transaction of its own: SUCCESS with the result, or
    /// FAILED with the error (DEAD after the last attempt; the error is returned as
    /// [`Error::Handler`] so the consumer nacks). [`Error::LeaseLost`] if another delivery
    /// took the message over meanwhile.
    pub async fn complete<DB: Backend, T: Serialize, E: fmt::Display>(
        self,
        pool: &Pool<DB>,
        result: Result<T, E>,
    ) -> Result<Delivery<T>, Error<E>> {
        reached(FaultPoint::WorkDone);
        let inbox = &self.inbox;
        // No lock timeout: only the lease's holder writes its record, so the wait is short,
        // and giving up would lose the outcome.
        let (mut tx, _writer) = begin_write(pool).await?;
        let now = inbox.clock.now_millis();
        let (group, message) = (Param::Text(&inbox.group), Param::Text(self.key.as_str()));
        let value = match result {
            Ok(value) => value,
            Err(e) => {
                self.fail(tx, &e.to_string(), now).await?;
                return Err(Error::Handler(e));
            }
        };
        let json = match serde_json::to_string(&value)
            .map_err(Error::Result)
            .and_then(bounded)
        {
            Ok(json) => json,
            // The work is done but its result cannot be stored: a failed attempt, so the
            // message is retried (and parked after the last attempt), never lost.
            Err(refused) => {
                self.fail(tx, &refused.to_string(), now).await?;
                return Err(refused);
            }
        };
        let stored = if json == "null" {
            Param::Null
        } else {
            Param::Text(&json)
        };
        let params = [
            group,
            message,
            stored,
            Param::Int(now),
            Param::Int(self.attempt),
        ];
        if DB::execute(&mut tx, sql::SUCCEED, &params).await? == 0 {
            tx.rollback().await?;
            return Err(self.lost());
        }
        tx.commit().await?;
        reached(FaultPoint::Committed);
        inbox.counters.add(Counter::Applied, 1);
        Ok(Delivery::Processed(value))
    }

    /// Records a failed attempt (DEAD after the last one) and commits.
    async fn fail<DB: Backend>(
        &self,
        mut tx: Transaction<'static, DB>,
        error: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let inbox = &self.inbox;
        let params = [
            Param::Text(&inbox.group),
            Param::Text(self.key.as_str()),
            Param::Int(inbox.max_attempts),
            Param::Text(error),
            Param::Int(now),
            Param::Int(self.attempt),
        ];
        let recorded = DB::execute(&mut tx, sql::FAIL, &params).await? == 1;
        tx.commit().await?;
        if recorded && self.attempt >= inbox.max_attempts {
            inbox.counters.add(Counter::Dead, 1);
        }
        Ok(())
    }

    fn lost<E>(&self) -> Error<E> {
        Error::LeaseLost {
            group: self.inbox.group.clone(),
            key: self.key.to_string(),
        }
    }
}

/// The payload's SHA-256, hex: what "the same content" means.
fn fingerprint(payload: &[u8]) -> String {
    let digest = Sha256::digest(payload);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// PostgreSQL's lock_timeout expired (SQLSTATE 55P03).
fn lock_not_available(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

/// Creates idem's tables (the default results table and the inbox) if they do not
/// exist: [`SQLITE_MIGRATION`] or [`POSTGRES_MIGRATION`], statement by statement.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    let (mut tx, _writer) = begin_write(pool).await?;
    let migration = match DB::dialect(&tx) {
        Dialect::Postgres => POSTGRES_MIGRATION,
        Dialect::Sqlite => SQLITE_MIGRATION,
    };
    for statement in sql::statements(migration) {
        DB::execute(&mut tx, statement, &[]).await?;
    }
    tx.commit().await
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
    fn only_in_progress_is_nacked() {
        assert!(Delivery::Processed(1).should_ack());
        assert!(Delivery::<i32>::Duplicate { first_result: None }.should_ack());
        assert!(Delivery::<i32>::Conflict.should_ack());
        assert!(
            !Delivery::<i32>::InProgress {
                lease_until_millis: None
            }
            .should_ack()
        );
    }
}
