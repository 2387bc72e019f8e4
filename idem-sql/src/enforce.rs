//! The SQL that makes the database itself enforce a machine: only declared states in the
//! state column, and only declared transitions between them, whoever writes the table.
//! Generated at compile time from the declaration (by `#[derive(StateMachine)]`), one
//! script per backend.

use crate::dialect::Dialect;
use crate::ident::{MAX_IDENT_LEN, quoted, quoted_with};

/// `name` if it has at most [`MAX_IDENT_LEN`] (63) bytes, PostgreSQL's limit (MySQL's is
/// 64); otherwise its head, `_`, 12 hex digits of a digest of the whole name, `_` and
/// `suffix`, 63 bytes in all — so two names that share their first 63 bytes (two long table
/// names differing at the end) stay two objects, where PostgreSQL would cut both to one.
///
/// The digest is 64-bit FNV-1a (std-only and `const`, defined by its two constants, so the
/// same on every machine and in every version of idem: a rerun of `enforce` must find the
/// objects the last one made), of which the low 48 bits are written. It is not a
/// cryptographic digest and needs not be: the names are the user's own declarations.
pub fn object_name(name: &str, suffix: &str) -> String {
    if name.len() <= MAX_IDENT_LEN {
        return name.to_owned();
    }
    let tail = format!(
        "_{:012x}_{suffix}",
        fnv1a(name.as_bytes()) & 0xffff_ffff_ffff
    );
    let head = floor_char_boundary(name, MAX_IDENT_LEN.saturating_sub(tail.len()));
    format!("{}{tail}", &name[..head])
}

/// 64-bit FNV-1a.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// The largest char boundary of `s` at most `at` (identifiers are ASCII; this never
/// panics either way).
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

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
    /// qualifying the table is part of the name, not of the object's schema), shortened by
    /// [`object_name`] when it is longer than [`MAX_IDENT_LEN`].
    fn object(&self, what: &str) -> String {
        object_name(&self.full_object(what), what)
    }

    /// The object's name as it was before names were shortened.
    fn full_object(&self, what: &str) -> String {
        format!(
            "idem_{}_{}_{what}",
            self.table.replace('.', "_"),
            self.state
        )
    }

    /// The name PostgreSQL gave the object before idem shortened names itself (it cut it
    /// at 63 bytes), when that differs from today's: the script drops it, so that a
    /// trigger installed under it (whose function another machine may have replaced) does
    /// not stay on the table.
    fn truncated_object(&self, what: &str) -> Option<String> {
        let full = self.full_object(what);
        (full.len() > MAX_IDENT_LEN)
            .then(|| full[..floor_char_boundary(&full, MAX_IDENT_LEN)].to_owned())
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
        // What an older idem left under the name PostgreSQL cut at 63 bytes (its function
        // may be another machine's by now: it is left, unused).
        let mut legacy = String::new();
        if let Some(check) = self.truncated_object("declared") {
            legacy += &format!(
                "ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {};\n",
                quoted(&check)
            );
        }
        if let Some(edges) = self.truncated_object("edges") {
            legacy += &format!("DROP TRIGGER IF EXISTS {} ON {table};\n", quoted(&edges));
        }
        format!(
            "{legacy}\
             ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {check};\n\
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
        // What an older idem left under the whole long name (SQLite cuts none).
        let mut legacy = String::new();
        for what in ["declared", "edges"] {
            if self.full_object(what).len() > MAX_IDENT_LEN {
                let full = quoted(&self.full_object(what));
                legacy += &format!("DROP TRIGGER IF EXISTS {schema}{full};\n");
            }
        }
        format!(
            "{legacy}\
             DROP TRIGGER IF EXISTS {declared};\n\
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

    /// Two tables whose names differ only past the 63rd byte of the objects' names.
    #[test]
    fn long_names_are_shortened_by_a_digest_of_the_whole() {
        let a = Machine {
            table: "orders_kept_by_the_billing_department_of_the_northern_region_a",
            ..ORDER
        };
        let b = Machine {
            table: "orders_kept_by_the_billing_department_of_the_northern_region_b",
            ..ORDER
        };
        let names = [a.object("edges"), b.object("edges")];
        assert_ne!(names[0], names[1]);
        for name in &names {
            assert_eq!(name.len(), MAX_IDENT_LEN, "{name}");
            assert!(
                name.starts_with("idem_orders_kept_by_the_billing_"),
                "{name}"
            );
            assert!(name.ends_with("_edges"), "{name}");
            assert_eq!(crate::ident::sql_identifier_problem(name), None, "{name}");
        }
        assert_ne!(a.object("declared"), a.object("edges"));
        // The digest is part of the database's state: it never changes.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            object_name(&"x".repeat(70), "edges"),
            format!(
                "{}_{:012x}_edges",
                "x".repeat(44),
                fnv1a("x".repeat(70).as_bytes()) & 0xffff_ffff_ffff
            )
        );
        // Short names are as they were.
        assert_eq!(ORDER.object("edges"), "idem_orders_status_edges");
        assert!(!ORDER.postgres().contains("idem_orders_status_edges_"));
        // What PostgreSQL cut at 63 bytes, and SQLite kept whole, is dropped first.
        let cut = &a.full_object("edges")[..MAX_IDENT_LEN];
        assert!(a.postgres().starts_with(&format!(
            "ALTER TABLE \"{}\" DROP CONSTRAINT IF EXISTS \"{}\";\nDROP TRIGGER IF EXISTS \"{cut}\" ON",
            a.table,
            &a.full_object("declared")[..MAX_IDENT_LEN],
        )), "{}", a.postgres());
        assert!(
            a.sqlite().starts_with(&format!(
                "DROP TRIGGER IF EXISTS \"{}\";\nDROP TRIGGER IF EXISTS \"{}\";\n",
                a.full_object("declared"),
                a.full_object("edges"),
            )),
            "{}",
            a.sqlite()
        );
        assert!(
            ORDER
                .sqlite()
                .starts_with("DROP TRIGGER IF EXISTS \"idem_orders_status_declared\";\nCREATE")
        );
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
