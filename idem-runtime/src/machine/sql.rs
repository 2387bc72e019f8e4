//! The SQL statements of a machine, one set per backend.
//!
//! The text is generated at compile time by `#[derive(StateMachine)]` (identifiers are
//! validated there and quoted), so it is a constant you can print, test and read in the
//! machine's rustdoc. Every value is a bound parameter; nothing is spliced at run time.

use crate::backend::Dialect;

/// The statements for one machine, one set per backend ([`Dialect`]).
///
/// ```
/// # use idem::{Dialect, StateMachine};
/// # #[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "order_id")]
/// # enum Order { #[state(to(Paid))] Created, Paid }
/// let sql = Order::IDEM_SQL.of(Dialect::MySql);
/// assert!(sql.update.starts_with("UPDATE `orders`"));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MachineSql {
    by_dialect: [Statements; Dialect::ALL.len()],
}

impl MachineSql {
    /// The statements of each dialect, in the order of [`Dialect::ALL`]
    /// (`#[derive(StateMachine)]` builds them).
    #[doc(hidden)]
    pub const fn new(by_dialect: [Statements; Dialect::ALL.len()]) -> Self {
        MachineSql { by_dialect }
    }

    /// The statements of `dialect`.
    pub const fn of(&self, dialect: Dialect) -> &Statements {
        &self.by_dialect[dialect.index()]
    }
}

