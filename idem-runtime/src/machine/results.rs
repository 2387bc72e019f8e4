//! The table idem keeps first results in.

use crate::backend::{Backend, begin_write};
use crate::machine::definition::Machine;
use sqlx::Pool;

/// Creates the results table of machine `M` if it does not exist (see
/// [`Statements::create_results_table`](crate::Statements::create_results_table) for the
/// DDL per backend, to copy into your own migrations instead).
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
/// idem::create_results_table::<Order, _>(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn create_results_table<M: Machine, DB: Backend>(
    pool: &Pool<DB>,
) -> Result<(), sqlx::Error> {
    let (mut tx, _writer) = begin_write(pool).await?;
    let sql = M::DEFINITION.sql.of(DB::dialect(&tx)?);
    DB::execute(&mut tx, sql.create_results_table, &[]).await?;
    tx.commit().await
}
