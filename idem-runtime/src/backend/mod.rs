//! The databases idem runs on, where transactions come from, and what their errors mean (a
//! lost conflict, a duplicate key, a lock timeout), also inside a handler's own errors
//! ([`conflict`]).
//!
//! All backends share one generic implementation ([`generic`]); a backend only says
//! which [`Dialect`] of the generated SQL it speaks and how a write transaction begins.

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "any"
))]
mod generic;

mod conflict;
pub(crate) mod ddl;
mod opened;
mod pooler;
mod writers;

#[cfg(feature = "any")]
mod any;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub(crate) use conflict::carries;
pub use conflict::is_conflict_source;
pub(crate) use opened::Opened;
#[cfg_attr(not(feature = "postgres"), allow(unused_imports))]
pub(crate) use pooler::unnamed;
pub use pooler::{PostgresStatements, set_postgres_statements};
#[cfg(feature = "postgres")]
pub use postgres::refuse_standby;
#[cfg(feature = "sqlite")]
pub use sqlite::sqlite_options;
use writers::wait_turn;
pub(crate) use writers::{Database, WriterGuard, holding};

use core::future::Future;
use sqlx::{Pool, Transaction};

/// A database idem can run transitions on: `sqlx::Sqlite` (feature `sqlite`),
/// `sqlx::Postgres` (feature `postgres`), `sqlx::MySql` (feature `mysql`: MySQL and
/// MariaDB) and `sqlx::Any` (feature `any`: the backend is chosen at run time from the
/// URL; on MySQL it also needs the feature `mysql`).
///
/// SQLite transactions begin with `BEGIN IMMEDIATE`. Build SQLite pools with
/// [`sqlite_options`](crate::sqlite_options) (WAL, busy timeout). An `sqlx::Any` pool is
/// configured by URL only: on SQLite, set `PRAGMA journal_mode = WAL` once on the database
/// file (it persists) or in an `after_connect` hook.
///
/// Sealed: the SQL idem generates is written and tested for these backends only.
pub trait Backend: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_;

    /// The database whose writers idem queues in the process before beginning (SQLite);
    /// `None` where the database queues writers itself (PostgreSQL).
    #[doc(hidden)]
    fn writer_queue(pool: &Pool<Self>) -> Option<Database>;

    /// The dialect a connection speaks (`sqlx::Any`: an error for a backend idem does not
    /// run on).
    #[doc(hidden)]
    fn dialect(conn: &Self::Connection) -> Result<Dialect, sqlx::Error>;

    /// The dialect of the pool's connections, before taking one (`sqlx::Any`: from the
    /// URL; an error for a backend idem does not run on).
    #[doc(hidden)]
    fn pool_dialect(pool: &Pool<Self>) -> Result<Dialect, sqlx::Error>;

    #[doc(hidden)]
    fn fetch<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a;

    /// Runs `sql` with `params` and decodes every row.
    #[doc(hidden)]
    fn fetch_all<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Vec<Record>, sqlx::Error>> + Send + 'a;

    /// Runs `sql` with `params` and hands each row to `each` as it arrives (streamed).
    #[doc(hidden)]
    fn fetch_each<'a, F: FnMut(Record) + Send + 'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        params: &'a [Param<'a>],
        each: F,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    #[doc(hidden)]
    fn execute<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;

    /// Runs a script of several statements, none with parameters (DDL).
    #[doc(hidden)]
    fn execute_script<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;
}

