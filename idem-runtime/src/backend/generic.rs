//! The two primitives every backend provides, written once over sqlx's generic API.

use super::{Dialect, Param, Record, Value, pooler::unnamed};
use idem_sql::placeholder::positional;
use sqlx::{Column, Database, Decode, Executor, IntoArguments, Row, Type, ValueRef};
use std::borrow::Cow;

/// Runs `sql` with `params` and decodes the first row, if any, into a [`Record`].
pub(super) async fn fetch<'a, DB>(
    conn: &'a mut DB::Connection,
    dialect: Dialect,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> Result<Option<Record>, sqlx::Error>
where
    DB: Bind,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    Vec<u8>: for<'r> Decode<'r, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let (sql, params) = placed(dialect, sql, params)?;
    let Some(row) = prepare::<DB>(dialect, &sql, &params)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    decoded::<DB>(&row, false).map(Some)
}

/// Runs `sql` with `params` and decodes every row into a [`Record`].
pub(super) async fn fetch_all<'a, DB>(
    conn: &'a mut DB::Connection,
    dialect: Dialect,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> Result<Vec<Record>, sqlx::Error>
where
    DB: Bind,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    Vec<u8>: for<'r> Decode<'r, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let (sql, params) = placed(dialect, sql, params)?;
    let rows = prepare::<DB>(dialect, &sql, &params)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(|row| decoded::<DB>(row, true)).collect()
}

/// Runs `sql` with `params` and hands each row, decoded, to `each` as it arrives: the rows
/// are streamed, never all held (reconciling a table of millions of rows).
pub(super) async fn fetch_each<'a, DB, F>(
    conn: &'a mut DB::Connection,
    dialect: Dialect,
    sql: &'a str,
    params: &'a [Param<'a>],
    mut each: F,
) -> Result<(), sqlx::Error>
where
    DB: Bind,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    Vec<u8>: for<'r> Decode<'r, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    F: FnMut(Record) + Send + 'a,
{
    use futures_util::TryStreamExt;
    let (sql, params) = placed(dialect, sql, params)?;
    let mut rows = prepare::<DB>(dialect, &sql, &params).fetch(&mut *conn);
    while let Some(row) = rows.try_next().await? {
        each(decoded::<DB>(&row, true)?);
    }
    Ok(())
}

/// A row as a [`Record`]: every column an integer, text or NULL; with `bytes`, a binary
/// value that is not UTF-8 as bytes (without, it is an error: where idem reads only text).
fn decoded<DB>(row: &DB::Row, bytes: bool) -> Result<Record, sqlx::Error>
where
    DB: Database,
    i64: for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    Vec<u8>: for<'r> Decode<'r, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut record = Record::default();
    for (i, column) in row.columns().iter().enumerate() {
        // Every column idem reads is an integer, text or bytes; NULL reads as NULL whatever
        // its type. The value's type picks the decoding, so a text column is not first tried
        // (and refused, with an error built and dropped) as an integer.
        let raw = row.try_get_raw(i)?;
        let value = if raw.is_null() {
            Value::Null
        } else if <i64 as Type<DB>>::compatible(&raw.type_info()) {
            Value::Int(row.try_get(i)?)
        } else if <String as Type<DB>>::compatible(&raw.type_info()) {
            Value::Text(row.try_get(i)?)
        } else {
            // Text the driver reports as binary (MySQL flags a column of a `_bin`
            // collation so, and a `VARBINARY` key): its bytes, read as text when they are
            // UTF-8; a payload's bytes otherwise.
            let raw: Vec<u8> = row.try_get(i)?;
            match String::from_utf8(raw) {
                Ok(text) => Value::Text(text),
                Err(e) if bytes => Value::Bytes(e.into_bytes()),
                Err(e) => {
                    return Err(sqlx::Error::ColumnDecode {
                        index: column.name().to_owned(),
                        source: Box::new(e),
                    });
                }
            }
        };
        record.values.push((column.name().to_owned(), value));
    }
    Ok(record)
}

/// Runs `sql` with `params`; the number of rows it affected.
pub(super) async fn execute<'a, DB>(
    conn: &'a mut DB::Connection,
    dialect: Dialect,
    sql: &'a str,
    params: &'a [Param<'a>],
    rows_affected: fn(&DB::QueryResult) -> u64,
) -> Result<u64, sqlx::Error>
where
    DB: Bind,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let (sql, params) = placed(dialect, sql, params)?;
    let done = prepare::<DB>(dialect, &sql, &params)
        .execute(&mut *conn)
        .await?;
    Ok(rows_affected(&done))
}

