//! The SQL text of a machine, generated once at compile time.
//!
//! Identifiers are validated before they get here and are quoted; every value is a bound
//! parameter. The parameter positions are documented on `idem::Statements`.

use crate::ident::quoted;

/// The names a machine's statements are built from.
pub struct Names<'a> {
    pub table: &'a str,
    /// The key's columns, in order: one, or several for a composite key.
    pub key: &'a [String],
    pub state: &'a str,
    pub version: &'a str,
    pub results: &'a str,
}

/// The statements of one backend, in the field order of `idem::Statements`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    pub transition: String,
    pub transition_guarded: String,
    pub update: String,
    pub update_guarded: String,
    pub classify: String,
    pub store_result: String,
    pub create_results_table: String,
}

/// The quoted names, and the parameter positions: the key's columns come first
/// (`$1` … `$k`), then the states, the machine's id, the key as text and the expected
/// version, each one position later per extra key column.
struct Quoted {
    table: String,
    keys: Vec<String>,
    state: String,
    version: String,
    results: String,
}

impl Quoted {
    fn new(names: &Names<'_>) -> Self {
        Quoted {
            table: quoted(names.table),
            keys: names.key.iter().map(|k| quoted(k)).collect(),
            state: quoted(names.state),
            version: quoted(names.version),
            results: quoted(names.results),
        }
    }

    /// The position of the `n`th parameter after the key's columns (`from` is 1).
    fn after_key(&self, n: usize) -> String {
        format!("${}", self.keys.len() + n)
    }

    /// `key = $1` — or, for a composite key, `tenant = $1 AND order_id = $2` — with each
    /// column behind `prefix`.
    fn key_matches(&self, prefix: &str) -> String {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, key)| format!("{prefix}{key} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `UPDATE … SET state = <to>, version = version + 1 WHERE <key> AND state = <from> AND <guard>`
    fn update(&self, guard: &str) -> String {
        let Quoted {
            table,
            state,
            version,
            ..
        } = self;
        format!(
            "UPDATE {table}\n\
             SET {state} = {to}, {version} = {version} + 1\n\
             WHERE {key} AND {state} = {from} AND {guard}",
            key = self.key_matches(""),
            from = self.after_key(1),
            to = self.after_key(2),
        )
    }

    /// The LEFT JOINs that read the row and its stored first result.
    fn current_row_and_result(&self) -> String {
        let Quoted { table, results, .. } = self;
        format!(
            "LEFT JOIN {table} AS cur ON {key}\n\
             LEFT JOIN {results} AS res ON res.machine = {machine} AND res.entity_key = {text}\n\
             \x20   AND res.from_state = CAST({from} AS TEXT) AND res.to_state = CAST({to} AS TEXT)",
            key = self.key_matches("cur."),
            from = self.after_key(1),
            to = self.after_key(2),
            machine = self.after_key(3),
            text = self.after_key(4),
        )
    }

    fn observed_columns(&self) -> String {
        let Quoted { state, version, .. } = self;
        format!(
            "CAST(CASE WHEN cur.{key} IS NULL THEN 0 ELSE 1 END AS BIGINT) AS found,\n\
             \x20      CAST(cur.{state} AS TEXT) AS current_state,\n\
             \x20      CAST(cur.{version} AS BIGINT) AS current_version,\n\
             \x20      res.result AS first_result",
            key = self.keys[0],
        )
    }

    fn classify(&self) -> String {
        format!(
            "SELECT {}\n\
             FROM (SELECT 1) AS one\n\
             {}",
            self.observed_columns(),
            self.current_row_and_result()
        )
    }

    /// The UPDATE, and only if it matched nothing, the classifying read: the second branch
    /// is gated by a one-time filter on the UPDATE's result, so an applied transition reads
    /// nothing more (no extra index scans, and no predicate locks under SERIALIZABLE that
    /// would make concurrent transitions of other keys conflict).
    fn postgres_transition(&self, guard: &str) -> String {
        let version = &self.version;
        format!(
            "WITH upd AS (\n\
             {update}\n\
             RETURNING {version}\n\
             )\n\
             SELECT CAST({version} AS BIGINT) AS applied_version,\n\
             \x20      CAST(1 AS BIGINT) AS found,\n\
             \x20      CAST(NULL AS TEXT) AS current_state,\n\
             \x20      CAST(NULL AS BIGINT) AS current_version,\n\
             \x20      CAST(NULL AS TEXT) AS first_result\n\
             FROM upd\n\
             UNION ALL\n\
             SELECT NULL,\n\
             \x20      {observed}\n\
             FROM (SELECT 1) AS one\n\
             {joins}\n\
             WHERE NOT EXISTS (SELECT FROM upd)",
            update = self.update(guard),
            observed = self.observed_columns(),
            joins = self.current_row_and_result(),
        )
    }

    /// The conditional UPDATE alone; the runtime reads how many rows it changed (no
    /// `RETURNING`: it costs SQLite a temporary table per statement).
    fn plain_update(&self, guard: &str) -> String {
        self.update(guard)
    }

    fn store_result(&self) -> String {
        format!(
            "INSERT INTO {} (machine, entity_key, from_state, to_state, result)\n\
             VALUES ($1, $2, $3, $4, $5)\n\
             ON CONFLICT (machine, entity_key, from_state, to_state)\n\
             DO UPDATE SET result = excluded.result, created_at = CURRENT_TIMESTAMP",
            self.results
        )
    }

    fn create_results_table(&self, timestamp: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20   machine TEXT NOT NULL,\n\
             \x20   entity_key TEXT NOT NULL,\n\
             \x20   from_state TEXT NOT NULL,\n\
             \x20   to_state TEXT NOT NULL,\n\
             \x20   result TEXT NOT NULL,\n\
             \x20   created_at {timestamp} NOT NULL DEFAULT CURRENT_TIMESTAMP,\n\
             \x20   PRIMARY KEY (machine, entity_key, from_state, to_state)\n\
             )",
            self.results
        )
    }
}

