//! The two primitives every backend provides, written once over sqlx's generic API.

use super::{Columns, Param};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

/// Runs `sql` with `params` and decodes the first row, if any, into [`Columns`].
pub(super) async fn fetch<'a, DB>(
    conn: &'a mut DB::Connection,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> Result<Option<Columns>, sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
    for<'s> &'s str: ColumnIndex<DB::Row>,
{
    let Some(row) = prepare::<DB>(sql, params)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(Columns {
        applied_version: optional(row.try_get::<Option<i64>, _>("applied_version"))?,
        found: optional(row.try_get::<Option<i64>, _>("found"))?.is_some_and(|n| n != 0),
        current_state: optional(row.try_get::<Option<String>, _>("current_state"))?,
        current_version: optional(row.try_get::<Option<i64>, _>("current_version"))?,
        first_result: optional(row.try_get::<Option<String>, _>("first_result"))?,
    }))
}

/// Runs `sql` with `params`, discarding its result.
pub(super) async fn execute<'a, DB>(
    conn: &'a mut DB::Connection,
    sql: &'a str,
    params: &'a [Param<'a>],
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
{
    prepare::<DB>(sql, params).execute(&mut *conn).await?;
    Ok(())
}

fn prepare<'a, DB>(
    sql: &'a str,
    params: &'a [Param<'a>],
) -> sqlx::query::Query<'a, DB, DB::Arguments<'a>>
where
    DB: Database,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    &'a str: Encode<'a, DB> + Type<DB>,
{
    let mut query = sqlx::query::<DB>(sql);
    for param in params {
        query = match *param {
            Param::Int(n) => query.bind(n),
            Param::Text(s) => query.bind(s),
        };
    }
    query
}

/// A column a statement does not return reads as `None`; any other error is an error.
fn optional<T>(value: Result<Option<T>, sqlx::Error>) -> Result<Option<T>, sqlx::Error> {
    match value {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => other,
    }
}
