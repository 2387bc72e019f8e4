//! The statements of a machine's transitions, per backend.
//!
//! Identifiers are validated before they get here and are quoted; every value is a bound
//! parameter. The parameter positions are documented on `idem::Statements`; the values of
//! columns a handler sets ([`Assignment`]) come after all of them.

use crate::ident::quoted_with;

/// The names a machine's statements are built from.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The machine's table (`orders`, `billing.orders`).
    pub table: &'a str,
    /// The key's columns, in order: one, or several for a composite key.
    pub key: &'a [&'a str],
    /// The state column.
    pub state: &'a str,
    /// The version column.
    pub version: &'a str,
    /// The table of first results.
    pub results: &'a str,
}

/// A column a handler sets in the transition's UPDATE, besides the state and the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment<'a> {
    /// The column (validated: a plain identifier, not the key, state or version column).
    pub column: &'a str,
    /// What it is set to.
    pub value: SetTo,
}

/// What a column is set to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTo {
    /// A bound parameter: the next one after the statement's own, in the order of the
    /// assignments that are bound.
    Bound,
    /// The database's current timestamp, `CURRENT_TIMESTAMP` (PostgreSQL: the
    /// transaction's start, `timestamptz`; SQLite: `YYYY-MM-DD HH:MM:SS` in UTC).
    Now,
}

/// The statements of one backend, in the field order of `idem::Statements`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statements {
    /// The transition attempt (on PostgreSQL, classifying a miss in the same statement).
    pub transition: String,
    /// `transition` with the guard `version = $n`.
    pub transition_guarded: String,
    /// `transition` that also stores the first result (`$k+5`, JSON) when it moves the
    /// row, in the same statement (PostgreSQL; empty on SQLite, which has no DML in a CTE).
    pub transition_storing: String,
    /// `transition_storing` with the guard `version = $n`.
    pub transition_storing_guarded: String,
    /// `transition` with an event's watermark (`version < $n`, `SET version = $n`).
    pub transition_watermark: String,
    /// `transition_storing` with an event's watermark.
    pub transition_storing_watermark: String,
    /// `update` with an event's watermark.
    pub update_watermark: String,
    /// The conditional UPDATE alone.
    pub update: String,
    /// `update` with the guard `version = $n`.
    pub update_guarded: String,
    /// The classifying read of a miss.
    pub classify: String,
    /// [`classify`](Self::classify) as the first read of a transaction: MySQL's without
    /// `LOCK IN SHARE MODE` (InnoDB takes a REPEATABLE READ snapshot at a transaction's
    /// first plain read, so this one sees the row the UPDATE that missed saw, which holds
    /// its lock); the same as `classify` elsewhere.
    pub classify_unlocked: String,
    /// Stores an applied transition's first result.
    pub store_result: String,
    /// Creates the results table.
    pub create_results_table: String,
    /// Creates the row in an initial state under its key, unless a row has the key: the
    /// key's columns (`$1` … `$k`), the state (`$k+1`), version 0, and the columns set
    /// (`$k+2` on), `ON CONFLICT (key) DO NOTHING`.
    pub create: String,
    /// After a creation that inserted nothing: the row, whether its columns hold this
    /// creation's values (`same_content`), and the first result of its creation. The
    /// classifying read's parameters (with `from` the empty string and `to` the state),
    /// then the bound values, from `$k+5`.
    pub classify_created: String,
    /// PostgreSQL: the creation and its first result in one statement, which also
    /// classifies a taken key (empty on SQLite).
    pub create_storing: String,
}

/// How a backend spells what differs between backends in a transition's statements.
struct Spelling {
    /// The identifier quote: `"` (standard SQL), or MySQL's backtick.
    quote: char,
    /// The type to cast a value to text: `TEXT`, or MySQL's `CHAR`.
    text: &'static str,
    /// The type to cast a value to a 64-bit integer: `BIGINT`, or MySQL's `SIGNED`.
    int: &'static str,
    /// Null-safe equality: `IS NOT DISTINCT FROM`, SQLite's `IS`, MySQL's `<=>`.
    same: &'static str,
    /// What a classifying read ends with: nothing, or MySQL's `LOCK IN SHARE MODE`, so
    /// that under REPEATABLE READ it reads the row as the UPDATE that missed it did (the
    /// latest committed version), not the transaction's older snapshot.
    locking: &'static str,
    /// How an insert gives way to a row with its unique key: `ON CONFLICT (…) DO
    /// NOTHING`, or nothing on MySQL (the runtime reads the duplicate-key error).
    insert_unless_taken: bool,
    /// Whether a classifying read starts from the machine's row (MySQL), not from one row
    /// of its own: see `Quoted::classified_rows`.
    from_the_row: bool,
    /// Whether an integer sum that overflows becomes a REAL instead of an error (SQLite):
    /// the version's increment then raises the error itself.
    overflow_to_real: bool,
}

