//! The inbox's table partitioned by day, for dedup tables at a hundred million records
//! (PostgreSQL, MariaDB/MySQL): retention drops a whole day at once instead of deleting its
//! records, and a lookup still probes one index.
//!
//! A message whose key is dated ([`MessageKey::dated`](super::MessageKey::dated): the day
//! of the message's own time before its key) is recorded in the partition of its day;
//! [`partition`] turns `idem_inbox` into the partitioned table (once; existing records are
//! moved into it), and [`maintain`] keeps the window of days (creates the days ahead, drops
//! the days past `keep_days`), by the database's clock. Keys without a day (the HTTP
//! layer's, undated message keys) live in two partitions of their own and are purged as
//! before ([`Inbox::purge`](super::Inbox::purge)). The layout, and why the primary key
//! still makes a second record of a message impossible, is `idem_sql::partition`'s.
//!
//! A delivery of a dated message older than the window (its day dropped) is recorded in
//! the past partition, which the next [`maintain`] empties (MariaDB/MySQL: in the oldest
//! day kept, which goes with its day): it is processed again, as a delivery after
//! [`Inbox::purge`](super::Inbox::purge) removed its record would be. Keep
//! the window longer than the longest a broker may redeliver, as for the purge's retention.

use crate::backend::{Backend, Dialect, begin_write};
use idem_sql::partition::{self as sql, AFTER_DATED, Bound, DATED};
use sqlx::Pool;
use std::collections::BTreeSet;

const UNDATED_LOW: &str = "idem_inbox_undated_low";
const UNDATED_HIGH: &str = "idem_inbox_undated_high";
const PAST: &str = "idem_inbox_dated_past";
const FUTURE: &str = "idem_inbox_dated_future";
/// Every dated key, before the first [`maintain`] splits it into days.
const REST: &str = "idem_inbox_dated_rest";

/// What [`maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Maintained {
    /// The day partitions created (`idem_inbox_dYYYYMMDD`).
    pub created: Vec<String>,
    /// The day partitions dropped, with their records (their failed and dead ones copied
    /// into `idem_inbox_failures` first).
    pub dropped: Vec<String>,
}

/// Makes `idem_inbox` a table partitioned by day, once (nothing to do, it does nothing).
/// Run it after [`migrate`](crate::migrate), then [`maintain`] (at start-up and daily).
///
/// - PostgreSQL: creates the partitioned table, or moves an existing one's records into it,
///   in one transaction;
/// - MariaDB/MySQL: partitions the table in place (`ALTER TABLE … PARTITION BY RANGE
///   COLUMNS (message_key)`), waiting at most 1 s for its metadata lock.
///
/// Either rewrites an existing table's records while holding it: do it in a quiet hour.
/// Refused on SQLite, with an error that says so.
pub async fn partition<DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    if partitioned_dialect::<DB>(pool)? == Dialect::MySql {
        return mysql::partition(pool).await;
    }
    let (mut tx, _writer) = begin_write(pool).await?;
    let exists = DB::fetch(
        &mut tx,
        "SELECT CAST(CAST(to_regclass('idem_inbox') IS NOT NULL AS INTEGER) AS BIGINT) AS found",
        &[],
    )
    .await?
    .and_then(|row| row.int("found"))
        == Some(1);
    let partitioned = exists
        && DB::fetch(&mut tx, sql::POSTGRES_IS_PARTITIONED, &[])
            .await?
            .and_then(|row| row.int("partitioned"))
            == Some(1);
    if partitioned {
        return tx.commit().await;
    }
    if exists {
        DB::execute_script(
            &mut tx,
            "ALTER INDEX IF EXISTS idem_inbox_pkey RENAME TO idem_inbox_unpartitioned_pkey; \
             ALTER INDEX IF EXISTS idem_inbox_updated_at RENAME TO idem_inbox_unpartitioned_updated_at; \
             ALTER TABLE idem_inbox RENAME TO idem_inbox_unpartitioned",
        )
        .await?;
    }
    let mut ddl = vec![
        sql::POSTGRES_TABLE.to_owned(),
        sql::postgres_partition(UNDATED_LOW, &Bound::Min, &Bound::Key(DATED)),
        sql::postgres_partition(REST, &Bound::Key(DATED), &Bound::Key(AFTER_DATED)),
        sql::postgres_partition(UNDATED_HIGH, &Bound::Key(AFTER_DATED), &Bound::Max),
        sql::POSTGRES_UPDATED_AT.to_owned(),
        sql::POSTGRES_FAILURES.to_owned(),
    ];
    if exists {
        ddl.push(sql::postgres_reinsert("idem_inbox_unpartitioned"));
        ddl.push(sql::postgres_drop("idem_inbox_unpartitioned"));
    }
    for statement in &ddl {
        DB::execute_script(&mut tx, statement).await?;
    }
    tx.commit().await
}

