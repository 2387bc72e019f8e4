//! Scheduled jobs that run **once per occurrence**, however many instances run them and
//! whatever their clocks say (feature `schedule`).
//!
//! A job is a name, a [`Schedule`] and a body. Each **occurrence** (the job, a scheduled
//! instant) is recorded in the transaction of its body: the job's row in `idem_jobs` moves
//! past it in the same transaction as the body's effects, so the occurrence commits once
//! with them. An instance killed after its commit leaves nothing to run again; one killed
//! before leaves nothing committed, and another instance runs the occurrence.
//!
//! - **The database's clock decides what is due**, as it decides the inbox's leases: each
//!   tick reads the time in the statement that reads the job's row, and sleeps for
//!   differences of that time. An instance whose clock runs hours ahead runs nothing early.
//! - **Occurrences of a job never overlap.** A transactional occurrence holds its job's row
//!   until it commits; a leased one holds the job by its lease. The next occurrence waits
//!   for the one running (as Kubernetes' `concurrencyPolicy: Forbid`), and if it became due
//!   meanwhile it is a missed occurrence, which [`Missed`] decides about. Work that may run
//!   in parallel is work to hand out: stage an outbox message per item from the occurrence.
//! - **Missed occurrences** (every instance down for a while, an occurrence running long):
//!   [`Missed::RunLatest`] (the default) runs only the latest due, [`Missed::RunEach`] runs
//!   each in order, [`Missed::Skip`] runs none late; a [deadline](Job::deadline) skips an
//!   occurrence not started in time. Every skipped occurrence is counted once, by the
//!   instance whose statement moved the job past it.
//! - **Failures** roll the occurrence back (its effects with it); it is tried again after
//!   the [retry delay](Job::retry_delay) (by the database's clock, on whichever instance),
//!   until it runs, or its deadline or the next occurrence makes it missed.
//!
//! # Two forms
//!
//! [`Job::run`] / [`Job::tick`]: the body runs in the occurrence's transaction, so it may
//! move rows with idem's handlers (`&mut *tx`) and stage outbox messages; its result is
//! stored in the job's row. [`Job::run_leased`] / [`Job::tick_leased`], for a long body that
//! calls outside the database: the occurrence is claimed with a lease (kept alive while the
//! body runs, its fencing token in [`Occurrence::fence`]); a dead runner's occurrence is
//! taken over once its lease ends, and its late completion is refused. Pass
//! [`Occurrence::effect_key`]`.derive("…")` to the outside service as its idempotency key:
//! the same on every attempt and takeover.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::schedule::{Job, Schedule};
//! use std::time::Duration;
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! idem::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE reports (at TEXT PRIMARY KEY)").execute(&pool).await?;
//!
//! let job = Job::new("report", Schedule::every(Duration::from_millis(100))?)?;
//! // `job.run(&pool, handler)` ticks for ever; here, until two occurrences ran.
//! let mut ran = 0;
//! while ran < 2 {
//!     let tick = job
//!         .tick(&pool, |tx, occurrence| {
//!             Box::pin(async move {
//!                 sqlx::query("INSERT INTO reports (at) VALUES (?)")
//!                     .bind(occurrence.key())
//!                     .execute(&mut **tx)
//!                     .await?;
//!                 Ok::<_, sqlx::Error>(())
//!             })
//!         })
//!         .await?;
//!     if tick.ran().is_some() {
//!         ran += 1;
//!     }
//!     tokio::time::sleep(tick.wait()).await;
//! }
//! let reports: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reports").fetch_one(&pool).await?;
//! assert_eq!(reports, 2);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```

mod steps;
mod when;

pub use when::{Schedule, ScheduleError};

use crate::backend::{Backend, Param};
use crate::error::Error;
use crate::inbox::{BatchFuture, Clock, millis};
use crate::outbox::EffectKey;
use crate::value::key::valid_text;
use crate::work::stored::bounded;
use crate::work::unit::{Begun, begin, stages_only};
use serde::Serialize;
use sqlx::{Pool, Transaction};
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use steps::{Did, NotRun, OccurrencePlan, Op, Row, Step};

/// The cursor of a job whose row was just made: the first instance to read it sets it to
/// the first occurrence at or after the database's now.
const NEW: i64 = -1;

