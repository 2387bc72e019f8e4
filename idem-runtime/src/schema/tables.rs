//! idem's own tables as a database has them, against this version's migrations: which
//! migrations were applied, and what differs ([`check_tables`]; [`verify`](crate::verify)
//! checks the same tables with a machine's).

use crate::backend::{Backend, Dialect, Opened, Param};
use crate::schema::{
    INBOX_COLUMNS, INBOX_KEY_COLUMNS, JOB_COLUMNS, LEASE_COLUMNS, OUTBOX_COLUMNS,
    OUTBOX_KEY_COLUMNS, Probe, RESULT_COLUMNS, RESULT_KEY_COLUMNS, migrations,
};
use idem_sql::catalog::{ColumnsOf, TypeKind};
use sqlx::Pool;
use std::fmt;

/// The results table [`check_tables`] looks at: the one machines use unless they name
/// their own (`#[machine(results = "…")]`).
pub const DEFAULT_RESULTS_TABLE: &str = "idem_results";

/// Checks idem's own tables in the database behind `pool` (the part of
/// [`verify`](crate::verify) that needs no machine): which of this version's migrations the
/// database has ([`TablesReport::migrations`], each told by what it creates or changes),
/// and every problem with the tables it has — the results table `results` (`None`:
/// [`DEFAULT_RESULTS_TABLE`]) missing, a table missing a column idem uses, key columns
/// that do not compare byte for byte (MySQL), the inbox's first-migration CHECK
/// (PostgreSQL), the outbox without its relays' lock rows (MySQL). The inbox, outbox,
/// leases and jobs tables need not exist: a service uses the ones it needs.
///
/// It reads the catalogue only, never a row: safe to call at any time. `Err` only when
/// the database cannot be asked.
///
/// ```
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// idem::migrate(&pool).await?;
/// let report = idem::check_tables(&pool, None).await?;
/// assert!(report.is_ok(), "{report}");
/// assert_eq!(report.current(), Some("0004_idem_outbox_due_at.sql"));
/// # Ok(()) }
/// ```
pub async fn check_tables<DB: Backend>(
    pool: &Pool<DB>,
    results: Option<&str>,
) -> Result<TablesReport, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let dialect = DB::dialect(conn)?;
    let mut problems = Vec::new();
    let results = results.unwrap_or(DEFAULT_RESULTS_TABLE);
    check_idem_tables::<DB>(conn, dialect, results, &mut problems).await?;
    let mut applied = Vec::new();
    for (name, probe) in migrations(dialect) {
        applied.push(Migration {
            name,
            applied: probe_holds::<DB>(conn, dialect, *probe).await?,
        });
    }
    let tables = existing::<DB>(
        conn,
        dialect,
        &[
            results,
            "idem_inbox",
            "idem_outbox",
            "idem_leases",
            "idem_jobs",
        ],
    )
    .await?;
    opened.end(true).await?;
    Ok(TablesReport {
        migrations: applied,
        tables,
        problems,
    })
}

/// Which of the tables `names` (`name` or `schema.name`) the database has, in the order
/// given: one catalogue read per table, nothing else — for a tool that only needs to know
/// what it can read (`check_tables` also checks each table's columns and keys).
///
/// ```
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
/// idem::migrate(&pool).await?;
/// let found = idem::existing_tables(&pool, &["idem_inbox", "payments"]).await?;
/// assert_eq!(found, ["idem_inbox"]);
/// # Ok(()) }
/// ```
pub async fn existing_tables<DB: Backend>(
    pool: &Pool<DB>,
    names: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let dialect = DB::dialect(conn)?;
    let found = existing::<DB>(conn, dialect, names).await?;
    opened.end(true).await?;
    Ok(found)
}

async fn existing<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    names: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    let mut found = Vec::new();
    for &table in names {
        if columns::<DB>(conn, dialect, table).await?.is_some() {
            found.push(table.to_owned());
        }
    }
    Ok(found)
}

/// Whether what a migration creates or changes is there.
async fn probe_holds<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    probe: Probe,
) -> Result<bool, sqlx::Error> {
    Ok(match probe {
        Probe::Tables(tables) => {
            for table in tables {
                if columns::<DB>(conn, dialect, table).await?.is_none() {
                    return Ok(false);
                }
            }
            true
        }
        Probe::Index(index) => {
            let row = DB::fetch(conn, dialect.index_exists(), &[Param::Text(index)]).await?;
            row.and_then(|r| r.int("n")).unwrap_or(0) > 0
        }
        Probe::InboxUnchecked => {
            let Some(sql) = dialect.outdated_inbox() else {
                return Ok(true);
            };
            let inbox = columns::<DB>(conn, dialect, "idem_inbox").await?.is_some();
            let row = DB::fetch(conn, sql, &[]).await?;
            inbox && row.and_then(|r| r.int("n")).unwrap_or(0) == 0
        }
        Probe::ExactKeys => {
            let mut exact = true;
            for (table, keys) in [
                (DEFAULT_RESULTS_TABLE, &RESULT_KEY_COLUMNS[..]),
                ("idem_inbox", &INBOX_KEY_COLUMNS[..]),
            ] {
                let Some(found) = columns::<DB>(conn, dialect, table).await? else {
                    return Ok(false);
                };
                exact &= found
                    .iter()
                    .filter(|c| keys.contains(&c.name.as_str()))
                    .all(|c| dialect.compares_exactly(&c.type_name, &c.category));
            }
            exact
        }
    })
}

