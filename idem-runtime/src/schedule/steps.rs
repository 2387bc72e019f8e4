//! The units of work on a job's row: the short ones of the scheduler's own bookkeeping
//! (read, skip, a failed attempt, a leased run's claim, extension and completion), and the
//! occurrence's stage, which records the occurrence in the transaction of its body.

use super::{Job, Occurrence};
use crate::backend::{Backend, Param, is_lock_timeout};
use crate::error::Error;
use crate::work::observe::Labels;
use crate::work::unit::{Entered, Entry, Kept, Plan, no_body};
use serde::Serialize;
use std::convert::Infallible;
use std::marker::PhantomData;

/// A job's row as read, with the database's time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) next_at: i64,
    pub(crate) fence: i64,
    pub(crate) running_at: Option<i64>,
    pub(crate) lease_until: Option<i64>,
    pub(crate) attempts: i64,
    pub(crate) now: i64,
}

/// One short unit of work on a job's row, ending in its stage.
pub(crate) struct Step<'a> {
    pub(crate) job: &'a Job,
    pub(crate) op: Op<'a>,
}

pub(crate) enum Op<'a> {
    /// Reads the row, if there is one. A plain read: it never waits for the lock an
    /// occurrence running elsewhere holds on the row.
    Read,
    /// Makes the row (first occurrence `first`) if missing. An insert that meets the row
    /// waits for that lock (PostgreSQL's ON CONFLICT and MySQL's ON DUPLICATE KEY alike):
    /// only on first use, after a read found none.
    Ensure { first: i64 },
    /// Moves the first occurrence not yet run from `from` to `to`.
    Skip { from: i64, to: i64 },
    /// A failed attempt of a transactional occurrence at cursor `cursor`.
    Fail { cursor: i64, error: &'a str },
    /// Claims the occurrence `at` (cursor `cursor`) for a leased run.
    Claim { cursor: i64, at: i64 },
    /// Extends a leased run's lease.
    Extend { fence: i64 },
    /// Completes a leased run: the cursor moves to `next`.
    Complete {
        fence: i64,
        at: i64,
        next: i64,
        result: Option<&'a str>,
    },
    /// A leased run failed.
    FailLeased { fence: i64, error: &'a str },
}

/// What a step did.
pub(crate) enum Did {
    Read(Option<Row>),
    /// The statement changed the row (`true`), or found it moved on (`false`).
    Changed(bool),
    /// A claim: the row after it, if it was this instance's.
    Claimed(Option<Row>),
}

impl<DB: Backend> Plan<DB> for Step<'_> {
    type Value = Infallible;
    type Reply = Did;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Did>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.leases();
        let job = Param::Text(&self.job.name);
        let now = self.job.at();
        let lease = Param::Int(self.job.lease_millis());
        let retry = Param::Int(self.job.retry_millis());
        let did = match self.op {
            Op::Read => Did::Read(self.fetch::<DB>(tx).await?),
            Op::Ensure { first } => {
                let params = [job, Param::Int(first), now];
                Did::Changed(DB::execute(tx, &sql.job_ensure, &params).await? == 1)
            }
            Op::Skip { from, to } => {
                let params = [job, Param::Int(from), Param::Int(to), now];
                Did::Changed(DB::execute(tx, &sql.job_skip, &params).await? == 1)
            }
            Op::Fail { cursor, error } => {
                let params = [job, Param::Int(cursor), Param::Text(error), retry, now];
                Did::Changed(DB::execute(tx, &sql.job_fail, &params).await? == 1)
            }
            Op::Claim { cursor, at } => {
                let params = [job, Param::Int(cursor), Param::Int(at), lease, now];
                if DB::execute(tx, &sql.job_claim, &params).await? == 1 {
                    Did::Claimed(Some(self.read::<DB>(tx).await?))
                } else {
                    Did::Claimed(None)
                }
            }
            Op::Extend { fence } => {
                DB::execute(tx, &sql.job_extend, &[job, Param::Int(fence), lease, now]).await?;
                // Judged by the row as it is now (MySQL counts a row whose values did not
                // change as none changed).
                let row = self.read::<DB>(tx).await?;
                Did::Changed(row.fence == fence && row.running_at.is_some())
            }
            Op::Complete {
                fence,
                at,
                next,
                result,
            } => {
                let params = [
                    job,
                    Param::Int(fence),
                    Param::Int(next),
                    Param::Int(at),
                    result.map_or(Param::Null, Param::Text),
                    now,
                ];
                Did::Changed(DB::execute(tx, &sql.job_complete, &params).await? == 1)
            }
            Op::FailLeased { fence, error } => {
                let params = [job, Param::Int(fence), Param::Text(error), retry, now];
                Did::Changed(DB::execute(tx, &sql.job_fail_leased, &params).await? == 1)
            }
        };
        Ok(Entered::Done {
            reply: did,
            commit: true,
        })
    }

    no_body!(Did);

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.job.label),
            ..Labels::default()
        }
    }

    fn outcome_name(reply: &Did) -> &'static str {
        match reply {
            Did::Read(_) => "read",
            Did::Changed(true) | Did::Claimed(Some(_)) => "changed",
            Did::Changed(false) | Did::Claimed(None) => "moved_on",
        }
    }
}

