//! `idem::schedule` on a SQLite file, PostgreSQL and MariaDB, with instances in one
//! process (`tests/schedule_instances.rs` runs them as processes, one of them killed and one
//! whose clock runs hours ahead):
//!
//! - three instances running a 100 ms job for three seconds: every occurrence commits
//!   once, with its effect, and the ones none of them reached in time are counted skipped;
//! - missed occurrences, under a test clock: `RunLatest` runs the latest and skips the rest,
//!   `RunEach` runs each in order, `Skip` runs none late, and a deadline skips what is
//!   older than it;
//! - a failed occurrence rolls back with its effects and is tried again after the retry
//!   delay, its attempt counted;
//! - the leased form: a runner that stops extending its lease is taken over once its lease
//!   ends, with a higher fence, and its late completion is refused;
//! - a body slower than its schedule: occurrences never overlap, and the ones that came due
//!   while one ran are skipped and counted;
//! - an instance whose session bounds its lock waits, meeting an occurrence that runs
//!   elsewhere past that bound, answers `Elsewhere`: no error, no second run;
//! - a job name too long is refused at definition.

use crate::common;
use idem::inbox::{BatchFuture, ManualClock};
use idem::schedule::{Job, Missed, Outcome, Schedule, ScheduleError};
use sqlx::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

/// The effects table: one row per run of a body, unconstrained, so a duplicate would show.
async fn effects_table<DB: idem::Backend>(pool: &Pool<DB>, table: &str)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let drop = format!("DROP TABLE IF EXISTS {table}");
    sqlx::raw_sql(&drop).execute(pool).await.unwrap();
    let create =
        format!("CREATE TABLE {table} (occurrence VARCHAR(64) NOT NULL, instance BIGINT NOT NULL)");
    sqlx::raw_sql(&create).execute(pool).await.unwrap();
}

/// The occurrences in `table`, in order, with duplicates.
async fn effects<DB: idem::Backend>(pool: &Pool<DB>, table: &str) -> Vec<String>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let sql = format!("SELECT occurrence FROM {table} ORDER BY occurrence");
    sqlx::query_scalar(&sql).fetch_all(pool).await.unwrap()
}

/// A statement run in a body's transaction, spelled per backend: a generic async block over
/// `&mut **tx` does not prove `Send` on rustc 1.95.
pub(crate) trait Exec: idem::Backend {
    /// How the backend spells its statements (its clock, for one).
    const DIALECT: idem::Dialect;

    fn exec<'a>(
        tx: &'a mut sqlx::Transaction<'static, Self>,
        sql: String,
    ) -> BatchFuture<'a, (), sqlx::Error>;
}

macro_rules! exec {
    ($($db:ty => $dialect:ident),*) => {$(
        impl Exec for $db {
            const DIALECT: idem::Dialect = idem::Dialect::$dialect;

            fn exec<'a>(tx: &'a mut sqlx::Transaction<'static, Self>, sql: String) -> BatchFuture<'a, (), sqlx::Error> {
                Box::pin(async move { sqlx::query(&sql).execute(&mut **tx).await.map(drop) })
            }
        }
    )*};
}
exec!(sqlx::Sqlite => Sqlite, sqlx::Postgres => Postgres, sqlx::MySql => MySql);

/// Inserts the effect of `occurrence` by `instance` in `tx`.
fn effect<'t, DB: Exec>(
    tx: &'t mut sqlx::Transaction<'static, DB>,
    table: &'t str,
    occurrence: &'t idem::schedule::Occurrence,
    instance: i64,
) -> BatchFuture<'t, i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {table} (occurrence, instance) VALUES ('{}', {instance})",
        occurrence.key()
    );
    Box::pin(async move {
        DB::exec(tx, sql).await?;
        Ok(instance)
    })
}

