//! Installing idem's schema: DDL run in one write transaction on a pool, as the pool's
//! backend spells it (the inbox's migration, a machine's results table, its enforcement).

use super::{Backend, Dialect, begin_write};
use sqlx::Pool;

/// One piece of DDL, without parameters.
pub(crate) enum Ddl<'a> {
    /// One statement (a prepared statement holds one command).
    Statement(&'a str),
    /// A script of several statements, sent as one.
    Script(&'a str),
}

/// Opens a write transaction on `pool`, runs in it, in order, the DDL `ddl` gives for the
/// dialect of its connection, and commits. The first error ends it (the transaction is
/// rolled back) and is returned as the database gave it.
pub(crate) async fn install<DB: Backend, I>(
    pool: &Pool<DB>,
    ddl: impl FnOnce(Dialect) -> I,
) -> Result<(), sqlx::Error>
where
    I: IntoIterator<Item = Ddl<'static>>,
{
    let (mut tx, _writer) = begin_write(pool).await?;
    for ddl in ddl(DB::dialect(&tx)?) {
        match ddl {
            Ddl::Statement(statement) => {
                DB::execute(&mut tx, statement, &[]).await?;
            }
            Ddl::Script(script) => DB::execute_script(&mut tx, script).await?,
        }
    }
    tx.commit().await
}