/// The longest a runner sleeps before reading its job's row again.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// What to do with occurrences that were due while no instance ran them (every instance
/// down, or the previous occurrence still running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Run only the latest due occurrence; skip (and count) the ones before it. The default:
    /// a report or a sweep needs running once, not once per hour it was down.
    #[default]
    RunLatest,
    /// Run each missed occurrence, oldest first (within the deadline, if one is set): for
    /// jobs whose occurrences each stand for their own period (an hourly rollup).
    RunEach,
    /// Run none late: an occurrence not started within the deadline (one minute unless
    /// [`Job::deadline`] says otherwise, as Quartz's misfire threshold) is skipped, and the
    /// job waits for its next occurrence.
    Skip,
}

/// A scheduled job: a name (its row in `idem_jobs`), a [`Schedule`], and what to do with
/// missed occurrences. Clones share their counters. See the [module](self).
#[derive(Clone)]
pub struct Job {
    name: String,
    /// The name as the job's spans and effect keys carry it (`schedule:<name>`).
    label: String,
    schedule: Schedule,
    missed: Missed,
    deadline: Option<Duration>,
    retry_delay: Duration,
    lease: Duration,
    clock: Option<Arc<dyn Clock>>,
    counters: Arc<Counters>,
    /// What this process last learned of the job's row (shared by clones).
    known: Arc<Mutex<Option<Known>>>,
}

