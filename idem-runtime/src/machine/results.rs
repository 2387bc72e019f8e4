//! The table idem keeps first results in.

use crate::backend::Backend;
use crate::backend::ddl::{Ddl, install};
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
    install(pool, |dialect| {
        let sql = M::DEFINITION.sql.of(dialect);
        [Ddl::Statement(sql.create_results_table)]
    })
    .await
}