/// Keeps the window of days of a partitioned `idem_inbox` ([`partition`]), by the
/// database's clock (PostgreSQL first; MariaDB/MySQL below): a partition for every day from `keep_days` days ago to `ahead_days`
/// days ahead (UTC), the days before dropped with their records (failed and dead ones
/// copied into `idem_inbox_failures` first). One transaction: it first copies the failures
/// of the days to drop as they are at the drop (each of those old partitions' writers held
/// off until its commit, so a record turning DEAD meanwhile is copied DEAD; deliveries to
/// every other day go on), then holds the inbox's table for as long as it runs (creating
/// and dropping tables, and moving the few records a catch-all partition holds), waits at
/// most 1 s for each lock (deliveries queue behind a transaction waiting for the table), and
/// otherwise gives up with the database's lock-timeout error, to be run again later.
/// Nothing to do, it changes nothing.
///
/// On MariaDB/MySQL, where DDL is not transactional, each day past is first swapped out of
/// the inbox at once (`EXCHANGE PARTITION` with a plain table shaped like it) and its failures
/// copied from there, where nobody writes; then the days past are dropped and the days ahead
/// made with one `ALTER TABLE` each (splitting the partition of days not made yet), each
/// waiting at most 1 s for the table's metadata lock. Its ranges are contiguous: a message older than the window lands in the oldest
/// day kept, and goes with it.
///
/// Run it at start-up and daily (with `ahead_days` of at least 1, a missed day changes
/// nothing). A record lives from `keep_days` to `keep_days + 1` days.
pub async fn maintain<DB: Backend>(
    pool: &Pool<DB>,
    keep_days: u32,
    ahead_days: u32,
) -> Result<Maintained, sqlx::Error> {
    if partitioned_dialect::<DB>(pool)? == Dialect::MySql {
        return mysql::maintain(pool, keep_days, ahead_days).await;
    }
    // One transaction. First, before it holds the inbox's table, the failures of the days
    // to drop are copied as they are at the drop, each of those partitions' writers held
    // off until the commit (a record turning DEAD meanwhile is copied as DEAD), while
    // deliveries to every other day go on. Then the partitions, holding the table: short.
    let (mut tx, _writer) = begin_write(pool).await?;
    // While it waits for the table, deliveries queue behind it: it waits little.
    DB::execute_script(&mut tx, "SET LOCAL lock_timeout = '1s'").await?;
    let plan = Plan::read::<DB>(&mut tx, keep_days, ahead_days).await?;
    if plan.nothing_to_do() {
        tx.commit().await?;
        return Ok(Maintained::default());
    }
    let Plan {
        first,
        last,
        days,
        catch_alls,
        to_drop,
        to_create,
    } = plan;
    for day in &to_drop {
        let name = sql::day_partition(&day_of(*day));
        DB::execute_script(&mut tx, &sql::postgres_keep_failures_at_drop(&name)).await?;
    }
    // The catch-alls' bounds follow the days: detached, remade around the new days, and
    // their records routed again.
    for catch_all in &catch_alls {
        DB::execute_script(&mut tx, &sql::postgres_detach(catch_all)).await?;
        let old = format!("{catch_all}_old");
        DB::execute_script(&mut tx, &sql::postgres_rename(catch_all, &old)).await?;
    }
    let mut done = Maintained::default();
    for day in &to_drop {
        let name = sql::day_partition(&day_of(*day));
        DB::execute_script(&mut tx, &sql::postgres_drop(&name)).await?;
        done.dropped.push(name);
    }
    for day in &to_create {
        let date = day_of(*day);
        let (from, to) = (sql::day_prefix(&date), sql::day_prefix(&day_of(day + 1)));
        let name = sql::day_partition(&date);
        let create = sql::postgres_partition(&name, &Bound::Key(&from), &Bound::Key(&to));
        DB::execute_script(&mut tx, &create).await?;
        done.created.push(name);
    }
    let newest = days.iter().copied().chain(to_create).max().unwrap_or(last);
    let (past_to, future_from) = (
        sql::day_prefix(&day_of(first)),
        sql::day_prefix(&day_of(newest + 1)),
    );
    for (name, from, to) in [
        (PAST, Bound::Key(DATED), Bound::Key(&past_to)),
        (FUTURE, Bound::Key(&future_from), Bound::Key(AFTER_DATED)),
    ] {
        DB::execute_script(&mut tx, &sql::postgres_partition(name, &from, &to)).await?;
    }
    for catch_all in &catch_alls {
        let old = format!("{catch_all}_old");
        if *catch_all == PAST {
            // Messages older than the window: dropped with it.
            DB::execute_script(&mut tx, &sql::postgres_keep_failures(&old)).await?;
        } else {
            DB::execute_script(&mut tx, &sql::postgres_reinsert(&old)).await?;
        }
        DB::execute_script(&mut tx, &sql::postgres_drop(&old)).await?;
    }
    tx.commit().await?;
    Ok(done)
}