/// The statements idem runs for one machine on one backend.
///
/// Parameters, by position:
///
/// | statement | `$1` | `$2` | `$3` | `$4` | `$5` | `$6` |
/// |---|---|---|---|---|---|---|
/// | `transition`, PostgreSQL | key | from | to | machine name | key as text | — |
/// | `transition_guarded`, PostgreSQL | key | from | to | machine name | key as text | expected version |
/// | `transition_storing`, PostgreSQL | key | from | to | machine name | key as text | result (JSON) |
/// | `transition_storing_guarded`, PostgreSQL | key | from | to | machine name | key as text | result (JSON), then `$7` expected version |
/// | `transition`, SQLite; `update` | key | from | to | — | — | — |
/// | `transition_guarded`, SQLite; `update_guarded` | key | from | to | expected version | — | — |
/// | `classify` | key | from | to | machine name | key as text | — |
/// | `store_result` | machine name | key as text | from | to | result (JSON) | — |
///
/// With a composite key of `k` columns (`key = ("tenant_id", "order_id")`), "key" is
/// `$1` … `$k`, the key's columns in declaration order, and every later position of the
/// transition and classifying statements moves up by `k − 1` (`from` is `$k+1`). The key as
/// text is the JSON array of the parts; `store_result` is unchanged.
///
/// MySQL's statements are those of SQLite (the rows marked SQLite apply to them), spelled
/// for MySQL, and written with the same numbered parameters: MySQL binds positionally, so
/// idem sends each `$n` as a `?` and binds the value again at each use
/// (`idem_sql::placeholder::positional` gives the text as sent). Their classifying reads end
/// with `LOCK IN SHARE MODE`, `store_result` is an `ON DUPLICATE KEY UPDATE`, and `create`
/// has no `ON CONFLICT` (a taken key is the duplicate-key error, 1062).
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    /// Attempts the transition. On PostgreSQL it also returns the current row and the
    /// stored first result when nothing was updated (columns `applied_version`, `found`,
    /// `current_state`, `current_version`, `first_result`); on SQLite and MySQL it is
    /// [`update`](Self::update).
    pub transition: &'static str,
    /// [`transition`](Self::transition) with the optimistic-locking guard `version = $n`.
    pub transition_guarded: &'static str,
    /// PostgreSQL: [`transition`](Self::transition) that also stores the first result
    /// (`$k+5`, JSON; the expected version moves to `$k+6`) when it moves the row, so that a
    /// handler without a transaction is one autocommit statement. Empty on SQLite, which
    /// has no DML in a CTE (there the result is stored by [`store_result`](Self::store_result)
    /// in a transaction). Empty on MySQL too.
    pub transition_storing: &'static str,
    /// [`transition_storing`](Self::transition_storing) with the guard `version = $k+6`.
    pub transition_storing_guarded: &'static str,
    /// [`transition`](Self::transition) with an event's watermark in the expected
    /// version's place (`$k+5`): `version < $n`, and the row takes the event's version
    /// (`SET version = $n`), so an event older than the row and a duplicate both match
    /// nothing. On SQLite, [`update_watermark`](Self::update_watermark).
    pub transition_watermark: &'static str,
    /// [`transition_storing`](Self::transition_storing) with an event's watermark (`$k+6`).
    /// Empty on SQLite and MySQL.
    pub transition_storing_watermark: &'static str,
    /// [`update`](Self::update) with an event's watermark (`$k+3`).
    pub update_watermark: &'static str,
    /// The conditional UPDATE alone (idem reads how many rows it changed);
    /// [`classify`](Self::classify) follows a miss. On SQLite the same as `transition`; on PostgreSQL used while misses are rare
    /// (see [`Classification`](crate::Classification)).
    pub update: &'static str,
    /// [`update`](Self::update) with the optimistic-locking guard `version = $4`.
    pub update_guarded: &'static str,
    /// Reads the current row and the stored first result (columns `found`,
    /// `current_state`, `current_version`, `first_result`).
    pub classify: &'static str,
    /// [`classify`](Self::classify) as the first read of a transaction idem began: on
    /// MySQL without `LOCK IN SHARE MODE` (InnoDB takes a REPEATABLE READ snapshot at a
    /// transaction's first plain read, so it sees the row the UPDATE that missed saw, and
    /// still locks); the same as `classify` elsewhere.
    pub classify_unlocked: &'static str,
    /// Stores the first result of an applied transition (an upsert).
    pub store_result: &'static str,
    /// Creates the results table if it does not exist.
    pub create_results_table: &'static str,
    /// Creates the row in an initial state under its key (`create = "…"`), unless a row
    /// has the key: `$1` … `$k` the key, `$k+1` the state, version 0, then the columns the
    /// handler sets; `ON CONFLICT (key) DO NOTHING` (the key needs a unique index).
    pub create: &'static str,
    /// After a creation that inserted nothing: the row, whether the columns the handler
    /// sets hold its values (`same_content`), and the first result of the row's creation.
    /// The parameters of [`classify`](Self::classify) (`from` is the empty string, `to`
    /// the created state), then the values compared, from `$k+5`.
    pub classify_created: &'static str,
    /// PostgreSQL: [`create`](Self::create) and the first result's insert in one
    /// statement, which also classifies a taken key, for a creation without a transaction:
    /// the key, `from` (empty), the state, the machine, the key as text, the result
    /// (`$k+5`), then the columns set (`$k+6` on). Empty on SQLite and MySQL.
    pub create_storing: &'static str,
    /// Makes the database enforce the machine, whoever writes the table: only declared
    /// states in the state column, and an UPDATE of it only along a declared transition
    /// (PostgreSQL: a CHECK constraint and a row trigger, SQLSTATE 23514; SQLite: two
    /// triggers, `RAISE(ABORT)`; MySQL: two triggers, `SIGNAL SQLSTATE '23000'`). A script
    /// of several statements, rerunnable; apply it
    /// with [`enforce`](crate::enforce) or in a migration of yours.
    pub enforce: &'static str,
}

#[cfg(test)]
impl Statements {
    /// No statements: for the tests of what a definition says, which run none.
    pub(crate) const NONE: Statements = Statements {
        transition: "",
        transition_guarded: "",
        transition_storing: "",
        transition_storing_guarded: "",
        transition_watermark: "",
        transition_storing_watermark: "",
        update_watermark: "",
        update: "",
        update_guarded: "",
        classify: "",
        classify_unlocked: "",
        store_result: "",
        create_results_table: "",
        create: "",
        classify_created: "",
        create_storing: "",
        enforce: "",
    };
}