/// A bound value.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Int(i64),
    Text(&'a str),
    /// Bytes, bound as a blob (`BYTEA`, `BLOB`).
    Bytes(&'a [u8]),
    /// A state name, compared with or assigned to the state column: bound so that the
    /// column's own type applies (PostgreSQL: `text`, `varchar` or an ENUM).
    State(&'a str),
    /// NULL, typed as an integer.
    Null,
    /// A UUID, bound as the driver binds `uuid::Uuid`.
    #[cfg(feature = "uuid")]
    Uuid(uuid::Uuid),
    /// The value of a column a handler sets in its transition.
    Column(&'a crate::value::column::ColumnValue),
}

/// A row as idem reads it: every column an integer, text, bytes or NULL.
#[doc(hidden)]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Record {
    pub values: Vec<(String, Value)>,
}

/// One column's value.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    /// A binary column's value that is not UTF-8 (one that is reads as text).
    Bytes(Vec<u8>),
}

impl Record {
    fn value(&self, column: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(name, _)| name == column)
            .map(|(_, v)| v)
    }

    /// The integer in `column`; `None` if NULL or absent.
    pub fn int(&self, column: &str) -> Option<i64> {
        match self.value(column) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        }
    }

    /// The text in `column`, taken out; `None` if NULL or absent.
    pub fn take_text(&mut self, column: &str) -> Option<String> {
        let value = self
            .values
            .iter_mut()
            .find(|(name, _)| name == column)
            .map(|(_, v)| v)?;
        match std::mem::replace(value, Value::Null) {
            Value::Text(s) => Some(s),
            other => {
                *value = other;
                None
            }
        }
    }
}

