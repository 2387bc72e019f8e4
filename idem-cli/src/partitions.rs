//! `idem partitions …`: the inbox partitioned by day (PostgreSQL, MariaDB/MySQL): its
//! days, making it partitioned, and keeping its window of days — each change a dry run
//! without `--yes`.

use crate::database::{Database, with_pool};
use crate::report::{self, Confirm, Failure};
use clap::{Args, Subcommand};
use idem::inbox::partitions;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// The database's day and the inbox's partitions.
    Status,
    /// Makes the inbox a table partitioned by day, moving its records (once; it holds the
    /// table while it runs: do it in a quiet hour).
    Create {
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Keeps the window of days: makes the days ahead, drops the days past `--keep-days`
    /// with their records (failed and parked ones copied to `idem_inbox_failures`).
    Maintain(Window),
}

/// The window of days to keep.
#[derive(Args, Debug)]
pub(crate) struct Window {
    /// Days kept before today: longer than the longest a broker may redeliver.
    #[arg(long)]
    keep_days: u32,
    /// Days made ahead of today (at least 1, so a missed day changes nothing).
    #[arg(long, default_value_t = 2)]
    ahead_days: u32,
    #[command(flatten)]
    confirm: Confirm,
}

pub(crate) async fn run(
    database: &Database,
    command: &Command,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    let status =
        with_pool!(database, pool => partitions::status(pool).await).map_err(Failure::database)?;
    match command {
        Command::Status => {
            let text = if status.is_partitioned() {
                format!(
                    "today (the database's): {}\ndays: {}\nothers: {}",
                    status.today,
                    if status.days.is_empty() {
                        "none yet: run `idem partitions maintain`".to_owned()
                    } else {
                        format!(
                            "{} to {} ({})",
                            status.days[0],
                            status.days[status.days.len() - 1],
                            status.days.len()
                        )
                    },
                    status.others.join(", ")
                )
            } else {
                "the inbox is not partitioned".to_owned()
            };
            report::done(
                json,
                &text,
                serde_json::json!({
                    "partitioned": status.is_partitioned(),
                    "today": status.today,
                    "days": status.days,
                    "others": status.others,
                }),
            );
            Ok(())
        }
        Command::Create { confirm } => {
            let yes = confirm.yes;
            if status.is_partitioned() {
                report::done(
                    json,
                    "the inbox is partitioned already: nothing to do",
                    serde_json::json!({"dry_run": !yes, "partitioned": true, "changed": false}),
                );
                return Ok(());
            }
            if !yes {
                report::done(
                    json,
                    "would partition the inbox by day, moving its records\nnothing changed: run again with --yes to do it",
                    serde_json::json!({"dry_run": true, "partitioned": false}),
                );
                return Ok(());
            }
            with_pool!(database, pool => partitions::partition(pool).await)
                .map_err(Failure::database)?;
            let what = "partitioned the inbox by day";
            report::audit(actor, what);
            report::done(
                json,
                what,
                serde_json::json!({"dry_run": false, "partitioned": true, "changed": true}),
            );
            Ok(())
        }
        Command::Maintain(window) => {
            if !status.is_partitioned() {
                return Err(Failure::NotFound(
                    "the inbox is not partitioned: run `idem partitions create` first".to_owned(),
                ));
            }
            let plan = if window.confirm.yes {
                with_pool!(database, pool => partitions::maintain(pool, window.keep_days, window.ahead_days).await)
                    .map_err(Failure::database)?
            } else {
                status.would_maintain(window.keep_days, window.ahead_days)
            };
            let list = |names: &[String]| {
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            };
            let text = format!(
                "{}: {}\n{}: {}",
                if window.confirm.yes {
                    "created"
                } else {
                    "would create"
                },
                list(&plan.created),
                if window.confirm.yes {
                    "dropped"
                } else {
                    "would drop"
                },
                list(&plan.dropped),
            );
            if window.confirm.yes && (!plan.created.is_empty() || !plan.dropped.is_empty()) {
                report::audit(
                    actor,
                    &format!(
                        "maintained the inbox's partitions: created {}; dropped {}",
                        list(&plan.created),
                        list(&plan.dropped)
                    ),
                );
            }
            let text = if window.confirm.yes {
                text
            } else {
                format!("{text}\nnothing changed: run again with --yes to do it")
            };
            report::done(
                json,
                &text,
                serde_json::json!({
                    "dry_run": !window.confirm.yes,
                    "created": plan.created,
                    "dropped": plan.dropped,
                }),
            );
            Ok(())
        }
    }
}
