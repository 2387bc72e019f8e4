//! PostgreSQL: one statement attempts the transition and classifies a miss.

use super::{Backend, Database, Dialect, Param, Record, generic};
use core::future::Future;
use sqlx::{PgConnection, Pool, Postgres, Transaction};

impl super::sealed::Sealed for Postgres {}
generic::bind_natively!(Postgres);

impl Backend for Postgres {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin()
    }

    fn writer_queue(_: &Pool<Self>) -> Option<Database> {
        None
    }

    fn dialect(_: &PgConnection) -> Dialect {
        Dialect::Postgres
    }

    fn fetch<'a>(
        conn: &'a mut PgConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send + 'a {
        generic::fetch::<Postgres>(conn, sql, params)
    }

    fn execute<'a>(
        conn: &'a mut PgConnection,
        sql: &'a str,
        params: &'a [Param<'a>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        generic::execute::<Postgres>(
            conn,
            sql,
            params,
            sqlx::postgres::PgQueryResult::rows_affected,
        )
    }
}