/// The partitions of a partitioned inbox, by the database's day ([`status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitions {
    /// The database's day (UTC), `YYYY-MM-DD`.
    pub today: String,
    /// The days that have a partition, oldest first, `YYYY-MM-DD`.
    pub days: Vec<String>,
    /// The other partitions: keys without a day, dated keys outside the days.
    pub others: Vec<String>,
    today_number: i64,
    day_numbers: BTreeSet<i64>,
}

impl Partitions {
    /// Whether `idem_inbox` is partitioned ([`partition`] ran).
    pub fn is_partitioned(&self) -> bool {
        !self.days.is_empty() || !self.others.is_empty()
    }

    /// What [`maintain`] with `keep_days` and `ahead_days` would do now, as its report
    /// says it: a dry run. The day partitions past the window go, the days missing from it
    /// are made.
    pub fn would_maintain(&self, keep_days: u32, ahead_days: u32) -> Maintained {
        let first = self.today_number - i64::from(keep_days);
        let last = self.today_number + i64::from(ahead_days);
        Maintained {
            created: (first..=last)
                .filter(|d| !self.day_numbers.contains(d))
                .map(|d| sql::day_partition(&day_of(d)))
                .collect(),
            dropped: self
                .day_numbers
                .range(..first)
                .map(|d| sql::day_partition(&day_of(*d)))
                .collect(),
        }
    }
}

/// The partitions `idem_inbox` has, and the database's day: to see the window of days
/// before [`maintain`] (and what it would do, [`Partitions::would_maintain`]). Refused on
/// SQLite, as [`partition`] is.
pub async fn status<DB: Backend>(pool: &Pool<DB>) -> Result<Partitions, sqlx::Error> {
    let (today, names) = match partitioned_dialect::<DB>(pool)? {
        Dialect::MySql => (sql::MYSQL_TODAY, sql::MYSQL_PARTITIONS),
        _ => (sql::POSTGRES_TODAY, sql::POSTGRES_PARTITIONS),
    };
    let mut conn = pool.acquire().await?;
    let today = DB::fetch(&mut conn, today, &[])
        .await?
        .and_then(|row| row.int("today"))
        .ok_or_else(|| sqlx::Error::Protocol("idem: the database gave no date".into()))?;
    let names: Vec<String> = DB::fetch_all(&mut conn, names, &[])
        .await?
        .into_iter()
        .filter_map(|mut row| row.take_text("name"))
        .collect();
    let day_numbers: BTreeSet<i64> = names.iter().filter_map(|n| day_named(n)).collect();
    Ok(Partitions {
        today: day_of(today),
        days: day_numbers.iter().map(|d| day_of(*d)).collect(),
        others: names
            .into_iter()
            .filter(|n| day_named(n).is_none())
            .collect(),
        today_number: today,
        day_numbers,
    })
}

