//! The two primitives every backend provides, written once over sqlx's generic API.

use super::{Param, Record, Value};
use sqlx::{Column, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

/// Runs `sql` with `params` and decodes the first row, if any, into a [`Record`].
pub(super) async fn fetch<'a, DB>(
    conn: &'a mut DB::Connection,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> Result<Option<Record>, sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let Some(row) = prepare::<DB>(sql, params)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let mut record = Record::default();
    for (i, column) in row.columns().iter().enumerate() {
        // Every column idem reads is an integer or text; NULL reads as NULL whatever its type.
        let value = match row.try_get::<Option<i64>, _>(i) {
            Ok(Some(n)) => Value::Int(n),
            Ok(None) => Value::Null,
            Err(_) => match row.try_get::<Option<String>, _>(i)? {
                Some(s) => Value::Text(s),
                None => Value::Null,
            },
        };
        record.values.push((column.name().to_owned(), value));
    }
    Ok(Some(record))
}

/// Runs `sql` with `params`; the number of rows it affected.
pub(super) async fn execute<'a, DB>(
    conn: &'a mut DB::Connection,
    sql: &'a str,
    params: &'a [Param<'a>],
    rows_affected: fn(&DB::QueryResult) -> u64,
) -> Result<u64, sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB>,
{
    let done = prepare::<DB>(sql, params).execute(&mut *conn).await?;
    Ok(rows_affected(&done))
}

fn prepare<'a, DB>(
    sql: &'a str,
    params: &'a [Param<'a>],
) -> sqlx::query::Query<'a, DB, DB::Arguments<'a>>
where
    DB: Database,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB>,
{
    let mut query = sqlx::query::<DB>(sql);
    for param in params {
        query = match *param {
            Param::Int(n) => query.bind(n),
            Param::Text(s) => query.bind(s),
            Param::Null => query.bind(None::<i64>),
        };
    }
    query
}