const STANDARD: Spelling = Spelling {
    quote: '"',
    text: "TEXT",
    int: "BIGINT",
    same: "IS NOT DISTINCT FROM",
    locking: "",
    insert_unless_taken: true,
    from_the_row: false,
    overflow_to_real: false,
};

const SQLITE: Spelling = Spelling {
    same: "IS",
    overflow_to_real: true,
    ..STANDARD
};

const MYSQL: Spelling = Spelling {
    quote: '`',
    text: "CHAR",
    int: "SIGNED",
    same: "<=>",
    locking: "\nLOCK IN SHARE MODE",
    insert_unless_taken: false,
    from_the_row: true,
    overflow_to_real: false,
};

/// The quoted names, and the parameter positions: the key's columns come first
/// (`$1` … `$k`), then the states, the machine's id, the key as text and the expected
/// version, each one position later per extra key column.
struct Quoted {
    table: String,
    keys: Vec<String>,
    state: String,
    version: String,
    results: String,
    /// The columns set besides the state and the version, quoted, and what to.
    set: Vec<(String, SetTo)>,
    spelling: &'static Spelling,
}

impl Quoted {
    fn new(names: &Names<'_>, set: &[Assignment<'_>], spelling: &'static Spelling) -> Self {
        let quoted = |name: &str| quoted_with(name, spelling.quote);
        Quoted {
            table: quoted(names.table),
            keys: names.key.iter().map(|k| quoted(k)).collect(),
            state: quoted(names.state),
            version: quoted(names.version),
            results: quoted(names.results),
            set: set.iter().map(|a| (quoted(a.column), a.value)).collect(),
            spelling,
        }
    }

    /// `, "paid_at" = CURRENT_TIMESTAMP, "amount" = $6`: the handler's columns, bound
    /// values numbered from `first` (one past the statement's last own parameter).
    fn assignments(&self, first: usize) -> String {
        let mut next = first;
        let mut out = String::new();
        for (column, value) in &self.set {
            match value {
                SetTo::Bound => {
                    out.push_str(&format!(", {column} = ${next}"));
                    next += 1;
                }
                SetTo::Now => out.push_str(&format!(", {column} = CURRENT_TIMESTAMP")),
            }
        }
        out
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

    /// `UPDATE … SET state = <to>, version = version + 1[, <set>] WHERE <key> AND state =
    /// <from> AND <guard>`, in a statement with `unguarded` own parameters after the key's
    /// columns besides the guard's.
    fn update(&self, guard: &Guard, unguarded: usize) -> String {
        let Quoted {
            table,
            state,
            version,
            ..
        } = self;
        format!(
            "UPDATE {table}\n\
             SET {state} = {to}, {version} = {next}{set}\n\
             WHERE {key} AND {state} = {from} AND {guard}",
            key = self.key_matches(""),
            from = self.after_key(1),
            to = self.after_key(2),
            next = guard.next_version(self, unguarded),
            set = self.assignments(guard.last(self, unguarded) + 1),
            guard = guard.sql(self, unguarded),
        )
    }

    /// The LEFT JOINs that read the row and its stored first result.
    fn current_row_and_result(&self) -> String {
        let Quoted { table, results, .. } = self;
        format!(
            "LEFT JOIN {table} AS cur ON {key}\n\
             LEFT JOIN {results} AS res ON res.machine = {machine} AND res.entity_key = {text}\n\
             \x20   AND res.from_state = CAST({from} AS {text_type}) AND res.to_state = CAST({to} AS {text_type})",
            key = self.key_matches("cur."),
            text_type = self.spelling.text,
            from = self.after_key(1),
            to = self.after_key(2),
            machine = self.after_key(3),
            text = self.after_key(4),
        )
    }

    fn observed_columns(&self) -> String {
        let Quoted { state, version, .. } = self;
        let Spelling { text, int, .. } = self.spelling;
        format!(
            "CAST(CASE WHEN cur.{key} IS NULL THEN 0 ELSE 1 END AS {int}) AS found,\n\
             \x20      CAST(cur.{state} AS {text}) AS current_state,\n\
             \x20      CAST(cur.{version} AS {int}) AS current_version,\n\
             \x20      res.result AS first_result",
            key = self.keys[0],
        )
    }

    /// `INSERT … ON CONFLICT (key) DO NOTHING`: an atomic insert into the unique key.
    fn create(&self) -> String {
        let k = self.keys.len();
        self.insert_row(k + 1, k + 2)
    }

    /// The creation's INSERT, the state bound at `$state`, the bound columns from `$first`.
    fn insert_row(&self, state_param: usize, first: usize) -> String {
        let Quoted {
            table,
            keys,
            state,
            version,
            set,
            ..
        } = self;
        let k = keys.len();
        let mut columns: Vec<String> = keys.clone();
        let mut values: Vec<String> = (1..=k).map(|n| format!("${n}")).collect();
        columns.push(state.clone());
        values.push(format!("${state_param}"));
        columns.push(version.clone());
        values.push("0".to_owned());
        let mut next = first;
        for (column, value) in set {
            columns.push(column.clone());
            values.push(match value {
                SetTo::Bound => {
                    next += 1;
                    format!("${}", next - 1)
                }
                SetTo::Now => "CURRENT_TIMESTAMP".to_owned(),
            });
        }
        let insert = format!(
            "INSERT INTO {table} ({})\n\
             VALUES ({})",
            columns.join(", "),
            values.join(", "),
        );
        if self.spelling.insert_unless_taken {
            format!("{insert}\nON CONFLICT ({}) DO NOTHING", keys.join(", "))
        } else {
            insert
        }
    }

    /// The classifying read of a creation that inserted nothing: the row as it is, and
    /// whether each bound column holds this creation's value (`same`: the backend's
    /// null-safe equality).
    fn classify_created(&self) -> String {
        let same = self.spelling.same;
        format!(
            "SELECT {observed},\n\
             \x20      {content}\n\
             {rows}",
            observed = self.observed_columns(),
            content = self.same_content(same, self.keys.len() + 5),
            rows = self.classified_rows(self.spelling.locking),
        )
    }

    /// `same_content`: whether each bound column holds the value bound from `$first` on.
    fn same_content(&self, same: &str, first: usize) -> String {
        let mut next = first;
        let mut checks = Vec::new();
        for (column, value) in &self.set {
            if *value == SetTo::Bound {
                checks.push(format!("cur.{column} {same} ${next}"));
                next += 1;
            }
        }
        let content = if checks.is_empty() {
            "1 = 1".to_owned()
        } else {
            checks.join(" AND ")
        };
        format!(
            "CAST(CASE WHEN {content} THEN 1 ELSE 0 END AS {int}) AS same_content",
            int = self.spelling.int
        )
    }

    /// PostgreSQL: the creation's INSERT and its first result's, as data-modifying CTEs of
    /// one statement that also classifies a taken key. Parameters: the key, `from` (the
    /// empty string), the state, the machine, the key as text, the result (`$k+5`), then
    /// the bound columns (`$k+6` on), used by the INSERT and the comparison alike.
    fn postgres_create_storing(&self) -> String {
        let k = self.keys.len();
        let version = &self.version;
        format!(
            "WITH ins AS (\n\
             {insert}\n\
             RETURNING {version}\n\
             ), res_ins AS (\n\
             {store}\n\
             )\n\
             SELECT CAST({version} AS BIGINT) AS applied_version,\n\
             \x20      CAST(1 AS BIGINT) AS found,\n\
             \x20      CAST(NULL AS TEXT) AS current_state,\n\
             \x20      CAST(NULL AS BIGINT) AS current_version,\n\
             \x20      CAST(NULL AS TEXT) AS first_result,\n\
             \x20      CAST(NULL AS BIGINT) AS same_content\n\
             FROM ins\n\
             UNION ALL\n\
             SELECT NULL,\n\
             \x20      {observed},\n\
             \x20      {content}\n\
             FROM (SELECT 1) AS one\n\
             {joins}\n\
             WHERE NOT EXISTS (SELECT FROM ins)",
            insert = self.insert_row(k + 2, k + 6),
            store = self.store_result_of("ins"),
            observed = self.observed_columns(),
            content = self.same_content(self.spelling.same, k + 6),
            joins = self.current_row_and_result(),
        )
    }

    fn classify(&self) -> String {
        self.classify_locking(self.spelling.locking)
    }

    /// The classifying read, ending with `locking`.
    fn classify_locking(&self, locking: &str) -> String {
        format!(
            "SELECT {}\n\
             {}",
            self.observed_columns(),
            self.classified_rows(locking),
        )
    }

    /// Where a classifying read takes its row from: one row always, the machine's row and
    /// its first result joined to it (`found` 0 when there is none); on MySQL, the machine's
    /// row by its key, its first result joined, so no derived table is built per call (a
    /// missing row is no row, which the runtime reads as not found), locking.
    fn classified_rows(&self, locking: &str) -> String {
        if !self.spelling.from_the_row {
            return format!(
                "FROM (SELECT 1) AS one\n{}{locking}",
                self.current_row_and_result()
            );
        }
        let Quoted { table, results, .. } = self;
        format!(
            "FROM {table} AS cur\n\
             LEFT JOIN {results} AS res ON res.machine = {machine} AND res.entity_key = {text}\n\
             \x20   AND res.from_state = CAST({from} AS {text_type}) AND res.to_state = CAST({to} AS {text_type})\n\
             WHERE {key}{locking}",
            key = self.key_matches("cur."),
            text_type = self.spelling.text,
            from = self.after_key(1),
            to = self.after_key(2),
            machine = self.after_key(3),
            text = self.after_key(4),
        )
    }

    /// The UPDATE, and only if it matched nothing, the classifying read: the second branch
    /// is gated by a one-time filter on the UPDATE's result, so an applied transition reads
    /// nothing more (no extra index scans, and no predicate locks under SERIALIZABLE that
    /// would make concurrent transitions of other keys conflict).
    fn postgres_transition(&self, guard: &Guard) -> String {
        format!(
            "WITH upd AS (\n\
             {update}\n\
             RETURNING {version}\n\
             )\n\
             {classified}",
            update = self.update(guard, 4),
            version = self.version,
            classified = self.classified(),
        )
    }

    /// [`postgres_transition`](Self::postgres_transition) whose applied branch also stores
    /// the first result (`$k+5`), by a second data-modifying CTE that reads the UPDATE's
    /// row: one statement, so one autocommit round trip, moves the row and keeps its result.
    fn postgres_transition_storing(&self, guard: &Guard) -> String {
        format!(
            "WITH upd AS (\n\
             {update}\n\
             RETURNING {version}\n\
             ), ins AS (\n\
             {store}\n\
             )\n\
             {classified}",
            update = self.update(guard, 5),
            version = self.version,
            store = self.store_result_of("upd"),
            classified = self.classified(),
        )
    }

    /// The first result's insert inside a storing statement, for the row the CTE `source`
    /// wrote (none: nothing is stored): `$k+1` from, `$k+2` to, `$k+3` the machine, `$k+4`
    /// the key as text, `$k+5` the result.
    fn store_result_of(&self, source: &str) -> String {
        format!(
            "INSERT INTO {results} (machine, entity_key, from_state, to_state, result)\n\
             SELECT {machine}, {text}, CAST({from} AS TEXT), CAST({to} AS TEXT), {result} FROM {source}\n\
             ON CONFLICT (machine, entity_key, from_state, to_state)\n\
             DO UPDATE SET result = excluded.result, created_at = CURRENT_TIMESTAMP",
            results = self.results,
            from = self.after_key(1),
            to = self.after_key(2),
            machine = self.after_key(3),
            text = self.after_key(4),
            result = self.after_key(5),
        )
    }

    /// The rest of PostgreSQL's transition statements, after the CTE `upd` of the UPDATE:
    /// the applied version from `upd`, or, only when it matched no row, the classifying
    /// read.
    fn classified(&self) -> String {
        let version = &self.version;
        format!(
            "SELECT CAST({version} AS BIGINT) AS applied_version,\n\
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
            observed = self.observed_columns(),
            joins = self.current_row_and_result(),
        )
    }

    /// The conditional UPDATE alone; the runtime reads how many rows it changed (no
    /// `RETURNING`: it costs SQLite a temporary table per statement).
    fn plain_update(&self, guard: &Guard) -> String {
        self.update(guard, 2)
    }

    fn store_result(&self) -> String {
        let insert = format!(
            "INSERT INTO {} (machine, entity_key, from_state, to_state, result)\n\
             VALUES ($1, $2, $3, $4, $5)",
            self.results
        );
        if self.spelling.insert_unless_taken {
            format!(
                "{insert}\n\
                 ON CONFLICT (machine, entity_key, from_state, to_state)\n\
                 DO UPDATE SET result = excluded.result, created_at = CURRENT_TIMESTAMP"
            )
        } else {
            // `VALUES(col)`: MariaDB has no row alias (`AS new`); MySQL 8.0.20+ accepts it
            // with a deprecation warning.
            format!(
                "{insert}\n\
                 ON DUPLICATE KEY UPDATE result = VALUES(result), created_at = CURRENT_TIMESTAMP(6)"
            )
        }
    }

    /// MySQL: the results table in InnoDB, its key columns `VARBINARY`, compared byte for
    /// byte. Not `VARCHAR … COLLATE utf8mb4_bin`: that collation is PAD SPACE, so `k` and
    /// `k ` would be one key, and one entity's first result would be replayed to another;
    /// the NO PAD collations are named differently on MariaDB (`utf8mb4_nopad_bin`) and
    /// MySQL 8 (`utf8mb4_0900_bin`), and binary columns are exact on both. Their lengths
    /// are [`limits`](crate::limits)' bytes, the primary key under InnoDB's 3072; the
    /// result is text in the default collation. The same table as the shipped migrations
    /// `0001_idem.sql` and `0002_idem_exact_keys.sql` together.
    fn mysql_create_results_table(&self) -> String {
        use crate::limits::{KEY_TEXT, MACHINE_ID, STATE};
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20   machine VARBINARY({MACHINE_ID}) NOT NULL,\n\
             \x20   entity_key VARBINARY({KEY_TEXT}) NOT NULL,\n\
             \x20   from_state VARBINARY({STATE}) NOT NULL,\n\
             \x20   to_state VARBINARY({STATE}) NOT NULL,\n\
             \x20   result LONGTEXT NOT NULL,\n\
             \x20   created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n\
             \x20   PRIMARY KEY (machine, entity_key, from_state, to_state)\n\
             ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
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

/// Which rows an UPDATE may move besides the key and the state.
enum Guard {
    /// Any version (`version IS NOT NULL`).
    Any,
    /// The optimistic-locking guard `version = $n`: the statement's last own parameter.
    Expected,
    /// An event stream's watermark: `version < $n`, and the row takes the event's version
    /// (`version = $n`), so an older event and a duplicate both match nothing.
    Watermark,
}

impl Guard {
    fn sql(&self, q: &Quoted, unguarded: usize) -> String {
        match self {
            Guard::Any => format!("{} IS NOT NULL", q.version),
            Guard::Expected => format!("{} = ${}", q.version, self.last(q, unguarded)),
            Guard::Watermark => format!("{} < ${}", q.version, self.last(q, unguarded)),
        }
    }

    /// What the version becomes: one more, or the event's.
    fn next_version(&self, q: &Quoted, unguarded: usize) -> String {
        match self {
            // SQLite turns `9223372036854775807 + 1` into a REAL and would move the row on
            // with it: there the increment refuses instead, with `abs` of the least
            // integer ("integer overflow"), as PostgreSQL and MySQL refuse the sum.
            Guard::Any | Guard::Expected if q.spelling.overflow_to_real => format!(
                "CASE WHEN {v} < 9223372036854775807 THEN {v} + 1 \
                 ELSE abs(-9223372036854775807 - 1) END",
                v = q.version
            ),
            Guard::Any | Guard::Expected => format!("{} + 1", q.version),
            Guard::Watermark => format!("${}", self.last(q, unguarded)),
        }
    }

    /// The position of the last own parameter of a statement that has `unguarded` of them
    /// after the key's columns without the guard.
    fn last(&self, q: &Quoted, unguarded: usize) -> usize {
        q.keys.len()
            + unguarded
            + match self {
                Guard::Any => 0,
                Guard::Expected | Guard::Watermark => 1,
            }
    }
}

/// The PostgreSQL statements: the transition attempt that also classifies a miss, in one
/// round trip, and the plain UPDATE with its classifying SELECT (the runtime chooses).
/// `set`: the columns a handler sets besides the state and the version (none for the
/// machine's own statements).
pub fn postgres(names: &Names<'_>, set: &[Assignment<'_>]) -> Statements {
    let q = Quoted::new(names, set, &STANDARD);
    Statements {
        transition: q.postgres_transition(&Guard::Any),
        transition_guarded: q.postgres_transition(&Guard::Expected),
        transition_storing: q.postgres_transition_storing(&Guard::Any),
        transition_storing_guarded: q.postgres_transition_storing(&Guard::Expected),
        transition_watermark: q.postgres_transition(&Guard::Watermark),
        transition_storing_watermark: q.postgres_transition_storing(&Guard::Watermark),
        update_watermark: q.plain_update(&Guard::Watermark),
        update: q.plain_update(&Guard::Any),
        update_guarded: q.plain_update(&Guard::Expected),
        classify: q.classify(),
        classify_unlocked: q.classify(),
        store_result: q.store_result(),
        create_results_table: q.create_results_table("TIMESTAMPTZ"),
        create: q.create(),
        classify_created: q.classify_created(),
        create_storing: q.postgres_create_storing(),
    }
}

/// The SQLite statements: no DML in a CTE, so a miss is classified by a second statement
/// (inside `BEGIN IMMEDIATE`, so nothing can change in between). `set` as for [`postgres`].
pub fn sqlite(names: &Names<'_>, set: &[Assignment<'_>]) -> Statements {
    let q = Quoted::new(names, set, &SQLITE);
    let results_table = q.create_results_table("TEXT");
    without_ctes(&q, results_table)
}

