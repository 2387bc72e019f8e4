//! The declared state machine: states, legal transitions, table and columns.

use crate::machine::sql::MachineSql;

/// A state machine declared with `#[derive(StateMachine)]`.
///
/// The derive implements this trait on an enum whose variants are the states. Everything
/// here is computed at compile time from the declaration; do not implement it by hand (the
/// derive checks the declaration — duplicate states, unknown targets, cycles — and a hand
/// implementation would skip those checks).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idem state machine",
    label = "`machine` must name an enum with `#[derive(idem::StateMachine)]`",
    note = "declare the machine once: `#[derive(idem::StateMachine)] #[machine(table = \"…\", key = \"…\")] enum {Self} {{ … }}`"
)]
pub trait Machine: Copy + Eq + core::fmt::Debug + Send + Sync + 'static {
    /// The declaration: table, columns, states, transitions and the SQL statements.
    const DEFINITION: &'static Definition;

    /// The state stored in the database as `name`, if the machine declares it.
    fn from_db(name: &str) -> Option<Self> {
        Self::DEFINITION
            .state_index(name)
            .map(|index| Self::from_index(index))
    }

    /// The variant for the state at `index` in [`Definition::states`].
    ///
    /// # Panics
    /// If `index` is out of range; the runtime only passes indices it got from the definition.
    fn from_index(index: usize) -> Self;

    /// The state's position in [`Definition::states`].
    fn index(self) -> usize;

    /// The name this state is stored under in the state column.
    fn as_db(self) -> &'static str {
        Self::DEFINITION.states[self.index()]
    }
}

/// The compile-time description of a state machine, produced by the derive.
#[derive(Debug)]
pub struct Definition {
    /// The Rust name of the machine (the enum), used in errors.
    pub name: &'static str,
    /// The machine's stable identity: the scope of its stored first results
    /// (`#[machine(id = "…")]`, by default the table's name). Renaming or moving the enum
    /// does not change it; two machines must not share one.
    pub id: &'static str,
    /// The table holding one row per business key.
    pub table: &'static str,
    /// The columns holding the business key, in order: one, or several for a composite
    /// key (`key = ("tenant_id", "order_id")`).
    pub key_columns: &'static [&'static str],
    /// The column holding the state name.
    pub state_column: &'static str,
    /// The integer column incremented by every transition.
    pub version_column: &'static str,
    /// The table holding the first result of each applied transition.
    pub results_table: &'static str,
    /// The states' database names, in declaration order.
    pub states: &'static [&'static str],
    /// The declared transitions as `(from, to)` indices into `states`.
    pub transitions: &'static [(u16, u16)],
    /// Every pair `(a, b)` such that `b` can be reached from `a` by one or more transitions.
    pub reachable: &'static [(u16, u16)],
    /// The statements idem runs for this machine, per backend.
    pub sql: MachineSql,
}

impl Definition {
    /// The index of the state stored as `name`.
    pub fn state_index(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| *s == name)
    }

    /// Whether `to` can be reached from `from` by one or more declared transitions.
    pub fn reaches(&self, from: usize, to: usize) -> bool {
        self.reachable
            .iter()
            .any(|&(a, b)| a as usize == from && b as usize == to)
    }

    /// Whether `from → to` is a declared transition.
    pub fn declares(&self, from: usize, to: usize) -> bool {
        self.transitions
            .iter()
            .any(|&(a, b)| a as usize == from && b as usize == to)
    }
}
