//! What the fast path in front of the database (idem's `cache`) asks the database: which
//! database a pool is connected to, so that two databases holding the same machines never
//! share cached first results.

use crate::dialect::Dialect;

impl Dialect {
    /// The statement that names the database a connection works in, as a column
    /// `identity` (text; empty or NULL where there is no name: an in-memory SQLite
    /// database, a MySQL connection without a default database).
    ///
    /// - PostgreSQL: `current_database()`;
    /// - SQLite: the main database's file, from `pragma_database_list`;
    /// - MySQL: `DATABASE()`, the default schema.
    pub fn database_identity(self) -> &'static str {
        match self {
            Dialect::Postgres => "SELECT current_database() AS identity",
            Dialect::Sqlite => {
                "SELECT file AS identity FROM pragma_database_list WHERE name = 'main'"
            }
            Dialect::MySql => "SELECT DATABASE() AS identity",
        }
    }
}