impl Record {
    /// The bytes in `column` (text as its UTF-8), taken out; `None` if NULL or absent.
    pub fn take_bytes(&mut self, column: &str) -> Option<Vec<u8>> {
        let value = self
            .values
            .iter_mut()
            .find(|(name, _)| name == column)
            .map(|(_, v)| v)?;
        match std::mem::replace(value, Value::Null) {
            Value::Text(s) => Some(s.into_bytes()),
            Value::Bytes(b) => Some(b),
            other => {
                *value = other;
                None
            }
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Which backend a connection speaks: its statements, its BEGIN, its error codes
/// (`idem_sql::dialect`, the one place they are written down).
pub use idem_sql::dialect::Dialect;
use idem_sql::dialect::ErrorClass;

/// Opens a write transaction, after waiting for this process's turn to write where the
/// backend needs one (SQLite, see [`writers`]). The guard must outlive the transaction.
pub(crate) async fn begin_write<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<(Transaction<'static, DB>, Option<WriterGuard>), sqlx::Error> {
    let writer = match DB::writer_queue(pool) {
        Some(database) => Some(wait_turn(database).await?),
        None => None,
    };
    Ok((DB::begin_pool(pool).await?, writer))
}

/// [`begin_write`], waiting at most `patience` for the turn to write (only that: opening
/// the transaction itself is not cut short); `None` if it ran out.
pub(crate) async fn begin_write_within<DB: Backend>(
    pool: &Pool<DB>,
    patience: std::time::Duration,
) -> Result<Option<(Transaction<'static, DB>, Option<WriterGuard>)>, sqlx::Error> {
    let writer = match DB::writer_queue(pool) {
        Some(database) => match tokio::time::timeout(patience, wait_turn(database)).await {
            Ok(guard) => Some(guard?),
            Err(_) => return Ok(None),
        },
        None => None,
    };
    Ok(Some((DB::begin_pool(pool).await?, writer)))
}

/// A connection from `pool` in autocommit (each statement its own transaction), after
/// waiting for this process's turn to write where the backend needs one, at most
/// `patience` if given (`None` if it ran out). The guard must outlive the connection's use.
pub(crate) async fn acquire_write<DB: Backend>(
    pool: &Pool<DB>,
    patience: Option<std::time::Duration>,
) -> Result<Option<(sqlx::pool::PoolConnection<DB>, Option<WriterGuard>)>, sqlx::Error> {
    let writer = match (DB::writer_queue(pool), patience) {
        (Some(database), None) => Some(wait_turn(database).await?),
        (Some(database), Some(patience)) => {
            match tokio::time::timeout(patience, wait_turn(database)).await {
                Ok(guard) => Some(guard?),
                Err(_) => return Ok(None),
            }
        }
        (None, _) => None,
    };
    Ok(Some((pool.acquire().await?, writer)))
}

/// Runs an INSERT that gives way to a row with its unique key: the rows it inserted, 0
/// when the key is taken. Where the dialect has no `ON CONFLICT … DO NOTHING` (MySQL), the
/// statement fails on a taken key with the duplicate-key error, read here as 0: only for
/// a table whose one unique index is that key (idem's own).
pub(crate) async fn insert_unless_taken<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    sql: &str,
    params: &[Param<'_>],
) -> Result<u64, sqlx::Error> {
    match DB::execute(conn, sql, params).await {
        Err(e) if dialect.refuses_taken_keys() && is_duplicate(&e) => Ok(0),
        done => done,
    }
}

/// Whether a unique index refused the row (only that statement failed).
pub(crate) fn is_duplicate(error: &sqlx::Error) -> bool {
    error_class(error) == ErrorClass::Duplicate
}

/// Whether a retry of the whole transaction may succeed: serialization failures and
/// deadlocks (PostgreSQL 40001, 40P01; MySQL 1213, MariaDB 1020), a busy or locked SQLite
/// database, a lost connection, an exhausted pool, a server that ended the connection or
/// cannot serve yet (PostgreSQL 57P01–57P03 and class 08, as a failover cuts connections;
/// MySQL 1053, 1927, and 1047 from a Galera node outside the cluster's primary component).
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        other => matches!(
            error_class(other),
            ErrorClass::Conflict | ErrorClass::Unavailable
        ),
    }
}

/// Whether the transaction lost a conflict with another one (serialization failure,
/// deadlock, a busy SQLite database): retrying it from the start is the cure.
pub(crate) fn is_conflict(error: &sqlx::Error) -> bool {
    error_class(error) == ErrorClass::Conflict
}

/// Whether a lock was not granted within the lock timeout (PostgreSQL's `lock_timeout`,
/// SQLSTATE 55P03): only the statement failed.
pub(crate) fn is_lock_timeout(error: &sqlx::Error) -> bool {
    error_class(error) == ErrorClass::LockTimeout
}

/// What a database error means, as the dialect of the driver that raised it says.
fn error_class(error: &sqlx::Error) -> ErrorClass {
    let sqlx::Error::Database(db) = error else {
        return ErrorClass::Other;
    };
    let Some(code) = db.code() else {
        return ErrorClass::Other;
    };
    match raised_by(db.as_ref(), &code) {
        Some((dialect, code)) => dialect.error(&code),
        None => ErrorClass::Other,
    }
}

/// The backend whose driver raised `error` (through `sqlx::Any` too: it passes the
/// driver's own error on). A driver this build does not know (an `sqlx::Any` pool on
/// PostgreSQL without idem's `postgres` feature) is told by its code: a SQLSTATE has five
/// characters, and SQLite's result codes are numbers below 10000.
fn raised_by<'c>(
    error: &dyn sqlx::error::DatabaseError,
    code: &'c str,
) -> Option<(Dialect, std::borrow::Cow<'c, str>)> {
    #[cfg(feature = "postgres")]
    if postgres::raised(error) {
        return Some((Dialect::Postgres, code.into()));
    }
    #[cfg(feature = "sqlite")]
    if sqlite::raised(error) {
        return Some((Dialect::Sqlite, code.into()));
    }
    #[cfg(feature = "mysql")]
    if let Some(number) = mysql::raised(error) {
        return Some((Dialect::MySql, number.to_string().into()));
    }
    let _ = error;
    (code.len() == 5).then_some((Dialect::Postgres, code.into()))
}

/// Whether this build runs on `dialect` through `sqlx::Any`: PostgreSQL and SQLite
/// always; MySQL with the feature `mysql`, which reads its error numbers.
#[cfg_attr(not(feature = "any"), allow(dead_code))]
pub(crate) fn runs_on_any(dialect: Dialect) -> bool {
    match dialect {
        Dialect::Postgres | Dialect::Sqlite => true,
        Dialect::MySql => cfg!(feature = "mysql"),
    }
}