/// What a process last learned of its job's row, so that the next occurrence can be
/// recorded without reading the row first: the record's own statement checks, by the
/// database's clock, that it is due and that no later occurrence is.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// The job's first occurrence not yet run, as this process last read or moved it.
    cursor: i64,
    /// The database's clock minus this process's, as of that read.
    offset: i64,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("missed", &self.missed)
            .field("deadline", &self.deadline)
            .field("retry_delay", &self.retry_delay)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// The job `name` (1 to 255 bytes, no control characters) on `schedule`, running the
    /// latest missed occurrence, with no deadline, a retry delay of 1 s and, in the leased
    /// form, a lease of 30 s.
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Result<Job, ScheduleError> {
        let name = valid_text(name.into()).map_err(ScheduleError::Name)?;
        Ok(Job {
            label: format!("schedule:{name}"),
            counters: Arc::new(Counters::default()),
            name,
            schedule,
            missed: Missed::default(),
            deadline: None,
            retry_delay: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            clock: None,
            known: Arc::new(Mutex::new(None)),
        })
    }

    /// What to do with missed occurrences (see [`Missed`]).
    pub fn missed(mut self, missed: Missed) -> Job {
        self.missed = missed;
        self
    }

    /// How late an occurrence may start: one not started within `deadline` of its time is
    /// skipped and counted (Kubernetes' `startingDeadlineSeconds`), whatever the
    /// [`Missed`] policy. None by default ([`Missed::Skip`]: one minute).
    pub fn deadline(mut self, deadline: Duration) -> Job {
        self.deadline = Some(deadline);
        self
    }

    /// How long a failed occurrence waits before it is tried again (by the database's clock,
    /// on any instance). 1 s by default.
    pub fn retry_delay(mut self, delay: Duration) -> Job {
        self.retry_delay = delay;
        self
    }

    /// The lease of a leased run ([`run_leased`](Self::run_leased)): kept alive every third of
    /// it while the body runs, so it bounds only how long a dead runner holds the job before
    /// another instance takes its occurrence over. 30 s by default.
    pub fn lease(mut self, lease: Duration) -> Job {
        self.lease = lease.max(Duration::from_millis(3));
        self
    }

    /// Replaces the database's clock with `clock` (for tests: a
    /// [`ManualClock`](crate::inbox::ManualClock), so a missed night needs no waiting).
    pub fn clock(mut self, clock: impl Clock) -> Job {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What this job (and its clones) did so far, in this process.
    pub fn counters(&self) -> JobCounters {
        self.counters.read()
    }

    /// Runs the job for ever: each due occurrence in a transaction with its body (see
    /// [`tick`](Self::tick)), sleeping until the next one by the database's clock. A
    /// failure (the body's error, the database down) is logged as a warning and the
    /// occurrence tried again after the retry delay. Drop the future to stop: an
    /// occurrence it was running rolls back, and another instance (or the next run) runs it;
    /// one dropped while its COMMIT was in flight may have committed (once, and is then not
    /// run again) without [`counters`](Self::counters) counting it. To stop between
    /// occurrences, loop on [`tick`](Self::tick) and check your shutdown signal between ticks.
    pub async fn run<DB, T, E, F>(&self, pool: &Pool<DB>, mut handler: F) -> Infallible
    where
        DB: Backend,
        T: Serialize + Send,
        E: fmt::Display + Send,
        F: for<'t> FnMut(&'t mut Transaction<'static, DB>, &'t Occurrence) -> BatchFuture<'t, T, E>
            + Send,
    {
        loop {
            let tick = self.tick(pool, &mut handler).await;
            self.pause(tick.map(|tick| tick.wait())).await;
        }
    }

    /// Runs what is due now, once: reads the job's row (making it on first use), skips the
    /// occurrences [`Missed`] and the deadline say to skip, and runs the one due, if any, with
    /// `handler` in the transaction that records it. [`Tick::wait`] says how long until there
    /// may be more to do.
    ///
    /// While another instance runs the occurrence, recording it waits for that instance's
    /// transaction (the job's row is locked until it commits), then finds it recorded:
    /// [`Outcome::Elsewhere`]. The session's lock timeout bounds the wait (PostgreSQL's
    /// `lock_timeout`, MySQL's `innodb_lock_wait_timeout`); a wait past it is `Elsewhere`
    /// too, not an error. Reading the job's row never waits. Bodies that run for minutes
    /// belong in [`run_leased`](Self::run_leased), whose claims never wait for a body.
    ///
    /// `Err(Error::Handler(e))` when the body failed: its transaction rolled back, and the
    /// occurrence is tried again after the retry delay.
    pub async fn tick<DB, T, E, F>(&self, pool: &Pool<DB>, handler: F) -> Result<Tick<T>, Error<E>>
    where
        DB: Backend,
        T: Serialize + Send,
        E: fmt::Display + Send,
        F: for<'t> FnOnce(
                &'t mut Transaction<'static, DB>,
                &'t Occurrence,
            ) -> BatchFuture<'t, T, E>
            + Send,
    {
        let (skipped, occurrence, cursor, until) = match self.recorded_ahead() {
            Some((occurrence, cursor, until)) => (0, occurrence, cursor, until),
            None => match self.decide(pool).await.map_err(Error::widen)? {
                Decided::Wait(tick) => return Ok(tick.widen()),
                Decided::Run {
                    skipped,
                    occurrence,
                    cursor,
                    ..
                } => (skipped, occurrence, cursor, i64::MAX),
            },
        };
        let plan = OccurrencePlan::<T> {
            job: self,
            occurrence: &occurrence,
            cursor,
            next: occurrence.at_millis.saturating_add(1),
            until,
            value: PhantomData,
        };
        let mut work = match begin(pool, &plan).await {
            Begun::Run(work) => work,
            Begun::Done(Ok(_)) => {
                self.forget();
                if until != i64::MAX {
                    // Recorded ahead of a read, and refused (not due yet, a later
                    // occurrence due, another instance first): read, and decide.
                    return Ok(Tick::new(0, Outcome::Elsewhere));
                }
                self.counters.add(&self.name, Event::Elsewhere, 1);
                return Ok(Tick::new(skipped, Outcome::Elsewhere));
            }
            Begun::Done(Err(e)) => {
                self.forget();
                return Err(Error::widen(e));
            }
        };
        let held = work.held();
        let result = held
            .run_unwound(handler(work.transaction(), &occurrence))
            .await;
        match work.finish_unwound(&plan, result).await {
            Ok(Ok(value)) => {
                self.counters.add(&self.name, Event::Ran, 1);
                let wait = self.ran(occurrence.at_millis);
                let mut tick = Tick::new(skipped, Outcome::Ran(occurrence, value));
                tick.after_run = wait;
                Ok(tick)
            }
            Ok(Err(NotRun::Elsewhere)) => Ok(Tick::new(skipped, Outcome::Elsewhere)),
            Err(e) => {
                self.forget();
                self.failed(pool, &occurrence, cursor, &e).await;
                Err(e)
            }
        }
    }

    /// The next occurrence, to record without reading the job's row first, if this process
    /// knows the row and its estimate of the database's clock says the occurrence is due;
    /// with the cursor to move from and the time before which the record may be made (the
    /// next occurrence, or the deadline), which the record's statement checks by the
    /// database's own clock.
    fn recorded_ahead(&self) -> Option<(Occurrence, i64, i64)> {
        let known = (*self.known.lock().unwrap_or_else(PoisonError::into_inner))?;
        let first = self.schedule.at_or_after(known.cursor)?;
        let now = self.local_now().saturating_add(known.offset);
        if first > now {
            return None;
        }
        let mut until = match self.missed {
            Missed::RunEach => i64::MAX,
            Missed::RunLatest | Missed::Skip => self
                .schedule
                .at_or_after(first.saturating_add(1))
                .unwrap_or(i64::MAX),
        };
        if let Some(deadline) = self.deadline_millis() {
            until = until.min(first.saturating_add(deadline).saturating_add(1));
        }
        self.counters.late(&self.name, now - first);
        Some((Occurrence::new(self, first, 1), known.cursor, until))
    }

    /// Notes that this process recorded the occurrence `at`: the job's row moved just past
    /// it. Returns how long until the next occurrence, by the estimate of the database's
    /// clock.
    fn ran(&self, at: i64) -> Duration {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(k) = known.as_mut() else {
            return Duration::ZERO;
        };
        k.cursor = at.saturating_add(1);
        let offset = k.offset;
        drop(known);
        let now = self.local_now().saturating_add(offset);
        match self.schedule.at_or_after(at.saturating_add(1)) {
            Some(next) => millis_to(next.saturating_sub(now)),
            None => Duration::ZERO,
        }
    }

    /// Forgets what this process knew of the row: the next tick reads it.
    fn forget(&self) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Remembers the row as read at `now` (the database's clock), its cursor at `cursor`.
    fn learn(&self, cursor: i64, now: i64) {
        let offset = now.saturating_sub(self.local_now());
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = Some(Known { cursor, offset });
    }

    /// This process's time (the given clock's, if one was), in milliseconds.
    fn local_now(&self) -> i64 {
        match &self.clock {
            Some(clock) => clock.now_millis(),
            None => crate::inbox::SystemClock.now_millis(),
        }
    }

    /// The deadline in milliseconds: the job's, or `Missed::Skip`'s minute.
    fn deadline_millis(&self) -> Option<i64> {
        match (self.deadline, self.missed) {
            (Some(deadline), _) => Some(deadline),
            (None, Missed::Skip) => Some(Duration::from_secs(60)),
            (None, _) => None,
        }
        .map(millis)
    }

    /// [`run`](Self::run), in the leased form: each due occurrence is claimed with the job's
    /// [lease](Self::lease), `work` runs outside any transaction while the lease is kept
    /// alive, and its result is recorded if the lease still holds (see
    /// [`tick_leased`](Self::tick_leased)).
    pub async fn run_leased<DB, T, E, F, Fut>(&self, pool: &Pool<DB>, mut work: F) -> Infallible
    where
        DB: Backend,
        T: Serialize,
        E: fmt::Display,
        F: FnMut(Occurrence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        loop {
            let tick = self.tick_leased(pool, &mut work).await;
            self.pause(tick.map(|tick| tick.wait())).await;
        }
    }

    /// [`tick`](Self::tick), in the leased form: claims the due occurrence with the job's
    /// lease (a new fencing token, [`Occurrence::fence`]), runs `work` while extending the
    /// lease every third of it, then records the result (the job moves past the occurrence)
    /// or the failure (tried again after the retry delay), both only if this run still holds
    /// the lease. An occurrence whose runner died is taken over once its lease ends.
    ///
    /// `Err(Error::LeaseLost { .. })` when the lease was lost while `work` ran (no beat got
    /// through for a whole lease, and another instance took the occurrence over): its
    /// result is refused and the other run's counts.
    pub async fn tick_leased<DB, T, E, F, Fut>(
        &self,
        pool: &Pool<DB>,
        work: F,
    ) -> Result<Tick<T>, Error<E>>
    where
        DB: Backend,
        T: Serialize,
        E: fmt::Display,
        F: FnOnce(Occurrence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (skipped, mut occurrence, cursor, row) =
            match self.decide(pool).await.map_err(Error::widen)? {
                Decided::Wait(tick) => return Ok(tick.widen()),
                Decided::Run {
                    skipped,
                    occurrence,
                    cursor,
                    row,
                } => (skipped, occurrence, cursor, row),
            };
        let claim = Step {
            job: self,
            op: Op::Claim {
                cursor,
                at: occurrence.at_millis,
            },
        };
        let Did::Claimed(Some(claimed)) = stages_only(pool, &claim).await.map_err(Error::widen)?
        else {
            self.counters.add(&self.name, Event::Elsewhere, 1);
            return Ok(Tick::new(skipped, Outcome::Elsewhere));
        };
        if row.running_at == Some(occurrence.at_millis) {
            // Its runner's lease ended without a completion: that runner died.
            self.counters.add(&self.name, Event::TakenOver, 1);
        }
        let fence = claimed.fence;
        occurrence.fence = Some(fence);
        occurrence.attempt = claimed.attempts;
        let result = self.kept_alive(pool, fence, work(occurrence.clone())).await;
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
        let op = match (&failure, &encoded) {
            (Some(error), _) => Op::FailLeased { fence, error },
            (None, Ok(json)) => Op::Complete {
                fence,
                at: occurrence.at_millis,
                next: occurrence.at_millis.saturating_add(1),
                result: json.as_deref().filter(|json| *json != "null"),
            },
            (None, Err(_)) => unreachable!("an encoding error is a failure"),
        };
        let recorded = stages_only(pool, &Step { job: self, op })
            .await
            .map_err(Error::widen)?;
        let lost = Error::LeaseLost {
            group: self.label.clone(),
            key: occurrence.key.clone(),
        };
        match (result, encoded, recorded) {
            (_, _, Did::Changed(false)) => {
                tracing::warn!(job = %self.name, occurrence = %occurrence.key, "idem: the job's lease was lost while its occurrence ran; its outcome is refused");
                Err(lost)
            }
            (Ok(value), Ok(_), _) => {
                self.counters.add(&self.name, Event::Ran, 1);
                Ok(Tick::new(skipped, Outcome::Ran(occurrence, value)))
            }
            (Ok(_), Err(refused), _) => {
                self.counters.add(&self.name, Event::Failed, 1);
                Err(refused)
            }
            (Err(e), _, _) => {
                self.counters.add(&self.name, Event::Failed, 1);
                Err(Error::Handler(e))
            }
        }
    }

    /// Runs `work` while extending the leased run's lease every third of it.
    async fn kept_alive<DB: Backend, F: Future>(
        &self,
        pool: &Pool<DB>,
        fence: i64,
        work: F,
    ) -> F::Output {
        let every = (self.lease / 3).max(Duration::from_millis(1));
        let beats = async {
            loop {
                tokio::time::sleep(every).await;
                let extend = Step {
                    job: self,
                    op: Op::Extend { fence },
                };
                match stages_only(pool, &extend).await {
                    Ok(Did::Changed(true)) => {}
                    Ok(_) => {
                        tracing::warn!(job = %self.name, "idem: the job's lease was lost while its occurrence ran");
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        tracing::warn!(job = %self.name, error = %e, "idem: the job's lease could not be extended; trying again at the next beat")
                    }
                }
            }
        };
        let work = std::pin::pin!(work);
        let beats = std::pin::pin!(beats);
        match futures_util::future::select(work, beats).await {
            futures_util::future::Either::Left((output, _)) => output,
            futures_util::future::Either::Right((never, _)) => match never {},
        }
    }

    /// Reads the job's row and decides: wait, or run an occurrence (after skipping what the
    /// policy skips).
    async fn decide<DB: Backend>(&self, pool: &Pool<DB>) -> Result<Decided, Error<Infallible>> {
        let read = Step {
            job: self,
            op: Op::Read,
        };
        let row = match stages_only(pool, &read).await? {
            Did::Read(Some(row)) => row,
            _ => {
                // First use: the row is made in a transaction of its own and read in
                // another (on MySQL's REPEATABLE READ, a read in the insert's transaction
                // after a read that found none would still find none).
                let ensure = Step {
                    job: self,
                    op: Op::Ensure { first: NEW },
                };
                stages_only(pool, &ensure).await?;
                match stages_only(pool, &read).await? {
                    Did::Read(Some(row)) => row,
                    _ => return Err(read.corrupt("missing")),
                }
            }
        };
        let now = row.now;
        if let Some(until) = row.lease_until.filter(|until| *until > now) {
            // A leased run holds the job, or a failed occurrence waits for its retry.
            self.counters.late(&self.name, 0);
            return Ok(Decided::Wait(Tick::new(
                0,
                Outcome::Held {
                    until_millis: until,
                    now_millis: now,
                },
            )));
        }
        let mut cursor = row.next_at;
        if cursor == NEW {
            // A new job starts with its first occurrence from now.
            let Some(first) = self.schedule.at_or_after(now) else {
                return Ok(Decided::Wait(Tick::new(0, Outcome::Finished)));
            };
            let skip = Step {
                job: self,
                op: Op::Skip {
                    from: NEW,
                    to: first,
                },
            };
            if !matches!(stages_only(pool, &skip).await?, Did::Changed(true)) {
                return Ok(Decided::Wait(Tick::new(0, Outcome::Elsewhere)));
            }
            cursor = first;
        }
        let Some(first) = self.schedule.at_or_after(cursor) else {
            return Ok(Decided::Wait(Tick::new(0, Outcome::Finished)));
        };
        self.learn(cursor, now);
        if first > now {
            self.counters.late(&self.name, 0);
            return Ok(Decided::Wait(Tick::new(
                0,
                Outcome::NotDue {
                    next_millis: first,
                    now_millis: now,
                },
            )));
        }
        self.counters.late(&self.name, now - first);
        let deadline = self.deadline_millis();
        let in_time = |at: i64| deadline.is_none_or(|d| at.saturating_add(d) >= now);
        let target = match self.missed {
            Missed::RunEach if in_time(first) => Some(first),
            Missed::RunEach => {
                deadline.and_then(|d| self.schedule.at_or_after(now.saturating_sub(d)))
            }
            Missed::RunLatest | Missed::Skip => self
                .schedule
                .latest_between(first, now)
                .filter(|latest| in_time(*latest))
                .or_else(|| self.schedule.at_or_after(now.saturating_add(1))),
        };
        let Some(target) = target else {
            return Ok(Decided::Wait(Tick::new(0, Outcome::Finished)));
        };
        let mut skipped = 0;
        if target > first {
            skipped = self.schedule.count_between(first, target, u64::MAX);
            let skip = Step {
                job: self,
                op: Op::Skip {
                    from: cursor,
                    to: target,
                },
            };
            if !matches!(stages_only(pool, &skip).await?, Did::Changed(true)) {
                self.counters.add(&self.name, Event::Elsewhere, 1);
                return Ok(Decided::Wait(Tick::new(0, Outcome::Elsewhere)));
            }
            self.counters.add(&self.name, Event::Skipped, skipped);
            tracing::info!(job = %self.name, skipped, "idem: missed occurrences skipped");
            cursor = target;
            self.learn(cursor, now);
        }
        if target > now {
            return Ok(Decided::Wait(Tick::new(
                skipped,
                Outcome::NotDue {
                    next_millis: target,
                    now_millis: now,
                },
            )));
        }
        let occurrence = Occurrence::new(self, target, row.attempts + 1);
        Ok(Decided::Run {
            skipped,
            occurrence,
            cursor,
            row,
        })
    }

    /// Records a failed attempt of a transactional occurrence, after its rollback.
    async fn failed<DB: Backend, E: fmt::Display>(
        &self,
        pool: &Pool<DB>,
        occurrence: &Occurrence,
        cursor: i64,
        error: &Error<E>,
    ) {
        self.counters.add(&self.name, Event::Failed, 1);
        let error = error.to_string();
        let fail = Step {
            job: self,
            op: Op::Fail {
                cursor,
                error: &error,
            },
        };
        if let Err(e) = stages_only(pool, &fail).await {
            tracing::warn!(job = %self.name, occurrence = %occurrence.key, error = %e, "idem: a failed occurrence could not be recorded; it is tried again at the next tick");
        }
    }

    /// Sleeps as a runner does after a tick: its wait, or the retry delay after a failure.
    async fn pause<E: fmt::Display>(&self, waited: Result<Duration, Error<E>>) {
        let wait = match waited {
            Ok(wait) => wait,
            Err(e) => {
                tracing::warn!(job = %self.name, error = %e, "idem: a scheduled occurrence failed; it is tried again after the retry delay");
                self.retry_delay
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait.min(MAX_SLEEP)).await;
        }
    }

    /// The time bound to a statement's `now`: NULL (the database's), unless a clock was
    /// given.
    pub(crate) fn at(&self) -> Param<'static> {
        match &self.clock {
            Some(clock) => Param::Int(clock.now_millis()),
            None => Param::Null,
        }
    }

    pub(crate) fn lease_millis(&self) -> i64 {
        millis(self.lease)
    }

    pub(crate) fn retry_millis(&self) -> i64 {
        millis(self.retry_delay)
    }
}

