//! The SQL text of a machine, generated once at compile time.
//!
//! Identifiers are validated before they get here and are quoted; every value is a bound
//! parameter. The parameter positions are documented on `idem::Statements`.

use crate::ident::quoted;

/// The names a machine's statements are built from.
pub struct Names<'a> {
    pub table: &'a str,
    pub key: &'a str,
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

struct Quoted {
    table: String,
    key: String,
    state: String,
    version: String,
    results: String,
}

impl Quoted {
    fn new(names: &Names<'_>) -> Self {
        Quoted {
            table: quoted(names.table),
            key: quoted(names.key),
            state: quoted(names.state),
            version: quoted(names.version),
            results: quoted(names.results),
        }
    }

    /// `UPDATE … SET state = $3, version = version + 1 WHERE key = $1 AND state = $2 AND <guard>`
    fn update(&self, guard: &str) -> String {
        let Quoted {
            table,
            key,
            state,
            version,
            ..
        } = self;
        format!(
            "UPDATE {table}\n\
             SET {state} = $3, {version} = {version} + 1\n\
             WHERE {key} = $1 AND {state} = $2 AND {guard}"
        )
    }

    /// The LEFT JOINs that read the row and its stored first result.
    fn current_row_and_result(&self) -> String {
        let Quoted {
            table,
            key,
            results,
            ..
        } = self;
        format!(
            "LEFT JOIN {table} AS cur ON cur.{key} = $1\n\
             LEFT JOIN {results} AS res ON res.machine = $4 AND res.entity_key = $5\n\
             \x20   AND res.from_state = CAST($2 AS TEXT) AND res.to_state = CAST($3 AS TEXT)"
        )
    }

    fn observed_columns(&self) -> String {
        let Quoted {
            key,
            state,
            version,
            ..
        } = self;
        format!(
            "CAST(CASE WHEN cur.{key} IS NULL THEN 0 ELSE 1 END AS BIGINT) AS found,\n\
             \x20      CAST(cur.{state} AS TEXT) AS current_state,\n\
             \x20      CAST(cur.{version} AS BIGINT) AS current_version,\n\
             \x20      res.result AS first_result"
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
    let guarded = format!("{} = $6", q.version);
    let update_guarded = format!("{} = $4", q.version);
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
    let guarded = format!("{} = $4", q.version);
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

    const ORDERS: Names<'static> = Names {
        table: "orders",
        key: "order_id",
        state: "status",
        version: "version",
        results: "idem_results",
    };

    #[test]
    fn sqlite_transition_is_one_conditional_update() {
        assert_eq!(
            sqlite(&ORDERS).transition,
            "UPDATE \"orders\"\n\
             SET \"status\" = $3, \"version\" = \"version\" + 1\n\
             WHERE \"order_id\" = $1 AND \"status\" = $2 AND \"version\" IS NOT NULL"
        );
        assert!(
            sqlite(&ORDERS)
                .transition_guarded
                .ends_with("AND \"version\" = $4")
        );
    }

    #[test]
    fn postgres_transition_classifies_in_the_same_statement() {
        let sql = postgres(&ORDERS).transition;
        assert!(sql.starts_with("WITH upd AS (\nUPDATE \"orders\"\n"));
        // The classifying read runs only when the UPDATE matched nothing.
        assert!(sql.contains("LEFT JOIN \"orders\" AS cur ON cur.\"order_id\" = $1"));
        assert!(sql.ends_with("WHERE NOT EXISTS (SELECT FROM upd)"));
        assert!(
            postgres(&ORDERS)
                .transition_guarded
                .contains("\"version\" = $6")
        );
        // every parameter of the unguarded statement is used, or PostgreSQL cannot type it
        for n in 1..=5 {
            assert!(sql.contains(&format!("${n}")), "missing ${n}");
        }
        assert!(!sql.contains("$6"));
    }

    #[test]
    fn values_are_never_spliced() {
        for s in [postgres(&ORDERS), sqlite(&ORDERS)] {
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
