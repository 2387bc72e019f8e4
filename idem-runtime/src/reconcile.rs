//! Reconciliation, the last line of defence: reads a table of your effects (payments,
//! shipments, ledger lines: one row per effect, carrying the idempotency key it was made
//! for) against idem's records of the same keys, and names the three ways a duplicate or
//! a loss shows after the fact:
//!
//! - **keys with more than one effect**: a duplicate got through — an effect written
//!   around idem, a retry that did not go through it;
//! - **effects without a record**: an effect whose key idem never recorded as done — written
//!   by code that does not go through idem, or whose record was purged (reconcile within
//!   the retention you keep);
//! - **records without an effect**: idem recorded the key as done and the effect is not
//!   there — deleted since, or a handler that succeeded without writing it.
//!
//! Each is one statement reading both tables in one snapshot, in the database; its rows
//! are streamed and counted, the first [`limit`](reconcile) of each kind kept, so a table of
//! millions of rows is reconciled in bounded memory. Nothing is written.
//!
//! ```
//! use idem::reconcile::{Effects, Records};
//!
//! # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! // The consumer group "payments" records each message it handled in the inbox; its
//! // handler inserts one row into `payments`, whose `message_key` column holds the key.
//! let report = idem::reconcile::reconcile(
//!     &pool,
//!     &Records::inbox("payments"),
//!     &Effects::table("payments", "message_key"),
//!     100,
//! )
//! .await?;
//! if !report.is_clean() {
//!     eprintln!("{report}");
//! }
//! # Ok(()) }
//! ```
//!
//! The statements, on PostgreSQL, for `Effects::table("payments", "message_key")` (a text
//! column: compared as it is, so an index of yours on it serves the last probe; a column of
//! another type is compared as `CAST(… AS TEXT)`) and the inbox's group `$1`:
//!
//! ```sql
//! SELECT e."message_key" AS effect_key, COUNT(*) AS effects FROM "payments" AS e
//! WHERE e."message_key" IS NOT NULL GROUP BY e."message_key" HAVING COUNT(*) > 1
//! ORDER BY e."message_key";
//!
//! SELECT e."message_key" AS effect_key, COUNT(*) AS effects FROM "payments" AS e
//! WHERE e."message_key" IS NOT NULL AND NOT EXISTS (SELECT 1 FROM idem_inbox AS r
//!   WHERE r.consumer_group = $1 AND r.status = 'SUCCESS' AND r.message_key = e."message_key")
//! GROUP BY e."message_key" ORDER BY e."message_key";
//!
//! SELECT r.message_key AS record_key FROM idem_inbox AS r
//! WHERE r.consumer_group = $1 AND r.status = 'SUCCESS'
//!   AND NOT EXISTS (SELECT 1 FROM "payments" AS e WHERE e."message_key" = r.message_key)
//! ORDER BY r.message_key;
//! ```

use crate::backend::{Backend, Opened, Param, Record};
use crate::machine::definition::{Definition, Machine};
use crate::schema::tables::columns;
use idem_sql::catalog::TypeKind;
use idem_sql::ident::{sql_identifier_problem, table_name_problem};
use idem_sql::reconcile::{EffectsFrom, RecordsOf};
use sqlx::Pool;
use std::fmt;

/// Where your effects are: a table and the column holding each effect's idempotency key,
/// or a query of yours and the name of its key column. Rows whose key is NULL are not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects {
    from: Source,
    key: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Table(String),
    Query(String),
}

impl Effects {
    /// The effects are the rows of `table` (`name` or `schema.name`), each made for the key
    /// in `key_column`.
    pub fn table(table: impl Into<String>, key_column: impl Into<String>) -> Effects {
        Effects {
            from: Source::Table(table.into()),
            key: key_column.into(),
        }
    }

    /// The effects are the rows of `sql`, a query of yours (used as written, inside
    /// `( … ) AS e`), each made for the key in its column `key_column`: to read part of a
    /// table (`WHERE kind = 'charge'`, a recent range that your retention still covers), or
    /// to join what makes the key.
    pub fn query(sql: impl Into<String>, key_column: impl Into<String>) -> Effects {
        Effects {
            from: Source::Query(sql.into()),
            key: key_column.into(),
        }
    }
}

/// Which records the effects are read against: a consumer group's in the inbox, or a
/// machine's rows past one of its transitions. Only records of work done count: an inbox
/// record that is SUCCESS; a row in a state its transition led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    of: Of,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Of {
    Inbox {
        group: String,
    },
    Rows {
        table: String,
        key: String,
        state: String,
        states: Vec<String>,
    },
}

