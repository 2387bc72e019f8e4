//! The examples' database: an embedded SQLite file by default, or a PostgreSQL server with
//! every table in a schema of the example's own, dropped and recreated at each run. Through
//! `sqlx::Any`, so one set of handlers serves both.
//!
//! Include it with `#[path = "support/database.rs"] mod database;`.

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool, Connection};
use std::error::Error;

/// A fresh, empty database.
pub struct Fresh {
    pub pool: AnyPool,
    /// Which database, for the example's first line of output.
    pub backend: String,
    /// PostgreSQL (else SQLite), for the DDL that differs.
    pub postgres: bool,
}

impl Fresh {
    /// The column type of an auto-numbered primary key.
    pub fn identity(&self) -> &'static str {
        if self.postgres {
            "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        } else {
            "INTEGER PRIMARY KEY"
        }
    }
}

/// Connects to `database_url` (`None`: a SQLite file `{file}` in the temp directory, removed
/// first; a `postgres…` URL: the schema `schema`, dropped and recreated; any other URL as it
/// is, which must not hold the example's tables yet).
pub async fn connect(
    database_url: Option<String>,
    file: &str,
    schema: &str,
) -> Result<Fresh, Box<dyn Error>> {
    sqlx::any::install_default_drivers();
    let (url, backend) = match database_url {
        None => {
            let path = std::env::temp_dir().join(file);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = format!("sqlite:{}?mode=rwc", path.display());
            (url, format!("SQLite ({})", path.display()))
        }
        Some(url) if url.starts_with("postgres") => {
            let mut admin = AnyConnection::connect(&url).await?;
            sqlx::raw_sql(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .execute(&mut admin)
            .await?;
            admin.close().await?;
            // The machine's table name is fixed by the derive (`orders`), so the schema is
            // chosen by the connection: every connection of the pool gets this search_path.
            let separator = if url.contains('?') { '&' } else { '?' };
            let url = format!("{url}{separator}options=-c%20search_path%3D{schema}");
            (url, format!("PostgreSQL (schema {schema})"))
        }
        Some(url) => (url.clone(), url),
    };
    let postgres = url.starts_with("postgres");
    let pool = AnyPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await?;
    if !postgres {
        // `idem::sqlite_options` sets WAL for a `SqlitePool`; an `Any` pool takes only a
        // URL, so set the journal mode here (it is stored in the file, for all connections).
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    Ok(Fresh {
        pool,
        backend,
        postgres,
    })
}
