//! Checking a live database against a machine's declaration, at start-up: one report with
//! every problem, instead of the first failing transition in production.

use crate::backend::{Backend, Dialect, Opened, Param};
use crate::machine::definition::Machine;
use crate::schema::{
    INBOX_COLUMNS, INBOX_KEY_COLUMNS, JOB_COLUMNS, LEASE_COLUMNS, OUTBOX_COLUMNS,
    OUTBOX_KEY_COLUMNS, RESULT_COLUMNS, RESULT_KEY_COLUMNS,
};
use idem_sql::catalog::{ColumnsOf, TypeKind};
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

    let results = definition.results_table;
    let results_table = IdemTable {
        name: results,
        columns: &RESULT_COLUMNS,
        key: &RESULT_KEY_COLUMNS,
        required: true,
    };
    results_table
        .check::<DB>(conn, dialect, &mut problems)
        .await?;
    let inbox_table = IdemTable {
        name: "idem_inbox",
        columns: &INBOX_COLUMNS,
        key: &INBOX_KEY_COLUMNS,
        required: false,
    };
    inbox_table
        .check::<DB>(conn, dialect, &mut problems)
        .await?;
    let outbox_table = IdemTable {
        name: "idem_outbox",
        columns: &OUTBOX_COLUMNS,
        key: &OUTBOX_KEY_COLUMNS,
        required: false,
    };
    outbox_table
        .check::<DB>(conn, dialect, &mut problems)
        .await?;
    for (name, columns, key) in [
        ("idem_leases", &LEASE_COLUMNS[..], &LEASE_COLUMNS[..1]),
        ("idem_jobs", &JOB_COLUMNS[..], &JOB_COLUMNS[..1]),
    ] {
        let table = IdemTable {
            name,
            columns,
            key,
            required: false,
        };
        table.check::<DB>(conn, dialect, &mut problems).await?;
    }
    if dialect == Dialect::MySql
        && columns::<DB>(conn, dialect, "idem_outbox").await?.is_some()
        && columns::<DB>(conn, dialect, "idem_outbox_locks")
            .await?
            .is_none()
    {
        problems.push(SchemaProblem::OutdatedTable {
            table: "idem_outbox".to_owned(),
            problem: "its relays' lock rows (`idem_outbox_locks`) and indexes are missing, and \
                      no relay can claim; run `idem::migrate` or the migration \
                      `0004_idem_outbox_held.sql`"
                .to_owned(),
        });
    }
    if let Some(sql) = dialect.outdated_inbox() {
        let checked = DB::fetch(conn, sql, &[]).await?;
        if checked.and_then(|r| r.int("n")).unwrap_or(0) > 0 {
            problems.push(SchemaProblem::OutdatedTable {
                table: "idem_inbox".to_owned(),
                problem: "it still has the status CHECK constraint of the first migration \
                          (each write pays for it); run `idem::migrate` or the second migration"
                    .to_owned(),
            });
        }
    }

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

/// One of idem's own tables, as this version of idem makes it.
struct IdemTable<'a> {
    /// Its name (`table` or `schema.table`).
    name: &'a str,
    /// The columns idem uses.
    columns: &'a [&'a str],
    /// The columns of its key, which must compare byte for byte.
    key: &'a [&'a str],
    /// Whether it must exist (the inbox need not).
    required: bool,
}

impl IdemTable<'_> {
    /// Its columns, if it exists (or must), and whether its key columns are exact.
    async fn check<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        dialect: Dialect,
        problems: &mut Vec<SchemaProblem>,
    ) -> Result<(), sqlx::Error> {
        let table = self.name;
        let found = match columns::<DB>(conn, dialect, table).await? {
            None if self.required => {
                problems.push(SchemaProblem::MissingTable {
                    table: table.to_owned(),
                });
                return Ok(());
            }
            None => return Ok(()),
            Some(found) => found,
        };
        for column in self.columns {
            if !found.iter().any(|c| c.name == *column) {
                problems.push(SchemaProblem::MissingColumn {
                    table: table.to_owned(),
                    column: (*column).to_owned(),
                    role: ColumnRole::Idem,
                });
            }
        }
        let padded: Vec<&Column> = self
            .key
            .iter()
            .filter_map(|key| found.iter().find(|c| c.name == *key))
            .filter(|c| !dialect.compares_exactly(&c.type_name, &c.category))
            .collect();
        if !padded.is_empty() {
            let names = padded
                .iter()
                .map(|c| format!("`{}`", c.name))
                .collect::<Vec<_>>()
                .join(", ");
            let mut collations: Vec<&str> = padded.iter().map(|c| c.category.as_str()).collect();
            collations.sort_unstable();
            collations.dedup();
            problems.push(SchemaProblem::OutdatedTable {
                table: table.to_owned(),
                problem: format!(
                    "its key columns {names} compare under `{}`, not byte for byte (keys that \
                     differ by trailing spaces are one); run `idem::migrate` or the migration \
                     `0002_idem_exact_keys.sql`",
                    collations.join("`, `")
                ),
            });
        }
        Ok(())
    }
}

