//! The leased mode's short units of work: the claim (a PROCESSING record with a lease), the
//! extension of a lease, and the completion (SUCCESS with the result, or FAILED with the
//! error). None has a body in the database: each ends in its stage, committing what it
//! wrote, so all get the unit of work's conflict retry, span and once-only counting.

use super::counters::Counter;
use super::record::{self, Found};
use super::{Claimed, Delivery, Inbox, Lease, MessageKey};
use crate::backend::{Backend, Param, insert_unless_taken};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::work::fast::CacheKey;
use crate::work::observe::Labels;
use crate::work::stored::Codec;
use crate::work::unit::{Entered, Entry, GaveUp, Plan, no_body};
use std::convert::Infallible;
use std::time::Duration;

use super::clock::millis;

/// A claim, and the event to count once it committed.
pub(crate) struct Claim<T> {
    pub(crate) claimed: Claimed<T>,
    event: Option<Counter>,
    /// The age of the processed record the claim found (see `Plan::cache_age`).
    age: Option<Duration>,
}

/// The claim of a message for a leased attempt.
pub(crate) struct ClaimPlan<'a, T> {
    pub(crate) inbox: &'a Inbox,
    pub(crate) key: &'a MessageKey,
    pub(crate) fingerprint: String,
    pub(crate) codec: Codec<T>,
}

impl<T> ClaimPlan<'_, T> {
    fn done(claimed: Claimed<T>, event: Option<Counter>, commit: bool) -> Entered<Claim<T>> {
        Entered::Done {
            reply: Claim {
                claimed,
                event,
                age: None,
            },
            commit,
        }
    }
}

impl<DB: Backend, T> Plan<DB> for ClaimPlan<'_, T> {
    // No body: a claim ends in its stage.
    type Value = Infallible;
    type Reply = Claim<T>;
    type Kept = ();

    fn patience(&self) -> Option<(Duration, GaveUp<Self, Claim<T>>)> {
        let gave_up: GaveUp<Self, Claim<T>> = |plan| {
            Ok(Claim {
                claimed: Claimed::Done(plan.inbox.in_progress(None)),
                event: None,
                age: None,
            })
        };
        self.inbox.lock_timeout.map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Claim<T>>, Error<Infallible>> {
        let dialect = DB::dialect(tx)?;
        let lock_timeout = self
            .inbox
            .lock_timeout
            .and_then(|timeout| dialect.set_lock_timeout(millis(timeout)));
        if let Some(set) = &lock_timeout {
            DB::execute(tx, set, &[]).await?;
        }
        let step = self.claim::<DB>(tx, dialect).await;
        // The transaction ends right after the claim, and with it PostgreSQL's setting;
        // MySQL's is the session's, put back whatever happened.
        let outlives = dialect.lock_timeout_outlives_transaction();
        if let (Some(_), Some(reset), true) =
            (&lock_timeout, dialect.reset_lock_timeout(), outlives)
        {
            match &step {
                Ok(_) => DB::execute(tx, reset, &[]).await.map(drop)?,
                Err(_) => drop(DB::execute(tx, reset, &[]).await),
            }
        }
        let inbox = self.inbox;
        Ok(match step? {
            Step::Work(lease, event) => Self::done(Claimed::Work(lease), event, true),
            Step::InProgress => Self::done(Claimed::Done(inbox.in_progress(None)), None, false),
            Step::Dead(attempts) => {
                let dead = Delivery::Dead {
                    attempts,
                    last_error: Some("the lease of the last attempt expired".into()),
                };
                Self::done(Claimed::Done(dead), Some(Counter::Dead), true)
            }
            Step::Ended(ended) => {
                let age = ended.duplicate_age();
                Entered::Done {
                    reply: Claim {
                        claimed: Claimed::Done(inbox.ended(self.codec, self.key, ended)?),
                        event: None,
                        age,
                    },
                    commit: false,
                }
            }
        })
    }

    no_body!(Claim<T>);

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            key: Some(self.key.as_str()),
            ..Labels::default()
        }
    }

    fn outcome_name(reply: &Claim<T>) -> &'static str {
        match &reply.claimed {
            Claimed::Work(_) => "claimed",
            Claimed::Done(delivery) => delivery.kind(),
        }
    }

    fn settled(&self, reply: &Claim<T>) {
        if let Some(event) = reply.event {
            self.inbox.counters.add(event, 1);
        }
        match &reply.claimed {
            Claimed::Work(_) => reached(FaultPoint::Claimed),
            Claimed::Done(delivery) => self.inbox.count(delivery, false),
        }
    }

    fn cache_key(&self) -> Option<CacheKey> {
        Some(super::cached::key(&self.inbox.group, self.key))
    }

    fn cached_reply(&self, value: &str) -> Option<Claim<T>> {
        let first_result = super::cached::first_result(value, &self.fingerprint, self.codec)?;
        Some(Claim {
            claimed: Claimed::Done(Delivery::Duplicate { first_result }),
            event: None,
            age: None,
        })
    }

    fn cache_value(&self, reply: &Claim<T>) -> Option<String> {
        match &reply.claimed {
            Claimed::Done(delivery) => {
                super::cached::of_delivery(&self.fingerprint, delivery, self.codec)
            }
            Claimed::Work(_) => None,
        }
    }

    fn cache_age(&self, reply: &Claim<T>) -> Option<Duration> {
        reply.age
    }
}