/// The statement as `dialect` runs it, and its parameters in the order it binds them:
/// numbered (`$n`) as written, or positional (`?`, MySQL), each use of a value bound again.
#[allow(clippy::type_complexity)]
fn placed<'s, 'a>(
    dialect: Dialect,
    sql: &'s str,
    params: &'a [Param<'a>],
) -> Result<(Cow<'s, str>, Cow<'a, [Param<'a>]>), sqlx::Error> {
    if !dialect.binds_positionally() {
        return Ok((Cow::Borrowed(sql), Cow::Borrowed(params)));
    }
    let placed = positional(sql);
    let bound = placed
        .order
        .iter()
        .map(|&n| {
            params.get(n).copied().ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "idem: a statement uses ${} but binds {} parameters",
                    n + 1,
                    params.len()
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((placed.text, Cow::Owned(bound)))
}

/// The items of a `Backend` impl that every backend writes the same way, over this
/// module's generic [`fetch`] and [`execute`]: `$dialect` is the connection's dialect,
/// `$done` the driver's query result type.
#[allow(unused_macros)]
macro_rules! run_generically {
    ($db:ty, $conn:ty, $dialect:expr, $done:ty) => {
        fn fetch<'a>(
            conn: &'a mut $conn,
            sql: &'a str,
            params: &'a [$crate::backend::Param<'a>],
        ) -> impl core::future::Future<
            Output = Result<Option<$crate::backend::Record>, sqlx::Error>,
        > + Send
        + 'a {
            $crate::backend::generic::fetch::<$db>(conn, $dialect, sql, params)
        }

        fn fetch_all<'a>(
            conn: &'a mut $conn,
            sql: &'a str,
            params: &'a [$crate::backend::Param<'a>],
        ) -> impl core::future::Future<
            Output = Result<Vec<$crate::backend::Record>, sqlx::Error>,
        > + Send
        + 'a {
            $crate::backend::generic::fetch_all::<$db>(conn, $dialect, sql, params)
        }

        fn fetch_each<'a, F: FnMut($crate::backend::Record) + Send + 'a>(
            conn: &'a mut $conn,
            sql: &'a str,
            params: &'a [$crate::backend::Param<'a>],
            each: F,
        ) -> impl core::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a {
            $crate::backend::generic::fetch_each::<$db, F>(conn, $dialect, sql, params, each)
        }

        fn execute<'a>(
            conn: &'a mut $conn,
            sql: &'a str,
            params: &'a [$crate::backend::Param<'a>],
        ) -> impl core::future::Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
            $crate::backend::generic::execute::<$db>(conn, $dialect, sql, params, <$done>::rows_affected)
        }

        async fn execute_script(conn: &mut $conn, sql: &str) -> Result<(), sqlx::Error> {
            // A query without arguments runs as a script (PostgreSQL's simple protocol,
            // SQLite stepping through every statement, MySQL's text protocol with several
            // statements), and its future is already `Send`.
            sqlx::Executor::execute(conn, sql).await.map(drop)
        }
    };
}
#[allow(unused_imports)]
pub(super) use run_generically;

/// A query being built, on backend `DB`.
pub(super) type Query<'a, DB> = sqlx::query::Query<'a, DB, <DB as Database>::Arguments<'a>>;

/// How a backend binds each kind of [`Param`].
pub(super) trait Bind: Database + sqlx::database::HasStatementCache {
    /// `query` with `param` bound as its next parameter.
    fn bind<'a>(query: Query<'a, Self>, param: Param<'a>) -> Query<'a, Self>;
}

/// Binds every kind of parameter with the driver's own encoding (a UUID as the driver
/// stores `uuid::Uuid`: PostgreSQL `uuid`, SQLite a 16-byte blob).
#[allow(unused_macros)]
macro_rules! bind_natively {
    ($db:ty) => {
        impl $crate::backend::generic::Bind for $db {
            fn bind<'a>(
                query: $crate::backend::generic::Query<'a, Self>,
                param: $crate::backend::Param<'a>,
            ) -> $crate::backend::generic::Query<'a, Self> {
                use $crate::backend::Param;
                match param {
                    Param::Int(n) => query.bind(n),
                    Param::Text(s) | Param::State(s) => query.bind(s),
                    Param::Bytes(b) => query.bind(b),
                    Param::Null => query.bind(None::<i64>),
                    #[cfg(feature = "uuid")]
                    Param::Uuid(id) => query.bind(id),
                    Param::Column(value) => {
                        $crate::backend::generic::bind_column!(query, value, uuid = |id| id)
                    }
                }
            }
        }
    };
}
#[allow(unused_imports)]
pub(super) use bind_natively;

/// Binds a [`ColumnValue`](crate::ColumnValue) with the driver's own encoding of its type,
/// a NULL typed as its column's values; `uuid` maps a UUID to what the backend binds.
#[allow(unused_macros)]
macro_rules! bind_column {
    ($query:expr, $value:expr, uuid = |$id:ident| $uuid:expr) => {{
        use $crate::value::column::{ColumnType, ColumnValue};
        let query = $query;
        match $value {
            ColumnValue::Int(n) => query.bind(*n),
            ColumnValue::Float(x) => query.bind(*x),
            ColumnValue::Bool(b) => query.bind(*b),
            ColumnValue::Text(s) => query.bind(s.as_str()),
            ColumnValue::Bytes(b) => query.bind(b.as_slice()),
            #[cfg(feature = "uuid")]
            ColumnValue::Uuid(id) => {
                let $id: uuid::Uuid = *id;
                query.bind($uuid)
            }
            ColumnValue::Null(ColumnType::Int) => query.bind(None::<i64>),
            ColumnValue::Null(ColumnType::Float) => query.bind(None::<f64>),
            ColumnValue::Null(ColumnType::Bool) => query.bind(None::<bool>),
            ColumnValue::Null(ColumnType::Text) => query.bind(None::<&str>),
            ColumnValue::Null(ColumnType::Bytes) => query.bind(None::<&[u8]>),
            #[cfg(feature = "uuid")]
            ColumnValue::Null(ColumnType::Uuid) => query.bind(None::<uuid::Uuid>.map(|$id| $uuid)),
        }
    }};
}
#[allow(unused_imports)]
pub(super) use bind_column;

/// `sql` with `params` bound: a named prepared statement, cached by the driver, unless
/// statements on `dialect` are unnamed ([`pooler`](super::pooler)).
fn prepare<'a, DB: Bind>(dialect: Dialect, sql: &'a str, params: &'a [Param<'a>]) -> Query<'a, DB> {
    let mut query = sqlx::query::<DB>(sql).persistent(!unnamed(dialect));
    for param in params {
        query = DB::bind(query, *param);
    }
    query
}