impl Records {
    /// The done records of the consumer group `group` in the inbox: an effect's key is the
    /// message key.
    pub fn inbox(group: impl Into<String>) -> Records {
        Records {
            of: Of::Inbox {
                group: group.into(),
            },
        }
    }

    /// The rows of the machine `M` that went through its transitions to `to`: those in
    /// `to`, or in a state that only a way through `to` leads to (from `Order`'s `PAID`:
    /// `PAID` and `SHIPPED`, not `CANCELLED`). An effect's key is the machine's key. A
    /// machine whose key has several columns is refused: read its rows with
    /// [`rows`](Self::rows) over a view that makes one key of them.
    pub fn transitions<M: Machine>(to: &str) -> Result<Records, ReconcileError> {
        let definition = M::DEFINITION;
        let Some(to_index) = definition.state_index(to) else {
            return Err(ReconcileError::Records(format!(
                "the machine {} has no state `{to}` (its states: {})",
                definition.name,
                definition.states.join(", ")
            )));
        };
        let [key] = definition.key_columns else {
            return Err(ReconcileError::Records(format!(
                "the machine {} has a key of {} columns: reconcile its rows with \
                 Records::rows over a view with one key column",
                definition.name,
                definition.key_columns.len()
            )));
        };
        Ok(Records::rows(
            definition.table,
            *key,
            definition.state_column,
            past(definition, to_index),
        ))
    }

    /// The rows of `table` whose `state_column` holds one of `states`: a machine's rows
    /// for a tool without its Rust type (`idem reconcile --rows`), or any table of yours
    /// that records work done. An effect's key is the row's `key_column`.
    pub fn rows<S: Into<String>>(
        table: impl Into<String>,
        key_column: impl Into<String>,
        state_column: impl Into<String>,
        states: impl IntoIterator<Item = S>,
    ) -> Records {
        Records {
            of: Of::Rows {
                table: table.into(),
                key: key_column.into(),
                state: state_column.into(),
                states: states.into_iter().map(Into::into).collect(),
            },
        }
    }
}

/// `to`, and the states only a way through `to` leads to: those reachable from `to` and
/// not from any initial state (one no transition leads to) along ways avoiding `to`.
fn past(definition: &Definition, to: usize) -> Vec<&'static str> {
    let states = definition.states.len();
    let mut around = vec![false; states];
    let mut next: Vec<usize> = (0..states)
        .filter(|&s| {
            s != to
                && !definition
                    .transitions
                    .iter()
                    .any(|&(_, b)| usize::from(b) == s)
        })
        .collect();
    for &s in &next {
        around[s] = true;
    }
    while let Some(s) = next.pop() {
        for &(a, b) in definition.transitions {
            let (a, b) = (usize::from(a), usize::from(b));
            if a == s && b != to && !around[b] {
                around[b] = true;
                next.push(b);
            }
        }
    }
    (0..states)
        .filter(|&s| s == to || (definition.reaches(to, s) && !around[s]))
        .map(|s| definition.states[s])
        .collect()
}

/// A key, and how many effects it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEffects {
    /// The key, as text.
    pub key: String,
    /// Its effects.
    pub effects: u64,
}

/// What one check found: how many, and the first of them in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<T> {
    /// How many were found.
    pub count: u64,
    /// The first found, in key order: at most the `limit` given to [`reconcile`].
    pub first: Vec<T>,
}

impl<T> Default for Found<T> {
    fn default() -> Self {
        Found {
            count: 0,
            first: Vec::new(),
        }
    }
}

/// What [`reconcile`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciliation {
    /// The effects read (their key not NULL).
    pub effects: u64,
    /// The done records read.
    pub records: u64,
    /// Keys with more than one effect.
    pub duplicates: Found<KeyEffects>,
    /// Keys with effects and no done record.
    pub effects_without_record: Found<KeyEffects>,
    /// Keys done with no effect.
    pub records_without_effect: Found<String>,
}

impl Reconciliation {
    /// Whether nothing was found: one effect for each done record, and no other.
    pub fn is_clean(&self) -> bool {
        self.duplicates.count == 0
            && self.effects_without_record.count == 0
            && self.records_without_effect.count == 0
    }
}

