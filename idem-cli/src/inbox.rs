//! `idem inbox …`: each consumer group's records by status; the stuck, processing, failed
//! and parked records (never their results); ending a stuck lease, reviving a parked
//! record, and purging a group's finished records — each repair a dry run without `--yes`.

use crate::database::{Database, with_pool};
use crate::report::{self, Confirm, Failure};
use clap::{Args, Subcommand};
use idem::inbox::{Inbox, InboxRecord, MessageKey, RecordStatus};
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Each consumer group's records: processing (and of those stuck), done, failed, parked.
    Groups,
    /// Records PROCESSING whose lease ended: their worker died or hangs, and the broker has
    /// not redelivered the message yet.
    Stuck(List),
    /// Records PROCESSING, their lease ended or not.
    Processing(List),
    /// Records whose last attempt failed: their next delivery tries again.
    Failed(List),
    /// Records parked (DEAD) after their last allowed attempt.
    Dead(List),
    /// Ends a PROCESSING record's lease now: the next delivery takes it over at once.
    Release(One),
    /// Brings a parked record back, with every attempt allowed: its next delivery (from the
    /// broker's dead-letter queue, a replay) runs the handler again.
    Revive(One),
    /// Deletes a group's finished records (done, failed) untouched for longer than
    /// `--older-than`; processing and parked records are kept.
    Purge(Purge),
}

/// Which records to list.
#[derive(Args, Debug)]
pub(crate) struct List {
    /// Only this consumer group's.
    #[arg(long)]
    group: Option<String>,
    /// At most this many, least recently touched first.
    #[arg(long, default_value_t = 100)]
    limit: u32,
}

/// One record, and whether to act on it.
#[derive(Args, Debug)]
pub(crate) struct One {
    /// Its consumer group.
    group: String,
    /// Its message key.
    key: String,
    #[command(flatten)]
    confirm: Confirm,
}

/// A purge of one group.
#[derive(Args, Debug)]
pub(crate) struct Purge {
    /// The consumer group.
    group: String,
    /// Keep what was touched more recently than this (30d, 12h, 15m): longer than the
    /// longest a broker may redeliver.
    #[arg(long, value_parser = report::duration)]
    older_than: Duration,
    /// Records per transaction.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
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
        Command::Groups => groups(database, json).await,
        Command::Stuck(list) => records(database, list, RecordStatus::Stuck, json).await,
        Command::Processing(list) => records(database, list, RecordStatus::Processing, json).await,
        Command::Failed(list) => records(database, list, RecordStatus::Failed, json).await,
        Command::Dead(list) => records(database, list, RecordStatus::Dead, json).await,
        Command::Release(one) => repair(database, one, Repair::Release, actor, json).await,
        Command::Revive(one) => repair(database, one, Repair::Revive, actor, json).await,
        Command::Purge(purge) => purge_group(database, purge, actor, json).await,
    }
}

fn inbox(group: &str) -> Result<Inbox, Failure> {
    Inbox::new(group).map_err(|e| Failure::Usage(format!("consumer group `{group}`: {e}")))
}

fn time(millis: Option<i64>) -> String {
    millis.map_or("-".to_owned(), report::utc)
}

async fn groups(database: &Database, json: bool) -> Result<(), Failure> {
    let groups =
        with_pool!(database, pool => idem::inbox::groups(pool).await).map_err(Failure::database)?;
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                g.group.clone(),
                g.processing.to_string(),
                g.stuck.to_string(),
                g.succeeded.to_string(),
                g.failed.to_string(),
                g.dead.to_string(),
                time(g.last_at_millis),
            ]
        })
        .collect();
    let header = [
        "group",
        "processing",
        "stuck",
        "done",
        "failed",
        "dead",
        "last touched",
    ];
    let table = if rows.is_empty() {
        "the inbox has no records".to_owned()
    } else {
        report::table(&header, &rows)
    };
    let value = serde_json::json!({
        "groups": groups.iter().map(|g| serde_json::json!({
            "group": g.group,
            "processing": g.processing,
            "stuck": g.stuck,
            "succeeded": g.succeeded,
            "failed": g.failed,
            "dead": g.dead,
            "last_at_millis": g.last_at_millis,
        })).collect::<Vec<_>>(),
    });
    report::done(json, &table, value);
    Ok(())
}

