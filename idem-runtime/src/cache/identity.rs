//! The name of the database a cache is attached for: the keys of two databases never
//! meet in one Redis.

use crate::backend::{Backend, Opened, Param};
use std::sync::atomic::{AtomicU64, Ordering};

/// The name of the database `pool` works in; for a database without one (SQLite in
/// memory, which no other process can share), a name unique to this process.
pub(crate) async fn identity<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<String, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let statement = DB::dialect(conn)?.database_identity();
    let no_params: [Param<'_>; 0] = [];
    let name = DB::fetch(conn, statement, &no_params)
        .await?
        .and_then(|mut row| row.take_text("identity"))
        .unwrap_or_default();
    opened.end(true).await?;
    if !name.is_empty() {
        return Ok(name);
    }
    static UNNAMED: AtomicU64 = AtomicU64::new(0);
    let n = UNNAMED.fetch_add(1, Ordering::Relaxed);
    Ok(format!("unnamed/{}/{n}", std::process::id()))
}
