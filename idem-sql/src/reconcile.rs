//! Reconciliation's statements: a user's table of effects (one row per effect, carrying
//! the idempotency key it was made for) read against idem's records of the same keys.
//!
//! Three statements, each one read of both tables in one snapshot, each streamed by the
//! runtime (its rows are counted and the first few kept, never all held):
//!
//! - **duplicates**: keys with more than one effect (`GROUP BY` the key);
//! - **effects without a record**: an effect whose key has no done record, probed by the
//!   records table's primary key;
//! - **records without an effect**: a done record whose key has no effect, probed by the
//!   effects' key column.
//!
//! Records are an inbox's (a consumer group's records done) or a machine's (its rows in
//! the states past a transition). Two keys of the same type (text, integer, UUID) are
//! compared as they are, so an index on either serves the probe; any other pair (an
//! integer effect key against the inbox's text keys, a query's column of unknown type)
//! as text ([`Dialect::text_type`]). Effects whose key is NULL are not read.

use crate::catalog::TypeKind;
use crate::dialect::Dialect;

/// Where the effects are: a table, or a query of the user's, and the column holding the
/// key. Names are quoted by the dialect; a query is the user's own SQL, used as written
/// inside `( … ) AS e`.
#[derive(Debug, Clone, Copy)]
pub enum EffectsFrom<'a> {
    /// A table (`name` or `schema.name`) and its key column.
    Table {
        /// The table.
        table: &'a str,
        /// Its key column.
        key: &'a str,
        /// The key column's type.
        kind: TypeKind,
    },
    /// A query and the name of its key column (of a type not known: compared as text).
    Query {
        /// The query, as the user wrote it.
        sql: &'a str,
        /// The column of its rows holding the key.
        key: &'a str,
    },
}

/// Which of idem's records the effects are read against, and how they are bound.
#[derive(Debug, Clone, Copy)]
pub enum RecordsOf<'a> {
    /// A consumer group's done records in the inbox (`idem_inbox`): `$1` the group.
    Inbox,
    /// A machine's rows in some states (those past a transition): `$1`… the states.
    Rows {
        /// The machine's table.
        table: &'a str,
        /// Its key column.
        key: &'a str,
        /// The key column's type.
        kind: TypeKind,
        /// Its state column.
        state: &'a str,
        /// How many states are bound.
        states: usize,
    },
}

/// The three statements of one reconciliation (see the module's documentation), and the
/// two counts of what was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileSql {
    /// `effect_key`, `effects`: each key with more than one effect, in key order.
    pub duplicates: String,
    /// `effect_key`, `effects`: each key with effects and no done record, in key order.
    pub without_record: String,
    /// `record_key`: each done record without an effect, in key order.
    pub without_effect: String,
    /// `n`: the effects read (NULL keys aside).
    pub effects: String,
    /// `n`: the done records read.
    pub records: String,
}

/// Whether two keys of these types compare as they are (an index on either serves the
/// comparison): text with text, integers with integers, UUIDs with UUIDs. Any other pair
/// compares as text.
fn compare_as_stored(a: TypeKind, b: TypeKind) -> bool {
    a == b && matches!(a, TypeKind::Text | TypeKind::Integer | TypeKind::Uuid)
}

