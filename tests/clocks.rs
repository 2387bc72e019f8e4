//! Leases and retention are decided by the database's clock, never by an instance's: an
//! instance whose clock runs three days ahead (a real process under libfaketime, against the
//! same PostgreSQL or MariaDB server) neither takes over a live lease nor purges a record
//! inside its retention, nor counts a live lease as stuck.
//!
//! The skewed instance is this test binary, run again as a child with libfaketime preloaded
//! (`FAKETIME=+3d`); `.ci/run` installs Debian's `faketime` package. On SQLite the database's
//! clock is the process's own, so there is nothing to skew apart.

use crate::child;
use crate::common;

use child::{ChildProcess, report};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey, Received};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const DAY: Duration = Duration::from_secs(24 * 3600);
/// How far ahead the skewed instance's clock runs.
const SKEW: &str = "+3d";

fn inbox() -> Inbox {
    Inbox::new("clocks")
        .unwrap()
        .lease(Duration::from_secs(600))
}

fn key(s: &str) -> MessageKey {
    MessageKey::new(s).unwrap()
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// libfaketime's path, or `None` (skipped) where it is not installed and servers are
/// optional (also the scheduler processes' skewed instance, `tests/schedule_processes.rs`).
pub(crate) fn libfaketime() -> Option<&'static str> {
    if std::path::Path::new(LIBFAKETIME).exists() {
        return Some(LIBFAKETIME);
    }
    assert!(
        !common::require_servers(),
        "{LIBFAKETIME} is missing (Debian's `faketime` package), and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
    );
    eprintln!(
        "skipped: install Debian's `faketime` package to run the skewed-clock tests and processes"
    );
    None
}

/// The parent's side: a live lease and a finished record, written with the real clock;
/// then the skewed instance's claim, purge and stuck count; then what is left.
async fn skewed_instance_changes_nothing<DB: idem::Backend>(
    pool: &sqlx::Pool<DB>,
    backend: &str,
    target: (&str, String),
) {
    let Some(lib) = libfaketime() else { return };
    idem::migrate(pool).await.unwrap();
    let inbox = inbox();
    let Claimed::Work(live) = inbox
        .claim::<_, String>(pool, &key("live"), b"x")
        .await
        .unwrap()
    else {
        panic!("the first claim")
    };
    match inbox
        .receive::<_, String>(pool, &key("done"), b"x")
        .await
        .unwrap()
    {
        Received::New(receipt) => {
            let first = receipt.finish(Ok::<String, String>("first".into())).await;
            assert_eq!(first.unwrap(), Delivery::Processed("first".to_owned()));
        }
        Received::Done(other) => panic!("{other:?}"),
    }
    let mut child = ChildProcess::spawn(
        "clocks::skewed_instance",
        &[
            ("IDEM_CHILD_BACKEND", backend.to_owned()),
            (target.0, target.1),
            ("IDEM_PARENT_NOW_MILLIS", now_millis().to_string()),
            ("LD_PRELOAD", lib.to_owned()),
            ("FAKETIME", SKEW.to_owned()),
            // tokio's timers keep the real monotonic clock.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ],
        &[],
    );
    child.step("skewed").await;
    assert_eq!(child.step("claim").await, "claim in progress");
    assert_eq!(child.step("purged").await, "purged 0");
    assert_eq!(child.step("stuck").await, "stuck 0");
    child.exits_successfully().await;
    // The live lease is still the first holder's, and the finished record is kept.
    assert_eq!(
        live.complete(pool, Ok::<_, String>("sent".into()))
            .await
            .unwrap(),
        Delivery::Processed("sent".to_owned())
    );
    match inbox
        .claim::<_, String>(pool, &key("done"), b"x")
        .await
        .unwrap()
    {
        Claimed::Done(Delivery::Duplicate { first_result }) => {
            assert_eq!(first_result.as_deref(), Some("first"));
        }
        other => panic!("the finished record is gone: {other:?}"),
    }
}

#[tokio::test]
async fn postgres_an_instance_clock_days_ahead_changes_nothing() {
    let schema = format!("clocks_{}", common::next_id());
    let Some(pool) = common::postgres(&schema, 2).await else {
        return;
    };
    let target = ("IDEM_CHILD_SCHEMA", format!("idem_test_{schema}"));
    skewed_instance_changes_nothing(&pool, "postgres", target).await;
}

#[tokio::test]
async fn mysql_an_instance_clock_days_ahead_changes_nothing() {
    let name = format!("clocks_{}", common::next_id());
    let Some(url) = common::mysql_database(&name).await else {
        return;
    };
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    skewed_instance_changes_nothing(&pool, "mysql", ("IDEM_CHILD_URL", url)).await;
}

/// The skewed instance (run by the tests above, as a child under libfaketime).
#[tokio::test]
#[ignore = "the child process of the skewed-clock tests"]
async fn skewed_instance() {
    let Ok(backend) = std::env::var("IDEM_CHILD_BACKEND") else {
        eprintln!("the child of the skewed-clock tests: run by them, not alone");
        return;
    };
    let parent: i64 = std::env::var("IDEM_PARENT_NOW_MILLIS")
        .unwrap()
        .parse()
        .unwrap();
    // Unless this process's clock really runs ahead, the test proves nothing.
    assert!(
        now_millis() > parent + 2 * DAY.as_millis() as i64,
        "libfaketime did not move this process's clock"
    );
    report("skewed");
    match backend.as_str() {
        "postgres" => as_skewed_instance(&child_postgres().await).await,
        "mysql" => {
            let url = std::env::var("IDEM_CHILD_URL").unwrap();
            let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
            as_skewed_instance(&pool).await;
        }
        other => panic!("unknown backend {other}"),
    }
}

/// A child's PostgreSQL pool, on the parent's schema (`IDEM_CHILD_SCHEMA`).
pub(crate) async fn child_postgres() -> sqlx::PgPool {
    let url = common::postgres_url().unwrap();
    let schema = std::env::var("IDEM_CHILD_SCHEMA").unwrap();
    let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&url)
        .unwrap()
        .options([("search_path", schema.as_str())]);
    sqlx::PgPool::connect_with(options).await.unwrap()
}

async fn as_skewed_instance<DB: idem::Backend>(pool: &sqlx::Pool<DB>) {
    let inbox = inbox();
    match inbox
        .claim::<_, String>(pool, &key("live"), b"x")
        .await
        .unwrap()
    {
        Claimed::Done(Delivery::InProgress { .. }) => report("claim in progress"),
        Claimed::Work(lease) => report(&format!("claim took over attempt {}", lease.attempt())),
        Claimed::Done(other) => report(&format!("claim {other:?}")),
    }
    let purged = inbox.purge(pool, DAY, 100).await.unwrap();
    report(&format!("purged {purged}"));
    let stuck = inbox.stuck(pool).await.unwrap();
    report(&format!("stuck {}", stuck.count));
}
