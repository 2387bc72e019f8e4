//! How each backend describes a table to `idem::verify`: its columns and their types, and
//! the states its rows hold.

use crate::dialect::Dialect;

/// What a column's type can hold, as far as idem's binding goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    /// An integer type.
    Integer,
    /// An exact numeric type (`numeric`, `decimal`).
    Numeric,
    /// A text type.
    Text,
    /// An enumeration type (PostgreSQL ENUM, MySQL `ENUM(…)`).
    Enum,
    /// A UUID type.
    Uuid,
    /// SQLite: any value fits any column.
    Any,
    /// Anything else.
    Other,
}

/// Where [`Dialect::columns`] reads a table's columns from: the parameters to bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnsOf {
    /// `$1`: the table's name quoted (`"billing"."orders"`), as the search path resolves it.
    Quoted,
    /// `$1`: the table's name, `$2`: its schema, or when the name has none,
    /// [`Dialect::default_schema`] (NULL if that is `None`: the connection's database).
    NameAndSchema,
}

impl Dialect {
    /// The identifier quote: `"`, or MySQL's backtick.
    pub fn quote(self) -> char {
        match self {
            Dialect::Postgres | Dialect::Sqlite => '"',
            Dialect::MySql => '`',
        }
    }

    /// `name` (`table` or `schema.table`) quoted in this dialect.
    pub fn quoted(self, name: &str) -> String {
        crate::ident::quoted_with(name, self.quote())
    }

    /// The schema an unqualified table name is looked up in by [`columns`](Self::columns),
    /// where it takes one: SQLite's `main`; `None` for the connection's own (MySQL's
    /// database; PostgreSQL resolves the name by its search path instead).
    pub fn default_schema(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("main"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// The query of a table's columns, as one text column `found`: a JSON array of
    /// `[name, type, category]` (the category is PostgreSQL's, of a domain's base type;
    /// MySQL's collation, empty for a column without one; empty on SQLite), `[]` when there
    /// is no such table.
    pub fn columns(self) -> (&'static str, ColumnsOf) {
        match self {
            Dialect::Postgres => (
                "SELECT CAST(COALESCE(json_agg(json_build_array(\
                     a.attname, COALESCE(b.typname, t.typname), COALESCE(b.typcategory, t.typcategory))), \
                     '[]') AS TEXT) AS found \
                 FROM pg_attribute a \
                 JOIN pg_type t ON t.oid = a.atttypid \
                 LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                ColumnsOf::Quoted,
            ),
            Dialect::Sqlite => (
                "SELECT CAST(COALESCE(json_group_array(json_array(name, type, '')), '[]') AS TEXT) \
                 AS found FROM pragma_table_info($1, $2)",
                ColumnsOf::NameAndSchema,
            ),
            Dialect::MySql => (
                "SELECT CAST(COALESCE(JSON_ARRAYAGG(JSON_ARRAY(\
                     column_name, data_type, COALESCE(collation_name, ''))), '[]') \
                 AS CHAR) AS found FROM information_schema.columns \
                 WHERE table_name = $1 AND table_schema = COALESCE($2, DATABASE())",
                ColumnsOf::NameAndSchema,
            ),
        }
    }

    /// What a column of type `name` (and PostgreSQL `category`) as [`columns`](Self::columns)
    /// reports it can hold.
    pub fn type_kind(self, name: &str, category: &str) -> TypeKind {
        match self {
            Dialect::Postgres => match (name, category) {
                ("int2" | "int4" | "int8", _) => TypeKind::Integer,
                ("numeric", _) => TypeKind::Numeric,
                ("uuid", _) => TypeKind::Uuid,
                (_, "S") => TypeKind::Text,
                (_, "E") => TypeKind::Enum,
                _ => TypeKind::Other,
            },
            Dialect::Sqlite => TypeKind::Any,
            Dialect::MySql => match name.to_ascii_lowercase().as_str() {
                "tinyint" | "smallint" | "mediumint" | "int" | "bigint" => TypeKind::Integer,
                "decimal" => TypeKind::Numeric,
                "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
                    TypeKind::Text
                }
                // Text compared byte for byte: idem binds and reads it as text.
                "binary" | "varbinary" => TypeKind::Text,
                "enum" => TypeKind::Enum,
                // MariaDB 10.7+
                "uuid" => TypeKind::Uuid,
                _ => TypeKind::Other,
            },
        }
    }

    /// Whether a column of type `name` (and `category`, as [`columns`](Self::columns)
    /// reports them) tells values apart byte for byte, trailing spaces included. MySQL's
    /// text types compare under their collation: only a binary NO PAD one is exact
    /// (MariaDB's `…_nopad_bin`, MySQL 8's `utf8mb4_0900_bin`); `utf8mb4_bin` is PAD SPACE
    /// (`'k' = 'k '`), and the default ones ignore case too. Its binary types are exact.
    /// PostgreSQL's and SQLite's text types, as idem's tables use them, are.
    pub fn compares_exactly(self, name: &str, category: &str) -> bool {
        match self {
            Dialect::Postgres | Dialect::Sqlite => true,
            Dialect::MySql => {
                let collation = category.to_ascii_lowercase();
                match name.to_ascii_lowercase().as_str() {
                    "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
                        collation.ends_with("_nopad_bin") || collation.ends_with("_0900_bin")
                    }
                    _ => true,
                }
            }
        }
    }

