//! Where statements from a pool run: a transaction, or a connection in autocommit where a
//! plan needs no transaction — unless statements are unnamed ([`pooler`](super::pooler)),
//! which must run inside one.

use super::{
    Backend, WriterGuard, acquire_write, begin_write, begin_write_within, pooler::unnamed,
};
use sqlx::{Pool, Transaction};
use std::time::Duration;

/// A transaction from a pool, or a connection of it in autocommit.
pub(crate) enum Opened<DB: Backend> {
    Transaction(Transaction<'static, DB>),
    Autocommit(sqlx::pool::PoolConnection<DB>),
}

impl<DB: Backend> Opened<DB> {
    /// Opens one to write, after the writer's turn (within `patience`, if given; `None` if
    /// it ran out): in autocommit if `autocommit` and the pool's statements may run
    /// outside a transaction, else a write transaction. The guard must outlive it.
    pub(crate) async fn open(
        pool: &Pool<DB>,
        autocommit: bool,
        patience: Option<Duration>,
    ) -> Result<Option<(Self, Option<WriterGuard>)>, sqlx::Error> {
        if autocommit && !in_transaction(pool) {
            let opened = acquire_write(pool, patience).await?;
            return Ok(opened.map(|(conn, writer)| (Opened::Autocommit(conn), writer)));
        }
        let begun = match patience {
            None => Some(begin_write(pool).await?),
            Some(patience) => begin_write_within(pool, patience).await?,
        };
        Ok(begun.map(|(tx, writer)| (Opened::Transaction(tx), writer)))
    }

    /// Opens one to read (a gauge, a schema check): a connection in autocommit, or a
    /// transaction where statements must run inside one. End it with [`end`](Self::end);
    /// dropped, its transaction rolls back when the connection returns to the pool.
    pub(crate) async fn read(pool: &Pool<DB>) -> Result<Self, sqlx::Error> {
        Ok(if in_transaction(pool) {
            Opened::Transaction(pool.begin().await?)
        } else {
            Opened::Autocommit(pool.acquire().await?)
        })
    }

    /// Its connection.
    pub(crate) fn connection(&mut self) -> &mut DB::Connection {
        match self {
            Opened::Transaction(tx) => tx,
            Opened::Autocommit(conn) => conn,
        }
    }

    /// Ends it: commits or rolls back the transaction; an autocommit connection has
    /// nothing left to end.
    pub(crate) async fn end(self, commit: bool) -> Result<(), sqlx::Error> {
        match self {
            Opened::Transaction(tx) if commit => tx.commit().await,
            Opened::Transaction(tx) => tx.rollback().await,
            Opened::Autocommit(_) => Ok(()),
        }
    }
}

/// Whether every statement on `pool` must run inside a transaction (an `sqlx::Any` pool on
/// a backend idem does not run on has no dialect: its first statement says so).
fn in_transaction<DB: Backend>(pool: &Pool<DB>) -> bool {
    DB::pool_dialect(pool).is_ok_and(unnamed)
}
