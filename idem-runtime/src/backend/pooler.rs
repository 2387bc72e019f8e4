//! How idem's statements reach PostgreSQL: as named prepared statements, each parsed once a
//! connection (sqlx's default), or unnamed and always inside a transaction, as a pooler in
//! transaction mode (pgbouncer's `pool_mode = transaction`) needs.

use super::Dialect;
use std::sync::atomic::{AtomicBool, Ordering};

/// How idem sends its statements to PostgreSQL; set it with [`set_postgres_statements`].
///
/// A pooler in **transaction mode** (pgbouncer's `pool_mode = transaction`, and the poolers
/// that copy it) lends a client one of its server connections for a transaction at a
/// time. Two things of a session then break:
///
/// - **named prepared statements**, which sqlx sends by default and caches per client
///   connection: the next transaction may run on a server connection that has never seen
///   the statement (`prepared statement "sqlx_s_1" does not exist`), or that another client
///   already prepared it on (`… already exists`), or where another client's statement of
///   the same name runs with this client's values — even with sqlx's statement cache at 0;
/// - **an unnamed statement outside a transaction**: sqlx parses it and executes it in two
///   exchanges, and between them the pooler may hand the server connection to another
///   client, whose own statement then replaces it (the bind fails, or runs the other
///   client's statement).
///
/// [`Unnamed`](Self::Unnamed) avoids both for every statement idem sends: each is unnamed
/// (parsed at each execution), and what idem would otherwise run outside a transaction —
/// the one-statement form, [`Inbox::stuck`](crate::inbox::Inbox::stuck),
/// [`outbox::backlog`](crate::outbox::backlog), [`outbox::dead`](crate::outbox::dead),
/// [`verify`](crate::verify()) — runs between
/// `BEGIN` and `COMMIT`, where the pooler keeps one server connection; and a spawned
/// outbox relay polls instead of `LISTEN`ing through the pool (see
/// [`Relay::notifications`](crate::outbox::Relay::notifications)). It changes statements
/// and round trips, never outcomes. The statements of your handlers' bodies
/// are yours: send them unnamed too (`sqlx::query(…).persistent(false)`), and only inside
/// a transaction.
///
/// Not needed in session pooling, nor with pgbouncer 1.21 or later with
/// `max_prepared_statements` set (it tracks named statements itself). Other backends
/// ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PostgresStatements {
    /// Named prepared statements, parsed once a connection and cached by sqlx; statements
    /// that need no transaction run in autocommit. The default: the fewest round trips.
    #[default]
    Named,
    /// Unnamed statements, each inside a transaction: what a pooler in transaction mode
    /// needs. It costs a round trip a statement (the parse), and `BEGIN` and `COMMIT`
    /// around the forms that need no transaction of their own.
    Unnamed,
}

static UNNAMED: AtomicBool = AtomicBool::new(false);

/// Sets how this process sends idem's statements to PostgreSQL (the default is
/// [`PostgresStatements::Named`]). Process-wide: set it once, before the first call, in a
/// process whose PostgreSQL connections go through a pooler in transaction mode.
///
/// ```
/// // The pool's connections go through pgbouncer with `pool_mode = transaction`.
/// idem::set_postgres_statements(idem::PostgresStatements::Unnamed);
/// ```
pub fn set_postgres_statements(statements: PostgresStatements) {
    UNNAMED.store(statements == PostgresStatements::Unnamed, Ordering::Relaxed);
}

/// Whether idem sends its statements on `dialect` unnamed, each inside a transaction.
pub(crate) fn unnamed(dialect: Dialect) -> bool {
    dialect == Dialect::Postgres && UNNAMED.load(Ordering::Relaxed)
}
