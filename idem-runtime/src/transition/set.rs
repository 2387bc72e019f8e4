//! The columns a handler sets in its transition's own UPDATE (`set(…)`): their statements,
//! built once per backend, the values one call binds to them, and the compile error for a
//! column the transition owns.

use crate::backend::Dialect;
use crate::error::Error;
use crate::machine::definition::Definition;
use crate::transition::declared::TransitionError;
use crate::value::column::{ColumnProblem, ColumnValue};
use idem_sql::transition::{Assignment, Names, SetTo, Statements};
use std::convert::Infallible;
use std::sync::OnceLock;

/// The columns one handler sets, and its statements, built once per backend on first use
/// from the machine's names and these columns (generated code only).
#[doc(hidden)]
pub struct SetColumns {
    assignments: &'static [Assignment<'static>],
    by_dialect: [OnceLock<Statements>; Dialect::ALL.len()],
}

impl SetColumns {
    /// The columns of `set(…)`, in the attribute's order.
    pub const fn new(assignments: &'static [Assignment<'static>]) -> Self {
        SetColumns {
            assignments,
            by_dialect: [const { OnceLock::new() }; Dialect::ALL.len()],
        }
    }

    /// The handler's statements for `dialect`: the machine's, with these columns set.
    pub(crate) fn statements(&self, dialect: Dialect, definition: &Definition) -> &Statements {
        let names = Names {
            table: definition.table,
            key: definition.key_columns,
            state: definition.state_column,
            version: definition.version_column,
            results: definition.results_table,
        };
        self.by_dialect[dialect.index()]
            .get_or_init(|| dialect.statements(&names, self.assignments))
    }

    /// The columns whose values are bound, in the order of their parameters.
    pub(crate) fn bound(&self) -> impl Iterator<Item = &'static str> {
        self.assignments
            .iter()
            .filter(|a| a.value == SetTo::Bound)
            .map(|a| a.column)
    }
}

/// The columns a handler sets in the UPDATE, and their values (or the first that cannot
/// be bound).
pub(crate) struct Setting {
    pub(crate) columns: &'static SetColumns,
    pub(crate) values: Result<Vec<ColumnValue>, (&'static str, ColumnProblem)>,
}

impl Setting {
    /// `columns` with `values`, one per bound column, in order.
    pub(crate) fn new(
        columns: &'static SetColumns,
        values: Vec<Result<ColumnValue, ColumnProblem>>,
    ) -> Self {
        let values = columns
            .bound()
            .zip(values)
            .map(|(column, value)| value.map_err(|problem| (column, problem)))
            .collect();
        Setting { columns, values }
    }

    /// The first value that cannot be bound, as the call's error.
    pub(crate) fn check(&self) -> Result<&[ColumnValue], Error<Infallible>> {
        self.values
            .as_deref()
            .map_err(|(column, problem)| Error::InvalidColumn {
                column,
                problem: problem.clone(),
            })
    }
}

/// The compile error for a handler that sets a column the transition owns: a key column,
/// the state column or the version column (compared as SQLite compares names, ignoring
/// ASCII case).
pub const fn column_error(definition: &Definition, column: &str) -> Option<TransitionError> {
    // No columns: the derive failed and reported why at the enum.
    if definition.key_columns.is_empty() {
        return None;
    }
    let role = if eq_ignore_case(column, definition.state_column) {
        "the state column: the transition itself sets it to its `to` state"
    } else if eq_ignore_case(column, definition.version_column) {
        "the version column: every transition increments it"
    } else {
        let mut i = 0;
        let mut key = false;
        while i < definition.key_columns.len() {
            if eq_ignore_case(column, definition.key_columns[i]) {
                key = true;
            }
            i += 1;
        }
        if !key {
            return None;
        }
        "a key column: a transition never changes which row it is"
    };
    Some(
        TransitionError::new()
            .push("`set` cannot set `")
            .push(column)
            .push("`, ")
            .push(role)
            .push(" (state machine `")
            .push(definition.name)
            .push("`, table `")
            .push(definition.table)
            .push("`); set the table's other columns"),
    )
}

const fn eq_ignore_case(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if !a[i].eq_ignore_ascii_case(&b[i]) {
            return false;
        }
        i += 1;
    }
    true
}
