//! Where a handler's unit of work runs, as its first parameter says: a pool (idem begins
//! and commits) or the caller's transaction (idem works in a savepoint of it); and, for a
//! handler whose first parameter is a pool, which database that pool is of.

use crate::backend::Backend;
use sqlx::{Pool, Transaction};

/// Where a handler's unit of work runs: a pool (idem begins and commits a transaction of
/// its own) or a transaction the caller owns (idem works in a savepoint of it; the caller
/// commits).
///
/// An `#[idempotent]` handler takes either as its first argument:
/// `pay(&pool, 7, 1000)` or `pay(&mut tx, 7, 1000)` (inside another handler's body:
/// `pay(&mut *tx, 7, 1000)`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is neither a pool nor a transaction of this handler's database",
    label = "pass `&pool` (idem begins and commits) or a `&mut Transaction` (idem works inside it)",
    note = "a `tx: Transaction<…>` of yours is passed as `&mut tx`; a `tx: &mut Transaction<…>` (another handler's body) as `&mut *tx`; the HTTP layer's `tx: idem::http::Tx<…>` as `&mut *tx`"
)]
pub trait Source<'c, DB: Backend>: Send + sealed::Sealed {
    /// Where the unit of work begins.
    #[doc(hidden)]
    fn origin(self) -> Origin<'c, DB>;
}

/// Where a unit of work begins, see [`Source`].
#[doc(hidden)]
pub enum Origin<'c, DB: Backend> {
    /// A transaction of its own, from this pool.
    Pool(Pool<DB>),
    /// A savepoint on this connection, inside the caller's transaction.
    Within(&'c mut DB::Connection),
}

mod sealed {
    pub trait Sealed {}
    impl<DB: sqlx::Database> Sealed for &sqlx::Pool<DB> {}
    impl<DB: sqlx::Database> Sealed for &mut sqlx::Transaction<'_, DB> {}
}

impl<'c, DB: Backend> Source<'c, DB> for &Pool<DB> {
    fn origin(self) -> Origin<'c, DB> {
        Origin::Pool(self.clone())
    }
}

impl<'c, DB: Backend> Source<'c, DB> for &'c mut Transaction<'_, DB> {
    fn origin(self) -> Origin<'c, DB> {
        Origin::Within(&mut **self)
    }
}

/// The database of a pool type (`PgPool` → `Postgres`): how a handler whose first
/// parameter is a pool, under whatever alias, learns its backend.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a pool of a database idem runs on",
    label = "the first parameter of a handler is `&mut Transaction<'_, DB>` or `&Pool<DB>`",
    note = "DB is one of `Sqlite`, `Postgres`, `Any`: `&SqlitePool`, `&PgPool`, `&AnyPool`"
)]
pub trait PoolOf {
    /// The pool's database.
    type Database: crate::Backend;
}

impl<DB: crate::Backend> PoolOf for sqlx::Pool<DB> {
    type Database = DB;
}
