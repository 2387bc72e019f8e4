//! The consumer examples' database: an SQLite file with idem's tables and the ledger the
//! consumers book payments in, and what the ledger holds at the end.
//!
//! Include it with `#[path = "support/ledger.rs"] mod ledger;`.

use idem::inbox::Inbox;
use sqlx::SqlitePool;
use std::error::Error;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Connects to `database_url` (`None`: the SQLite file `file` in the temp directory, removed
/// first), and creates idem's tables and the ledger, where each payment is a row.
pub async fn database(database_url: Option<String>, file: &str) -> Result<SqlitePool> {
    let database_url = match database_url {
        Some(url) => url,
        None => {
            let path = std::env::temp_dir().join(file);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            format!("sqlite:{}", path.display())
        }
    };
    let pool = SqlitePool::connect_with(idem::sqlite_options(&database_url)?).await?;
    idem::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ledger (order_id INTEGER NOT NULL, amount INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// Prints what `inbox` counted and what the ledger holds, and returns the latter: its rows
/// and the sum of their amounts.
pub async fn summary(pool: &SqlitePool, inbox: &Inbox) -> Result<(i64, i64)> {
    let counters = inbox.counters();
    let (rows, total): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM ledger")
            .fetch_one(pool)
            .await?;
    println!(
        "deliveries: {} applied, {} duplicates absorbed; ledger: {rows} rows, {total} in total",
        counters.applied, counters.duplicates
    );
    Ok((rows, total))
}
