//! The SQL that makes the database itself enforce a machine: only declared states in the
//! state column, and only declared transitions between them, whoever writes the table.
//! Generated at compile time from the declaration (by `#[derive(StateMachine)]`), one
//! script per backend.

use crate::dialect::Dialect;
use crate::ident::{quoted, quoted_with};

/// What the scripts are built from.
pub struct Machine<'a> {
    /// The enum's name, for the error messages.
    pub name: &'a str,
    /// The machine's table (`orders`, `billing.orders`).
    pub table: &'a str,
    /// Its state column.
    pub state: &'a str,
    /// The states' database names.
    pub states: &'a [&'a str],
    /// The declared transitions, as indices into `states`.
    pub transitions: &'a [(u16, u16)],
}

impl Machine<'_> {
    /// The script for `dialect`.
    pub fn script(&self, dialect: Dialect) -> String {
        match dialect {
            Dialect::Postgres => self.postgres(),
            Dialect::Sqlite => self.sqlite(),
            Dialect::MySql => self.mysql(),
        }
    }

    /// `idem_<table>_<state>_<what>`, the name of an object of the script (a schema
    /// qualifying the table is part of the name, not of the object's schema).
    fn object(&self, what: &str) -> String {
        format!(
            "idem_{}_{}_{what}",
            self.table.replace('.', "_"),
            self.state
        )
    }

    fn state_list(&self) -> String {
        self.states
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn edge_list(&self) -> String {
        self.transitions
            .iter()
            .map(|&(a, b)| {
                format!(
                    "('{}', '{}')",
                    self.states[a as usize], self.states[b as usize]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// PostgreSQL: a CHECK constraint on the state column, and a row trigger that refuses an
    /// UPDATE moving the state along no declared transition (SQLSTATE 23514,
    /// `check_violation`). Rerunnable: each object is dropped or replaced first.
    pub fn postgres(&self) -> String {
        let table = quoted(self.table);
        let state = quoted(self.state);
        let check = quoted(&self.object("declared"));
        // The trigger is named on its table; its function lives in the table's schema.
        let edges = quoted(&self.object("edges"));
        let function = match self.table.split_once('.') {
            Some((schema, _)) => format!("{}.{edges}", quoted(schema)),
            None => edges.clone(),
        };
        let name = self.name;
        let text = |row: &str| format!("CAST({row}.{state} AS TEXT)");
        let (old, new) = (text("OLD"), text("NEW"));
        format!(
            "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {check};\n\
             ALTER TABLE {table} ADD CONSTRAINT {check}\n\
             \x20   CHECK (CAST({state} AS TEXT) IN ({states}));\n\
             CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $idem$\n\
             BEGIN\n\
             \x20   IF {new} IS DISTINCT FROM {old}\n\
             \x20      AND ({old}, {new}) NOT IN ({transitions}) THEN\n\
             \x20       RAISE EXCEPTION 'idem: % -> % is not a transition of the state machine {name}', {old}, {new}\n\
             \x20           USING ERRCODE = 'check_violation';\n\
             \x20   END IF;\n\
             \x20   RETURN NEW;\n\
             END\n\
             $idem$;\n\
             DROP TRIGGER IF EXISTS {edges} ON {table};\n\
             CREATE TRIGGER {edges} BEFORE UPDATE OF {state} ON {table}\n\
             \x20   FOR EACH ROW EXECUTE FUNCTION {function}();",
            states = self.state_list(),
            transitions = self.edge_list(),
        )
    }

    /// SQLite: no constraint can be added to an existing table, so triggers do both jobs:
    /// one refuses an INSERT of an undeclared state, one an UPDATE along no declared
    /// transition (`RAISE(ABORT, …)`). Rerunnable.
    pub fn sqlite(&self) -> String {
        // A trigger lives in its table's schema and names the table unqualified.
        let (schema, table) = match self.table.split_once('.') {
            Some((schema, table)) => (format!("{}.", quoted(schema)), quoted(table)),
            None => (String::new(), quoted(self.table)),
        };
        let state = quoted(self.state);
        let declared = format!("{schema}{}", quoted(&self.object("declared")));
        let edges = format!("{schema}{}", quoted(&self.object("edges")));
        let name = self.name;
        format!(
            "DROP TRIGGER IF EXISTS {declared};\n\
             CREATE TRIGGER {declared} BEFORE INSERT ON {table}\n\
             WHEN NEW.{state} NOT IN ({states})\n\
             BEGIN SELECT RAISE(ABORT, 'idem: not a state of the state machine {name}'); END;\n\
             DROP TRIGGER IF EXISTS {edges};\n\
             CREATE TRIGGER {edges} BEFORE UPDATE OF {state} ON {table}\n\
             WHEN NEW.{state} IS NOT OLD.{state}\n\
             \x20   AND (OLD.{state}, NEW.{state}) NOT IN (VALUES {transitions})\n\
             BEGIN SELECT RAISE(ABORT, 'idem: not a transition of the state machine {name}'); END;",
            states = self.state_list(),
            transitions = self.edge_list(),
        )
    }

    /// MySQL and MariaDB: triggers, as on SQLite (a CHECK constraint cannot be added
    /// rerunnably on both), refusing an INSERT of an undeclared state and an UPDATE along no
    /// declared transition with `SIGNAL SQLSTATE '23000'` (error 1644). A trigger lives in
    /// its table's schema. Rerunnable. Each trigger is one statement of the script, its
    /// body's `;` inside `BEGIN … END` (the server parses it; only the `mysql` client needs
    /// `DELIMITER`).
    pub fn mysql(&self) -> String {
        let q = |name: &str| quoted_with(name, '`');
        let schema = match self.table.split_once('.') {
            Some((schema, _)) => format!("{}.", q(schema)),
            None => String::new(),
        };
        let table = q(self.table);
        let state = q(self.state);
        let declared = format!("{schema}{}", q(&self.object("declared")));
        let edges = format!("{schema}{}", q(&self.object("edges")));
        let name = self.name;
        // Compared byte for byte: in a case-insensitive collation `created` would pass
        // for `CREATED`.
        let (new, old) = (
            format!("CAST(NEW.{state} AS BINARY)"),
            format!("CAST(OLD.{state} AS BINARY)"),
        );
        format!(
            "DROP TRIGGER IF EXISTS {declared};\n\
             CREATE TRIGGER {declared} BEFORE INSERT ON {table}\n\
             FOR EACH ROW BEGIN\n\
             \x20   IF {new} NOT IN ({states}) THEN\n\
             \x20       SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = 'idem: not a state of the state machine {name}';\n\
             \x20   END IF;\n\
             END;\n\
             DROP TRIGGER IF EXISTS {edges};\n\
             CREATE TRIGGER {edges} BEFORE UPDATE ON {table}\n\
             FOR EACH ROW BEGIN\n\
             \x20   DECLARE refused VARCHAR(255);\n\
             \x20   IF NOT ({new} <=> {old})\n\
             \x20      AND ({old}, {new}) NOT IN ({transitions}) THEN\n\
             \x20       SET refused = CONCAT('idem: ', COALESCE(OLD.{state}, 'NULL'), ' -> ', COALESCE(NEW.{state}, 'NULL'),\n\
             \x20           ' is not a transition of the state machine {name}');\n\
             \x20       SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = refused;\n\
             \x20   END IF;\n\
             END;",
            states = self.state_list(),
            transitions = self.edge_list(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: Machine<'static> = Machine {
        name: "Order",
        table: "orders",
        state: "status",
        states: &["CREATED", "PAID", "SHIPPED"],
        transitions: &[(0, 1), (1, 2)],
    };

    #[test]
    fn the_scripts_list_every_state_and_transition() {
        let pg = ORDER.postgres();
        assert!(pg.contains("CHECK (CAST(\"status\" AS TEXT) IN ('CREATED', 'PAID', 'SHIPPED'))"));
        assert!(pg.contains("NOT IN (('CREATED', 'PAID'), ('PAID', 'SHIPPED'))"));
        assert!(pg.contains("BEFORE UPDATE OF \"status\" ON \"orders\""));
        let lite = ORDER.sqlite();
        assert!(lite.contains("WHEN NEW.\"status\" NOT IN ('CREATED', 'PAID', 'SHIPPED')"));
        assert!(lite.contains("NOT IN (VALUES ('CREATED', 'PAID'), ('PAID', 'SHIPPED'))"));
        let my = ORDER.script(Dialect::MySql);
        assert!(my.contains(
            "IF CAST(NEW.`status` AS BINARY) NOT IN ('CREATED', 'PAID', 'SHIPPED') THEN"
        ));
        assert!(my.contains("NOT IN (('CREATED', 'PAID'), ('PAID', 'SHIPPED')) THEN"));
        assert!(my.contains("BEFORE UPDATE ON `orders`"));
    }

    #[test]
    fn a_schema_qualified_table_keeps_its_triggers_in_its_schema() {
        let billing = Machine {
            table: "billing.orders",
            ..ORDER
        };
        let lite = billing.sqlite();
        assert!(lite.contains(
            "CREATE TRIGGER \"billing\".\"idem_billing_orders_status_edges\" BEFORE UPDATE OF \"status\" ON \"orders\""
        ));
        let pg = billing.postgres();
        assert!(pg.contains("ON \"billing\".\"orders\""));
        assert!(pg.contains("EXECUTE FUNCTION \"billing\".\"idem_billing_orders_status_edges\"()"));
    }
}
