//! What the fast path in front of the database (idem's `cache`) asks the database: which
//! database, and which schema of it, a pool's idem tables are in, so that two databases (or
//! two schemas of one database) holding the same machines never share cached first results.

use crate::dialect::Dialect;

impl Dialect {
    /// The statement that names where a connection's idem tables are, as a column
    /// `identity` (text; empty or NULL where there is no name: an in-memory SQLite
    /// database, a MySQL connection without a default database).
    ///
    /// - PostgreSQL: `current_database()`, and the schemas `idem_inbox` and `idem_results`
    ///   resolve to on the connection's `search_path` (before they exist, the schema they
    ///   would be created in, `current_schema()`): two schemas of one database are two
    ///   names;
    /// - SQLite: the main database's file, from `pragma_database_list`;
    /// - MySQL: `DATABASE()`, the default schema, where unqualified names resolve.
    pub fn database_identity(self) -> &'static str {
        match self {
            Dialect::Postgres => {
                "SELECT current_database() \
                     || '/' || COALESCE((SELECT n.nspname FROM pg_catalog.pg_class c \
                         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                         WHERE c.oid = to_regclass('idem_inbox')), current_schema(), '') \
                     || '/' || COALESCE((SELECT n.nspname FROM pg_catalog.pg_class c \
                         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                         WHERE c.oid = to_regclass('idem_results')), current_schema(), '') \
                     AS identity"
            }
            Dialect::Sqlite => {
                "SELECT file AS identity FROM pragma_database_list WHERE name = 'main'"
            }
            Dialect::MySql => "SELECT DATABASE() AS identity",
        }
    }
}