async fn instances<DB: Exec>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    idem::migrate(&pool).await.unwrap();
    effects_table(&pool, "job_effects").await;
    let name = format!("every-100ms-{}", common::next_id());
    let period = Duration::from_millis(100);
    let jobs: Vec<Job> = (0..3)
        .map(|_| Job::new(&name, Schedule::every(period).unwrap()).unwrap())
        .collect();
    let runs = jobs.iter().enumerate().map(|(instance, job)| {
        let pool = pool.clone();
        async move {
            // Ticks until the deadline, never cancelled half way: a run dropped while its
            // COMMIT is in flight may commit without being counted.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            while tokio::time::Instant::now() < deadline {
                let tick = job
                    .tick(&pool, |tx, occurrence| {
                        effect(tx, "job_effects", occurrence, instance as i64)
                    })
                    .await
                    .unwrap();
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(tick.wait().min(left)).await;
            }
        }
    });
    futures_util::future::join_all(runs).await;
    let ran = effects(&pool, "job_effects").await;
    let mut distinct = ran.clone();
    distinct.dedup();
    assert_eq!(ran, distinct, "an occurrence committed twice");
    let counters: Vec<_> = jobs.iter().map(Job::counters).collect();
    let committed: u64 = counters.iter().map(|c| c.ran).sum();
    let skipped: u64 = counters.iter().map(|c| c.skipped).sum();
    assert_eq!(committed as usize, ran.len(), "{counters:?}");
    // About 30 occurrences in three seconds: each either ran once or was skipped once.
    let first = ran.first().unwrap();
    let last = ran.last().unwrap();
    let span = (millis_of(last) - millis_of(first)) / 100 + 1;
    assert_eq!(ran.len() as u64 + skipped, span as u64, "{counters:?}");
    assert!(
        ran.len() >= 15,
        "only {} occurrences ran: {counters:?}",
        ran.len()
    );
}

