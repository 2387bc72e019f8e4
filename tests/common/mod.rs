//! Real databases for the integration tests.
//!
//! SQLite always runs (in memory and in a file). PostgreSQL runs when
//! `IDEM_TEST_POSTGRES_URL` is set; with `IDEM_TEST_REQUIRE_SERVERS=1` (as in CI) an unset
//! URL is a failure, never a silent skip. Every test gets its own schema (PostgreSQL) or
//! database (SQLite), so tests run in parallel.

#![allow(dead_code)]

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{PgPool, SqlitePool};
use std::path::PathBuf;
use std::str::FromStr;

/// Lets the database's clock leave the current millisecond. Retention keeps what was
/// touched *before* now minus the retention (`updated_at < now - retention`), in whole
/// milliseconds: with a retention of zero, a row written in the same millisecond as the
/// purge is still kept, so a test that purges right after writing steps past it first.
pub async fn past_this_millisecond() {
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
}

/// Runs `sql` on one of `pool`'s connections, as it is (no parameters): for a test that
/// plants a state by hand.
pub async fn exec<DB: idem::Backend>(pool: &sqlx::Pool<DB>, sql: &str)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await.unwrap();
    sqlx::Executor::execute(&mut *conn, sql).await.unwrap();
}

/// The business tables every test uses: orders (the machine's table) and effects (what a
/// handler's body writes, to count side effects).
pub const TABLES: &str = "
    CREATE TABLE orders (
        order_id BIGINT PRIMARY KEY,
        status TEXT,
        version BIGINT DEFAULT 0
    );
    CREATE TABLE effects (
        order_id BIGINT NOT NULL,
        kind TEXT NOT NULL,
        amount BIGINT NOT NULL
    );
    CREATE TABLE text_orders (
        code TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        version BIGINT NOT NULL DEFAULT 0
    );
";

pub fn require_servers() -> bool {
    std::env::var("IDEM_TEST_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// The PostgreSQL URL, or `None` (test skipped) when it is unset and servers are optional.
pub fn postgres_url() -> Option<String> {
    match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if require_servers() => {
            panic!(
                "IDEM_TEST_POSTGRES_URL is not set, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
            )
        }
        _ => {
            eprintln!("skipped: set IDEM_TEST_POSTGRES_URL to run the PostgreSQL tests");
            None
        }
    }
}

/// A pool on a fresh schema `name` (dropped and recreated), holding [`TABLES`].
pub async fn postgres(name: &str, max_connections: u32) -> Option<PgPool> {
    postgres_with(name, max_connections, &[]).await
}

/// [`postgres`], with more session settings (e.g. `default_transaction_isolation`).
pub async fn postgres_with(
    name: &str,
    max_connections: u32,
    settings: &[(&str, &str)],
) -> Option<PgPool> {
    let url = postgres_url()?;
    let schema = format!("idem_test_{name}");
    let admin = PgPool::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to IDEM_TEST_POSTGRES_URL={url}: {e}"));
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", schema.as_str())])
        .options(settings.iter().copied())
        .application_name(&schema);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
    Some(pool)
}

/// An `sqlx::Any` pool on PostgreSQL, on a fresh schema `name` holding [`TABLES`].
pub async fn any_postgres(name: &str) -> Option<sqlx::AnyPool> {
    let url = postgres_url()?;
    drop(postgres(name, 1).await?);
    sqlx::any::install_default_drivers();
    let schema = format!("idem_test_{name}");
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let set = format!("SET search_path TO {schema}");
            Box::pin(async move {
                sqlx::Executor::execute(conn, set.as_str()).await?;
                Ok(())
            })
        })
        .connect(&url)
        .await
        .unwrap();
    Some(pool)
}

/// [`TABLES`] for MySQL and MariaDB: a text key is a `VARCHAR` (InnoDB indexes no whole
/// `TEXT`) under a binary collation, compared byte for byte as on the other backends.
pub const MYSQL_TABLES: &str = "
    CREATE TABLE orders (
        order_id BIGINT PRIMARY KEY,
        status VARCHAR(32),
        version BIGINT DEFAULT 0
    );
    CREATE TABLE effects (
        order_id BIGINT NOT NULL,
        kind VARCHAR(32) NOT NULL,
        amount BIGINT NOT NULL
    );
    CREATE TABLE text_orders (
        code VARCHAR(255) COLLATE utf8mb4_nopad_bin PRIMARY KEY,
        state VARCHAR(32) NOT NULL,
        version BIGINT NOT NULL DEFAULT 0
    );
";

