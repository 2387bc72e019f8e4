//! SQLite: `BEGIN IMMEDIATE`, WAL and a busy timeout.

use super::{Backend, Database, Dialect, generic};
use core::future::Future;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Pool, Sqlite, SqliteConnection, Transaction};
use std::time::Duration;

impl super::sealed::Sealed for Sqlite {}

/// Whether SQLite's driver raised `error` (its codes are extended result codes).
pub(super) fn raised(error: &dyn sqlx::error::DatabaseError) -> bool {
    error
        .try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .is_some()
}
generic::bind_natively!(Sqlite);

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

    fn dialect(_: &SqliteConnection) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::Sqlite)
    }

    fn pool_dialect(_: &Pool<Self>) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::Sqlite)
    }

    generic::run_generically!(
        Sqlite,
        SqliteConnection,
        Dialect::Sqlite,
        sqlx::sqlite::SqliteQueryResult
    );
}

/// Connect options for a SQLite database used by idem: WAL journal, `synchronous = FULL`,
/// a 5 s busy timeout so writers queue instead of failing, and the file created if
/// missing.
///
/// **Durability.** With `FULL`, a commit is on disk (the WAL is synced) before `COMMIT`
/// returns, so an outcome idem reported as applied survives a power loss. `NORMAL` syncs
/// only at checkpoints: still safe against a crash of the application, but a power loss or
/// an OS crash can lose the last commits — already acknowledged, so their messages would
/// not be redelivered and their effects would be gone. Opt into it where that is
/// acceptable and throughput matters (the cost of each is in `BENCHMARKS.md`):
///
/// ```
/// # async fn run() -> Result<(), sqlx::Error> {
/// use sqlx::sqlite::SqliteSynchronous;
/// // The default: durable commits.
/// let pool = sqlx::SqlitePool::connect_with(idem::sqlite_options("sqlite:orders.db")?).await?;
/// // Opt-in: faster, and may lose the last commits on power loss.
/// let options = idem::sqlite_options("sqlite:cache.db")?.synchronous(SqliteSynchronous::Normal);
/// # let _ = (pool, options); Ok(()) }
/// ```
pub fn sqlite_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(url
        .parse::<SqliteConnectOptions>()?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5)))
}
