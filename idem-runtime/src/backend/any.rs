//! `sqlx::Any`: the dialect is read from the connection at run time.
//!
//! An `Any` pool is configured by URL only, so on SQLite it cannot get the WAL journal of
//! [`sqlite_options`](crate::sqlite_options): run `PRAGMA journal_mode = WAL` once on the
//! database (the mode is persistent), or use an `after_connect` hook. Transactions still
//! begin with `BEGIN IMMEDIATE`.

use super::{Backend, Database, Dialect, Param, Record, generic};
use core::future::Future;
use sqlx::{Any, AnyConnection, Pool, Transaction};

impl super::sealed::Sealed for Any {}

impl generic::Bind for Any {
    fn bind<'a>(query: generic::Query<'a, Self>, param: Param<'a>) -> generic::Query<'a, Self> {
        match param {
            Param::Int(n) => query.bind(n),
            // `sqlx::Any` types every string as text: an ENUM state column needs the
            // `Postgres` backend.
            Param::Text(s) | Param::State(s) => query.bind(s),
            Param::Bytes(b) => query.bind(b),
            Param::Null => query.bind(None::<i64>),
            // `sqlx::Any` has no UUID type: bound as its text, which a PostgreSQL `uuid`
            // column refuses (use the `Postgres` backend for UUID keys) and a text column
            // accepts.
            #[cfg(feature = "uuid")]
            Param::Uuid(id) => query.bind(id.hyphenated().to_string()),
            Param::Column(value) => {
                generic::bind_column!(query, value, uuid = |id| id.hyphenated().to_string())
            }
        }
    }
}

fn unsupported(name: &str) -> sqlx::Error {
    let message = match Dialect::named(name) {
        Some(_) => format!(
            "this `sqlx::Any` connection is {name}: enable idem's `{}` feature to run on it",
            name.to_ascii_lowercase()
        ),
        None => format!(
            "idem runs on SQLite, PostgreSQL and MySQL; this `sqlx::Any` connection is {name}"
        ),
    };
    sqlx::Error::Configuration(message.into())
}

/// The dialect named by a URL scheme or a driver's name, if this build runs on it.
fn dialect_named(name: &str) -> Result<Dialect, sqlx::Error> {
    Dialect::named(name)
        .filter(|dialect| super::runs_on_any(*dialect))
        .ok_or_else(|| unsupported(name))
}

impl Backend for Any {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        let scheme = pool.connect_options().database_url.scheme().to_owned();
        async move { pool.begin_with(dialect_named(&scheme)?.begin()).await }
    }

    fn writer_queue(pool: &Pool<Self>) -> Option<Database> {
        let url = &pool.connect_options().database_url;
        (Dialect::named(url.scheme()) == Some(Dialect::Sqlite))
            .then(|| Database::of_url(url.as_str()))
    }

    fn pool_dialect(pool: &Pool<Self>) -> Result<Dialect, sqlx::Error> {
        dialect_named(pool.connect_options().database_url.scheme())
    }

    fn dialect(conn: &AnyConnection) -> Result<Dialect, sqlx::Error> {
        dialect_named(conn.backend_name())
    }

    async fn fetch(
        conn: &mut AnyConnection,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Record>, sqlx::Error> {
        let dialect = Any::dialect(conn)?;
        generic::fetch::<Any>(conn, dialect, sql, params).await
    }

    async fn fetch_all(
        conn: &mut AnyConnection,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Record>, sqlx::Error> {
        let dialect = Any::dialect(conn)?;
        generic::fetch_all::<Any>(conn, dialect, sql, params).await
    }

    async fn fetch_each<'a, F: FnMut(Record) + Send + 'a>(
        conn: &'a mut AnyConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
        each: F,
    ) -> Result<(), sqlx::Error> {
        let dialect = Any::dialect(conn)?;
        generic::fetch_each::<Any, F>(conn, dialect, sql, params, each).await
    }

    async fn execute(
        conn: &mut AnyConnection,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, sqlx::Error> {
        let dialect = Any::dialect(conn)?;
        let rows_affected = sqlx::any::AnyQueryResult::rows_affected;
        generic::execute::<Any>(conn, dialect, sql, params, rows_affected).await
    }

    async fn execute_script(conn: &mut AnyConnection, sql: &str) -> Result<(), sqlx::Error> {
        // A query without arguments runs as a script (PostgreSQL's simple protocol; SQLite
        // steps through every statement), and its future is already `Send`.
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }
}