/// What a tick decided before running anything.
enum Decided {
    Wait(Tick<Infallible>),
    Run {
        skipped: u64,
        occurrence: Occurrence,
        cursor: i64,
        row: Row,
    },
}

impl<T> Tick<T> {
    fn new(skipped: u64, outcome: Outcome<T>) -> Tick<T> {
        Tick {
            skipped,
            outcome,
            after_run: Duration::ZERO,
        }
    }
}

impl Tick<Infallible> {
    /// The same tick, for any body's value (nothing ran).
    fn widen<T>(self) -> Tick<T> {
        let outcome = match self.outcome {
            Outcome::Ran(_, never) => match never {},
            Outcome::NotDue {
                next_millis,
                now_millis,
            } => Outcome::NotDue {
                next_millis,
                now_millis,
            },
            Outcome::Held {
                until_millis,
                now_millis,
            } => Outcome::Held {
                until_millis,
                now_millis,
            },
            Outcome::Elsewhere => Outcome::Elsewhere,
            Outcome::Finished => Outcome::Finished,
        };
        Tick::new(self.skipped, outcome)
    }
}

/// One occurrence of a job: the job and its scheduled instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    job: String,
    label: String,
    at_millis: i64,
    key: String,
    attempt: i64,
    fence: Option<i64>,
}