/// What [`maintain`] finds to do, read in a transaction.
struct Plan {
    /// The first day kept.
    first: i64,
    /// The last day made ahead.
    last: i64,
    /// The day partitions there are.
    days: BTreeSet<i64>,
    /// The catch-all partitions of dated keys there are.
    catch_alls: Vec<&'static str>,
    /// The days to drop, before `first`.
    to_drop: Vec<i64>,
    /// The days to create.
    to_create: Vec<i64>,
}

impl Plan {
    async fn read<DB: Backend>(
        tx: &mut DB::Connection,
        keep_days: u32,
        ahead_days: u32,
    ) -> Result<Plan, sqlx::Error> {
        let today = DB::fetch(tx, sql::POSTGRES_TODAY, &[])
            .await?
            .and_then(|row| row.int("today"))
            .ok_or_else(|| sqlx::Error::Protocol("idem: the database gave no date".into()))?;
        let first = today - i64::from(keep_days);
        let last = today + i64::from(ahead_days);
        let names: Vec<String> = DB::fetch_all(tx, sql::POSTGRES_PARTITIONS, &[])
            .await?
            .into_iter()
            .filter_map(|mut row| row.take_text("name"))
            .collect();
        let days: BTreeSet<i64> = names.iter().filter_map(|n| day_named(n)).collect();
        let catch_alls = [PAST, FUTURE, REST]
            .into_iter()
            .filter(|c| names.iter().any(|n| n == c))
            .collect();
        let to_drop = days.range(..first).copied().collect();
        let to_create = (first..=last).filter(|d| !days.contains(d)).collect();
        Ok(Plan {
            first,
            last,
            days,
            catch_alls,
            to_drop,
            to_create,
        })
    }

    fn nothing_to_do(&self) -> bool {
        self.to_drop.is_empty() && self.to_create.is_empty() && self.catch_alls == [PAST, FUTURE]
    }
}

/// The pool's dialect, if it partitions the inbox (PostgreSQL, MariaDB/MySQL).
fn partitioned_dialect<DB: Backend>(pool: &Pool<DB>) -> Result<Dialect, sqlx::Error> {
    match DB::pool_dialect(pool)? {
        Dialect::Sqlite => Err(sqlx::Error::Configuration(
            "idem: an inbox partitioned by day is for PostgreSQL and MariaDB/MySQL; on SQLite \
             purge the inbox (`Inbox::purge`) instead"
                .into(),
        )),
        dialect => Ok(dialect),
    }
}

/// MariaDB/MySQL, where DDL is not transactional: each statement stands on its own, and
/// waits at most 1 s for the table's metadata lock.
mod mysql {
    use super::{Maintained, day_named, day_of};
    use crate::backend::Backend;
    use idem_sql::partition as sql;
    use sqlx::Pool;