    /// The states in a machine's table, as one text column `found`: a JSON array of
    /// `[state, rows, rows without a version]`, one per distinct state (NULL included).
    pub fn state_groups(self, table: &str, state: &str, version: &str) -> String {
        let state = self.quoted(state);
        let (aggregate, array, text, value, group) = match self {
            Dialect::Postgres => (
                "json_agg",
                "json_build_array",
                "TEXT",
                format!("CAST({state} AS TEXT)"),
                "s".to_owned(),
            ),
            Dialect::Sqlite => (
                "json_group_array",
                "json_array",
                "TEXT",
                format!("CAST({state} AS TEXT)"),
                "s".to_owned(),
            ),
            // Grouped by the bytes, as the enforcing triggers compare them: under the
            // column's collation (or even `utf8mb4_bin`, which pads) `created` or `CREATED `
            // would be counted as `CREATED`. Within a group every value has the same bytes,
            // so MIN picks the one text.
            Dialect::MySql => (
                "JSON_ARRAYAGG",
                "JSON_ARRAY",
                "CHAR",
                format!("MIN(CAST({state} AS CHAR))"),
                format!("CAST({state} AS BINARY)"),
            ),
        };
        format!(
            "SELECT CAST(COALESCE({aggregate}({array}(s, n, nv)), '[]') AS {text}) AS found \
             FROM (SELECT {value} AS s, COUNT(*) AS n, COUNT(*) - COUNT({version}) AS nv \
             FROM {table} GROUP BY {group}) AS g",
            version = self.quoted(version),
            table = self.quoted(table),
        )
    }

    /// A query of whether the index `$1` exists, as the integer column `n` (1 or 0): by
    /// the search path (PostgreSQL), in `main` (SQLite), in the connection's database (MySQL).
    pub fn index_exists(self) -> &'static str {
        match self {
            Dialect::Postgres => {
                "SELECT CAST(CASE WHEN to_regclass($1) IS NULL THEN 0 ELSE 1 END AS BIGINT) AS n"
            }
            Dialect::Sqlite => {
                "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'index' AND name = $1"
            }
            Dialect::MySql => {
                "SELECT CAST(COUNT(*) AS SIGNED) AS n FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND index_name = $1"
            }
        }
    }

    /// A query counting (as the integer column `n`) what an inbox table still has of an
    /// older migration this version of idem dropped: PostgreSQL's status CHECK constraint.
    pub fn outdated_inbox(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some(
                "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM pg_constraint \
                 WHERE conrelid = to_regclass('idem_inbox') AND conname = 'idem_inbox_status_check'",
            ),
            Dialect::Sqlite | Dialect::MySql => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_reads_its_own_catalogue() {
        assert_eq!(Dialect::MySql.type_kind("BIGINT", ""), TypeKind::Integer);
        assert_eq!(Dialect::MySql.type_kind("varchar", ""), TypeKind::Text);
        assert_eq!(Dialect::MySql.type_kind("json", ""), TypeKind::Other);
        assert_eq!(Dialect::MySql.type_kind("varbinary", ""), TypeKind::Text);
        assert_eq!(Dialect::Postgres.type_kind("citext", "S"), TypeKind::Text);
        assert_eq!(Dialect::Sqlite.type_kind("", ""), TypeKind::Any);
        let groups = Dialect::MySql.state_groups("billing.orders", "status", "version");
        assert!(groups.contains("MIN(CAST(`status` AS CHAR)) AS s"));
        assert!(groups.contains("FROM `billing`.`orders` GROUP BY CAST(`status` AS BINARY)"));
        let pg = Dialect::Postgres.state_groups("orders", "status", "version");
        assert!(pg.contains("SELECT CAST(\"status\" AS TEXT) AS s"), "{pg}");
        assert!(pg.contains("GROUP BY s"), "{pg}");
        let my = Dialect::MySql;
        assert!(!my.compares_exactly("varchar", "utf8mb4_bin"));
        assert!(!my.compares_exactly("VARCHAR", "utf8mb4_general_ci"));
        assert!(my.compares_exactly("varchar", "utf8mb4_nopad_bin"));
        assert!(my.compares_exactly("varchar", "utf8mb4_0900_bin"));
        assert!(my.compares_exactly("varbinary", ""));
        assert!(Dialect::Postgres.compares_exactly("text", "S"));
        assert!(Dialect::Postgres.outdated_inbox().is_some());
    }
}
