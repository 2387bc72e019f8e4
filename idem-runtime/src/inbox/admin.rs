//! The inbox as the people on call see it: every group's records by status, the records
//! stuck, failed or parked, and the two repairs a person makes — ending a lease whose
//! worker is gone, and bringing a parked record back for its next delivery. Reads see no
//! result (results may hold personal data); each repair is a unit of work of its own and
//! writes who made it into the record's error, at the database's time.

use super::{Inbox, MessageKey};
use crate::backend::{Backend, Opened, Param, Record};
use crate::error::Error;
use crate::work::observe::Labels;
use crate::work::unit::{Entered, Entry, Plan, no_body, stages_only};
use sqlx::Pool;
use std::convert::Infallible;
use std::time::Duration;

/// One consumer group's records, by status ([`groups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecords {
    /// The consumer group.
    pub group: String,
    /// Records PROCESSING: a delivery holds them, or held them.
    pub processing: u64,
    /// Of those, the ones whose lease ended: their worker died or hangs, and the broker
    /// has not redelivered the message yet ([`Inbox::stuck`]).
    pub stuck: u64,
    /// Records done (SUCCESS): a duplicate of one is acknowledged with its first result.
    pub succeeded: u64,
    /// Records whose last attempt failed: the next delivery tries again.
    pub failed: u64,
    /// Records parked (DEAD) after their last allowed attempt: a delivery of one is
    /// acknowledged without running the handler, until [`Inbox::revive`].
    pub dead: u64,
    /// When a record of the group was last touched (milliseconds since the Unix epoch, by
    /// the database's clock).
    pub last_at_millis: Option<i64>,
}

/// Which records [`records`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordStatus {
    /// PROCESSING with a lease that ended by now: see [`GroupRecords::stuck`].
    Stuck,
    /// PROCESSING, their lease ended or not.
    Processing,
    /// FAILED, waiting for their next delivery.
    Failed,
    /// DEAD: parked after their last attempt.
    Dead,
}

impl RecordStatus {
    /// The status as the table stores it.
    fn stored(self) -> &'static str {
        match self {
            RecordStatus::Stuck | RecordStatus::Processing => "PROCESSING",
            RecordStatus::Failed => "FAILED",
            RecordStatus::Dead => "DEAD",
        }
    }
}

/// One inbox record, without its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRecord {
    /// Its consumer group.
    pub group: String,
    /// Its message key.
    pub key: String,
    /// Its status as stored: PROCESSING, SUCCESS, FAILED or DEAD.
    pub status: String,
    /// The attempts made.
    pub attempts: u32,
    /// The last attempt's error, or who last repaired it ([`Inbox::release`],
    /// [`Inbox::revive`]).
    pub error: Option<String>,
    /// When its lease ends (or ended), if it has one; the times below are milliseconds
    /// since the Unix epoch, by the database's clock.
    pub lease_until_millis: Option<i64>,
    /// When its message was first delivered.
    pub created_at_millis: i64,
    /// When it was last touched.
    pub updated_at_millis: i64,
}

/// Every consumer group in the inbox and its records by status, by group name. One scan of
/// the table: on an inbox of many millions of records it takes seconds, so call it when a
/// person asks, not on a timer (the gauge of [`Inbox::stuck`] is the one to alert on).
pub async fn groups<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<GroupRecords>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = &DB::dialect(conn)?.inbox().groups;
    let rows = DB::fetch_all(conn, sql, &[Param::Null]).await?;
    opened.end(true).await?;
    let count = |row: &Record, column: &str| row.int(column).map_or(0, |n| n.max(0) as u64);
    Ok(rows
        .into_iter()
        .map(|mut row| GroupRecords {
            processing: count(&row, "processing"),
            stuck: count(&row, "stuck"),
            succeeded: count(&row, "succeeded"),
            failed: count(&row, "failed"),
            dead: count(&row, "dead"),
            last_at_millis: row.int("last_at"),
            group: row.take_text("consumer_group").unwrap_or_default(),
        })
        .collect())
}

