//! Installing a machine's enforcement in the database (see [`Statements::enforce`]).
//!
//! [`Statements::enforce`]: crate::Statements::enforce

use crate::backend::Backend;
use crate::backend::ddl::{Ddl, install};
use crate::machine::definition::Machine;
use sqlx::Pool;

/// Makes the database enforce the state machine `M`, whoever writes its table: the state
/// column holds only declared states, and an UPDATE moves it only along a declared
/// transition — so a hand-written `UPDATE orders SET status = 'SHIPPED'` elsewhere in a
/// codebase fails instead of breaking the workflow. idem's own transitions pass.
///
/// On PostgreSQL: a CHECK constraint `idem_<table>_<state>_declared` and a row trigger
/// `idem_<table>_<state>_edges`, whose refusal is SQLSTATE 23514 (`check_violation`) with a
/// message naming both states. On SQLite, which cannot add a constraint to a table, two
/// triggers (`…_declared` on INSERT, `…_edges` on UPDATE) that abort the statement; on
/// MySQL and MariaDB the same two triggers, refusing with `SIGNAL SQLSTATE '23000'` (error
/// 1644). A name over 63 bytes (PostgreSQL's limit; MySQL's is 64) is cut to 63, ending
/// in 12 hex digits of a digest of the whole name and the object's kind
/// (`idem_orders_kept_by_the_billing_departmen_5febecd79c02_declared`), so two tables
/// whose names share a long prefix never share a trigger or a function; the objects an
/// older idem made under the whole name (SQLite) or under PostgreSQL's cut of it are
/// dropped by the script (such a function, unused, is left). NULL states are left to the
/// column's own `NOT NULL`. The script is
/// `M::IDEM_SQL.of(Dialect::Postgres).enforce` (and so on for each
/// [`Dialect`](crate::Dialect)): run it here, once at start-up (it is rerunnable: every
/// object is dropped or replaced first), or copy it into your migrations.
///
/// Adding the CHECK fails if a row already holds an undeclared state: run
/// [`verify`](crate::verify) first, and correct or declare what it lists. The cost on each
/// transition is measured in BENCHMARKS.md ("The database enforcing the machine").
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
/// idem::enforce::<Order, _>(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn enforce<M: Machine, DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    install(pool, |dialect| {
        let script = M::DEFINITION.sql.of(dialect).enforce;
        [Ddl::Script(script)]
    })
    .await
}
