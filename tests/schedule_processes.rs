//! Three scheduler processes against one PostgreSQL or MariaDB database, running a job
//! every second with `Missed::RunEach`: one of them under libfaketime with its clock three
//! hours ahead, one SIGKILLed in the middle of an occurrence (its body has written its
//! effect; the transaction is not committed).
//!
//! Every occurrence from the first to the last runs exactly once, the killed one by another
//! process; no occurrence runs before its time by the database's clock, the skewed process's
//! included. The processes are this test binary, run again as children (`.ci/run` installs
//! Debian's `faketime` package).

use crate::child::{self, ChildProcess, report};
use crate::clocks::{child_postgres, libfaketime};
use crate::common;
use crate::schedule::Exec;
use idem::schedule::{Job, Missed, Schedule};
use std::time::Duration;

/// How long each surviving process runs the job.
const RUN: Duration = Duration::from_secs(12);

fn job(name: &str) -> Job {
    Job::new(name, Schedule::every(Duration::from_secs(1)).unwrap())
        .unwrap()
        .missed(Missed::RunEach)
}

async fn processes<DB: Exec>(pool: &sqlx::Pool<DB>, backend: &str, target: (&str, String))
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let Some(lib) = libfaketime() else { return };
    idem::migrate(pool).await.unwrap();
    sqlx::raw_sql("DROP TABLE IF EXISTS process_effects")
        .execute(pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE process_effects (occurrence VARCHAR(64) NOT NULL, instance BIGINT NOT NULL, late_ms BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
    let name = format!("every-second-{}", common::next_id());
    let spawn = |instance: &str, extra: &[(&str, String)]| {
        let mut env = vec![
            ("IDEM_CHILD_BACKEND", backend.to_owned()),
            ("IDEM_CHILD_JOB", name.clone()),
            ("IDEM_CHILD_INSTANCE", instance.to_owned()),
            (target.0, target.1.clone()),
        ];
        env.extend(extra.iter().cloned());
        ChildProcess::spawn("schedule_processes::scheduler_process", &env, &[])
    };
    let mut plain = spawn("1", &[]);
    let mut skewed = spawn(
        "2",
        &[
            ("LD_PRELOAD", lib.to_owned()),
            ("FAKETIME", "+3h".to_owned()),
            // tokio's timers keep the real monotonic clock.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ],
    );
    let mut killed = spawn("3", &[("IDEM_CHILD_CRASH", "1".to_owned())]);
    plain.step("ready").await;
    assert_eq!(skewed.step("ready").await, "ready skewed");
    killed.step("ready").await;
    // The third process stops after its first body wrote its effect, before the commit.
    let running = killed.step("running ").await;
    let interrupted = running.trim_start_matches("running ").to_owned();
    killed.step("crash-point body_done").await;
    killed.kill();
    let plain_ran = plain.step("ran ").await;
    let skewed_ran = skewed.step("ran ").await;
    plain.exits_successfully().await;
    skewed.exits_successfully().await;
    eprintln!("plain {plain_ran}; skewed {skewed_ran}; killed in {interrupted}");

    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT occurrence, instance, late_ms FROM process_effects ORDER BY occurrence",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let occurrences: Vec<i64> = rows
        .iter()
        .map(|(key, ..)| key.parse::<jiff::Timestamp>().unwrap().as_millisecond())
        .collect();
    let (first, last) = (occurrences[0], *occurrences.last().unwrap());
    let expected: Vec<i64> = (0..=(last - first) / 1000)
        .map(|n| first + n * 1000)
        .collect();
    assert_eq!(
        occurrences, expected,
        "each occurrence once, none missing: {rows:?}"
    );
    assert!(occurrences.len() >= 8, "{rows:?}");
    assert!(
        rows.iter().all(|(_, _, late)| *late >= 0),
        "an occurrence ran before its time: {rows:?}"
    );
    let again: Vec<_> = rows
        .iter()
        .filter(|(key, ..)| *key == interrupted)
        .collect();
    assert_eq!(again.len(), 1, "the interrupted occurrence: {rows:?}");
    assert_ne!(again[0].1, 3, "the killed process's effect committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_three_scheduler_processes_one_skewed_one_killed() {
    let schema = format!("schedule_processes_{}", common::next_id());
    let Some(pool) = common::postgres(&schema, 2).await else {
        return;
    };
    let target = ("IDEM_CHILD_SCHEMA", format!("idem_test_{schema}"));
    processes(&pool, "postgres", target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_three_scheduler_processes_one_skewed_one_killed() {
    let name = format!("schedule_processes_{}", common::next_id());
    let Some(url) = common::mysql_database(&name).await else {
        return;
    };
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    processes(&pool, "mysql", ("IDEM_CHILD_URL", url)).await;
}

/// One scheduler process (run by the tests above, as a child).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the scheduler process tests"]
async fn scheduler_process() {
    let Ok(backend) = std::env::var("IDEM_CHILD_BACKEND") else {
        eprintln!("a child of the scheduler process tests: run by them, not alone");
        return;
    };
    let crash = std::env::var("IDEM_CHILD_CRASH").is_ok();
    if crash {
        child::stop_at_nth(idem::fault::FaultPoint::BodyDone, 1);
    }
    let skewed = std::env::var("LD_PRELOAD").is_ok();
    report(if skewed { "ready skewed" } else { "ready" });
    let name = std::env::var("IDEM_CHILD_JOB").unwrap();
    let instance: i64 = std::env::var("IDEM_CHILD_INSTANCE")
        .unwrap()
        .parse()
        .unwrap();
    match backend.as_str() {
        "postgres" => run(&child_postgres().await, &name, instance, crash).await,
        "mysql" => {
            let url = std::env::var("IDEM_CHILD_URL").unwrap();
            let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
            run(&pool, &name, instance, crash).await;
        }
        other => panic!("unknown backend {other}"),
    }
}

async fn run<DB: Exec>(pool: &sqlx::Pool<DB>, name: &str, instance: i64, crash: bool) {
    let job = job(name);
    let now = DB::DIALECT.now_millis();
    let running = job.run(pool, |tx, occurrence| {
        if crash {
            report(&format!("running {}", occurrence.key()));
        }
        // How late it runs, by the database's clock.
        let sql = format!(
            "INSERT INTO process_effects (occurrence, instance, late_ms) VALUES ('{}', {instance}, {now} - {})",
            occurrence.key(),
            occurrence.at_millis()
        );
        Box::pin(async move { DB::exec(tx, sql).await })
    });
    let _ = tokio::time::timeout(RUN, running).await;
    let counters = job.counters();
    report(&format!(
        "ran {} skipped {}",
        counters.ran, counters.skipped
    ));
}