impl Occurrence {
    fn new(job: &Job, at_millis: i64, attempt: i64) -> Occurrence {
        Occurrence {
            job: job.name.clone(),
            label: job.label.clone(),
            at_millis,
            key: key_of(at_millis),
            attempt,
            fence: None,
        }
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The scheduled instant.
    pub fn at(&self) -> SystemTime {
        match u64::try_from(self.at_millis) {
            Ok(millis) => UNIX_EPOCH + Duration::from_millis(millis),
            Err(_) => UNIX_EPOCH,
        }
    }

    /// The scheduled instant, in milliseconds since the Unix epoch.
    pub fn at_millis(&self) -> i64 {
        self.at_millis
    }

    /// The scheduled instant in RFC 3339, UTC, with milliseconds
    /// (`2026-12-07T03:00:00.000Z`): a key for the occurrence's own rows, the same on every
    /// instance.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Which attempt this is (1 for the first).
    pub fn attempt(&self) -> i64 {
        self.attempt
    }

    /// The fencing token of a leased run ([`Job::tick_leased`]): higher than every earlier
    /// run's of this job. `None` in the transactional form.
    pub fn fence(&self) -> Option<i64> {
        self.fence
    }

    /// The occurrence's effect: the same on every attempt, instance and takeover. Pass
    /// `occurrence.effect_key().derive("charge")` to an outside API as its idempotency key.
    /// In the transactional form, the messages the body stages take their ids from it.
    pub fn effect_key(&self) -> EffectKey {
        EffectKey::of_message(&self.label, &self.key)
    }
}

/// A duration of `millis` milliseconds, none if negative.
fn millis_to(millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// The RFC 3339 text of an instant, UTC, with milliseconds.
fn key_of(at_millis: i64) -> String {
    match jiff::Timestamp::from_millisecond(at_millis) {
        Ok(at) => format!(
            "{}.{:03}Z",
            at.strftime("%Y-%m-%dT%H:%M:%S"),
            at_millis.rem_euclid(1000)
        ),
        Err(_) => at_millis.to_string(),
    }
}

/// What one tick did.
#[derive(Debug)]
#[non_exhaustive]
pub struct Tick<T> {
    /// Occurrences this tick skipped (missed, or past their deadline).
    pub skipped: u64,
    /// What else it did.
    pub outcome: Outcome<T>,
    /// After a run: how long until the next occurrence, by this process's estimate of the
    /// database's clock.
    after_run: Duration,
}

impl<T> Tick<T> {
    /// The occurrence this tick ran, and its body's value.
    pub fn ran(&self) -> Option<(&Occurrence, &T)> {
        match &self.outcome {
            Outcome::Ran(occurrence, value) => Some((occurrence, value)),
            _ => None,
        }
    }

    /// How long until there may be more to do: until the next occurrence or the end of the
    /// lease that holds the job (by the database's clock; after a run, by this process's
    /// estimate of it, which the next record checks), at once after a race lost, at most a
    /// minute (a job whose schedule has ended is read again each minute).
    pub fn wait(&self) -> Duration {
        if let Outcome::Ran(..) = self.outcome {
            return self.after_run.min(MAX_SLEEP);
        }
        let millis = match self.outcome {
            Outcome::NotDue {
                next_millis,
                now_millis,
            } => next_millis.saturating_sub(now_millis),
            Outcome::Held {
                until_millis,
                now_millis,
            } => until_millis.saturating_sub(now_millis),
            Outcome::Ran(..) | Outcome::Elsewhere => 0,
            Outcome::Finished => i64::MAX,
        };
        millis_to(millis).min(MAX_SLEEP)
    }
}

/// What a tick did besides skipping.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// This instance ran the occurrence and committed it, with the body's value.
    Ran(Occurrence, T),
    /// Nothing due: the next occurrence is at `next_millis` (the database's clock read
    /// `now_millis`).
    NotDue {
        /// The next occurrence, in milliseconds since the epoch.
        next_millis: i64,
        /// The database's time at the tick.
        now_millis: i64,
    },
    /// A leased run holds the job, or a failed occurrence waits for its retry, until
    /// `until_millis`.
    Held {
        /// When the hold ends, in milliseconds since the epoch.
        until_millis: i64,
        /// The database's time at the tick.
        now_millis: i64,
    },
    /// Nothing ran: another instance ran or skipped the occurrence first, or this process's
    /// record of the next occurrence, made without reading the job's row, was refused by the
    /// database's clock (a later occurrence was due too). Tick again: the next tick reads.
    Elsewhere,
    /// The schedule has no more occurrences.
    Finished,
}

/// A reading of a job's counters (shared by its clones), since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobCounters {
    /// Occurrences this process ran and committed.
    pub ran: u64,
    /// Occurrences this process skipped (missed, or past their deadline).
    pub skipped: u64,
    /// Occurrences whose runner died, taken over by this process.
    pub taken_over: u64,
    /// Attempts that failed here (each tried again after the retry delay).
    pub failed: u64,
    /// Occurrences another instance ran or skipped first.
    pub elsewhere: u64,
    /// How late the oldest due occurrence not yet run was at this process's last tick, in
    /// milliseconds (0: none was due).
    pub late_millis: i64,
}

