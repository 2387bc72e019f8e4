//! The database a command runs on, chosen by its URL's scheme.

use crate::report::Failure;

/// A pool on one of idem's backends.
pub(crate) enum Database {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

/// A small pool: a command runs a few statements, one after another.
fn pool<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new().max_connections(max)
}

impl Database {
    /// Connects to `url`: `sqlite:` (a file, created only if `create`), `postgres:` or
    /// `postgresql:`, `mysql:` or `mariadb:`.
    pub(crate) async fn connect(url: &str, create: bool) -> Result<Database, Failure> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" => {
                let options = idem::sqlite_options(url)
                    .map_err(Failure::database)?
                    .create_if_missing(create);
                pool(1)
                    .connect_with(options)
                    .await
                    .map(Database::Sqlite)
                    .map_err(|e| {
                        Failure::Database(format!(
                            "{e} (a SQLite file that does not exist is created by `idem migrate` only)"
                        ))
                    })
            }
            "postgres" | "postgresql" => pool(2)
                .connect(url)
                .await
                .map(Database::Postgres)
                .map_err(Failure::database),
            "mysql" | "mariadb" => {
                let url = format!("mysql{}", &url[scheme.len()..]);
                pool(2)
                    .connect(&url)
                    .await
                    .map(Database::MySql)
                    .map_err(Failure::database)
            }
            _ => Err(Failure::Usage(format!(
                "unknown database URL scheme `{scheme}:`: use sqlite:, postgres:, mysql: or mariadb:"
            ))),
        }
    }
}

/// Runs `$body` with `$pool` bound to the database's pool, whatever its backend.
macro_rules! with_pool {
    ($database:expr, $pool:ident => $body:expr) => {
        match $database {
            $crate::database::Database::Sqlite($pool) => $body,
            $crate::database::Database::Postgres($pool) => $body,
            $crate::database::Database::MySql($pool) => $body,
        }
    };
}
pub(crate) use with_pool;

impl Database {
    /// Fails with exit 3 unless the database has idem's table `table` (a database without
    /// idem's tables, or a service that does not use that part of idem).
    pub(crate) async fn require(&self, table: &str) -> Result<(), Failure> {
        let found = with_pool!(self, pool => idem::existing_tables(pool, &[table]).await)
            .map_err(Failure::database)?;
        if !found.is_empty() {
            Ok(())
        } else {
            Err(Failure::NotFound(format!(
                "the database has no table `{table}`: run `idem migrate`, or point \
                 DATABASE_URL at the database of the service that uses it"
            )))
        }
    }
}
