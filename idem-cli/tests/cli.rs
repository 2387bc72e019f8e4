//! The `idem` binary against real databases (a SQLite file always; PostgreSQL and MariaDB
//! when `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_MYSQL_URL` are set, required with
//! `IDEM_TEST_REQUIRE_SERVERS=1`): migrate; the backlog; the dead messages grouped by
//! error; a requeue that is a dry run without `--yes`, refused for an id that is not a
//! dead message (exit 3, nothing changed), and done for a group while a relay runs (each
//! message published once, its key's held message after it); a discard; a purge; `check`
//! before and after `migrate` (exit 4, then 0); the inbox's groups, stuck and parked
//! records, a revive and a release (dry runs first, exit 3 for a record not in the state
//! needed), a purge; every change logged with who made it; bad input (an unknown URL
//! scheme, no URL) with exit 2.

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

/// Fails `a` and `c` as refused, `b` as timed out; acknowledges the rest.
struct Failing;

impl Publisher for Failing {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        match message.id() {
            "a" | "c" => Err("broker refused".into()),
            "b" => Err("timeout".into()),
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
    // Before `migrate`: `check` says what is missing, with exit 4.
    let unmigrated = json(url, &["check"], 4);
    assert_eq!(unmigrated["ok"], false);
    assert_eq!(unmigrated["current"], Value::Null);
    assert_eq!(
        unmigrated["problems"],
        serde_json::json!(["there is no table `idem_results`"])
    );
    let out = idem(Some(url), &["migrate"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "idem's tables are up to date"
    );

    let checked = json(url, &["check"], 0);
    assert_eq!(checked["ok"], true);
    let migrations = checked["migrations"].as_array().unwrap();
    assert!(migrations.len() >= 4 && migrations.iter().all(|m| m["applied"] == true));
    assert_eq!(checked["current"], migrations.last().unwrap()["name"]);
    let text = idem(Some(url), &["check"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.starts_with("migration")
            && text.contains("0001_idem.sql")
            && text.contains("\non migration 000"),
        "{text}"
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
    assert_eq!(
        json(url, &["outbox", "backlog", "--by-destination"], 0)["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| (
                d["destination"].as_str().unwrap(),
                d["pending"].as_u64().unwrap(),
                d["dead"].as_u64().unwrap(),
                d["held"].as_u64().unwrap()
            ))
            .collect::<Vec<_>>(),
        [("orders", 4, 3, 1)]
    );
    let dead = json(url, &["outbox", "dead"], 0);
    assert_eq!(
        dead["groups"],
        serde_json::json!([
            {"error": "broker refused", "count": 2, "ids": ["a", "c"]},
            {"error": "timeout", "count": 1, "ids": ["b"]},
        ])
    );
    let table = idem(Some(url), &["outbox", "dead"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.starts_with("count  last error") && table.contains("2      broker refused  a, c"),
        "{table}"
    );

    // Without --yes, nothing changes; an id that is not dead changes nothing either.
    let dry = json(url, &["outbox", "requeue", "a"], 0);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["ids"], serde_json::json!(["a"]));
    // `--error` takes one group, its error exactly; `--error-containing` any whose error
    // contains the text.
    let exact = json(url, &["outbox", "requeue", "--error", "refused"], 0);
    assert_eq!(exact["ids"], serde_json::json!([]));
    let exact = json(url, &["outbox", "discard", "--error", "timeout"], 0);
    assert_eq!(exact["ids"], serde_json::json!(["b"]));
    // Lists of messages keep the order they were staged in, whatever their groups.
    let all = json(url, &["outbox", "dead", "--all-messages"], 0);
    let ids: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    let every = json(url, &["outbox", "requeue", "--all"], 0);
    assert_eq!(every["ids"], serde_json::json!(["a", "b", "c"]));
    let missing = json(url, &["outbox", "requeue", "a", "nope", "--yes"], 3);
    assert_eq!(missing["error"]["kind"], "not_found");
    assert_eq!(json(url, &["outbox", "backlog"], 0)["dead"], 3);

    // The refused ones, requeued while a relay runs: each published once, `d` after `a`.
    let published = Counting::default();
    let relay = Relay::new(pool.clone(), published.clone())
        .poll_interval(Duration::from_millis(20))
        .spawn()
        .unwrap();
    let out = idem(
        Some(url),
        &[
            "outbox",
            "requeue",
            "--error-containing",
            "refused",
            "--yes",
            "--json",
            "--actor",
            "alice",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let requeued: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(requeued["requeued"], serde_json::json!(["a", "c"]));
    // Each action logged: when, who, what.
    let log = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].starts_with("idem: 20")
            && lines[0].ends_with("Z alice requeued the outbox message `a`"),
        "{log}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while published.0.lock().unwrap().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    let counts = published.0.lock().unwrap().clone();
    assert_eq!(
        counts,
        BTreeMap::from([("a".into(), 1), ("c".into(), 1), ("d".into(), 1)]),
        "each requeued message and the one held behind it, published once"
    );

    // The last one discarded: nothing is left.
    assert_eq!(
        json(url, &["outbox", "discard", "--all"], 0)["ids"],
        serde_json::json!(["b"])
    );
    let discarded = json(url, &["outbox", "discard", "--all", "--yes"], 0);
    assert_eq!(discarded["discarded"], serde_json::json!(["b"]));
    let backlog = json(url, &["outbox", "backlog"], 0);
    assert_eq!(
        (backlog["pending"].as_u64(), backlog["dead"].as_u64()),
        (Some(0), Some(0))
    );
    // An action names its messages.
    let unnamed = idem(Some(url), &["outbox", "requeue", "--yes"]);
    assert_eq!(unnamed.status.code(), Some(2), "{unnamed:?}");

    // The published ones purged: counted first, then deleted.
    let dry = json(url, &["outbox", "purge", "--older-than", "0s"], 0);
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["messages"].as_u64()),
        (Some(true), Some(3))
    );
    assert_eq!(
        json(url, &["outbox", "purge", "--older-than", "1h"], 0)["messages"],
        0
    );
    let purged = json(url, &["outbox", "purge", "--older-than", "0s", "--yes"], 0);
    assert_eq!(purged["messages"], 3);
    let bad = idem(Some(url), &["outbox", "purge", "--older-than", "3 weeks"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    inbox(url, &pool).await;
    partitions(url);
}

/// The inbox's partitions: refused on SQLite; elsewhere made, then kept, dry runs first.
fn partitions(url: &str) {
    if url.starts_with("sqlite:") {
        let refused = json(url, &["partitions", "status"], 1);
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("on SQLite purge the inbox"),
            "{refused}"
        );
        return;
    }
    assert_eq!(
        json(url, &["partitions", "status"], 0)["partitioned"],
        false
    );
    json(url, &["partitions", "maintain", "--keep-days", "2"], 3);
    assert_eq!(json(url, &["partitions", "create"], 0)["dry_run"], true);
    assert_eq!(
        json(url, &["partitions", "status"], 0)["partitioned"],
        false
    );
    let out = idem(
        Some(url),
        &["partitions", "create", "--yes", "--actor", "carol"],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Z carol partitioned the inbox by day"));
    let status = json(url, &["partitions", "status"], 0);
    assert_eq!(status["partitioned"], true);
    assert_eq!(status["days"], serde_json::json!([]));
    let would = json(url, &["partitions", "maintain", "--keep-days", "2"], 0);
    assert_eq!(would["dry_run"], true);
    assert_eq!(would["created"].as_array().unwrap().len(), 5, "{would}");
    assert_eq!(
        json(url, &["partitions", "status"], 0)["days"],
        serde_json::json!([])
    );
    let made = json(
        url,
        &["partitions", "maintain", "--keep-days", "2", "--yes"],
        0,
    );
    assert_eq!(made["created"], would["created"]);
    let status = json(url, &["partitions", "status"], 0);
    assert_eq!(status["days"].as_array().unwrap().len(), 5);
    assert_eq!(status["days"][2], status["today"]);
    let again = json(
        url,
        &["partitions", "maintain", "--keep-days", "2", "--yes"],
        0,
    );
    assert_eq!(again["created"], serde_json::json!([]));
}

/// The inbox's records from the command line: stuck, parked, their repairs, a purge.
async fn inbox<DB: idem::Backend>(url: &str, pool: &sqlx::Pool<DB>) {
    use idem::inbox::{Claimed, Inbox, MessageKey};
    let claim = |inbox: Inbox, key: &'static str| {
        let pool = pool.clone();
        async move {
            let key = MessageKey::new(key).unwrap();
            match inbox.claim::<DB, String>(&pool, &key, b"{}").await.unwrap() {
                Claimed::Work(lease) => lease,
                Claimed::Done(done) => panic!("not claimed: {done:?}"),
            }
        }
    };
    let billing = Inbox::new("billing").unwrap().max_attempts(1);
    let done = claim(billing.clone(), "done").await;
    let _ = done
        .complete(pool, Ok::<_, String>("paid".to_owned()))
        .await;
    let parked = claim(billing.clone(), "parked").await;
    let _ = parked
        .complete(pool, Err::<String, _>("no such account"))
        .await;
    let _stuck = claim(billing.clone().lease(Duration::from_millis(10)), "stuck").await;
    let _held = claim(billing.clone().lease(Duration::from_secs(3600)), "held").await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The last hour's signals from the tables; nothing touched in the last 20 ms.
    let signals = json(url, &["signals"], 0);
    let billing = &signals["inbox"][0];
    assert_eq!(
        (
            billing["group"].as_str(),
            billing["first_delivered"].as_u64(),
            billing["succeeded"].as_u64(),
            billing["dead"].as_u64(),
            billing["stuck_now"].as_u64()
        ),
        (Some("billing"), Some(4), Some(1), Some(1), Some(1)),
        "{signals}"
    );
    assert!(
        signals["not_in_the_tables"]
            .as_str()
            .unwrap()
            .contains("metrics")
    );
    let quiet = json(url, &["signals", "--window", "20ms"], 0);
    assert_eq!(quiet["inbox"], serde_json::json!([]), "{quiet}");

    let groups = json(url, &["inbox", "groups"], 0);
    let group = &groups["groups"][0];
    assert_eq!(
        (
            group["group"].as_str(),
            group["processing"].as_u64(),
            group["stuck"].as_u64(),
            group["succeeded"].as_u64(),
            group["dead"].as_u64()
        ),
        (Some("billing"), Some(2), Some(1), Some(1), Some(1))
    );
    let stuck = json(url, &["inbox", "stuck"], 0);
    assert_eq!(stuck["records"][0]["key"], "stuck");
    assert_eq!(stuck["records"].as_array().unwrap().len(), 1);
    let dead = json(url, &["inbox", "dead", "--group", "billing"], 0);
    assert_eq!(dead["records"][0]["error"], "no such account");
    assert!(
        dead["records"][0].get("result").is_none(),
        "no result is shown"
    );
    let table = idem(Some(url), &["inbox", "dead"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.starts_with("group    key") && table.contains("no such account"),
        "{table}"
    );

    // Repairs: a dry run first; a record not in the state needed, or not there, is exit 3.
    let dry = json(url, &["inbox", "revive", "billing", "parked"], 0);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        json(url, &["inbox", "dead"], 0)["records"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let wrong = json(url, &["inbox", "revive", "billing", "done", "--yes"], 3);
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is SUCCESS, not DEAD"),
        "{wrong}"
    );
    json(url, &["inbox", "release", "billing", "nothing", "--yes"], 3);
    let out = idem(
        Some(url),
        &[
            "inbox", "revive", "billing", "parked", "--yes", "--actor", "bob",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .ends_with("Z bob revived the inbox record `parked` in `billing`\n"),
        "{out:?}"
    );
    let failed = json(url, &["inbox", "failed"], 0);
    assert_eq!(failed["records"][0]["key"], "parked");
    assert_eq!(failed["records"][0]["error"], "revived by bob");
    assert_eq!(failed["records"][0]["attempts"], 0);
    let out = idem(
        Some(url),
        &[
            "inbox", "release", "billing", "held", "--yes", "--actor", "bob",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let stuck = json(url, &["inbox", "stuck", "--group", "billing"], 0);
    let keys: Vec<&str> = stuck["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{stuck}");
    assert!(keys.contains(&"held") && keys.contains(&"stuck"), "{stuck}");

    // A purge of the finished records (done; the revived one is FAILED): counted, then done.
    let dry = json(url, &["inbox", "purge", "billing", "--older-than", "0s"], 0);
    assert_eq!(dry["records"], 2);
    let purged = json(
        url,
        &["inbox", "purge", "billing", "--older-than", "0s", "--yes"],
        0,
    );
    assert_eq!(purged["records"], 2);
    let groups = json(url, &["inbox", "groups"], 0);
    assert_eq!(groups["groups"][0]["succeeded"], 0);
    assert_eq!(groups["groups"][0]["processing"], 2);
    // A group name idem refuses is a usage error.
    let bad = idem(Some(url), &["inbox", "purge", "", "--older-than", "1d"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
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

/// A command line as a shell splits it: words, and "quoted words".
fn words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Every `idem …` line the docs show is a command `idem` accepts: run on a database that
/// cannot open, each ends in a database error (exit 1), never a usage error (exit 2).
#[test]
fn every_command_the_docs_show_parses() {
    let nowhere = std::env::temp_dir().join("idem-no-such-dir/db.sqlite");
    let url = format!("sqlite:{}", nowhere.display());
    let mut seen = 0;
    for (name, page) in [
        ("README.md", include_str!("../README.md")),
        (
            "docs/guide/operating.md",
            include_str!("../../docs/guide/operating.md"),
        ),
    ] {
        for block in page.split("```text\n").skip(1) {
            let block = block.split("\n```").next().unwrap();
            for line in block.lines().filter(|l| l.starts_with("idem ")) {
                let command = line.split(" #").next().unwrap().trim();
                let args = words(command);
                let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
                let out = idem(Some(&url), &args);
                assert_eq!(
                    out.status.code(),
                    Some(1),
                    "{name}: `{command}`: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 30, "{seen} commands read");
}

/// A database without idem's tables (a service's own, or the wrong one): the commands that
/// read a table say which is missing (exit 3), `check` what to do (exit 4), `signals` what
/// there is.
#[tokio::test]
async fn a_database_without_idems_tables_is_named_so() {
    let path = std::env::temp_dir().join(format!("idem-cli-bare-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let options = idem::sqlite_options(&url).unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    for (args, table) in [
        (&["outbox", "dead"][..], "idem_outbox"),
        (&["outbox", "requeue", "--all", "--yes"][..], "idem_outbox"),
        (&["inbox", "groups"][..], "idem_inbox"),
        (
            &["inbox", "revive", "billing", "k", "--yes"][..],
            "idem_inbox",
        ),
    ] {
        let refused = json(&url, args, 3);
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!(
                "the database has no table `{table}`: run `idem migrate`"
            )),
            "{args:?}: {message}"
        );
    }
    assert_eq!(json(&url, &["check"], 4)["current"], Value::Null);
    let signals = json(&url, &["signals"], 0);
    assert_eq!(
        (signals["inbox"].clone(), signals["outbox"].clone()),
        (serde_json::json!([]), Value::Null)
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
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

/// `idem reconcile` on a SQLite file: clean (exit 0), then with a planted duplicate, an
/// effect written around idem and a deleted effect (exit 4, each named); a machine's rows
/// named by `--rows`; a query of the effects; bad names (exit 2) and a missing table
/// (exit 3).
#[tokio::test]
async fn reconcile_names_what_it_finds() {
    use idem::inbox::{Inbox, MessageKey};
    let path = std::env::temp_dir().join(format!("idem-cli-reconcile-{}.db", std::process::id()));
    let url = format!("sqlite:{}", path.display());
    let options = idem::sqlite_options(&url).unwrap().create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE payments (message_key TEXT NOT NULL, amount INTEGER NOT NULL);
         CREATE TABLE orders (order_id INTEGER PRIMARY KEY, status TEXT NOT NULL);
         CREATE TABLE charges (order_id INTEGER NOT NULL);
         INSERT INTO orders VALUES (1, 'PAID'), (2, 'SHIPPED'), (3, 'CREATED');
         INSERT INTO charges VALUES (1), (2), (2), (3);",
    )
    .execute(&pool)
    .await
    .unwrap();
    let inbox = Inbox::new("payments").unwrap();
    for k in ["k1", "k2", "k3"] {
        let _ = inbox
            .process(&pool, &MessageKey::new(k).unwrap(), b"{}", {
                async move |tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
                    sqlx::query("INSERT INTO payments VALUES (?, 10)")
                        .bind(k)
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                }
            })
            .await
            .unwrap();
    }
    let group = [
        "reconcile",
        "--group",
        "payments",
        "--table",
        "payments",
        "--key",
        "message_key",
    ];
    let clean = json(&url, &group, 0);
    assert_eq!(
        (clean["clean"].as_bool(), clean["effects"].as_u64()),
        (Some(true), Some(3))
    );

    sqlx::raw_sql(
        "INSERT INTO payments VALUES ('k1', 10), ('rogue', 5);
         DELETE FROM payments WHERE message_key = 'k3';",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let found = json(&url, &group, 4);
    assert_eq!(found["clean"], false);
    assert_eq!(
        found["duplicates"],
        serde_json::json!({"count": 1, "first": [{"key": "k1", "effects": 2}]})
    );
    assert_eq!(
        found["effects_without_record"],
        serde_json::json!({"count": 1, "first": [{"key": "rogue", "effects": 1}]})
    );
    assert_eq!(
        found["records_without_effect"],
        serde_json::json!({"count": 1, "first": ["k3"]})
    );
    let text = idem(Some(&url), &group);
    assert_eq!(text.status.code(), Some(4));
    assert_eq!(
        String::from_utf8_lossy(&text.stdout),
        "4 effect(s) read against 3 done record(s)\n\
         keys with more than one effect: 1: k1 (2)\n\
         effects without a record: 1: rogue (1)\n\
         records without an effect: 1: k3\n"
    );
    let query = json(
        &url,
        &[
            "reconcile",
            "--group",
            "payments",
            "--query",
            "SELECT message_key AS ref FROM payments WHERE amount > 5",
            "--key",
            "ref",
        ],
        4,
    );
    assert_eq!(
        query["effects_without_record"]["count"], 0,
        "rogue's amount is 5: {query}"
    );

    // A machine's rows past PAID: order 2 charged twice, 3 charged before it was paid.
    let rows = json(
        &url,
        &[
            "reconcile",
            "--rows",
            "orders",
            "--row-key",
            "order_id",
            "--state-column",
            "status",
            "--states",
            "PAID,SHIPPED",
            "--table",
            "charges",
            "--key",
            "order_id",
        ],
        4,
    );
    assert_eq!(rows["duplicates"]["first"][0]["key"], "2");
    assert_eq!(rows["effects_without_record"]["first"][0]["key"], "3");
    assert_eq!(rows["records_without_effect"]["count"], 0);

    let bad = json(
        &url,
        &[
            "reconcile",
            "--group",
            "payments",
            "--table",
            "pay ments",
            "--key",
            "k",
        ],
        2,
    );
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`pay ments`"),
        "{bad}"
    );
    let missing = json(
        &url,
        &[
            "reconcile",
            "--group",
            "payments",
            "--table",
            "nowhere",
            "--key",
            "k",
        ],
        3,
    );
    assert_eq!(
        missing["error"]["message"],
        "the table `nowhere` does not exist"
    );
    let unnamed = idem(
        Some(&url),
        &["reconcile", "--table", "payments", "--key", "k"],
    );
    assert_eq!(unnamed.status.code(), Some(2), "{unnamed:?}");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