impl Dialect {
    /// The type a value is cast to for text: `TEXT`, or MySQL's `CHAR`.
    pub fn text_type(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::Sqlite => "TEXT",
            Dialect::MySql => "CHAR",
        }
    }

    /// The statements reconciling `effects` with `records`.
    pub fn reconcile(self, effects: EffectsFrom<'_>, records: RecordsOf<'_>) -> ReconcileSql {
        let text = |expr: &str, kind: TypeKind| match kind {
            TypeKind::Text => expr.to_owned(),
            _ => format!("CAST({expr} AS {})", self.text_type()),
        };
        let (from, key, kind) = match effects {
            EffectsFrom::Table { table, key, kind } => {
                (self.quoted(table), format!("e.{}", self.quoted(key)), kind)
            }
            EffectsFrom::Query { sql, key } => (
                format!("({sql})"),
                format!("e.{}", self.quoted(key)),
                TypeKind::Other,
            ),
        };
        let (records_table, record_key, record_kind, done) = match records {
            // The inbox's keys are text (MySQL: bytes, which compare with text byte for
            // byte).
            RecordsOf::Inbox => (
                "idem_inbox".to_owned(),
                "r.message_key".to_owned(),
                TypeKind::Text,
                "r.consumer_group = $1 AND r.status = 'SUCCESS'".to_owned(),
            ),
            RecordsOf::Rows {
                table,
                key,
                kind,
                state,
                states,
            } => (
                self.quoted(table),
                format!("r.{}", self.quoted(key)),
                kind,
                format!(
                    "{} IN ({})",
                    text(&format!("r.{}", self.quoted(state)), TypeKind::Other),
                    (1..=states.max(1))
                        .map(|n| format!("${n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        };
        let (effect_side, record_side) = if compare_as_stored(kind, record_kind) {
            (key.clone(), record_key.clone())
        } else {
            (text(&key, kind), text(&record_key, record_kind))
        };
        let effect_key = text(&key, kind);
        let shown_record_key = text(&record_key, record_kind);
        ReconcileSql {
            duplicates: format!(
                "SELECT {effect_key} AS effect_key, COUNT(*) AS effects FROM {from} AS e \
                 WHERE {key} IS NOT NULL GROUP BY {key} HAVING COUNT(*) > 1 ORDER BY {key}"
            ),
            without_record: format!(
                "SELECT {effect_key} AS effect_key, COUNT(*) AS effects FROM {from} AS e \
                 WHERE {key} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {records_table} AS r \
                 WHERE {done} AND {record_side} = {effect_side}) GROUP BY {key} ORDER BY {key}"
            ),
            without_effect: format!(
                "SELECT {shown_record_key} AS record_key FROM {records_table} AS r WHERE {done} \
                 AND NOT EXISTS (SELECT 1 FROM {from} AS e WHERE {effect_side} = {record_side}) \
                 ORDER BY {record_key}"
            ),
            effects: format!("SELECT COUNT(*) AS n FROM {from} AS e WHERE {key} IS NOT NULL"),
            records: format!("SELECT COUNT(*) AS n FROM {records_table} AS r WHERE {done}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_key_is_compared_as_it_is_and_another_as_its_text() {
        let text = Dialect::Postgres.reconcile(
            EffectsFrom::Table {
                table: "shop.payments",
                key: "message_key",
                kind: TypeKind::Text,
            },
            RecordsOf::Inbox,
        );
        assert!(
            text.without_effect.contains(
                "FROM \"shop\".\"payments\" AS e WHERE e.\"message_key\" = r.message_key"
            ),
            "{}",
            text.without_effect
        );
        let int = Dialect::Postgres.reconcile(
            EffectsFrom::Table {
                table: "payments",
                key: "order_id",
                kind: TypeKind::Integer,
            },
            RecordsOf::Inbox,
        );
        assert!(
            int.without_effect
                .contains("WHERE CAST(e.\"order_id\" AS TEXT) = r.message_key"),
            "{}",
            int.without_effect
        );
    }

    #[test]
    fn a_machines_rows_are_read_in_the_states_bound() {
        let orders = RecordsOf::Rows {
            table: "orders",
            key: "order_id",
            kind: TypeKind::Integer,
            state: "status",
            states: 2,
        };
        let payments = |kind| EffectsFrom::Table {
            table: "payments",
            key: "order_id",
            kind,
        };
        let same = Dialect::Postgres.reconcile(payments(TypeKind::Integer), orders);
        assert!(
            same.without_record.contains(
                "WHERE CAST(r.\"status\" AS TEXT) IN ($1, $2) AND r.\"order_id\" = e.\"order_id\")"
            ),
            "{}",
            same.without_record
        );
        assert!(
            same.without_effect.starts_with(
                "SELECT CAST(r.\"order_id\" AS TEXT) AS record_key FROM \"orders\" AS r"
            )
        );
        let text = Dialect::MySql.reconcile(payments(TypeKind::Text), orders);
        assert!(
            text.without_record
                .contains("CAST(r.`order_id` AS CHAR) = e.`order_id`"),
            "{}",
            text.without_record
        );
    }

    #[test]
    fn mysql_casts_to_char() {
        let sql = Dialect::MySql.reconcile(
            EffectsFrom::Query {
                sql: "SELECT ref FROM ledger WHERE kind = 'credit'",
                key: "ref",
            },
            RecordsOf::Inbox,
        );
        assert!(sql.duplicates.starts_with(
            "SELECT CAST(e.`ref` AS CHAR) AS effect_key, COUNT(*) AS effects \
             FROM (SELECT ref FROM ledger WHERE kind = 'credit') AS e"
        ));
    }
}
