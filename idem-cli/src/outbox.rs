//! `idem outbox …`: the backlog, the dead messages grouped by their error, and requeueing or
//! discarding them (one, several, a group, or all), through idem's own functions: a
//! requeued message is published by the relay's claim like any other, once.

use crate::database::{Database, with_pool};
use crate::report::{self, Confirm, Failure};
use clap::{Args, Subcommand};
use idem::outbox::{Backlog, DeadGroup, DeadMessage};

/// The most dead messages a command reads.
const MAX_DEAD: u32 = 100_000;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// How many messages wait, how many are dead or held behind a dead one, and the age of
    /// the oldest.
    Backlog {
        /// One line per destination with unpublished messages.
        #[arg(long)]
        by_destination: bool,
    },
    /// The dead messages, grouped by their last error (`--all-messages` lists each one).
    Dead {
        /// List every dead message instead of the groups, in the order they were staged.
        #[arg(long)]
        all_messages: bool,
    },
    /// Sends dead messages again, as new: the relay publishes them, and their keys go on.
    Requeue(Targets),
    /// Deletes dead messages without publishing them: their keys go on without them.
    Discard(Targets),
    /// Deletes the messages published longer ago than `--older-than`; unpublished and dead
    /// messages are kept.
    Purge {
        /// Keep what was published more recently than this (7d, 12h, 15m).
        #[arg(long, value_parser = report::duration)]
        older_than: std::time::Duration,
        /// Messages per transaction.
        #[arg(long, default_value_t = 1000)]
        batch: u32,
        #[command(flatten)]
        confirm: Confirm,
    },
}

/// Which dead messages an action takes, and whether to take it.
#[derive(Args, Debug)]
pub(crate) struct Targets {
    /// The ids of the dead messages.
    ids: Vec<String>,
    /// The dead messages of one group: those whose last error is exactly this text, as
    /// `idem outbox dead` shows it.
    #[arg(long, conflicts_with_all = ["ids", "all", "error_containing"])]
    error: Option<String>,
    /// The dead messages whose last error contains this text (several groups, maybe).
    #[arg(long, conflicts_with_all = ["ids", "all"])]
    error_containing: Option<String>,
    /// Every dead message.
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    #[command(flatten)]
    confirm: Confirm,
}

pub(crate) async fn run(
    database: &Database,
    command: &Command,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    match command {
        Command::Backlog { by_destination } => backlog(database, *by_destination, json).await,
        Command::Dead { all_messages } => dead(database, *all_messages, json).await,
        Command::Requeue(targets) => act(database, targets, Action::Requeue, actor, json).await,
        Command::Discard(targets) => act(database, targets, Action::Discard, actor, json).await,
        Command::Purge {
            older_than,
            batch,
            confirm,
        } => purge(database, *older_than, *batch, confirm.yes, actor, json).await,
    }
}

async fn purge(
    database: &Database,
    older_than: std::time::Duration,
    batch: u32,
    yes: bool,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    if !yes {
        let n = with_pool!(database, pool => idem::outbox::purgeable(pool, older_than).await)
            .map_err(Failure::database)?;
        report::done(
            json,
            &format!(
                "would delete {n} published message(s)\nnothing changed: run again with --yes to do it"
            ),
            serde_json::json!({"dry_run": true, "messages": n}),
        );
        return Ok(());
    }
    let n = with_pool!(database, pool => idem::outbox::purge(pool, older_than, batch).await)
        .map_err(Failure::database)?;
    let what = format!("purged {n} published outbox message(s)");
    report::audit(actor, &what);
    report::done(
        json,
        &what,
        serde_json::json!({"dry_run": false, "messages": n}),
    );
    Ok(())
}

/// A backlog's cells and its JSON fields.
fn backlog_row(backlog: &Backlog) -> (Vec<String>, serde_json::Value) {
    let oldest = backlog.oldest.map(|age| age.as_secs_f64());
    let cells = vec![
        backlog.pending.to_string(),
        backlog.dead.to_string(),
        backlog.held.to_string(),
        oldest.map_or("-".to_owned(), |s| format!("{s:.1}")),
    ];
    let value = serde_json::json!({
        "pending": backlog.pending,
        "dead": backlog.dead,
        "held": backlog.held,
        "oldest_seconds": oldest,
    });
    (cells, value)
}

async fn backlog(database: &Database, by_destination: bool, json: bool) -> Result<(), Failure> {
    const HEADER: [&str; 4] = ["pending", "dead", "held", "oldest (s)"];
    if by_destination {
        let destinations =
            with_pool!(database, pool => idem::outbox::backlog_by_destination(pool).await)
                .map_err(Failure::database)?;
        let (mut rows, mut values) = (Vec::new(), Vec::new());
        for d in &destinations {
            let (mut cells, mut value) = backlog_row(&d.backlog);
            cells.insert(0, d.destination.clone());
            value["destination"] = serde_json::json!(d.destination);
            rows.push(cells);
            values.push(value);
        }
        let text = if rows.is_empty() {
            "nothing waits".to_owned()
        } else {
            let header: Vec<&str> = std::iter::once("destination").chain(HEADER).collect();
            report::table(&header, &rows)
        };
        report::done(json, &text, serde_json::json!({"destinations": values}));
        return Ok(());
    }
    let backlog = with_pool!(database, pool => idem::outbox::backlog(pool).await)
        .map_err(Failure::database)?;
    let (cells, value) = backlog_row(&backlog);
    report::done(json, &report::table(&HEADER, &[cells]), value);
    Ok(())
}