fn record_json(r: &InboxRecord) -> serde_json::Value {
    serde_json::json!({
        "group": r.group,
        "key": r.key,
        "status": r.status,
        "attempts": r.attempts,
        "error": r.error,
        "lease_until_millis": r.lease_until_millis,
        "created_at_millis": r.created_at_millis,
        "updated_at_millis": r.updated_at_millis,
    })
}

async fn records(
    database: &Database,
    list: &List,
    status: RecordStatus,
    json: bool,
) -> Result<(), Failure> {
    let group = list.group.as_deref();
    let records =
        with_pool!(database, pool => idem::inbox::records(pool, group, status, list.limit).await)
            .map_err(Failure::database)?;
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.group.clone(),
                r.key.clone(),
                r.attempts.to_string(),
                time(r.lease_until_millis),
                time(Some(r.updated_at_millis)),
                r.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let header = [
        "group",
        "key",
        "attempts",
        "lease until",
        "last touched",
        "error",
    ];
    let table = if rows.is_empty() {
        "no such records".to_owned()
    } else {
        report::table(&header, &rows)
    };
    let value = serde_json::json!({"records": records.iter().map(record_json).collect::<Vec<_>>()});
    report::done(json, &table, value);
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Repair {
    Release,
    Revive,
}

impl Repair {
    /// The status the record must have.
    fn needs(self) -> &'static str {
        match self {
            Repair::Release => "PROCESSING",
            Repair::Revive => "DEAD",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Repair::Release => "release the lease of",
            Repair::Revive => "revive",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Repair::Release => "released the lease of",
            Repair::Revive => "revived",
        }
    }
}

async fn repair(
    database: &Database,
    one: &One,
    repair: Repair,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    let inbox = inbox(&one.group)?;
    let key = MessageKey::new(one.key.as_str())
        .map_err(|e| Failure::Usage(format!("message key `{}`: {e}", one.key)))?;
    let record =
        with_pool!(database, pool => inbox.record(pool, &key).await).map_err(Failure::database)?;
    let named = format!("`{}` in `{}`", one.key, one.group);
    match &record {
        None => {
            return Err(Failure::NotFound(format!(
                "the inbox has no record {named}"
            )));
        }
        Some(r) if r.status != repair.needs() => {
            return Err(Failure::NotFound(format!(
                "the record {named} is {}, not {}: nothing to {}",
                r.status,
                repair.needs(),
                repair.verb()
            )));
        }
        Some(_) => {}
    }
    if !one.confirm.yes {
        report::done(
            json,
            &format!(
                "would {} the record {named}\nnothing changed: run again with --yes to do it",
                repair.verb()
            ),
            serde_json::json!({"dry_run": true, "record": record.as_ref().map(record_json)}),
        );
        return Ok(());
    }
    let changed = with_pool!(database, pool => match repair {
        Repair::Release => inbox.release(pool, &key, actor).await,
        Repair::Revive => inbox.revive(pool, &key, actor).await,
    })
    .map_err(Failure::database)?;
    if !changed {
        return Err(Failure::NotFound(format!(
            "the record {named} is no longer {} (a delivery moved it meanwhile): nothing changed",
            repair.needs()
        )));
    }
    let what = format!("{} the inbox record {named}", repair.done());
    report::audit(actor, &what);
    report::done(
        json,
        &what,
        serde_json::json!({"dry_run": false, "changed": true, "group": one.group, "key": one.key}),
    );
    Ok(())
}

async fn purge_group(
    database: &Database,
    purge: &Purge,
    actor: &str,
    json: bool,
) -> Result<(), Failure> {
    let inbox = inbox(&purge.group)?;
    if !purge.confirm.yes {
        let n = with_pool!(database, pool => inbox.purgeable(pool, purge.older_than).await)
            .map_err(Failure::database)?;
        report::done(
            json,
            &format!(
                "would delete {n} finished record(s) of `{}`\nnothing changed: run again with --yes to do it",
                purge.group
            ),
            serde_json::json!({"dry_run": true, "group": purge.group, "records": n}),
        );
        return Ok(());
    }
    let n = with_pool!(database, pool => inbox.purge(pool, purge.older_than, purge.batch).await)
        .map_err(Failure::database)?;
    let what = format!(
        "purged {n} finished record(s) of the inbox group `{}`",
        purge.group
    );
    report::audit(actor, &what);
    report::done(
        json,
        &what,
        serde_json::json!({"dry_run": false, "group": purge.group, "records": n}),
    );
    Ok(())
}