/// A column as the database describes it.
struct Column {
    name: String,
    type_name: String,
    /// PostgreSQL's type category; MySQL's collation (see `Dialect::columns`).
    category: String,
    kind: TypeKind,
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

/// The columns of `table` (`name` or `schema.name`), or `None` if it does not exist.
async fn columns<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    table: &str,
) -> Result<Option<Vec<Column>>, sqlx::Error> {
    let quoted_table = dialect.quoted(table);
    let (found, of) = dialect.columns();
    let params = match (of, table.split_once('.')) {
        (ColumnsOf::Quoted, _) => vec![Param::Text(&quoted_table)],
        (ColumnsOf::NameAndSchema, Some((schema, name))) => {
            vec![Param::Text(name), Param::Text(schema)]
        }
        (ColumnsOf::NameAndSchema, None) => match dialect.default_schema() {
            Some(schema) => vec![Param::Text(table), Param::Text(schema)],
            None => vec![Param::Text(table), Param::Null],
        },
    };
    let found = fetch_json::<DB>(conn, found, &params).await?;
    let found: Vec<(String, String, String)> = serde_json::from_str(&found).map_err(decode)?;
    if found.is_empty() {
        // A table has at least one column: none means no such table.
        return Ok(None);
    }
    Ok(Some(
        found
            .into_iter()
            .map(|(name, type_name, category)| Column {
                name,
                kind: dialect.type_kind(&type_name, &category),
                type_name,
                category,
            })
            .collect(),
    ))
}

async fn fetch_json<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &str,
    params: &[Param<'_>],
) -> Result<String, sqlx::Error> {
    let mut row = DB::fetch(conn, sql, params).await?.unwrap_or_default();
    Ok(row.take_text("found").unwrap_or_else(|| "[]".to_owned()))
}

/// "1 row", "2 rows".
fn rows(n: i64) -> String {
    if n == 1 {
        "1 row".to_owned()
    } else {
        format!("{n} rows")
    }
}

fn decode(e: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
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

/// The part a column plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ColumnRole {
    /// A column of the machine's key.
    Key,
    /// The machine's state column.
    State,
    /// The machine's version column.
    Version,
    /// A column of one of idem's own tables.
    Idem,
}

impl ColumnRole {
    fn described(self) -> &'static str {
        match self {
            ColumnRole::Key => "a key column",
            ColumnRole::State => "the state column",
            ColumnRole::Version => "the version column",
            ColumnRole::Idem => "a column idem uses",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            ColumnRole::Key => "an integer, numeric, text or uuid",
            ColumnRole::State => "text, varchar or an ENUM",
            ColumnRole::Version => "an integer or numeric",
            ColumnRole::Idem => "as idem's migrations create it",
        }
    }
}

/// One way the database differs from what the machine and idem need.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist (as the connection's search path resolves it).
    MissingTable {
        /// The table's name.
        table: String,
    },
    /// The table has no such column.
    MissingColumn {
        /// The table's name.
        table: String,
        /// The column's name.
        column: String,
        /// What the column is for.
        role: ColumnRole,
    },
    /// The column's type cannot hold what idem binds to it (PostgreSQL).
    UnusableType {
        /// The table's name.
        table: String,
        /// The column's name.
        column: String,
        /// What the column is for.
        role: ColumnRole,
        /// The column's type, as the database names it.
        found: String,
    },
    /// Rows hold state values the machine does not declare: a transition on them ends in
    /// [`Error::CorruptRow`](crate::Error::CorruptRow).
    UndeclaredStates {
        /// The table's name.
        table: String,
        /// The state column.
        column: String,
        /// The most frequent undeclared values (at most ten) and their row counts.
        values: Vec<(String, i64)>,
        /// How many distinct undeclared values there are.
        distinct: usize,
        /// How many rows hold one.
        rows: i64,
    },
    /// Rows have no state (NULL).
    NullStates {
        /// The table's name.
        table: String,
        /// The state column.
        column: String,
        /// How many rows.
        rows: i64,
    },
    /// Rows have no version (NULL): a transition never moves them (its guard is
    /// `version IS NOT NULL`).
    NullVersions {
        /// The table's name.
        table: String,
        /// The version column.
        column: String,
        /// How many rows.
        rows: i64,
    },
    /// One of idem's own tables is from an older version of idem.
    OutdatedTable {
        /// The table's name.
        table: String,
        /// What differs, and how to fix it.
        problem: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaProblem::MissingTable { table } => {
                write!(f, "there is no table `{table}`")
            }
            SchemaProblem::MissingColumn {
                table,
                column,
                role,
            } => write!(
                f,
                "table `{table}` has no column `{column}` ({})",
                role.described()
            ),
            SchemaProblem::UnusableType {
                table,
                column,
                role,
                found,
            } => write!(
                f,
                "column `{table}.{column}` ({}) is of type `{found}`; it must be {}",
                role.described(),
                role.expected()
            ),
            SchemaProblem::UndeclaredStates {
                table,
                column,
                values,
                distinct,
                rows: total,
            } => {
                let shown = values
                    .iter()
                    .map(|(value, n)| format!("{value:?} ({})", rows(*n)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let more = distinct.saturating_sub(values.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                write!(
                    f,
                    "`{table}`: states the machine does not declare in `{column}`, in {}: \
                     {shown}{more}; declare them or correct the rows",
                    rows(*total)
                )
            }
            SchemaProblem::NullStates {
                table,
                column,
                rows: n,
            } => write!(
                f,
                "`{table}`: {} with no state (`{column}` is NULL)",
                rows(*n)
            ),
            SchemaProblem::NullVersions {
                table,
                column,
                rows: n,
            } => write!(
                f,
                "`{table}`: {} with no version (`{column}` is NULL), which no transition moves",
                rows(*n)
            ),
            SchemaProblem::OutdatedTable { table, problem } => {
                write!(f, "idem's table `{table}` is outdated: {problem}")
            }
        }
    }
}

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
        assert_eq!(rows(1), "1 row");
        assert_eq!(rows(0), "0 rows");
    }
}
