//! How long the values idem stores in a results table may be, in bytes, on every backend.
//!
//! One set of limits for every backend, the tightest's, so that a key a test accepts on
//! SQLite is one production accepts on a server: MySQL's results table holds them in
//! `VARBINARY` columns whose primary key stays under InnoDB's 3072 bytes, and PostgreSQL's
//! B-tree refuses an index entry over about 2700 bytes. Each is checked before any
//! statement runs, never left to the database (which, on MySQL outside strict mode,
//! truncates a value and lets two keys collide): the machine id and the state names by
//! the derive, at compile time; a key's text by the runtime, as `Error::InvalidKey`.

/// The longest machine id (`#[machine(id = "…")]`, or the enum's name), in bytes: the
/// results table's `machine` column.
pub const MACHINE_ID: usize = 255;

/// The longest key as stored in the results table (`entity_key`), in bytes: a key's text
/// (a composite key's JSON array of its parts; an event stream's key with the event's
/// version after U+001F).
pub const KEY_TEXT: usize = 2048;

/// The longest state name, in bytes: the results table's `from_state` and `to_state`.
pub const STATE: usize = 64;

// MySQL's primary key over the four columns stays under InnoDB's 3072 bytes.
const _: () = assert!(MACHINE_ID + KEY_TEXT + 2 * STATE <= 3072);

#[cfg(test)]
mod tests {
    use super::*;

    /// MySQL's results table declares these lengths.
    #[test]
    fn the_mysql_results_table_has_these_lengths() {
        let ddl = crate::transition::mysql(
            &crate::transition::Names {
                table: "orders",
                key: &["id"],
                state: "status",
                version: "version",
                results: "idem_results",
            },
            &[],
        )
        .create_results_table;
        for column in [
            format!("machine VARBINARY({MACHINE_ID})"),
            format!("entity_key VARBINARY({KEY_TEXT})"),
            format!("from_state VARBINARY({STATE})"),
            format!("to_state VARBINARY({STATE})"),
        ] {
            assert!(ddl.contains(&column), "{ddl}");
        }
    }
}