/// The instant of an occurrence key (`2026-12-07T03:00:00.100Z`), in milliseconds.
fn millis_of(key: &str) -> i64 {
    let at: jiff::Timestamp = key.parse().unwrap();
    at.as_millisecond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_occurrence_once_sqlite() {
    instances(common::sqlite_file(&format!("schedule-{}", common::next_id()), 4).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_occurrence_once_postgres() {
    let Some(pool) = common::postgres("schedule_instances", 6).await else {
        return;
    };
    instances(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_occurrence_once_mysql() {
    let Some(pool) = common::mysql("schedule_instances", 6).await else {
        return;
    };
    instances(pool).await;
}

/// A clock at a whole hour, and a job on it every minute.
fn clocked(name: &str, missed: Missed) -> (ManualClock, Job) {
    let clock = ManualClock::new(1_800_000_000_000);
    let job = Job::new(
        format!("{name}-{}", common::next_id()),
        Schedule::every(MINUTE).unwrap(),
    )
    .unwrap()
    .missed(missed)
    .clock(clock.clone());
    (clock, job)
}

/// Ticks `job` until nothing is due, noting what ran and what was skipped.
async fn ticks<DB: idem::Backend>(pool: &Pool<DB>, job: &Job) -> (Vec<i64>, u64)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let (mut ran, mut skipped) = (Vec::new(), 0);
    loop {
        let tick = job
            .tick(pool, |_, occurrence| {
                let at = occurrence.at_millis();
                Box::pin(async move { Ok::<_, sqlx::Error>(at) })
            })
            .await
            .unwrap();
        skipped += tick.skipped;
        match tick.outcome {
            Outcome::Ran(_, at) => ran.push((at - 1_800_000_000_000) / 60_000),
            Outcome::NotDue { .. } => return (ran, skipped),
            // Recorded ahead of a read and refused (a later occurrence is due): read.
            Outcome::Elsewhere => {}
            other => panic!("{other:?}"),
        }
    }
}

/// Instance A runs occurrence 0 with a body that holds its transaction for two seconds;
/// instance B, on `bounded` (a pool whose sessions wait at most a moment for a lock),
/// ticks meanwhile: it reads the row without waiting, waits for A's lock only that
/// moment, and answers `Elsewhere`.
async fn lock_wait<DB: idem::Backend>(pool: Pool<DB>, bounded: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(&pool).await.unwrap();
    let (clock, a) = clocked("lock-wait", Missed::RunLatest);
    let b = Job::new(a.name(), Schedule::every(MINUTE).unwrap())
        .unwrap()
        .clock(clock.clone());
    let (started, running) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn({
        let pool = pool.clone();
        async move {
            a.tick(&pool, move |_, occurrence| {
                let at = occurrence.at_millis();
                Box::pin(async move {
                    started.send(()).unwrap();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok::<_, sqlx::Error>(at)
                })
            })
            .await
            .map(|tick| tick.ran().map(|(_, at)| *at))
        }
    });
    running.await.unwrap();
    let ran_here = Arc::new(AtomicUsize::new(0));
    let second = b
        .tick(&bounded, {
            let ran_here = ran_here.clone();
            move |_, _| {
                ran_here.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok::<_, sqlx::Error>(()) })
            }
        })
        .await;
    assert_eq!(
        ran_here.load(Ordering::SeqCst),
        0,
        "B ran it while A runs it"
    );
    match second {
        Ok(tick) => assert!(matches!(tick.outcome, Outcome::Elsewhere), "{tick:?}"),
        Err(e) => panic!("a wait past the session's lock timeout is an error: {e}"),
    }
    assert_eq!(first.await.unwrap().unwrap(), Some(1_800_000_000_000));
    let after = b
        .tick(&bounded, |_, _| {
            Box::pin(async { Ok::<_, sqlx::Error>(()) })
        })
        .await
        .unwrap();
    assert!(matches!(after.outcome, Outcome::NotDue { .. }), "{after:?}");
    assert_eq!(b.counters().ran, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_lock_timeout_is_elsewhere_postgres() {
    let Some(pool) = common::postgres("schedule_lock_wait", 2).await else {
        return;
    };
    let options = (*pool.connect_options())
        .clone()
        .options([("lock_timeout", "300")]);
    let bounded = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    lock_wait(pool, bounded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_lock_timeout_is_elsewhere_mysql() {
    let Some(pool) = common::mysql("schedule_lock_wait", 2).await else {
        return;
    };
    let bounded = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    lock_wait(pool, bounded).await;
}

async fn missed<DB: idem::Backend>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(&pool).await.unwrap();

    // A new job starts with its first occurrence from now, which is due now.
    let (clock, latest) = clocked("latest", Missed::RunLatest);
    assert_eq!(ticks(&pool, &latest).await, (vec![0], 0));
    // Ten minutes down: the latest runs, the nine before it are skipped.
    clock.advance(10 * MINUTE + Duration::from_secs(5));
    assert_eq!(ticks(&pool, &latest).await, (vec![10], 9));
    assert_eq!(latest.counters().skipped, 9);

    let (clock, each) = clocked("each", Missed::RunEach);
    assert_eq!(ticks(&pool, &each).await, (vec![0], 0));
    clock.advance(5 * MINUTE);
    assert_eq!(ticks(&pool, &each).await, ((1..=5).collect(), 0));

    // With a deadline of two and a half minutes, the ones older than it are skipped.
    let (clock, deadline) = clocked("deadline", Missed::RunEach);
    let deadline = deadline.deadline(Duration::from_secs(150));
    assert_eq!(ticks(&pool, &deadline).await, (vec![0], 0));
    clock.advance(10 * MINUTE);
    assert_eq!(ticks(&pool, &deadline).await, (vec![8, 9, 10], 7));

    // `Skip`, with a deadline of 20 s: within it, it runs; later, not at all, and the job
    // waits for its next occurrence.
    let (clock, skip) = clocked("skip", Missed::Skip);
    let skip = skip.deadline(Duration::from_secs(20));
    assert_eq!(ticks(&pool, &skip).await, (vec![0], 0));
    clock.advance(MINUTE + Duration::from_secs(10));
    assert_eq!(ticks(&pool, &skip).await, (vec![1], 0));
    clock.advance(11 * MINUTE + Duration::from_secs(35));
    assert_eq!(ticks(&pool, &skip).await, (vec![], 11));
    clock.advance(Duration::from_secs(15));
    assert_eq!(ticks(&pool, &skip).await, (vec![13], 0));
}

#[tokio::test]
async fn missed_occurrences_sqlite() {
    missed(common::sqlite_file(&format!("schedule-missed-{}", common::next_id()), 2).await).await;
}

#[tokio::test]
async fn missed_occurrences_postgres() {
    let Some(pool) = common::postgres("schedule_missed", 2).await else {
        return;
    };
    missed(pool).await;
}

#[tokio::test]
async fn missed_occurrences_mysql() {
    let Some(pool) = common::mysql("schedule_missed", 2).await else {
        return;
    };
    missed(pool).await;
}

async fn failures<DB: Exec>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    idem::migrate(&pool).await.unwrap();
    effects_table(&pool, "failing_effects").await;
    let (clock, job) = clocked("failing", Missed::RunLatest);
    let job = job.retry_delay(Duration::from_secs(10));
    // The first attempt writes its effect, then fails: both roll back.
    let failed = job
        .tick(&pool, |tx, occurrence| {
            let sql = format!(
                "INSERT INTO failing_effects (occurrence, instance) VALUES ('{}', {})",
                occurrence.key(),
                occurrence.attempt()
            );
            Box::pin(async move {
                DB::exec(tx, sql).await.unwrap();
                Err::<i64, _>("the report service is down")
            })
        })
        .await
        .unwrap_err();
    assert!(matches!(
        failed,
        idem::Error::Handler("the report service is down")
    ));
    assert!(effects(&pool, "failing_effects").await.is_empty());
    let sql = format!(
        "SELECT attempts, error FROM idem_jobs WHERE job = '{}'",
        job.name()
    );
    let (attempts, error): (i64, Option<String>) =
        sqlx::query_as(&sql).fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 1);
    assert!(error.unwrap().contains("the report service is down"));
    // Held back for the retry delay, by the job's clock.
    let held = job
        .tick(&pool, |tx, occurrence| {
            effect(tx, "failing_effects", occurrence, 0)
        })
        .await
        .unwrap();
    assert!(matches!(held.outcome, Outcome::Held { .. }), "{held:?}");
    assert_eq!(held.wait(), Duration::from_secs(10));
    clock.advance(Duration::from_secs(10));
    let retried = job
        .tick(&pool, |tx, occurrence| {
            let attempt = occurrence.attempt();
            Box::pin(async move { effect(tx, "failing_effects", occurrence, attempt).await })
        })
        .await
        .unwrap();
    let (occurrence, attempt) = retried.ran().unwrap();
    assert_eq!((occurrence.attempt(), *attempt), (2, 2));
    assert_eq!(effects(&pool, "failing_effects").await.len(), 1);
    assert_eq!(job.counters().failed, 1);
    // Its result is stored in the job's row.
    let sql = format!("SELECT result FROM idem_jobs WHERE job = '{}'", job.name());
    let (result,): (Option<String>,) = sqlx::query_as(&sql).fetch_one(&pool).await.unwrap();
    assert_eq!(result.as_deref(), Some("2"));
}

#[tokio::test]
async fn a_failed_occurrence_is_retried_sqlite() {
    failures(common::sqlite_file(&format!("schedule-failures-{}", common::next_id()), 2).await)
        .await;
}

#[tokio::test]
async fn a_failed_occurrence_is_retried_postgres() {
    let Some(pool) = common::postgres("schedule_failures", 2).await else {
        return;
    };
    failures(pool).await;
}

#[tokio::test]
async fn a_failed_occurrence_is_retried_mysql() {
    let Some(pool) = common::mysql("schedule_failures", 2).await else {
        return;
    };
    failures(pool).await;
}

async fn leased<DB: idem::Backend>(pool: Pool<DB>) {
    idem::migrate(&pool).await.unwrap();
    let (clock, job) = clocked("leased", Missed::RunLatest);
    let job = job.lease(Duration::from_secs(30));
    let (claimed, on_claim) = tokio::sync::oneshot::channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    // The first runner claims the occurrence and stalls (its beats, every 10 s of real
    // time, never come in this test).
    let first = {
        let job = job.clone();
        let pool = pool.clone();
        tokio::spawn(async move {
            job.tick_leased(&pool, |occurrence| async move {
                claimed.send(occurrence.clone()).unwrap();
                finished.await.unwrap();
                Ok::<_, String>("first")
            })
            .await
        })
    };
    let stalled = on_claim.await.unwrap();
    assert_eq!((stalled.fence(), stalled.attempt()), (Some(1), 1));
    // While its lease lasts, the job is held.
    let held = job
        .tick_leased(&pool, |_| async { Ok::<_, String>("second") })
        .await
        .unwrap();
    assert!(matches!(held.outcome, Outcome::Held { .. }), "{held:?}");
    // Its lease ends: another runner takes the occurrence over, with a higher fence and
    // the same effect key.
    clock.advance(Duration::from_secs(31));
    let taken = job
        .tick_leased(&pool, |occurrence| async move {
            Ok::<_, String>(format!("{:?} {}", occurrence.fence(), occurrence.attempt()))
        })
        .await
        .unwrap();
    let (occurrence, value) = taken.ran().unwrap();
    assert_eq!(value, "Some(2) 2");
    assert_eq!(occurrence.at_millis(), stalled.at_millis());
    assert_eq!(occurrence.effect_key(), stalled.effect_key());
    assert_eq!(job.counters().taken_over, 1);
    // The first runner's late completion is refused.
    finish.send(()).unwrap();
    let late = first.await.unwrap().unwrap_err();
    assert!(matches!(late, idem::Error::LeaseLost { .. }), "{late:?}");
    assert_eq!(job.counters().ran, 1);
}

#[tokio::test]
async fn a_dead_runner_is_taken_over_and_its_late_completion_refused_sqlite() {
    leased(common::sqlite_file(&format!("schedule-leased-{}", common::next_id()), 2).await).await;
}

#[tokio::test]
async fn a_dead_runner_is_taken_over_and_its_late_completion_refused_postgres() {
    let Some(pool) = common::postgres("schedule_leased", 2).await else {
        return;
    };
    leased(pool).await;
}

#[tokio::test]
async fn a_dead_runner_is_taken_over_and_its_late_completion_refused_mysql() {
    let Some(pool) = common::mysql("schedule_leased", 2).await else {
        return;
    };
    leased(pool).await;
}

/// A body in progress, counted in `running` until it ends or is dropped.
struct Running {
    running: Arc<AtomicUsize>,
    /// How many ran with it when it entered (itself included).
    now: usize,
}

impl Running {
    fn enter(running: Arc<AtomicUsize>) -> Running {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        Running { running, now }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn dense<DB: idem::Backend>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(&pool).await.unwrap();
    let name = format!("dense-{}", common::next_id());
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let jobs: Vec<Job> = (0..2)
        .map(|_| Job::new(&name, Schedule::every(Duration::from_millis(50)).unwrap()).unwrap())
        .collect();
    let runs = jobs.iter().map(|job| {
        let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
        async move {
            let run = job.run(&pool, move |_, _| {
                let (running, most) = (running.clone(), most.clone());
                Box::pin(async move {
                    // Counted out when the body ends, or is dropped: the timeout below
                    // cancels a run in the middle of its body (its transaction then rolls
                    // back), and the other instance may run the next body at once.
                    let body = Running::enter(running);
                    most.fetch_max(body.now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    drop(body);
                    Ok::<_, sqlx::Error>(())
                })
            });
            let _ = tokio::time::timeout(Duration::from_secs(2), run).await;
        }
    });
    futures_util::future::join_all(runs).await;
    let ran: u64 = jobs.iter().map(|j| j.counters().ran).sum();
    let skipped: u64 = jobs.iter().map(|j| j.counters().skipped).sum();
    assert_eq!(most.load(Ordering::SeqCst), 1, "two occurrences overlapped");
    assert!(
        ran >= 4 && skipped >= 2 * ran,
        "ran {ran}, skipped {skipped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_its_schedule_never_overlaps_sqlite() {
    dense(common::sqlite_file(&format!("schedule-dense-{}", common::next_id()), 4).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_its_schedule_never_overlaps_postgres() {
    let Some(pool) = common::postgres("schedule_dense", 4).await else {
        return;
    };
    dense(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_its_schedule_never_overlaps_mysql() {
    let Some(pool) = common::mysql("schedule_dense", 4).await else {
        return;
    };
    dense(pool).await;
}

#[test]
fn a_job_name_too_long_is_refused() {
    let every = Schedule::every(MINUTE).unwrap();
    let refused = Job::new("j".repeat(256), every).unwrap_err();
    assert_eq!(
        refused,
        ScheduleError::Name(idem::KeyError::TooLong { len: 256 })
    );
    assert!(
        refused.to_string().starts_with("invalid job name"),
        "{refused}"
    );
}
