//! Checking a live database against a machine's declaration, at start-up: one report with
//! every problem, instead of the first failing transition in production.

use crate::backend::{Backend, Dialect, Opened};
use crate::machine::definition::Machine;
use crate::schema::tables::{ColumnRole, SchemaProblem, columns, decode, fetch_json};
use idem_sql::catalog::TypeKind;
use sqlx::Pool;
use std::fmt;

/// How many undeclared state values a report names (it counts them all).
const SHOWN_STATES: usize = 10;

/// Checks the database behind `pool` against the state machine `M`, and returns one report
/// listing every problem found (an empty report when there is none):
///
/// - the machine's table exists, with its key, state and version columns; on PostgreSQL,
///   of types idem can use (a key column an integer, numeric, text or `uuid`; the state
///   column text, `varchar` or an ENUM; the version column an integer or numeric — a
///   domain counts as its base type). SQLite stores any value in any column, so there only
///   the columns' presence is checked;
/// - every state value in the table is one the machine declares, compared byte for byte
///   as `idem::enforce` compares them (`'CREATED '` or `'created'` is not `CREATED`, even
///   in a MySQL column whose collation says so), no row has a NULL state,
///   and no row has a NULL version (a transition never moves such a row: its guard is
///   `version IS NOT NULL`);
/// - the machine's results table exists with the columns idem uses;
/// - the inbox table `idem_inbox`, if the database has one (a service without an inbox
///   needs none), has the columns of this version of idem and, on PostgreSQL, no longer
///   the status CHECK constraint of the first migration (`idem::migrate` drops it);
/// - the outbox table `idem_outbox`, if the database has one, has the columns of this
///   version of idem, and on MySQL its relays' lock rows `idem_outbox_locks`;
/// - on MySQL, the key columns of both (results: machine, key, states; inbox: group, key)
///   compare byte for byte: a table of the first migration alone compares them under
///   `utf8mb4_bin`, which ignores trailing spaces, so `"k"` and `"k "` share one record
///   (`idem::migrate` or the migration `0002_idem_exact_keys.sql` makes them `VARBINARY`).
///
/// It reads the machine's table once (one `GROUP BY` of the state column, a full scan
/// unless the column is indexed): call it at start-up, not per request. `Err` only when
/// the database cannot be asked (a connection or permission error).
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// // Refuse to start on a database the handlers cannot work with.
/// idem::verify::<Order, _>(&pool).await?.into_result()?;
/// # Ok(()) }
/// ```
pub async fn verify<M: Machine, DB: Backend>(pool: &Pool<DB>) -> Result<SchemaReport, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let report = report::<M, DB>(opened.connection()).await?;
    opened.end(true).await?;
    Ok(report)
}

/// [`verify`]'s report, read on `conn`.
async fn report<M: Machine, DB: Backend>(
    conn: &mut DB::Connection,
) -> Result<SchemaReport, sqlx::Error> {
    let definition = M::DEFINITION;
    let dialect = DB::dialect(conn)?;
    let mut problems = Vec::new();
    let table = definition.table;

    match columns::<DB>(conn, dialect, table).await? {
        None => problems.push(SchemaProblem::MissingTable {
            table: table.to_owned(),
        }),
        Some(found) => {
            let mut present = |column: &str, role: ColumnRole| {
                let found = found.iter().find(|c| c.name == column);
                match found {
                    None => problems.push(SchemaProblem::MissingColumn {
                        table: table.to_owned(),
                        column: column.to_owned(),
                        role,
                    }),
                    Some(found) if !usable_as(found.kind, role) => {
                        problems.push(SchemaProblem::UnusableType {
                            table: table.to_owned(),
                            column: column.to_owned(),
                            role,
                            found: found.type_name.clone(),
                        })
                    }
                    Some(_) => return true,
                }
                false
            };
            for key in definition.key_columns {
                present(key, ColumnRole::Key);
            }
            let state = present(definition.state_column, ColumnRole::State);
            let version = present(definition.version_column, ColumnRole::Version);
            if state && version {
                check_rows::<M, DB>(conn, dialect, &mut problems).await?;
            }
        }
    }

    crate::schema::tables::check_idem_tables::<DB>(
        conn,
        dialect,
        definition.results_table,
        &mut problems,
    )
    .await?;

    Ok(SchemaReport {
        machine: definition.name,
        problems,
    })
}

/// The state values in the machine's table, against the declared ones; rows without a
/// state or a version.
async fn check_rows<M: Machine, DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    problems: &mut Vec<SchemaProblem>,
) -> Result<(), sqlx::Error> {
    let definition = M::DEFINITION;
    let sql = dialect.state_groups(
        definition.table,
        definition.state_column,
        definition.version_column,
    );
    let found = fetch_json::<DB>(conn, &sql, &[]).await?;
    let groups: Vec<(Option<String>, i64, i64)> = serde_json::from_str(&found).map_err(decode)?;
    let table = definition.table.to_owned();
    let mut undeclared: Vec<(String, i64)> = Vec::new();
    let (mut null_states, mut null_versions) = (0, 0);
    for (state, rows, versionless) in groups {
        null_versions += versionless;
        match state {
            None => null_states += rows,
            Some(state) if definition.state_index(&state).is_none() => {
                undeclared.push((state, rows));
            }
            Some(_) => {}
        }
    }
    if !undeclared.is_empty() {
        undeclared.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        problems.push(SchemaProblem::UndeclaredStates {
            table: table.clone(),
            column: definition.state_column.to_owned(),
            rows: undeclared.iter().map(|(_, n)| n).sum(),
            distinct: undeclared.len(),
            values: undeclared.into_iter().take(SHOWN_STATES).collect(),
        });
    }
    if null_states > 0 {
        problems.push(SchemaProblem::NullStates {
            table: table.clone(),
            column: definition.state_column.to_owned(),
            rows: null_states,
        });
    }
    if null_versions > 0 {
        problems.push(SchemaProblem::NullVersions {
            table,
            column: definition.version_column.to_owned(),
            rows: null_versions,
        });
    }
    Ok(())
}

/// Whether a column of type `kind` can hold what idem binds in `role` (SQLite: anything).
fn usable_as(kind: TypeKind, role: ColumnRole) -> bool {
    use TypeKind::*;
    match role {
        ColumnRole::Key => matches!(kind, Integer | Numeric | Text | Uuid | Any),
        ColumnRole::State => matches!(kind, Text | Enum | Any),
        ColumnRole::Version => matches!(kind, Integer | Numeric | Any),
        ColumnRole::Idem => true,
    }
}

/// What [`verify`] found: every problem, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a report does nothing unless its problems are looked at, e.g. with `.into_result()?`"]
pub struct SchemaReport {
    /// The Rust name of the machine checked.
    pub machine: &'static str,
    /// Every problem found, in the order checked (the machine's table, its rows, the
    /// results table, the inbox).
    pub problems: Vec<SchemaProblem>,
}

impl SchemaReport {
    /// Whether the database matches: no problem found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// `Ok(())` when there is no problem, else the report as an error (its `Display` lists
    /// every problem).
    pub fn into_result(self) -> Result<(), SchemaReport> {
        if self.is_ok() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for SchemaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            return write!(
                f,
                "the database matches the state machine `{}`",
                self.machine
            );
        }
        write!(
            f,
            "the database does not match the state machine `{}`:",
            self.machine
        )?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SchemaReport {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_per_part() {
        assert_eq!(Dialect::Postgres.quoted("orders"), "\"orders\"");
        assert_eq!(
            Dialect::MySql.quoted("billing.orders"),
            "`billing`.`orders`"
        );
    }
}