#[derive(Debug, Default)]
struct Counters {
    ran: AtomicU64,
    skipped: AtomicU64,
    taken_over: AtomicU64,
    failed: AtomicU64,
    elsewhere: AtomicU64,
    late: AtomicI64,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Ran,
    Skipped,
    TakenOver,
    Failed,
    Elsewhere,
}

impl Counters {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn add(&self, job: &str, event: Event, n: u64) {
        let (cell, name) = match event {
            Event::Ran => (&self.ran, "ran"),
            Event::Skipped => (&self.skipped, "skipped"),
            Event::TakenOver => (&self.taken_over, "taken_over"),
            Event::Failed => (&self.failed, "failed"),
            Event::Elsewhere => (&self.elsewhere, "elsewhere"),
        };
        cell.fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        if n > 0 {
            metrics::counter!("idem_schedule_occurrences_total", "job" => job.to_owned(), "outcome" => name)
                .increment(n);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = name;
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn late(&self, job: &str, millis: i64) {
        self.late.store(millis.max(0), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::gauge!("idem_schedule_late_seconds", "job" => job.to_owned())
            .set(millis.max(0) as f64 / 1000.0);
    }

    fn read(&self) -> JobCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        JobCounters {
            ran: get(&self.ran),
            skipped: get(&self.skipped),
            taken_over: get(&self.taken_over),
            failed: get(&self.failed),
            elsewhere: get(&self.elsewhere),
            late_millis: self.late.load(Ordering::Relaxed),
        }
    }
}
