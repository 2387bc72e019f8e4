//! Real brokers for the integration tests, and the effect store their consumers write to.
//!
//! NATS (with JetStream) runs when `IDEM_TEST_NATS_URL` is set, RabbitMQ when
//! `IDEM_TEST_AMQP_URL` is set; with `IDEM_TEST_REQUIRE_SERVERS=1` (as in CI) an unset URL
//! is a failure, never a silent skip. Every test declares its own stream or queue under a
//! name unique to the process ([`unique`]) and deletes it when it ends, passed or failed
//! ([`cleanup_after`]).
//!
//! Include it next to `mod common;` with `#[path = "common/brokers.rs"] mod brokers;`.

#![allow(dead_code)]

use crate::common;
use idem::inbox::{Delivery, Inbox, MessageKey, Received};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn require_servers() -> bool {
    std::env::var("IDEM_TEST_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

fn server_url(variable: &str, what: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if require_servers() => {
            panic!("{variable} is not set, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping")
        }
        _ => {
            eprintln!("skipped: set {variable} to run the {what} tests");
            None
        }
    }
}

/// The NATS URL (a server with JetStream), or `None` (test skipped).
pub fn nats_url() -> Option<String> {
    server_url("IDEM_TEST_NATS_URL", "NATS JetStream")
}

/// The AMQP URL (RabbitMQ), or `None` (test skipped).
pub fn amqp_url() -> Option<String> {
    server_url("IDEM_TEST_AMQP_URL", "RabbitMQ")
}

/// `{prefix}-{pid}-{start}-{n}`: a stream or queue name no other process (and no other
/// test of this one) uses. Letters, digits, `-` and `_` only, valid for both brokers.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000_000
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{start}-{n}", std::process::id())
}