    pub(super) async fn partition<DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
        let mut conn = pool.acquire().await?;
        if !DB::fetch_all(&mut conn, sql::MYSQL_PARTITIONS, &[])
            .await?
            .is_empty()
        {
            return Ok(());
        }
        DB::execute_script(&mut conn, sql::MYSQL_FAILURES).await?;
        bounded::<DB>(&mut conn, &[sql::MYSQL_PARTITION_BY.to_owned()]).await
    }

    pub(super) async fn maintain<DB: Backend>(
        pool: &Pool<DB>,
        keep_days: u32,
        ahead_days: u32,
    ) -> Result<Maintained, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let today = DB::fetch(&mut conn, sql::MYSQL_TODAY, &[])
            .await?
            .and_then(|row| row.int("today"))
            .ok_or_else(|| sqlx::Error::Protocol("idem: the database gave no date".into()))?;
        let names: Vec<String> = DB::fetch_all(&mut conn, sql::MYSQL_PARTITIONS, &[])
            .await?
            .into_iter()
            .filter_map(|mut row| row.take_text("name"))
            .collect();
        if names.is_empty() {
            return Err(sqlx::Error::Configuration(
                "idem: idem_inbox is not partitioned; run idem::inbox::partitions::partition first"
                    .into(),
            ));
        }
        let days: Vec<i64> = names.iter().filter_map(|n| day_named(n)).collect();
        let first = today - i64::from(keep_days);
        let last = today + i64::from(ahead_days);
        // The days past the window: their failures copied, then the partitions dropped (the
        // next day's partition takes their range: a message older than the window lands
        // in the oldest day kept, and goes with it).
        let mut done = Maintained {
            dropped: days
                .iter()
                .filter(|day| **day < first)
                .map(|day| sql::day_partition(&day_of(*day)))
                .collect(),
            ..Maintained::default()
        };
        // A maintenance that stopped between an exchange and its copy left that day's records
        // in `idem_inbox_dropping` alone: their failures are copied before it is made again.
        let left = DB::fetch(&mut conn, sql::MYSQL_DROPPING_LEFT, &[])
            .await?
            .and_then(|row| row.int("left"))
            .unwrap_or(0);
        if left > 0 {
            DB::execute_script(&mut conn, sql::MYSQL_KEEP_DROPPED_FAILURES).await?;
            DB::execute_script(&mut conn, sql::MYSQL_DROPPING_DROP).await?;
        }
        for name in &done.dropped {
            // The day's records swapped out of the inbox at once, then their failures copied
            // as they were at that moment (DDL is not transactional here: a copy before the
            // drop would miss a record turning DEAD in between).
            for make in sql::MYSQL_DROPPING_MAKE {
                DB::execute_script(&mut conn, make).await?;
            }
            bounded::<DB>(&mut conn, &[sql::mysql_exchange(name)]).await?;
            DB::execute_script(&mut conn, sql::MYSQL_KEEP_DROPPED_FAILURES).await?;
            DB::execute_script(&mut conn, sql::MYSQL_DROPPING_DROP).await?;
        }
        let mut ddl = Vec::new();
        if !done.dropped.is_empty() {
            ddl.push(sql::mysql_drop(&done.dropped));
        }
        // The days ahead, split from the partition of days not made yet.
        let newest = days.iter().copied().max().unwrap_or(first - 1);
        let made: Vec<(String, String)> = (first.max(newest + 1)..=last)
            .map(|day| {
                let name = sql::day_partition(&day_of(day));
                (name, sql::day_prefix(&day_of(day + 1)))
            })
            .collect();
        if !made.is_empty() {
            ddl.push(sql::mysql_split_future(&made));
        }
        done.created = made.into_iter().map(|(name, _)| name).collect();
        bounded::<DB>(&mut conn, &ddl).await?;
        Ok(done)
    }

    /// Runs `ddl` with the metadata-lock wait bounded, then puts the session's own back.
    async fn bounded<DB: Backend>(
        conn: &mut DB::Connection,
        ddl: &[String],
    ) -> Result<(), sqlx::Error> {
        if ddl.is_empty() {
            return Ok(());
        }
        DB::execute_script(conn, sql::MYSQL_SET_LOCK_WAIT).await?;
        let mut done = Ok(());
        for statement in ddl {
            done = DB::execute_script(conn, statement).await;
            if done.is_err() {
                break;
            }
        }
        let reset = DB::execute_script(conn, sql::MYSQL_RESET_LOCK_WAIT).await;
        done.and(reset)
    }
}

/// The day a partition named `idem_inbox_dYYYYMMDD` holds, in days since 1970-01-01.
fn day_named(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("idem_inbox_d")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, m, d) = (
        digits[..4].parse().ok()?,
        digits[4..6].parse().ok()?,
        digits[6..].parse().ok()?,
    );
    Some(days_from_civil(y, m, d))
}

/// `YYYY-MM-DD` of a day counted from 1970-01-01 (proleptic Gregorian, UTC).
pub(crate) fn day_of(days: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days from 1970-01-01 to `y-m-d`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_dates_agree() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(day_of(-1), "1969-12-31");
        assert_eq!(day_of(20_792), "2026-12-05");
        assert_eq!(day_of(11_016), "2000-02-29");
        for day in -800_000..800_000 {
            let date = day_of(day);
            let name = format!("idem_inbox_d{}", date.replace('-', ""));
            if day >= -719_162 {
                // Years 0001 onwards name their partition in eight digits.
                assert_eq!(day_named(&name), Some(day), "{date}");
            }
        }
        assert_eq!(day_named("idem_inbox_dated_past"), None);
        assert_eq!(day_named("idem_inbox_d2026120"), None);
    }
}