/// The MySQL (MariaDB) URL, or `None` (test skipped) when it is unset and servers are
/// optional.
pub fn mysql_url() -> Option<String> {
    match std::env::var("IDEM_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if require_servers() => {
            panic!(
                "IDEM_TEST_MYSQL_URL is not set, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
            )
        }
        _ => {
            eprintln!("skipped: set IDEM_TEST_MYSQL_URL to run the MySQL tests");
            None
        }
    }
}

/// The URL of a fresh database `idem_test_{name}` (dropped and recreated) on the MySQL
/// server, holding [`MYSQL_TABLES`].
pub async fn mysql_database(name: &str) -> Option<String> {
    let url = mysql_url()?;
    let database = format!("idem_test_{name}");
    let mut admin: sqlx::MySqlConnection = sqlx::Connection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to IDEM_TEST_MYSQL_URL={url}: {e}"));
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}; USE {database}; {MYSQL_TABLES}"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    drop(admin);
    Some(on_database(&url, &database))
}

/// A MySQL `url` with its database replaced by `database` (its query string kept).
pub fn on_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let base = base.rsplit_once('/').map_or(base, |(server, _)| server);
    format!("{base}/{database}{query}")
}

/// A pool on a fresh database `name` holding [`MYSQL_TABLES`].
pub async fn mysql(name: &str, max_connections: u32) -> Option<sqlx::MySqlPool> {
    mysql_with(name, max_connections, "").await
}

/// [`mysql`], each connection running `init` first (e.g. `SET SESSION TRANSACTION
/// ISOLATION LEVEL SERIALIZABLE`), unless it is empty.
pub async fn mysql_with(
    name: &str,
    max_connections: u32,
    init: &'static str,
) -> Option<sqlx::MySqlPool> {
    let url = mysql_database(name).await?;
    Some(
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max_connections)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if !init.is_empty() {
                        sqlx::Executor::execute(conn, init).await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .unwrap(),
    )
}

/// An `sqlx::Any` pool on a fresh MySQL database `name` holding [`MYSQL_TABLES`].
pub async fn any_mysql(name: &str) -> Option<sqlx::AnyPool> {
    let url = mysql_database(name).await?;
    sqlx::any::install_default_drivers();
    Some(
        sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap(),
    )
}

/// A statement of a test's own, as the backend binds it: unchanged where parameters are
/// numbered (`$1`), or with `?` placeholders on MySQL (`positional`), each `$n` in order.
pub fn placed(positional: bool, sql: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    if !positional {
        return sql;
    }
    static PLACED: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut placed = PLACED.get_or_init(Default::default).lock().unwrap();
    placed.entry(sql).or_insert_with(|| {
        let p = idem_sql::placeholder::positional(sql);
        assert!(
            p.order.iter().enumerate().all(|(i, n)| i == *n),
            "a test statement uses its parameters out of order: {sql}"
        );
        Box::leak(p.text.into_owned().into_boxed_str())
    })
}

/// A single-connection pool on a private in-memory SQLite database holding [`TABLES`].
pub async fn sqlite_memory() -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(idem::sqlite_options("sqlite::memory:").unwrap())
        .await
        .unwrap();
    sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
    pool
}

/// A pool on a fresh SQLite file (WAL, busy timeout) holding [`TABLES`].
pub async fn sqlite_file(name: &str, max_connections: u32) -> SqlitePool {
    let path = scratch_file(&format!("{name}.db"));
    let pool = SqlitePoolOptions::new()
        .max_connections(max_connections)
        .connect_with(idem::sqlite_options(&format!("sqlite:{}", path.display())).unwrap())
        .await
        .unwrap();
    sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
    pool
}

/// A process-unique name part, so each test gets its own database or schema.
pub fn next_id() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A path under the target directory, with any earlier file (and WAL) removed.
pub fn scratch_file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idem-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// Runs the repository's `scripts/{name}` (a test cluster's own script) with `args`, under
/// the environment the test runs in, and fails the test if it fails.
///
/// It runs from a folder only this user can enter (as `.ci/run` runs them): the servers a
/// script restarts as another user must not depend on the caller's folder.
pub async fn script(name: &str, args: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    let path = format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let owned: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let command = path.clone();
    let private = std::env::temp_dir().join(format!("idem-script-{}", next_id()));
    std::fs::create_dir_all(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let folder = private.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(command)
            .current_dir(folder)
            .args(&owned)
            .output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("cannot run {path}: {e}"));
    let _ = std::fs::remove_dir(&private);
    assert!(
        output.status.success(),
        "scripts/{name} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