impl fmt::Display for Reconciliation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} effect(s) read against {} done record(s)",
            self.effects, self.records
        )?;
        let keys = |found: &Found<KeyEffects>| {
            found
                .first
                .iter()
                .map(|k| format!("{} ({})", k.key, k.effects))
                .collect::<Vec<_>>()
        };
        let lines = [
            (
                "keys with more than one effect",
                self.duplicates.count,
                keys(&self.duplicates),
            ),
            (
                "effects without a record",
                self.effects_without_record.count,
                keys(&self.effects_without_record),
            ),
            (
                "records without an effect",
                self.records_without_effect.count,
                self.records_without_effect.first.clone(),
            ),
        ];
        for (what, count, first) in lines {
            write!(f, "{what}: {count}")?;
            if !first.is_empty() {
                let more = if count > first.len() as u64 {
                    ", …"
                } else {
                    ""
                };
                write!(f, ": {}{more}", first.join(", "))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Why [`reconcile`] could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReconcileError {
    /// A table or column name that is not a plain SQL identifier (nothing was read).
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A table read does not exist, or has no such column.
    NotFound(String),
    /// The records cannot be read as named: a state the machine does not have, a machine
    /// whose key has several columns, no states.
    Records(String),
    /// The database failed or refused a statement (a query of yours included).
    Database(sqlx::Error),
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileError::InvalidName { name, problem } => {
                write!(f, "`{name}` is not a name to reconcile: it {problem}")
            }
            ReconcileError::NotFound(what) | ReconcileError::Records(what) => f.write_str(what),
            ReconcileError::Database(e) => write!(f, "the database failed: {e}"),
        }
    }
}