/// The PostgreSQL statements: the transition attempt that also classifies a miss, in one
/// round trip, and the plain UPDATE with its classifying SELECT (the runtime chooses).
pub fn postgres(names: &Names<'_>) -> Statements {
    let q = Quoted::new(names);
    let not_null = format!("{} IS NOT NULL", q.version);
    let guarded = format!("{} = {}", q.version, q.after_key(5));
    let update_guarded = format!("{} = {}", q.version, q.after_key(3));
    Statements {
        transition: q.postgres_transition(&not_null),
        transition_guarded: q.postgres_transition(&guarded),
        update: q.plain_update(&not_null),
        update_guarded: q.plain_update(&update_guarded),
        classify: q.classify(),
        store_result: q.store_result(),
        create_results_table: q.create_results_table("TIMESTAMPTZ"),
    }
}

/// The SQLite statements: no DML in a CTE, so a miss is classified by a second statement
/// (inside `BEGIN IMMEDIATE`, so nothing can change in between).
pub fn sqlite(names: &Names<'_>) -> Statements {
    let q = Quoted::new(names);
    let not_null = format!("{} IS NOT NULL", q.version);
    let guarded = format!("{} = {}", q.version, q.after_key(3));
    Statements {
        transition: q.plain_update(&not_null),
        transition_guarded: q.plain_update(&guarded),
        update: q.plain_update(&not_null),
        update_guarded: q.plain_update(&guarded),
        classify: q.classify(),
        store_result: q.store_result(),
        create_results_table: q.create_results_table("TEXT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(keys: &[&str], backend: fn(&Names<'_>) -> Statements) -> Statements {
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        backend(&Names {
            table: "orders",
            key: &keys,
            state: "status",
            version: "version",
            results: "idem_results",
        })
    }

    fn pg() -> Statements {
        statements(&["order_id"], postgres)
    }

    fn lite() -> Statements {
        statements(&["order_id"], sqlite)
    }

    #[test]
    fn sqlite_transition_is_one_conditional_update() {
        assert_eq!(
            lite().transition,
            "UPDATE \"orders\"\n\
             SET \"status\" = $3, \"version\" = \"version\" + 1\n\
             WHERE \"order_id\" = $1 AND \"status\" = $2 AND \"version\" IS NOT NULL"
        );
        assert!(lite().transition_guarded.ends_with("AND \"version\" = $4"));
    }

    #[test]
    fn postgres_transition_classifies_in_the_same_statement() {
        let sql = pg().transition;
        assert!(sql.starts_with("WITH upd AS (\nUPDATE \"orders\"\n"));
        // The classifying read runs only when the UPDATE matched nothing.
        assert!(sql.contains("LEFT JOIN \"orders\" AS cur ON cur.\"order_id\" = $1"));
        assert!(sql.ends_with("WHERE NOT EXISTS (SELECT FROM upd)"));
        assert!(pg().transition_guarded.contains("\"version\" = $6"));
        // every parameter of the unguarded statement is used, or PostgreSQL cannot type it
        for n in 1..=5 {
            assert!(sql.contains(&format!("${n}")), "missing ${n}");
        }
        assert!(!sql.contains("$6"));
    }

    #[test]
    fn a_composite_key_matches_every_column_and_shifts_the_rest() {
        let keys = ["tenant_id", "order_id"];
        let lite = statements(&keys, sqlite);
        assert_eq!(
            lite.transition,
            "UPDATE \"orders\"\n\
             SET \"status\" = $4, \"version\" = \"version\" + 1\n\
             WHERE \"tenant_id\" = $1 AND \"order_id\" = $2 AND \"status\" = $3 AND \"version\" IS NOT NULL"
        );
        assert!(lite.update_guarded.ends_with("AND \"version\" = $5"));
        assert!(lite.classify.contains(
            "LEFT JOIN \"orders\" AS cur ON cur.\"tenant_id\" = $1 AND cur.\"order_id\" = $2\n"
        ));
        assert!(
            lite.classify
                .contains("res.machine = $5 AND res.entity_key = $6")
        );
        assert!(
            lite.classify
                .contains("CAST($3 AS TEXT) AND res.to_state = CAST($4 AS TEXT)")
        );
        let pg = statements(&keys, postgres);
        for n in 1..=6 {
            assert!(pg.transition.contains(&format!("${n}")), "missing ${n}");
        }
        assert!(!pg.transition.contains("$7"));
        assert!(pg.transition_guarded.contains("\"version\" = $7"));
        assert!(pg.update_guarded.ends_with("\"version\" = $5"));
    }

    #[test]
    fn values_are_never_spliced() {
        for s in [pg(), lite(), statements(&["a", "b"], postgres)] {
            for text in [
                &s.transition,
                &s.transition_guarded,
                &s.classify,
                &s.store_result,
            ] {
                assert!(!text.contains('\''), "{text}");
            }
        }
    }
}