/// What one consumer group's records show of a recent window ([`activity`]): the signals
/// the tables hold. (Duplicates answered, keys reused with another body, conflicts and the
/// fast path's hits leave no row: they are counted in memory, by the metrics.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupActivity {
    /// The consumer group.
    pub group: String,
    /// Records touched in the window: delivered, attempted, finished or repaired.
    pub touched: u64,
    /// Of those, first delivered in the window.
    pub first_delivered: u64,
    /// Done (SUCCESS).
    pub succeeded: u64,
    /// Done after more than one attempt: a retry that succeeded.
    pub succeeded_after_retry: u64,
    /// Given more than one attempt (a failure or a lease taken over), done or not.
    pub retried: u64,
    /// Failed, waiting for their next delivery.
    pub failed: u64,
    /// Parked (DEAD) after their last attempt.
    pub dead: u64,
}

impl GroupActivity {
    /// The share of retried records that are done: `None` when none was retried.
    pub fn retry_success_rate(&self) -> Option<f64> {
        (self.retried > 0).then(|| self.succeeded_after_retry as f64 / self.retried as f64)
    }
}

/// What each consumer group's records show of the last `window`, by the database's clock:
/// one range read of the index on `updated_at` (the one retention uses). A record shows its
/// latest state: one retried and done within the window counts as done after a retry.
pub async fn activity<DB: Backend>(
    pool: &Pool<DB>,
    window: Duration,
) -> Result<Vec<GroupActivity>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = &DB::dialect(conn)?.inbox().activity;
    let params = [Param::Null, Param::Int(super::millis(window))];
    let rows = DB::fetch_all(conn, sql, &params).await?;
    opened.end(true).await?;
    let count = |row: &Record, column: &str| row.int(column).map_or(0, |n| n.max(0) as u64);
    Ok(rows
        .into_iter()
        .map(|mut row| GroupActivity {
            touched: count(&row, "touched"),
            first_delivered: count(&row, "first_delivered"),
            succeeded: count(&row, "succeeded"),
            succeeded_after_retry: count(&row, "succeeded_after_retry"),
            retried: count(&row, "retried"),
            failed: count(&row, "failed"),
            dead: count(&row, "dead"),
            group: row.take_text("consumer_group").unwrap_or_default(),
        })
        .collect())
}

/// How many of a group's records were last touched within one bucket of time, by their
/// status now ([`activity_series`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivityBucket {
    /// PROCESSING: held by a delivery, or stuck.
    pub processing: u64,
    /// Done (SUCCESS).
    pub succeeded: u64,
    /// Failed, waiting for their next delivery.
    pub failed: u64,
    /// Parked (DEAD) after their last attempt.
    pub dead: u64,
}

impl ActivityBucket {
    /// Every record the bucket counts.
    pub fn total(&self) -> u64 {
        self.processing + self.succeeded + self.failed + self.dead
    }
}

/// One consumer group's records over a recent window, bucket by bucket
/// ([`activity_series`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSeries {
    /// The consumer group.
    pub group: String,
    /// The length of each bucket.
    pub bucket: Duration,
    /// The buckets, the oldest first; the last one ends now, by the database's clock.
    pub buckets: Vec<ActivityBucket>,
}

/// The most buckets [`activity_series`] returns per group.
pub const MAX_BUCKETS: u32 = 10_000;