/// One of this version's migrations, and whether the database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Its file name, as in idem's `migrations/<backend>/` (`0003_idem_outbox.sql`).
    pub name: &'static str,
    /// Whether what it creates or changes is there.
    pub applied: bool,
}

/// What [`check_tables`] found: the migrations the database has, and every problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a report does nothing unless its problems are looked at"]
pub struct TablesReport {
    /// This version's migrations for the database's backend, in order, each applied or not.
    pub migrations: Vec<Migration>,
    /// idem's tables the database has, of the results table, `idem_inbox`, `idem_outbox`,
    /// `idem_leases` and `idem_jobs`: a service has the ones it uses.
    pub tables: Vec<String>,
    /// Every problem found with idem's tables.
    pub problems: Vec<SchemaProblem>,
}

impl TablesReport {
    /// Whether the database has idem's table `table` (`idem_outbox`, …).
    pub fn has(&self, table: &str) -> bool {
        self.tables.iter().any(|t| t == table)
    }

    /// Whether every migration is applied and no table has a problem.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty() && self.migrations.iter().all(|m| m.applied)
    }

    /// The migration the database is on: the last of an unbroken run of applied ones from
    /// the first (`None`: not even the first; run `idem::migrate`).
    pub fn current(&self) -> Option<&'static str> {
        self.migrations
            .iter()
            .take_while(|m| m.applied)
            .last()
            .map(|m| m.name)
    }

    /// The migrations not applied, in order: what `idem::migrate` would do.
    pub fn pending(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.migrations
            .iter()
            .filter(|m| !m.applied)
            .map(|m| m.name)
    }
}

impl fmt::Display for TablesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.current() {
            Some(current) => write!(f, "idem's tables are on migration {current}")?,
            None => write!(f, "idem's tables are not migrated")?,
        }
        let pending: Vec<&str> = self.pending().collect();
        if !pending.is_empty() {
            write!(
                f,
                "; not applied: {} (run `idem::migrate`)",
                pending.join(", ")
            )?;
        }
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

/// Checks the results table `results` (which must exist) and, where they exist, the inbox,
/// outbox, leases and jobs tables, adding what differs to `problems`.
pub(crate) async fn check_idem_tables<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    results: &str,
    problems: &mut Vec<SchemaProblem>,
) -> Result<(), sqlx::Error> {
    let results_table = IdemTable {
        name: results,
        columns: &RESULT_COLUMNS,
        key: &RESULT_KEY_COLUMNS,
        required: true,
    };
    results_table.check::<DB>(conn, dialect, problems).await?;
    let inbox_table = IdemTable {
        name: "idem_inbox",
        columns: &INBOX_COLUMNS,
        key: &INBOX_KEY_COLUMNS,
        required: false,
    };
    inbox_table.check::<DB>(conn, dialect, problems).await?;
    let outbox_table = IdemTable {
        name: "idem_outbox",
        columns: &OUTBOX_COLUMNS,
        key: &OUTBOX_KEY_COLUMNS,
        required: false,
    };
    outbox_table.check::<DB>(conn, dialect, problems).await?;
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
        table.check::<DB>(conn, dialect, problems).await?;
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
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) type_name: String,
    /// PostgreSQL's type category; MySQL's collation (see `Dialect::columns`).
    pub(crate) category: String,
    pub(crate) kind: TypeKind,
}

/// The columns of `table` (`name` or `schema.name`), or `None` if it does not exist.
pub(crate) async fn columns<DB: Backend>(
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

pub(crate) async fn fetch_json<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &str,
    params: &[Param<'_>],
) -> Result<String, sqlx::Error> {
    let mut row = DB::fetch(conn, sql, params).await?.unwrap_or_default();
    Ok(row.take_text("found").unwrap_or_else(|| "[]".to_owned()))
}

/// "1 row", "2 rows".
pub(crate) fn rows(n: i64) -> String {
    if n == 1 {
        "1 row".to_owned()
    } else {
        format!("{n} rows")
    }
}

pub(crate) fn decode(e: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

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
    fn rows_are_counted_in_words() {
        assert_eq!(rows(1), "1 row");
        assert_eq!(rows(0), "0 rows");
    }

    #[test]
    fn the_current_migration_is_the_last_of_an_unbroken_run() {
        let report = |applied: [bool; 3]| TablesReport {
            migrations: ["a", "b", "c"]
                .into_iter()
                .zip(applied)
                .map(|(name, applied)| Migration { name, applied })
                .collect(),
            tables: Vec::new(),
            problems: Vec::new(),
        };
        assert_eq!(report([true, true, true]).current(), Some("c"));
        assert!(report([true, true, true]).is_ok());
        assert_eq!(report([true, false, true]).current(), Some("a"));
        assert_eq!(
            report([true, false, true]).pending().collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(report([false, true, true]).current(), None);
        assert!(!report([true, true, false]).is_ok());
    }
}