/// Runs `body` on its own task, then `cleanup` (even if `body` panicked), then re-raises
/// the panic: broker resources never outlive a failed test.
pub async fn cleanup_after<T: Send + 'static>(
    body: impl Future<Output = T> + Send + 'static,
    cleanup: impl AsyncFnOnce(),
) -> T {
    let result = tokio::spawn(body).await;
    cleanup().await;
    match result {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Where a handler waits inside its transaction, after its effect and before the commit.
#[derive(Debug, Clone, Copy)]
pub enum Pause {
    /// Commit at once.
    None,
    /// Work this long (a slow handler).
    Sleep(Duration),
    /// Print `idem-child: crash-point <name>` and never commit: the process is killed here.
    Forever(&'static str),
}

/// The database a consumer writes its effects to: PostgreSQL, MySQL or an SQLite file,
/// holding [`common::TABLES`] (MySQL: [`common::MYSQL_TABLES`]) and idem's tables.
#[derive(Debug, Clone)]
pub enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

/// One delivery through the inbox, the effect being one row in `effects`; the result is
/// the effect's order id.
macro_rules! deliver {
    ($pool:expr, $inbox:expr, $key:expr, $payload:expr, $order:expr, $pause:expr, $positional:expr) => {
        match $inbox
            .receive($pool, $key, $payload)
            .await
            .map_err(idem::Error::widen)?
        {
            Received::New(mut receipt) => {
                let effect = sqlx::query($crate::common::placed(
                    $positional,
                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 1)",
                ))
                .bind($order)
                .execute(&mut **receipt.transaction())
                .await;
                match $pause {
                    Pause::None => {}
                    Pause::Sleep(work) => tokio::time::sleep(work).await,
                    Pause::Forever(point) => {
                        println!("idem-child: crash-point {point}");
                        std::future::pending::<()>().await;
                    }
                }
                receipt.finish(effect.map(|_| $order)).await
            }
            Received::Done(delivery) => Ok(delivery),
        }
    };
}

impl Db {
    /// A fresh PostgreSQL schema `idem_test_{name}` (see [`common::postgres`]), migrated;
    /// `None` when PostgreSQL is not configured.
    pub async fn postgres(name: &str, max_connections: u32) -> Option<Db> {
        let pool = common::postgres(name, max_connections).await?;
        idem::migrate(&pool).await.unwrap();
        Some(Db::Postgres(pool))
    }

    /// A fresh MySQL database `idem_test_{name}` (see [`common::mysql`]), migrated; `None`
    /// when MySQL is not configured.
    pub async fn mysql(name: &str, max_connections: u32) -> Option<Db> {
        let pool = common::mysql(name, max_connections).await?;
        idem::migrate(&pool).await.unwrap();
        Some(Db::MySql(pool))
    }

    /// A fresh SQLite file `{name}.db` (see [`common::sqlite_file`]), migrated.
    pub async fn sqlite(name: &str, max_connections: u32) -> Db {
        let pool = common::sqlite_file(name, max_connections).await;
        idem::migrate(&pool).await.unwrap();
        Db::Sqlite(pool)
    }

    /// How another process reaches this database: see [`Db::connect`].
    pub fn spec(&self) -> String {
        match self {
            Db::Postgres(pool) => {
                let options = pool.connect_options();
                format!("postgres:{}", options.get_application_name().unwrap())
            }
            Db::Sqlite(pool) => {
                let options = pool.connect_options();
                format!("sqlite:{}", options.get_filename().display())
            }
            Db::MySql(pool) => {
                let options = pool.connect_options();
                format!("mysql:{}", options.get_database().unwrap())
            }
        }
    }

    /// Connects to a database made by [`Db::postgres`] or [`Db::sqlite`] in another
    /// process, from its [`Db::spec`]; nothing is recreated.
    pub async fn connect(spec: &str) -> Db {
        if let Some(database) = spec.strip_prefix("mysql:") {
            let url = common::mysql_url().expect("the parent test ran on MySQL");
            let options = sqlx::mysql::MySqlConnectOptions::from_str(&url)
                .unwrap()
                .database(database);
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            return Db::MySql(pool);
        }
        if let Some(schema) = spec.strip_prefix("postgres:") {
            let url = common::postgres_url().expect("the parent test ran on PostgreSQL");
            let options = PgConnectOptions::from_str(&url)
                .unwrap()
                .options([("search_path", schema)])
                .application_name(schema);
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            Db::Postgres(pool)
        } else {
            let options = idem::sqlite_options(spec).unwrap().create_if_missing(false);
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .unwrap();
            Db::Sqlite(pool)
        }
    }

    /// Handles one delivery of `order`'s message through `inbox`: the effect (a row in
    /// `effects`) and the inbox record commit together, after `pause`.
    pub async fn deliver(
        &self,
        inbox: &Inbox,
        key: &MessageKey,
        payload: &[u8],
        order: i64,
        pause: Pause,
    ) -> Result<Delivery<i64>, idem::Error<sqlx::Error>> {
        match self {
            Db::Postgres(pool) => deliver!(pool, inbox, key, payload, order, pause, false),
            Db::Sqlite(pool) => deliver!(pool, inbox, key, payload, order, pause, false),
            Db::MySql(pool) => deliver!(pool, inbox, key, payload, order, pause, true),
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        match self {
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Db::MySql(pool) => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
        }
    }

    /// The effects committed: rows in `effects`.
    pub async fn effects(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM effects").await
    }

    /// The distinct orders with an effect.
    pub async fn distinct_effects(&self) -> i64 {
        self.count("SELECT COUNT(DISTINCT order_id) FROM effects")
            .await
    }

    /// The committed inbox records.
    pub async fn records(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idem_inbox").await
    }
}

/// What a test reports about a delivery's outcome, in one word.
pub fn outcome_name<T>(delivery: &Delivery<T>) -> &'static str {
    delivery.kind()
}

/// What a producer that retried sends: each of `messages` messages one to three times,
/// shuffled (seeded, so a failure reproduces).
pub fn retried_copies(messages: i64, seed: u64) -> Vec<i64> {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut copies: Vec<i64> = (0..messages)
        .flat_map(|m| std::iter::repeat_n(m, rng.random_range(1..=3)))
        .collect();
    copies.shuffle(&mut rng);
    copies
}