/// Each consumer group's records last touched in the `buckets` × `bucket` before now (by
/// the database's clock), counted by status per bucket, the oldest bucket first: what the
/// console's charts draw. Groups with no record in the window are left out; every group
/// returned has all its buckets, empty ones as zeros.
///
/// One range read of the index on `updated_at`, like [`activity`]. The table keeps each
/// record's latest state only, so a record shows once, in the bucket of its last touch,
/// with the status it has now; the metrics keep the real history. `bucket` is taken in
/// whole milliseconds, at least 1 and at most about 14,000 years (so that no arithmetic
/// in the statement overflows), and `buckets` between 1 and [`MAX_BUCKETS`].
pub async fn activity_series<DB: Backend>(
    pool: &Pool<DB>,
    bucket: Duration,
    buckets: u32,
) -> Result<Vec<GroupSeries>, sqlx::Error> {
    // The window at most half of i64's range: the statement subtracts it from now and
    // then subtracts that from each record's time.
    const WIDEST: i64 = i64::MAX / (2 * MAX_BUCKETS as i64);
    let width = super::millis(bucket).clamp(1, WIDEST);
    let buckets = buckets.clamp(1, MAX_BUCKETS);
    let window = width * i64::from(buckets);
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = &DB::dialect(conn)?.inbox().activity_series;
    let params = [Param::Null, Param::Int(window), Param::Int(width)];
    let rows = DB::fetch_all(conn, sql, &params).await?;
    opened.end(true).await?;
    let count = |row: &Record, column: &str| row.int(column).map_or(0, |n| n.max(0) as u64);
    let mut series: Vec<GroupSeries> = Vec::new();
    for mut row in rows {
        let group = row.take_text("consumer_group").unwrap_or_default();
        if series.last().is_none_or(|last| last.group != group) {
            series.push(GroupSeries {
                group,
                bucket: Duration::from_millis(width as u64),
                buckets: vec![ActivityBucket::default(); buckets as usize],
            });
        }
        let last = series.last_mut().expect("pushed above");
        // A record touched exactly now is the bucket after the last: it belongs to the last.
        let at = row
            .int("bucket")
            .unwrap_or(0)
            .clamp(0, i64::from(buckets) - 1) as usize;
        let into = &mut last.buckets[at];
        into.processing += count(&row, "processing");
        into.succeeded += count(&row, "succeeded");
        into.failed += count(&row, "failed");
        into.dead += count(&row, "dead");
    }
    Ok(series)
}

/// The records of `status` in `group` (`None`: every group), least recently touched first,
/// at most `limit`, without their results. Reads the table without an index on the status:
/// name the group where you can (its records are together in the key).
pub async fn records<DB: Backend>(
    pool: &Pool<DB>,
    group: Option<&str>,
    status: RecordStatus,
    limit: u32,
) -> Result<Vec<InboxRecord>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = &DB::dialect(conn)?.inbox().records;
    let params = [
        Param::Text(group.unwrap_or("")),
        Param::Text(status.stored()),
        Param::Int(i64::from(status == RecordStatus::Stuck)),
        Param::Null,
        Param::Int(i64::from(limit)),
    ];
    let rows = DB::fetch_all(conn, sql, &params).await?;
    opened.end(true).await?;
    Ok(rows.into_iter().map(InboxRecord::from_row).collect())
}

impl InboxRecord {
    fn from_row(mut row: Record) -> InboxRecord {
        InboxRecord {
            group: row.take_text("consumer_group").unwrap_or_default(),
            key: row.take_text("message_key").unwrap_or_default(),
            status: row.take_text("status").unwrap_or_default(),
            attempts: row
                .int("attempts")
                .map_or(0, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX)),
            error: row.take_text("error"),
            lease_until_millis: row.int("lease_until"),
            created_at_millis: row.int("created_at").unwrap_or(0),
            updated_at_millis: row.int("updated_at").unwrap_or(0),
        }
    }
}