/// The MySQL and MariaDB statements: no `UPDATE … RETURNING` and no DML in a CTE, so a
/// miss is classified by a second statement, a locking read (`LOCK IN SHARE MODE`: see
/// [`Statements::classify`]); a creation is a plain INSERT whose duplicate-key error
/// (1062) the runtime reads as a taken key. Written with numbered parameters like the
/// others; [`positional`](crate::placeholder::positional) gives the `?` form MySQL runs.
/// `set` as for [`postgres`].
pub fn mysql(names: &Names<'_>, set: &[Assignment<'_>]) -> Statements {
    let q = Quoted::new(names, set, &MYSQL);
    let results_table = q.mysql_create_results_table();
    without_ctes(&q, results_table)
}

/// The statements of a backend that cannot write in a CTE: the plain UPDATE for every
/// attempt, the classifying read after a miss, and no storing forms.
fn without_ctes(q: &Quoted, create_results_table: String) -> Statements {
    Statements {
        transition: q.plain_update(&Guard::Any),
        transition_guarded: q.plain_update(&Guard::Expected),
        transition_storing: String::new(),
        transition_storing_guarded: String::new(),
        transition_watermark: q.plain_update(&Guard::Watermark),
        transition_storing_watermark: String::new(),
        update_watermark: q.plain_update(&Guard::Watermark),
        update: q.plain_update(&Guard::Any),
        update_guarded: q.plain_update(&Guard::Expected),
        classify: q.classify(),
        classify_unlocked: q.classify_locking(""),
        store_result: q.store_result(),
        create_results_table,
        create: q.create(),
        classify_created: q.classify_created(),
        create_storing: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Backend = fn(&Names<'_>, &[Assignment<'_>]) -> Statements;

    fn names<'a>(keys: &'a [&'a str]) -> Names<'a> {
        Names {
            table: "orders",
            key: keys,
            state: "status",
            version: "version",
            results: "idem_results",
        }
    }

    fn statements(keys: &[&str], backend: Backend) -> Statements {
        backend(&names(keys), &[])
    }

    fn pg() -> Statements {
        statements(&["order_id"], postgres)
    }

    fn lite() -> Statements {
        statements(&["order_id"], sqlite)
    }

    /// SQLite's `"version" + 1`, which refuses to overflow into a REAL.
    const LITE_NEXT: &str = "CASE WHEN \"version\" < 9223372036854775807 THEN \"version\" + 1 \
                             ELSE abs(-9223372036854775807 - 1) END";

    #[test]
    fn sqlite_transition_is_one_conditional_update() {
        assert_eq!(
            lite().transition,
            format!(
                "UPDATE \"orders\"\n\
             SET \"status\" = $3, \"version\" = {LITE_NEXT}\n\
             WHERE \"order_id\" = $1 AND \"status\" = $2 AND \"version\" IS NOT NULL"
            )
        );
        assert!(lite().transition_guarded.ends_with("AND \"version\" = $4"));
        // Elsewhere the database refuses the overflowing sum itself.
        assert!(pg().update.contains("\"version\" = \"version\" + 1\n"));
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
            format!(
                "UPDATE \"orders\"\n\
             SET \"status\" = $4, \"version\" = {LITE_NEXT}\n\
             WHERE \"tenant_id\" = $1 AND \"order_id\" = $2 AND \"status\" = $3 AND \"version\" IS NOT NULL"
            )
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

    const PAY_SET: [Assignment<'static>; 3] = [
        Assignment {
            column: "paid_at",
            value: SetTo::Now,
        },
        Assignment {
            column: "amount",
            value: SetTo::Bound,
        },
        Assignment {
            column: "note",
            value: SetTo::Bound,
        },
    ];

    #[test]
    fn set_columns_are_bound_after_every_own_parameter() {
        let lite = sqlite(&names(&["order_id"]), &PAY_SET);
        assert_eq!(
            lite.update,
            format!(
                "UPDATE \"orders\"\n\
             SET \"status\" = $3, \"version\" = {LITE_NEXT}, \"paid_at\" = CURRENT_TIMESTAMP, \"amount\" = $4, \"note\" = $5\n\
             WHERE \"order_id\" = $1 AND \"status\" = $2 AND \"version\" IS NOT NULL"
            )
        );
        assert!(
            lite.update_guarded
                .contains("\"amount\" = $5, \"note\" = $6\n")
        );
        assert!(lite.update_guarded.ends_with("AND \"version\" = $4"));
        // the classifying read and the store do not change
        let plain = statements(&["order_id"], sqlite);
        assert_eq!(lite.classify, plain.classify);
        assert_eq!(lite.store_result, plain.store_result);

        let pg = postgres(&names(&["tenant_id", "order_id"]), &PAY_SET);
        assert!(pg.transition.contains("\"amount\" = $7, \"note\" = $8\n"));
        assert!(
            pg.transition_guarded
                .contains("\"amount\" = $8, \"note\" = $9\n")
        );
        assert!(pg.transition_guarded.contains("\"version\" = $7\n"));
        assert!(pg.update.contains("\"amount\" = $5, \"note\" = $6\n"));
        assert!(
            pg.update_guarded
                .contains("\"amount\" = $6, \"note\" = $7\n")
        );
        // every position up to the last is used, none past it
        for (sql, last) in [
            (&pg.transition, 8),
            (&pg.transition_guarded, 9),
            (&pg.update, 6),
            (&pg.update_guarded, 7),
        ] {
            for n in 1..=last {
                assert!(sql.contains(&format!("${n}")), "missing ${n} in {sql}");
            }
            assert!(!sql.contains(&format!("${}", last + 1)), "{sql}");
        }
    }

    #[test]
    fn postgres_stores_the_result_in_the_transition_statement() {
        let pg = postgres(&names(&["order_id"]), &PAY_SET);
        let sql = &pg.transition_storing;
        assert!(sql.contains(
            "), ins AS (\nINSERT INTO \"idem_results\" (machine, entity_key, from_state, to_state, result)\n\
             SELECT $4, $5, CAST($2 AS TEXT), CAST($3 AS TEXT), $6 FROM upd\n"
        ));
        // own parameters up to the result ($6), then the columns set ($7, $8)
        assert!(sql.contains("\"amount\" = $7, \"note\" = $8\n"));
        assert!(pg.transition_storing_guarded.contains("\"version\" = $7\n"));
        assert!(
            pg.transition_storing_guarded
                .contains("\"amount\" = $8, \"note\" = $9\n")
        );
        for (sql, last) in [(sql, 8), (&pg.transition_storing_guarded, 9)] {
            for n in 1..=last {
                assert!(sql.contains(&format!("${n}")), "missing ${n} in {sql}");
            }
            assert!(!sql.contains(&format!("${}", last + 1)), "{sql}");
        }
        assert_eq!(sqlite(&names(&["order_id"]), &[]).transition_storing, "");
    }

    #[test]
    fn a_watermark_takes_the_events_version() {
        let lite = sqlite(&names(&["account_id"]), &[]);
        assert_eq!(
            lite.update_watermark,
            "UPDATE \"orders\"\n\
             SET \"status\" = $3, \"version\" = $4\n\
             WHERE \"account_id\" = $1 AND \"status\" = $2 AND \"version\" < $4"
        );
        let pg = postgres(&names(&["account_id"]), &PAY_SET);
        assert!(
            pg.update_watermark
                .contains("\"version\" = $4, \"paid_at\" = CURRENT_TIMESTAMP, \"amount\" = $5")
        );
        assert!(
            pg.transition_watermark
                .contains("\"version\" = $6, \"paid_at\"")
        );
        assert!(pg.transition_watermark.contains("AND \"version\" < $6\n"));
        assert!(
            pg.transition_storing_watermark
                .contains("AND \"version\" < $7\n")
        );
        assert!(
            pg.transition_storing_watermark
                .contains("\"amount\" = $8, \"note\" = $9\n")
        );
    }

    #[test]
    fn a_creation_is_one_insert_into_the_unique_key() {
        let pg = postgres(&names(&["tenant_id", "order_id"]), &PAY_SET);
        assert_eq!(
            pg.create,
            "INSERT INTO \"orders\" (\"tenant_id\", \"order_id\", \"status\", \"version\", \"paid_at\", \"amount\", \"note\")\n\
             VALUES ($1, $2, $3, 0, CURRENT_TIMESTAMP, $4, $5)\n\
             ON CONFLICT (\"tenant_id\", \"order_id\") DO NOTHING"
        );
        assert!(pg.classify_created.contains(
            "CASE WHEN cur.\"amount\" IS NOT DISTINCT FROM $7 AND cur.\"note\" IS NOT DISTINCT FROM $8 THEN 1"
        ));
        let storing = &pg.create_storing;
        assert!(storing.contains(
            "VALUES ($1, $2, $4, 0, CURRENT_TIMESTAMP, $8, $9)\nON CONFLICT (\"tenant_id\", \"order_id\") DO NOTHING\nRETURNING"
        ));
        assert!(
            storing.contains("SELECT $5, $6, CAST($3 AS TEXT), CAST($4 AS TEXT), $7 FROM ins\n")
        );
        assert!(storing.contains(
            "cur.\"amount\" IS NOT DISTINCT FROM $8 AND cur.\"note\" IS NOT DISTINCT FROM $9"
        ));
        for n in 1..=9 {
            assert!(
                storing.contains(&format!("${n}")),
                "missing ${n} in {storing}"
            );
        }
        assert!(!storing.contains("$10"));
        let lite = sqlite(&names(&["order_id"]), &[]);
        assert!(lite.classify_created.contains("CASE WHEN 1 = 1 THEN 1"));
        assert!(
            lite.classify_created
                .contains("res.from_state = CAST($2 AS TEXT)")
        );
        assert!(!lite.create.contains('\''));
    }

    #[test]
    fn no_columns_set_is_the_machine_statement() {
        let sql = postgres(&names(&["order_id"]), &[]);
        assert!(sql.update.starts_with(
            "UPDATE \"orders\"\nSET \"status\" = $3, \"version\" = \"version\" + 1\nWHERE"
        ));
    }

    #[test]
    fn mysql_quotes_with_backticks_and_classifies_with_a_locking_read() {
        let my = statements(&["order_id"], mysql);
        assert_eq!(
            my.update,
            "UPDATE `orders`\n\
             SET `status` = $3, `version` = `version` + 1\n\
             WHERE `order_id` = $1 AND `status` = $2 AND `version` IS NOT NULL"
        );
        assert_eq!(my.transition, my.update);
        assert!(my.classify.ends_with("\nLOCK IN SHARE MODE"));
        assert!(
            my.classify
                .contains("CAST(cur.`version` AS SIGNED) AS current_version")
        );
        assert!(my.classify_created.ends_with("\nLOCK IN SHARE MODE"));
        assert!(!my.create.contains("ON CONFLICT"), "{}", my.create);
        assert!(
            my.store_result
                .contains("ON DUPLICATE KEY UPDATE result = VALUES(result)")
        );
        assert!(my.transition_storing.is_empty() && my.create_storing.is_empty());
        let set = mysql(&names(&["order_id"]), &PAY_SET);
        assert!(
            set.classify_created
                .contains("cur.`amount` <=> $6 AND cur.`note` <=> $7")
        );
        // From the row by its key, no derived table; as MySQL binds it, the classifying
        // read's five parameters, each once, the key last.
        assert!(
            my.classify
                .contains("FROM `orders` AS cur\nLEFT JOIN `idem_results` AS res")
        );
        assert!(
            my.classify
                .contains("\nWHERE cur.`order_id` = $1\nLOCK IN SHARE MODE")
        );
        let sent = crate::placeholder::positional(&my.classify);
        assert_eq!(sent.order, [3, 4, 1, 2, 0]);
    }

    #[test]
    fn values_are_never_spliced() {
        for s in [
            pg(),
            lite(),
            statements(&["a", "b"], postgres),
            statements(&["order_id"], mysql),
        ] {
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
