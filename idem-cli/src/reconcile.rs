//! `idem reconcile`: a table of the service's effects read against idem's records of the
//! same keys (`idem::reconcile`): keys with more than one effect, effects without a
//! record, records without an effect. Reads only; exit 4 when it finds any.

use crate::database::{Database, with_pool};
use crate::report::{self, Failure};
use clap::{ArgGroup, Args};
use idem::reconcile::{Effects, Found, KeyEffects, ReconcileError, Records};

/// What `idem reconcile` reads.
#[derive(Args, Debug)]
#[command(
    group(ArgGroup::new("effects").required(true).args(["table", "query"])),
    group(ArgGroup::new("records").required(true).args(["group", "rows"])),
)]
pub(crate) struct Reconcile {
    /// The table of the effects (`name` or `schema.name`): one row per effect.
    #[arg(long)]
    table: Option<String>,
    /// A query of the effects instead of a table (its rows, each with the key in `--key`).
    #[arg(long)]
    query: Option<String>,
    /// The column of the effects holding the key each was made for.
    #[arg(long)]
    key: String,
    /// The consumer group whose inbox records the effects answer to.
    #[arg(long)]
    group: Option<String>,
    /// A machine's table (or any table recording work done), whose rows in `--states`
    /// the effects answer to.
    #[arg(long, requires_all = ["row_key", "states"])]
    rows: Option<String>,
    /// The key column of `--rows`.
    #[arg(long, requires = "rows")]
    row_key: Option<String>,
    /// The state column of `--rows`.
    #[arg(long, requires = "rows", default_value = "state")]
    state_column: String,
    /// The states of the rows that record work done, comma-separated: the transition's
    /// state and those only a way through it leads to (PAID,SHIPPED).
    #[arg(long, requires = "rows", value_delimiter = ',')]
    states: Vec<String>,
    /// How many keys of each kind to list (all are counted).
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

pub(crate) async fn run(database: &Database, args: &Reconcile, json: bool) -> Result<(), Failure> {
    let effects = match (&args.table, &args.query) {
        (Some(table), _) => Effects::table(table, &args.key),
        (None, Some(query)) => Effects::query(query, &args.key),
        (None, None) => unreachable!("clap requires --table or --query"),
    };
    let records = match (&args.group, &args.rows, &args.row_key) {
        (Some(group), _, _) => Records::inbox(group),
        (None, Some(table), Some(key)) => {
            Records::rows(table, key, &args.state_column, &args.states)
        }
        _ => unreachable!("clap requires --group, or --rows with --row-key and --states"),
    };
    if args.group.is_some() {
        database.require("idem_inbox").await?;
    }
    let report = with_pool!(database, pool =>
        idem::reconcile::reconcile(pool, &records, &effects, args.limit).await)
    .map_err(|e| match e {
        ReconcileError::InvalidName { .. } => Failure::Usage(e.to_string()),
        ReconcileError::Records(_) => Failure::Usage(e.to_string()),
        ReconcileError::NotFound(_) => Failure::NotFound(e.to_string()),
        _ => Failure::database(e),
    })?;
    let keys = |found: &Found<KeyEffects>| {
        serde_json::json!({
            "count": found.count,
            "first": found.first.iter().map(|k| serde_json::json!({
                "key": k.key,
                "effects": k.effects,
            })).collect::<Vec<_>>(),
        })
    };
    report::done(
        json,
        report.to_string().trim_end(),
        serde_json::json!({
            "clean": report.is_clean(),
            "effects": report.effects,
            "records": report.records,
            "duplicates": keys(&report.duplicates),
            "effects_without_record": keys(&report.effects_without_record),
            "records_without_effect": {
                "count": report.records_without_effect.count,
                "first": report.records_without_effect.first,
            },
        }),
    );
    if report.is_clean() {
        Ok(())
    } else {
        Err(Failure::Unhealthy)
    }
}
