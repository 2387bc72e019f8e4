//! `idem`: idem's state from the command line, for the people on call. The database comes
//! from `--database-url` or `DATABASE_URL` (`sqlite:`, `postgres:`, `mysql:` or `mariadb:`);
//! every command prints a table for people, or JSON with `--json`. Destructive commands
//! only say what they would do unless given `--yes`.
//!
//! Exit codes: 0 done; 1 the database failed or refused; 2 a usage error (a bad argument,
//! an unknown URL scheme); 3 a message or record named does not exist (or is not in the
//! state the command needs), or the database has no table the command reads; 4 `idem check`
//! or `idem reconcile` found something to fix.
//!
//! Every change a command makes is logged on the standard error (when, who, what), and
//! where the table has room for it, who made it is written into the row.

mod check;
mod database;
mod inbox;
mod outbox;
mod partitions;
mod reconcile;
mod report;
mod signals;

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
    /// Who acts, written into the rows a command changes and into its log (default: the
    /// user's login name).
    #[arg(long, env = "IDEM_ACTOR", global = true)]
    actor: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Creates idem's tables, or brings them up to this version (safe to run again).
    Migrate,
    /// Which of this version's migrations the database has, and what is wrong with idem's
    /// tables (exit 4 when something is).
    Check {
        /// The results table your machines use, if not `idem_results`.
        #[arg(long)]
        results_table: Option<String>,
    },
    /// The inbox: each group's records, stuck, failed and parked ones, and their repairs.
    #[command(subcommand)]
    Inbox(inbox::Command),
    /// The outbox: its backlog, its dead messages, requeueing and discarding them.
    #[command(subcommand)]
    Outbox(outbox::Command),
    /// What the tables show of the last `--window`: per consumer group the deliveries,
    /// retries and how many succeeded, failures, parked records, stuck leases; the outbox.
    Signals {
        /// How far back (1h, 30m, 1d).
        #[arg(long, default_value = "1h", value_parser = report::duration)]
        window: std::time::Duration,
    },
    /// The inbox partitioned by day (PostgreSQL, MariaDB/MySQL): its days and their window.
    #[command(subcommand)]
    Partitions(partitions::Command),
    /// Reads a table of your effects against idem's records of the same keys: keys with
    /// more than one effect, effects without a record, records without an effect (exit 4
    /// when there are any). Reads only.
    Reconcile(reconcile::Reconcile),
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
    let actor = cli.actor.clone().unwrap_or_else(|| {
        std::env::var("USER")
            .or_else(|_| std::env::var("USERNAME"))
            .unwrap_or_else(|_| "someone".to_owned())
    });
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
        Command::Check { results_table } => {
            check::run(&database, results_table.as_deref(), cli.json).await
        }
        Command::Inbox(command) => {
            database.require("idem_inbox").await?;
            inbox::run(&database, command, &actor, cli.json).await
        }
        Command::Outbox(command) => {
            database.require("idem_outbox").await?;
            outbox::run(&database, command, &actor, cli.json).await
        }
        Command::Signals { window } => signals::run(&database, *window, cli.json).await,
        Command::Partitions(command) => {
            database.require("idem_inbox").await?;
            partitions::run(&database, command, &actor, cli.json).await
        }
        Command::Reconcile(args) => reconcile::run(&database, args, cli.json).await,
    }
}
