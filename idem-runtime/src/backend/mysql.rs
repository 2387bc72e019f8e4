//! MySQL and MariaDB (InnoDB): plain `BEGIN`, positional `?` parameters, and a miss
//! classified by a second, locking read.

use super::{Backend, Database, Dialect, generic};
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

    generic::run_generically!(
        MySql,
        MySqlConnection,
        Dialect::MySql,
        sqlx::mysql::MySqlQueryResult
    );
}
