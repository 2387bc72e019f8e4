//! PostgreSQL: one statement attempts the transition and classifies a miss.

use super::{Backend, Database, Dialect, Param, generic};
use core::future::Future;
use sqlx::{PgConnection, Pool, Postgres, Transaction};

impl super::sealed::Sealed for Postgres {}

/// Whether PostgreSQL's driver raised `error` (its codes are SQLSTATEs).
pub(super) fn raised(error: &dyn sqlx::error::DatabaseError) -> bool {
    error
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
}

impl generic::Bind for Postgres {
    fn bind<'a>(query: generic::Query<'a, Self>, param: Param<'a>) -> generic::Query<'a, Self> {
        match param {
            Param::Int(n) => query.bind(n),
            Param::Text(s) => query.bind(s),
            Param::Bytes(b) => query.bind(b),
            Param::State(s) => query.bind(Untyped(s)),
            Param::Null => query.bind(None::<i64>),
            #[cfg(feature = "uuid")]
            Param::Uuid(id) => query.bind(id),
            Param::Column(value) => generic::bind_column!(query, value, uuid = |id| id),
        }
    }
}

/// A state name sent without a declared type (OID 0), so PostgreSQL gives the parameter
/// the type of the state column it is compared with or assigned to: `text`, `varchar`, or
/// an ENUM type of the user's. Every other use of it in idem's statements is cast to text.
/// Its bytes are the same in each of those types' binary form: the name, in UTF-8.
struct Untyped<'a>(&'a str);

impl sqlx::Type<Postgres> for Untyped<'_> {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(0))
    }
}

impl<'q> sqlx::Encode<'q, Postgres> for Untyped<'_> {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(self.0.as_bytes());
        Ok(sqlx::encode::IsNull::No)
    }
}

impl Backend for Postgres {
    fn begin_pool(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send + '_ {
        pool.begin()
    }

    fn writer_queue(_: &Pool<Self>) -> Option<Database> {
        None
    }

    fn dialect(_: &PgConnection) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::Postgres)
    }

    fn pool_dialect(_: &Pool<Self>) -> Result<Dialect, sqlx::Error> {
        Ok(Dialect::Postgres)
    }

    generic::run_generically!(
        Postgres,
        PgConnection,
        Dialect::Postgres,
        sqlx::postgres::PgQueryResult
    );
}

/// Refuses a connection to a PostgreSQL server in recovery (a standby, or a primary being
/// promoted that cannot write yet): for a pool's `after_connect`, so that a pool behind a
/// proxy that can send a connection to the wrong node opens another instead.
///
/// A failover proxy's health check (HAProxy asking Patroni's `GET /primary`) can answer
/// for a node a moment before its promotion ends; a connection opened then fails its first
/// write with `25006` ("cannot execute … in a read-only transaction"), which no retry is
/// told to cure. Refused here, the connection never reaches a call: the pool's `acquire`
/// fails with this I/O error (transient: [`is_transient`](crate::is_transient) is `true`, so
/// idem's callers retry) or, within its `acquire_timeout`, opens one on the new primary.
///
/// It asks with one simple-protocol query (no prepared statement), so it also works through
/// a pooler in transaction mode.
///
/// ```
/// use sqlx::postgres::PgPoolOptions;
///
/// let options = PgPoolOptions::new()
///     .acquire_timeout(std::time::Duration::from_secs(2))
///     .after_connect(|conn, _| Box::pin(idem::refuse_standby(conn)));
/// # let _ = options;
/// ```
pub async fn refuse_standby(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    use sqlx::Row;
    // A query without arguments runs on the simple protocol (and its future is `Send`
    // for any borrow of the connection, as `after_connect` needs).
    let row = sqlx::Executor::fetch_one(conn, "SELECT pg_is_in_recovery()").await?;
    if row.try_get::<bool, _>(0)? {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "idem: the server is in recovery (a standby), not the primary",
        );
        return Err(sqlx::Error::Io(refused));
    }
    Ok(())
}
