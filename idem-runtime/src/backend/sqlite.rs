//! SQLite: `BEGIN IMMEDIATE`, WAL and a busy timeout.

use super::{Backend, Database, Dialect, Param, Record, generic};
use core::future::Future;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Pool, Sqlite, SqliteConnection, Transaction};
use std::time::Duration;

impl super::sealed::Sealed for Sqlite {}

impl Backend for Sqlite {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin_with(Dialect::Sqlite.begin())
    }

    fn writer_queue(pool: &Pool<Self>) -> Option<Database> {
        // In-memory databases get a unique name per pool from sqlx.
        Some(Database::of_file(pool.connect_options().get_filename()))
    }

    fn dialect(_: &SqliteConnection) -> Dialect {
        Dialect::Sqlite
    }

    fn fetch<'a>(
        conn: &'a mut SqliteConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a {
        generic::fetch::<Sqlite>(conn, sql, params)
    }

    fn execute<'a>(
        conn: &'a mut SqliteConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        generic::execute::<Sqlite>(
            conn,
            sql,
            params,
            sqlx::sqlite::SqliteQueryResult::rows_affected,
        )
    }
}

/// Connect options for a SQLite database used by idem: WAL journal, `synchronous = NORMAL`
/// (durable at each WAL checkpoint, safe against application crashes), a 5 s busy
/// timeout so writers queue instead of failing, and the file created if missing.
///
/// ```
/// # async fn run() -> Result<(), sqlx::Error> {
/// let pool = sqlx::SqlitePool::connect_with(idem::sqlite_options("sqlite:orders.db")?).await?;
/// # Ok(()) }
/// ```
pub fn sqlite_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(url
        .parse::<SqliteConnectOptions>()?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5)))
}