impl std::error::Error for ReconcileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReconcileError::Database(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for ReconcileError {
    fn from(e: sqlx::Error) -> Self {
        ReconcileError::Database(e)
    }
}

fn checked(name: &str, problem: Option<String>) -> Result<(), ReconcileError> {
    match problem {
        Some(problem) => Err(ReconcileError::InvalidName {
            name: name.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Reads `effects` against `records` (see the [module](self)): counts each kind of
/// mismatch and keeps the first `limit` of each, in key order. Three statements, each
/// reading both tables in one snapshot; nothing is written.
pub async fn reconcile<DB: Backend>(
    pool: &Pool<DB>,
    records: &Records,
    effects: &Effects,
    limit: usize,
) -> Result<Reconciliation, ReconcileError> {
    checked(&effects.key, sql_identifier_problem(&effects.key))?;
    if let Source::Table(table) = &effects.from {
        checked(table, table_name_problem(table))?;
    }
    if let Of::Rows {
        table,
        key,
        state,
        states,
    } = &records.of
    {
        checked(table, table_name_problem(table))?;
        checked(key, sql_identifier_problem(key))?;
        checked(state, sql_identifier_problem(state))?;
        if states.is_empty() {
            return Err(ReconcileError::Records(format!(
                "no states named: which rows of `{table}` record work done?"
            )));
        }
    }
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let dialect = DB::dialect(conn)?;
    let from = match &effects.from {
        Source::Table(table) => EffectsFrom::Table {
            table,
            key: &effects.key,
            kind: column_kind::<DB>(conn, dialect, table, &effects.key, None).await?,
        },
        Source::Query(sql) => EffectsFrom::Query {
            sql,
            key: &effects.key,
        },
    };
    let (of, params) = match &records.of {
        Of::Inbox { group } => (RecordsOf::Inbox, vec![Param::Text(group)]),
        Of::Rows {
            table,
            key,
            state,
            states,
        } => (
            RecordsOf::Rows {
                table,
                key,
                kind: column_kind::<DB>(conn, dialect, table, key, Some(state)).await?,
                state,
                states: states.len(),
            },
            states.iter().map(|s| Param::Text(s)).collect(),
        ),
    };
    let sql = dialect.reconcile(from, of);
    let count = |row: Option<Record>| row.and_then(|r| r.int("n")).map_or(0, |n| n.max(0) as u64);
    let effect_count = count(DB::fetch(conn, &sql.effects, &[]).await?);
    let record_count = count(DB::fetch(conn, &sql.records, &params).await?);
    let duplicates = keys_with_effects::<DB>(conn, &sql.duplicates, &[], limit).await?;
    let effects_without_record =
        keys_with_effects::<DB>(conn, &sql.without_record, &params, limit).await?;
    let mut records_without_effect = Found::default();
    DB::fetch_each(conn, &sql.without_effect, &params, |mut row| {
        records_without_effect.count += 1;
        if records_without_effect.first.len() < limit {
            let key = row.take_text("record_key").unwrap_or_default();
            records_without_effect.first.push(key);
        }
    })
    .await?;
    opened.end(true).await?;
    Ok(Reconciliation {
        effects: effect_count,
        records: record_count,
        duplicates,
        effects_without_record,
        records_without_effect,
    })
}

/// The type of `table`'s column `key` (and that it has `also`): an error naming what is
/// missing.
async fn column_kind<DB: Backend>(
    conn: &mut DB::Connection,
    dialect: idem_sql::dialect::Dialect,
    table: &str,
    key: &str,
    also: Option<&str>,
) -> Result<TypeKind, ReconcileError> {
    let Some(columns) = columns::<DB>(conn, dialect, table).await? else {
        return Err(ReconcileError::NotFound(format!(
            "the table `{table}` does not exist"
        )));
    };
    for wanted in std::iter::once(key).chain(also) {
        if !columns.iter().any(|c| c.name == wanted) {
            return Err(ReconcileError::NotFound(format!(
                "the table `{table}` has no column `{wanted}`"
            )));
        }
    }
    Ok(columns
        .iter()
        .find(|c| c.name == key)
        .map_or(TypeKind::Other, |c| c.kind))
}

async fn keys_with_effects<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &str,
    params: &[Param<'_>],
    limit: usize,
) -> Result<Found<KeyEffects>, sqlx::Error> {
    let mut found = Found::default();
    DB::fetch_each(conn, sql, params, |mut row| {
        found.count += 1;
        if found.first.len() < limit {
            found.first.push(KeyEffects {
                effects: row.int("effects").map_or(0, |n| n.max(0) as u64),
                key: row.take_text("effect_key").unwrap_or_default(),
            });
        }
    })
    .await?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_sql::dialect::Dialect;

    /// The statements the module's documentation shows are the ones run.
    #[test]
    fn the_documented_statements_are_the_generated_ones() {
        let source = include_str!("reconcile.rs");
        let block = source
            .split("//! ```sql\n")
            .nth(1)
            .and_then(|rest| rest.split("//! ```\n").next())
            .unwrap();
        let documented: Vec<String> = block
            .lines()
            .map(|line| line.trim_start_matches("//!").trim())
            .collect::<Vec<_>>()
            .join(" ")
            .split(';')
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|s| !s.is_empty())
            .collect();
        let sql = Dialect::Postgres.reconcile(
            EffectsFrom::Table {
                table: "payments",
                key: "message_key",
                kind: TypeKind::Text,
            },
            RecordsOf::Inbox,
        );
        let spaced = |s: &str| s.replace("( ", "(").replace(" )", ")");
        assert_eq!(
            documented.iter().map(|s| spaced(s)).collect::<Vec<_>>(),
            [sql.duplicates, sql.without_record, sql.without_effect]
        );
    }

    #[test]
    fn the_states_past_a_transition_are_those_only_it_leads_to() {
        // CREATED → PAID → SHIPPED → DELIVERED; CREATED → CANCELLED; SHIPPED → RETURNED;
        // CREATED → GIFTED → SHIPPED (a way around PAID).
        static STATES: [&str; 7] = [
            "CREATED",
            "PAID",
            "SHIPPED",
            "DELIVERED",
            "CANCELLED",
            "RETURNED",
            "GIFTED",
        ];
        static TRANSITIONS: [(u16, u16); 7] =
            [(0, 1), (1, 2), (2, 3), (0, 4), (2, 5), (0, 6), (6, 2)];
        static REACHABLE: [(u16, u16); 3] = [(1, 2), (1, 3), (1, 5)];
        let mut definition = Definition {
            name: "Order",
            id: "orders",
            table: "orders",
            key_columns: &["order_id"],
            state_column: "status",
            version_column: "version",
            results_table: "idem_results",
            states: &STATES,
            transitions: &TRANSITIONS[..5],
            reachable: &REACHABLE,
            sql: crate::MachineSql::new([crate::Statements::NONE; Dialect::ALL.len()]),
        };
        assert_eq!(
            past(&definition, 1),
            ["PAID", "SHIPPED", "DELIVERED", "RETURNED"]
        );
        // With a way to SHIPPED around PAID, only PAID itself is past PAID.
        definition.transitions = &TRANSITIONS;
        assert_eq!(past(&definition, 1), ["PAID"]);
        assert_eq!(past(&definition, 4), ["CANCELLED"]);
    }
}
