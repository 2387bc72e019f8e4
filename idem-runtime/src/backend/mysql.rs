//! MySQL and MariaDB (InnoDB): plain `BEGIN`, positional `?` parameters, and a miss
//! classified by a second, locking read.

use super::{Backend, Database, Dialect, Param, Record, generic};
use core::future::Future;
use sqlx::{MySql, MySqlConnection, Pool, Transaction};

impl super::sealed::Sealed for MySql {}

/// The server's error number, if MySQL's driver raised `error` (its SQLSTATE is too
/// coarse to read: a lock wait timeout is `HY000`).
pub(super) fn raised(error: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    error
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(sqlx::mysql::MySqlDatabaseError::number)
}

generic::bind_natively!(MySql);

impl Backend for MySql {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin()
    }

    fn writer_queue(_: &Pool<Self>) -> Option<Database> {
        None
    }

    fn dialect(_: &MySqlConnection) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::MySql)
    }

    fn pool_dialect(_: &Pool<Self>) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::MySql)
    }

    fn fetch<'a>(
        conn: &'a mut MySqlConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a {
        generic::fetch::<MySql>(conn, Dialect::MySql, sql, params)
    }

    fn execute<'a>(
        conn: &'a mut MySqlConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        generic::execute::<MySql>(
            conn,
            Dialect::MySql,
            sql,
            params,
            sqlx::mysql::MySqlQueryResult::rows_affected,
        )
    }

    async fn execute_script(conn: &mut MySqlConnection, sql: &str) -> Result<(), sqlx::Error> {
        // A query without arguments runs as text, several statements at once (sqlx asks
        // for CLIENT_MULTI_STATEMENTS), and its future is already `Send`.
        sqlx::Executor::execute(conn, sql).await.map(drop)
    }
}
