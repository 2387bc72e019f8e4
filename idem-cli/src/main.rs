//! `idem`: idem's state from the command line, for the people on call. The database comes
//! from `--database-url` or `DATABASE_URL` (`sqlite:`, `postgres:`, `mysql:` or `mariadb:`);
//! every command prints a table for people, or JSON with `--json`. Destructive commands
//! only say what they would do unless given `--yes`.
//!
//! Exit codes: 0 done; 1 the database failed or refused; 2 a usage error (a bad argument,
//! an unknown URL scheme); 3 a message named does not exist (or is not dead).

mod database;
mod outbox;
mod report;

use clap::{Parser, Subcommand};
use database::Database;
use report::Failure;
use std::process::ExitCode;

/// idem's tables and the outbox's messages, from the command line.
#[derive(Parser, Debug)]
#[command(name = "idem", version, about, long_about = None)]
struct Cli {
    /// The database: sqlite:path, postgres://…, mysql://… or mariadb://…
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// Print JSON, for scripts, instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Creates idem's tables, or brings them up to this version (safe to run again).
    Migrate,
    /// The outbox: its backlog, its dead messages, requeueing and discarding them.
    #[command(subcommand)]
    Outbox(outbox::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return Failure::Database(e.to_string()).exit(cli.json),
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.exit(cli.json),
    }
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    let Some(url) = cli.database_url.as_deref() else {
        return Err(Failure::Usage(
            "no database: give --database-url or set DATABASE_URL".to_owned(),
        ));
    };
    let database = Database::connect(url, matches!(cli.command, Command::Migrate)).await?;
    match &cli.command {
        Command::Migrate => {
            database::with_pool!(&database, pool => idem::migrate(pool).await)
                .map_err(Failure::database)?;
            report::done(
                cli.json,
                "idem's tables are up to date",
                serde_json::json!({"migrated": true}),
            );
            Ok(())
        }
        Command::Outbox(command) => outbox::run(&database, command, cli.json).await,
    }
}