impl Step<'_> {
    /// The job's row, which must be there.
    async fn read<DB: Backend>(&self, tx: &mut DB::Connection) -> Result<Row, Error<Infallible>> {
        let row = self.fetch::<DB>(tx).await?;
        row.ok_or_else(|| self.corrupt("missing"))
    }

    pub(crate) fn corrupt(&self, problem: &str) -> Error<Infallible> {
        Error::CorruptRecord {
            group: self.job.label.clone(),
            key: String::new(),
            problem: format!("the job's row in idem_jobs is {problem}"),
        }
    }

    /// The job's row, if there is one.
    async fn fetch<DB: Backend>(
        &self,
        tx: &mut DB::Connection,
    ) -> Result<Option<Row>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.leases();
        let row = DB::fetch(
            tx,
            &sql.job_read,
            &[Param::Text(&self.job.name), self.job.at()],
        )
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let corrupt = || self.corrupt("with NULL columns");
        Ok(Some(Row {
            next_at: row.int("next_at").ok_or_else(corrupt)?,
            fence: row.int("fence").ok_or_else(corrupt)?,
            running_at: row.int("running_at"),
            lease_until: row.int("lease_until"),
            attempts: row.int("attempts").ok_or_else(corrupt)?,
            now: row.int("now").ok_or_else(corrupt)?,
        }))
    }
}

/// An occurrence, run in the transaction of its body: its stage records it (the job's
/// first occurrence not yet run moves past it) before the body, and stores the body's
/// result before the commit.
pub(crate) struct OccurrencePlan<'a, T> {
    pub(crate) job: &'a Job,
    pub(crate) occurrence: &'a Occurrence,
    /// The cursor the record moves on from.
    pub(crate) cursor: i64,
    /// Where the cursor moves to: just after the occurrence.
    pub(crate) next: i64,
    /// The record is made only while the database's now is before this (the next
    /// occurrence, or the deadline), for a record made without reading the row.
    pub(crate) until: i64,
    pub(crate) value: PhantomData<fn() -> T>,
}

/// What the occurrence's stage keeps until the commit: where the result goes.
pub(crate) struct Recorded<'a> {
    job: &'a str,
}

impl Kept for Recorded<'_> {
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        let sql = DB::dialect(conn)?.leases();
        DB::execute(
            conn,
            &sql.job_store,
            &[Param::Text(self.job), Param::Text(json)],
        )
        .await
        .map(drop)
    }
}

/// Why an occurrence did not run here.
pub(crate) enum NotRun {
    /// Another instance recorded it first, or moved the job on.
    Elsewhere,
}

impl<'a, DB: Backend, T: Serialize> Plan<DB> for OccurrencePlan<'a, T> {
    type Value = T;
    type Reply = Result<T, NotRun>;
    type Kept = Recorded<'a>;

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Self::Reply, Recorded<'a>>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.leases();
        let params = [
            Param::Text(&self.job.name),
            Param::Int(self.cursor),
            Param::Int(self.next),
            self.job.at(),
            Param::Int(self.occurrence.at_millis),
            Param::Int(self.until),
        ];
        match DB::execute(tx, &sql.job_occur, &params).await {
            Ok(1) => Ok(Entered::Run(Recorded {
                job: &self.job.name,
            })),
            // Recorded elsewhere, or the job moved on; or an occurrence running elsewhere
            // holds the row past the session's lock timeout (PostgreSQL's `lock_timeout`,
            // MySQL's `innodb_lock_wait_timeout`): not this instance's to run either way.
            Ok(_) => Ok(Entered::Done {
                reply: Err(NotRun::Elsewhere),
                commit: false,
            }),
            Err(e) if is_lock_timeout(&e) => Ok(Entered::Done {
                reply: Err(NotRun::Elsewhere),
                commit: false,
            }),
            Err(e) => Err(e.into()),
        }
    }

    fn encode(&self, value: &T) -> Result<String, Error<Infallible>> {
        serde_json::to_string(value).map_err(Error::Result)
    }

    fn applied(&self, value: T) -> Self::Reply {
        Ok(value)
    }

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.job.label),
            key: Some(&self.occurrence.key),
            ..Labels::default()
        }
    }

    fn outcome_name(reply: &Self::Reply) -> &'static str {
        match reply {
            Ok(_) => "ran",
            Err(NotRun::Elsewhere) => "elsewhere",
        }
    }
}
