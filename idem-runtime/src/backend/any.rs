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
    sqlx::Error::Configuration(
        format!("idem runs on SQLite and PostgreSQL; this `sqlx::Any` pool is {name}").into(),
    )
}

impl Backend for Any {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        let scheme = pool.connect_options().database_url.scheme().to_owned();
        async move {
            let dialect = Dialect::named(&scheme).ok_or_else(|| unsupported(&scheme))?;
            pool.begin_with(dialect.begin()).await
        }
    }

    fn writer_queue(pool: &Pool<Self>) -> Option<Database> {
        let url = &pool.connect_options().database_url;
        (Dialect::named(url.scheme()) == Some(Dialect::Sqlite))
            .then(|| Database::of_url(url.as_str()))
    }

    fn pool_dialect(pool: &Pool<Self>) -> Result<Dialect, sqlx::Error> {
        let scheme = pool.connect_options().database_url.scheme().to_owned();
        Dialect::named(&scheme).ok_or_else(|| unsupported(&scheme))
    }

    fn dialect(conn: &AnyConnection) -> Dialect {
        // Only reached inside a transaction begun above, which refused other backends.
        Dialect::named(conn.backend_name()).unwrap_or(Dialect::Postgres)
    }

    fn fetch<'a>(
        conn: &'a mut AnyConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a {
        generic::fetch::<Any>(conn, sql, params)
    }

    fn execute<'a>(
        conn: &'a mut AnyConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        generic::execute::<Any>(conn, sql, params, sqlx::any::AnyQueryResult::rows_affected)
    }

    async fn execute_script(conn: &mut AnyConnection, sql: &str) -> Result<(), sqlx::Error> {
        // A query without arguments runs as a script (PostgreSQL's simple protocol; SQLite
        // steps through every statement), and its future is already `Send`.
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }
}
