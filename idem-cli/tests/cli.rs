//! The `idem` binary against real databases (a SQLite file always; PostgreSQL and MariaDB
//! when `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_MYSQL_URL` are set, required with
//! `IDEM_TEST_REQUIRE_SERVERS=1`): migrate; the backlog; the dead messages grouped by
//! error; a requeue that is a dry run without `--yes`, refused for an id that is not a
//! dead message (exit 3, nothing changed), and done for a group while a relay runs (each
//! message published once, its key's held message after it); a discard; bad input (an
//! unknown URL scheme, no URL) with exit 2.

use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs `idem` with `args` on `url` (through `DATABASE_URL`).
fn idem(url: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.args(args).env_remove("DATABASE_URL");
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    command.output().unwrap()
}

/// Runs `idem … --json`, expecting exit code `code`, and reads its JSON.
fn json(url: &str, args: &[&str], code: i32) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let out = idem(Some(url), &args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "idem {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Fails `a` and `b` as refused, `c` as timed out; acknowledges the rest.
struct Failing;

impl Publisher for Failing {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        match message.id() {
            "a" | "b" => Err("broker refused".into()),
            "c" => Err("timeout".into()),
            _ => Ok(Published::Acked),
        }
    }
}

/// Acknowledges everything, counting each id.
#[derive(Clone, Default)]
struct Counting(Arc<Mutex<BTreeMap<String, u32>>>);

impl Publisher for Counting {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        *self
            .0
            .lock()
            .unwrap()
            .entry(message.id().to_owned())
            .or_default() += 1;
        Ok(Published::Acked)
    }
}

async fn operate<DB: idem::Backend>(url: &str, pool: sqlx::Pool<DB>) {
    let out = idem(Some(url), &["migrate"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "idem's tables are up to date"
    );

    // Three messages die (two refused, one timed out); `d` waits behind `a`, its key's.
    let mut tx = pool.begin().await.unwrap();
    for (id, key) in [("a", "ka"), ("b", "kb"), ("c", "kc"), ("d", "ka")] {
        let message = Message::json("orders", &id).id(id).ordering_key(key);
        outbox::stage(&mut tx, message).await.unwrap();
    }
    tx.commit().await.unwrap();
    let failing = Relay::new(pool.clone(), Failing).max_attempts(1);
    while failing.run_once().await.unwrap().claimed > 0 {}

    let backlog = json(url, &["outbox", "backlog"], 0);
    assert_eq!(
        (backlog["pending"].as_u64(), backlog["dead"].as_u64()),
        (Some(4), Some(3))
    );
    let dead = json(url, &["outbox", "dead"], 0);
    assert_eq!(
        dead["groups"],
        serde_json::json!([
            {"error": "broker refused", "count": 2, "ids": ["a", "b"]},
            {"error": "timeout", "count": 1, "ids": ["c"]},
        ])
    );
    let table = idem(Some(url), &["outbox", "dead"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.starts_with("count  last error") && table.contains("2      broker refused  a, b"),
        "{table}"
    );

    // Without --yes, nothing changes; an id that is not dead changes nothing either.
    let dry = json(url, &["outbox", "requeue", "a"], 0);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["ids"], serde_json::json!(["a"]));
    let missing = json(url, &["outbox", "requeue", "a", "nope", "--yes"], 3);
    assert_eq!(missing["error"]["kind"], "not_found");
    assert_eq!(json(url, &["outbox", "backlog"], 0)["dead"], 3);

    // The refused ones, requeued while a relay runs: each published once, `d` after `a`.
    let published = Counting::default();
    let relay = Relay::new(pool.clone(), published.clone())
        .poll_interval(Duration::from_millis(20))
        .spawn()
        .unwrap();
    let requeued = json(
        url,
        &["outbox", "requeue", "--error", "refused", "--yes"],
        0,
    );
    assert_eq!(requeued["requeued"], serde_json::json!(["a", "b"]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while published.0.lock().unwrap().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    let counts = published.0.lock().unwrap().clone();
    assert_eq!(
        counts,
        BTreeMap::from([("a".into(), 1), ("b".into(), 1), ("d".into(), 1)]),
        "each requeued message and the one held behind it, published once"
    );

    // The last one discarded: nothing is left.
    assert_eq!(
        json(url, &["outbox", "discard", "--all"], 0)["ids"],
        serde_json::json!(["c"])
    );
    let discarded = json(url, &["outbox", "discard", "--all", "--yes"], 0);
    assert_eq!(discarded["discarded"], serde_json::json!(["c"]));
    let backlog = json(url, &["outbox", "backlog"], 0);
    assert_eq!(
        (backlog["pending"].as_u64(), backlog["dead"].as_u64()),
        (Some(0), Some(0))
    );
    // An action names its messages.
    let unnamed = idem(Some(url), &["outbox", "requeue", "--yes"]);
    assert_eq!(unnamed.status.code(), Some(2), "{unnamed:?}");
}

fn require_servers() -> bool {
    std::env::var("IDEM_TEST_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// `name`'s URL, or `None` (skipped) when it is unset and servers are optional.
fn server_url(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if require_servers() => {
            panic!("{name} is not set, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping")
        }
        _ => {
            eprintln!("skipped: set {name}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operate_sqlite() {
    let path = std::env::temp_dir().join(format!("idem-cli-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let pool = sqlx::SqlitePool::connect_with(idem::sqlite_options(&url).unwrap())
        .await
        .unwrap();
    operate(&url, pool).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operate_postgres() {
    let Some(server) = server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let admin = sqlx::PgPool::connect(&server).await.unwrap();
    // One statement each: a multi-statement string runs as one transaction block.
    for statement in [
        "DROP DATABASE IF EXISTS idem_cli WITH (FORCE)",
        "CREATE DATABASE idem_cli",
    ] {
        sqlx::raw_sql(statement).execute(&admin).await.unwrap();
    }
    let options: sqlx::postgres::PgConnectOptions = server.parse().unwrap();
    let url = format!(
        "postgres://{}@{}:{}/idem_cli",
        options.get_username(),
        options.get_host(),
        options.get_port()
    );
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    operate(&url, pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operate_mysql() {
    let Some(server) = server_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    let admin = sqlx::MySqlPool::connect(&server).await.unwrap();
    sqlx::raw_sql("DROP DATABASE IF EXISTS idem_cli; CREATE DATABASE idem_cli")
        .execute(&admin)
        .await
        .unwrap();
    let base = server
        .rsplit_once('/')
        .map_or(server.as_str(), |(base, _)| base);
    let url = format!("{base}/idem_cli");
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    // Through the `mariadb:` spelling too.
    operate(&url.replacen("mysql:", "mariadb:", 1), pool).await;
}

#[test]
fn bad_input_is_a_usage_error() {
    let out = idem(Some("redis://127.0.0.1/0"), &["outbox", "backlog"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown database URL scheme `redis:`"),
        "{stderr}"
    );
    let out = idem(None, &["outbox", "backlog"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DATABASE_URL"));
    let out = idem(None, &["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("outbox"));
    // A SQLite file that does not exist is not created.
    let missing = std::env::temp_dir().join(format!("idem-cli-missing-{}.db", std::process::id()));
    let out = idem(
        Some(&format!("sqlite:{}", missing.display())),
        &["outbox", "backlog"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("created by `idem migrate` only"),
        "{out:?}"
    );
    assert!(!missing.exists());
    // `idem migrate` creates it.
    let url = format!("sqlite:{}", missing.display());
    assert!(idem(Some(&url), &["migrate"]).status.success());
    let out = idem(Some(&url), &["outbox", "dead"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "no dead messages"
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", missing.display()));
    }
}