/// The dead messages in the order they were staged (the order the relay publishes in).
async fn read_dead(database: &Database) -> Result<Vec<DeadMessage>, Failure> {
    with_pool!(database, pool => idem::outbox::dead(pool, MAX_DEAD).await)
        .map_err(Failure::database)
}

/// The dead messages' failure groups, the largest first.
async fn read_groups(database: &Database) -> Result<Vec<DeadGroup>, Failure> {
    with_pool!(database, pool => idem::outbox::dead_by_error(pool, MAX_DEAD).await)
        .map_err(Failure::database)
}

fn message_json(message: &DeadMessage) -> serde_json::Value {
    serde_json::json!({
        "id": message.id,
        "ordering_key": message.ordering_key,
        "destination": message.destination,
        "routing_key": message.routing_key,
        "attempts": message.attempts,
        "last_error": message.last_error,
        "created_at_millis": message.created_at_millis,
        "dead_at_millis": message.dead_at_millis,
    })
}

async fn dead(database: &Database, all_messages: bool, json: bool) -> Result<(), Failure> {
    if all_messages {
        let dead = read_dead(database).await?;
        let rows: Vec<Vec<String>> = dead
            .iter()
            .map(|m| {
                vec![
                    m.id.clone(),
                    m.ordering_key.clone(),
                    m.destination.clone(),
                    m.attempts.to_string(),
                    m.last_error.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let header = [
            "id",
            "ordering key",
            "destination",
            "attempts",
            "last error",
        ];
        let value =
            serde_json::json!({"messages": dead.iter().map(message_json).collect::<Vec<_>>()});
        report::done(json, &report::table(&header, &rows), value);
        return Ok(());
    }
    let groups = read_groups(database).await?;
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|group| {
            let mut ids: Vec<&str> = group
                .messages
                .iter()
                .take(3)
                .map(|m| m.id.as_str())
                .collect();
            if group.messages.len() > 3 {
                ids.push("…");
            }
            vec![
                group.messages.len().to_string(),
                group.error.clone(),
                ids.join(", "),
            ]
        })
        .collect();
    let value = serde_json::json!({
        "groups": groups.iter().map(|group| serde_json::json!({
            "error": group.error,
            "count": group.messages.len(),
            "ids": group.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    let table = if rows.is_empty() {
        "no dead messages".to_owned()
    } else {
        report::table(&["count", "last error", "ids"], &rows)
    };
    report::done(json, &table, value);
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Requeue,
    Discard,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Requeue => "requeue",
            Action::Discard => "discard",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Requeue => "requeued",
            Action::Discard => "discarded",
        }
    }
}

async fn act(
    database: &Database,
    targets: &Targets,
    action: Action,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    if targets.ids.is_empty()
        && targets.error.is_none()
        && targets.error_containing.is_none()
        && !targets.all
    {
        return Err(Failure::Usage(format!(
            "name the messages to {}: their ids, --error TEXT, --error-containing TEXT or --all",
            action.verb()
        )));
    }
    let dead = read_dead(database).await?;
    let of = |keep: &dyn Fn(&str) -> bool| -> Vec<&DeadMessage> {
        dead.iter().filter(|m| keep(m.group())).collect()
    };
    let chosen: Vec<&DeadMessage> = if targets.all {
        of(&|_| true)
    } else if let Some(error) = &targets.error {
        of(&|group| group == error)
    } else if let Some(text) = &targets.error_containing {
        of(&|group| group.contains(text.as_str()))
    } else {
        let mut chosen = Vec::new();
        for id in &targets.ids {
            match dead.iter().find(|m| &m.id == id) {
                Some(message) => chosen.push(message),
                None => {
                    return Err(Failure::NotFound(format!(
                        "no dead message has the id `{id}` (nothing was {})",
                        action.done()
                    )));
                }
            }
        }
        chosen
    };
    let ids: Vec<&str> = chosen.iter().map(|m| m.id.as_str()).collect();
    if !targets.confirm.yes {
        report::done(
            json,
            &format!(
                "would {} {} dead message(s): {}\nnothing changed: run again with --yes to do it",
                action.verb(),
                ids.len(),
                ids.join(", ")
            ),
            serde_json::json!({"dry_run": true, "action": action.verb(), "ids": ids}),
        );
        return Ok(());
    }
    let (mut changed, mut gone) = (Vec::new(), Vec::new());
    for id in ids {
        let did = with_pool!(database, pool => match action {
            Action::Requeue => idem::outbox::requeue_by(pool, id, actor).await,
            Action::Discard => idem::outbox::discard(pool, id).await,
        })
        .map_err(Failure::database)?;
        if did {
            report::audit(
                actor,
                &format!("{} the outbox message `{id}`", action.done()),
            );
            changed.push(id)
        } else {
            gone.push(id)
        }
    }
    let mut line = format!("{} {} dead message(s)", action.done(), changed.len());
    if !gone.is_empty() {
        line.push_str(&format!(
            "; no longer dead (requeued or discarded meanwhile): {}",
            gone.join(", ")
        ));
    }
    report::done(
        json,
        &line,
        serde_json::json!({"dry_run": false, "action": action.verb(), action.done(): changed, "no_longer_dead": gone}),
    );
    Ok(())
}