/// What a claim did, before a stored result is decoded: nothing here holds a `T`, so it
/// can wait for the lock timeout's reset.
enum Step {
    /// This delivery holds the lease.
    Work(Lease, Option<Counter>),
    /// Another delivery holds the key's row lock.
    InProgress,
    /// Parked after its last allowed attempt.
    Dead(i64),
    /// The message ended before.
    Ended(record::Ended),
}

impl<T> ClaimPlan<'_, T> {
    /// The claim itself, under the lock timeout [`enter`](Plan::enter) set.
    async fn claim<DB: Backend>(
        &self,
        tx: &mut DB::Connection,
        dialect: crate::backend::Dialect,
    ) -> Result<Step, Error<Infallible>> {
        let inbox = self.inbox;
        // The database's time (or a test clock's), read once: the claim reports when its
        // lease ends, and every statement of the claim judges by the same time.
        let now = inbox.now_in::<DB>(tx, self.key).await?;
        let lease = inbox.lease_millis();
        let lease_until = now.saturating_add(lease);
        let (group, message) = (Param::Text(&inbox.group), Param::Text(self.key.as_str()));
        let insert = [
            group,
            message,
            Param::Text(&self.fingerprint),
            Param::Text(record::PROCESSING),
            Param::Int(lease),
            Param::Int(now),
        ];
        let (statement, _) = dialect.inbox_insert(false);
        let inserted = match insert_unless_taken::<DB>(tx, dialect, statement, &insert).await {
            Ok(n) => n,
            Err(e) if crate::backend::is_lock_timeout(&e) => return Ok(Step::InProgress),
            Err(e) => return Err(e.into()),
        };
        if inserted == 1 {
            let lease = inbox.lease_of(self.key, &self.fingerprint, 1, lease_until);
            return Ok(Step::Work(lease, None));
        }
        Ok(
            match inbox.found::<DB>(tx, self.key, &self.fingerprint).await? {
                Found::Retry { attempts, .. } if attempts >= inbox.max_attempts => {
                    // The last attempt died with its lease (a crash): park the message.
                    let bury = &dialect.inbox().bury;
                    DB::execute(tx, bury, &[group, message, Param::Int(now)]).await?;
                    Step::Dead(attempts)
                }
                Found::Retry { attempts, takeover } => {
                    let params = [
                        group,
                        message,
                        Param::Text(record::PROCESSING),
                        Param::Int(lease),
                        Param::Int(now),
                        Param::Int(attempts),
                    ];
                    if DB::execute(tx, &dialect.inbox().retry, &params).await? != 1 {
                        // Another delivery retried it between the read and the update: it
                        // holds the message now.
                        return Ok(Step::InProgress);
                    }
                    let lease =
                        inbox.lease_of(self.key, &self.fingerprint, attempts + 1, lease_until);
                    Step::Work(lease, takeover.then_some(Counter::Takeovers))
                }
                Found::Ended(ended) => Step::Ended(ended),
            },
        )
    }
}

/// What a completion records.
pub(crate) enum Outcome<'a> {
    /// SUCCESS with this result (`None`: nothing to store).
    Succeeded(Option<&'a str>),
    /// FAILED (DEAD after the last attempt) with this error.
    Failed(&'a str),
}

/// What a completion recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    Succeeded,
    Failed,
    /// The last allowed attempt failed: the message is parked as DEAD.
    Buried,
}

/// The completion of a leased attempt.
pub(crate) struct CompletePlan<'a> {
    pub(crate) lease: &'a Lease,
    pub(crate) outcome: Outcome<'a>,
}