impl Inbox {
    /// The record of `key` in this inbox's group, without its result; `None` if the key
    /// was never delivered (or its record was purged).
    pub async fn record<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
    ) -> Result<Option<InboxRecord>, sqlx::Error> {
        let mut opened = Opened::read(pool).await?;
        let conn = opened.connection();
        let sql = &DB::dialect(conn)?.inbox().record;
        let params = [Param::Text(&self.group), Param::Text(key.as_str())];
        let row = DB::fetch(conn, sql, &params).await?;
        opened.end(true).await?;
        Ok(row.map(InboxRecord::from_row))
    }

    /// Ends the lease of the PROCESSING record of `key` now, so the next delivery of its
    /// message takes it over at once instead of waiting for the lease to run out: for a
    /// worker known dead under a long lease. `by` (a person, a tool) is written into the
    /// record's error: `lease released by <by>`. `true` if the record was PROCESSING.
    ///
    /// A worker that was in fact alive keeps going: it finishes as any attempt whose lease
    /// ran out does — its result stands unless another delivery took the record over first,
    /// and then the other one's does (the attempt number fences it).
    pub async fn release<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        by: &str,
    ) -> Result<bool, Error<Infallible>> {
        self.repair(pool, key, format!("lease released by {by}"), |sql| {
            &sql.release
        })
        .await
    }

    /// Brings the parked (DEAD) record of `key` back as FAILED with no attempts: the next
    /// delivery of its message runs the handler again, with every attempt allowed. The
    /// inbox keeps no payload, so the message must come again from the broker (its
    /// dead-letter queue, a replay). `by` is written into the record's error:
    /// `revived by <by>`. `true` if the record was DEAD.
    pub async fn revive<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        by: &str,
    ) -> Result<bool, Error<Infallible>> {
        self.repair(pool, key, format!("revived by {by}"), |sql| &sql.revive)
            .await
    }

    /// Runs one repair of the record of `key` as a unit of work of its own, and logs it.
    async fn repair<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        key: &MessageKey,
        note: String,
        statement: fn(&'static idem_sql::inbox::InboxSql) -> &'static String,
    ) -> Result<bool, Error<Infallible>> {
        let plan = Repair {
            inbox: self,
            key,
            note,
            statement,
        };
        let changed = stages_only(pool, &plan).await?;
        if changed {
            tracing::info!(group = %self.group, key = %key.as_str(), note = %plan.note, "idem inbox record repaired");
        }
        Ok(changed)
    }

    /// How many records [`purge`](Self::purge) with `retention` would delete now (a dry
    /// run), by the database's clock.
    pub async fn purgeable<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        retention: Duration,
    ) -> Result<u64, sqlx::Error> {
        let mut opened = Opened::read(pool).await?;
        let conn = opened.connection();
        let sql = &DB::dialect(conn)?.inbox().purgeable;
        let params = [
            Param::Text(&self.group),
            self.at(),
            Param::Int(super::millis(retention)),
        ];
        let row = DB::fetch(conn, sql, &params).await?;
        opened.end(true).await?;
        Ok(row.and_then(|r| r.int("n")).map_or(0, |n| n.max(0) as u64))
    }
}

/// One repair of one record: a unit of work of its own (its span, the conflict retry).
struct Repair<'a> {
    inbox: &'a Inbox,
    key: &'a MessageKey,
    /// What the record's error says afterwards: who repaired it.
    note: String,
    statement: fn(&'static idem_sql::inbox::InboxSql) -> &'static String,
}

impl<DB: Backend> Plan<DB> for Repair<'_> {
    type Value = Infallible;
    type Reply = bool;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<bool>, Error<Infallible>> {
        let statement = (self.statement)(DB::dialect(tx)?.inbox());
        let params = [
            Param::Text(&self.inbox.group),
            Param::Text(self.key.as_str()),
            Param::Text(&self.note),
            self.inbox.at(),
        ];
        let changed = DB::execute(tx, statement, &params).await?;
        Ok(Entered::Done {
            reply: changed > 0,
            commit: true,
        })
    }

    no_body!(bool);

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            ..Labels::default()
        }
    }

    fn outcome_name(changed: &bool) -> &'static str {
        if *changed { "repaired" } else { "unchanged" }
    }
}