impl<DB: Backend> Plan<DB> for CompletePlan<'_> {
    // No body: a completion ends in its stage.
    type Value = Infallible;
    type Reply = Recorded;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Recorded>, Error<Infallible>> {
        let lease = self.lease;
        let inbox = &lease.inbox;
        let now = inbox.at();
        let statements = DB::dialect(tx)?.inbox();
        let (group, message) = (Param::Text(&inbox.group), Param::Text(lease.key.as_str()));
        let (reply, recorded) = match self.outcome {
            Outcome::Succeeded(json) => {
                let stored = json.map_or(Param::Null, Param::Text);
                let params = [group, message, stored, now, Param::Int(lease.attempt)];
                let recorded = DB::execute(tx, &statements.succeed, &params).await? == 1;
                (Recorded::Succeeded, recorded)
            }
            Outcome::Failed(error) => {
                let params = [
                    group,
                    message,
                    Param::Int(inbox.max_attempts),
                    Param::Text(error),
                    now,
                    Param::Int(lease.attempt),
                ];
                let recorded = DB::execute(tx, &statements.fail, &params).await? == 1;
                let last = recorded && lease.attempt >= inbox.max_attempts;
                // A failure whose lease was taken over records nothing; the handler's
                // error is still what the caller gets.
                (
                    if last {
                        Recorded::Buried
                    } else {
                        Recorded::Failed
                    },
                    true,
                )
            }
        };
        if !recorded {
            // Another delivery took the expired lease over: record nothing (the
            // transaction is dropped, so rolled back).
            return Err(lease.lost());
        }
        Ok(Entered::Done {
            reply,
            commit: true,
        })
    }

    no_body!(Recorded);

    fn labels(&self) -> Labels<'_> {
        self.lease.labels()
    }

    fn outcome_name(reply: &Recorded) -> &'static str {
        match reply {
            Recorded::Succeeded => "processed",
            Recorded::Failed => "failed",
            Recorded::Buried => "dead",
        }
    }

    fn settled(&self, reply: &Recorded) {
        let counters = &self.lease.inbox.counters;
        match reply {
            Recorded::Succeeded => {
                reached(FaultPoint::Committed);
                counters.add(Counter::Applied, 1);
            }
            Recorded::Failed => {}
            Recorded::Buried => counters.add(Counter::Dead, 1),
        }
    }

    fn cache_key(&self) -> Option<CacheKey> {
        Some(super::cached::key(&self.lease.inbox.group, &self.lease.key))
    }

    /// A success committed: its result, for the fast path.
    fn cache_value(&self, reply: &Recorded) -> Option<String> {
        match (reply, &self.outcome) {
            (Recorded::Succeeded, Outcome::Succeeded(json)) => Some(super::cached::value(
                &self.lease.fingerprint,
                json.unwrap_or("null"),
            )),
            _ => None,
        }
    }

    /// Never asked: a completion is not a delivery.
    fn cache_reads(&self) -> bool {
        false
    }
}

/// The extension of a lease: `until` moved to `by` from now, if the lease is still held.
pub(crate) struct ExtendPlan<'a> {
    pub(crate) lease: &'a Lease,
    pub(crate) by: Duration,
}

/// The lease's new end, or `None` when it was lost (taken over).
pub(crate) type Extended = Option<i64>;

impl<DB: Backend> Plan<DB> for ExtendPlan<'_> {
    // No body: an extension ends in its stage.
    type Value = Infallible;
    type Reply = Extended;
    type Kept = ();

    // No lock timeout: only the lease's holder writes its record, so the wait is short,
    // and giving up would lose the lease.

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Extended>, Error<Infallible>> {
        let lease = self.lease;
        let now = lease.inbox.now_in::<DB>(tx, &lease.key).await?;
        let until = now.saturating_add(millis(self.by));
        let params = [
            Param::Text(&lease.inbox.group),
            Param::Text(lease.key.as_str()),
            Param::Int(until),
            Param::Int(now),
            Param::Int(lease.attempt),
        ];
        let extended = DB::execute(tx, &DB::dialect(tx)?.inbox().extend, &params).await? == 1;
        Ok(Entered::Done {
            reply: extended.then_some(until),
            commit: extended,
        })
    }

    no_body!(Extended);

    fn labels(&self) -> Labels<'_> {
        self.lease.labels()
    }

    fn outcome_name(reply: &Extended) -> &'static str {
        match reply {
            Some(_) => "extended",
            None => "lease_lost",
        }
    }
}

impl Lease {
    /// The consumer group and the message key, for the spans of the lease's units of work.
    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            key: Some(self.key.as_str()),
            ..Labels::default()
        }
    }
}
