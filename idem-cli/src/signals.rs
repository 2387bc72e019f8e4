//! `idem signals`: what the tables show of a recent window — per consumer group, the
//! deliveries, retries and how many of them succeeded, failures and parked records, the
//! leases stuck now; the outbox's backlog. The other signals (duplicates answered, keys
//! reused with another body, conflicts, the fast path's hits) leave no row: the metrics
//! count them.

use crate::database::{Database, with_pool};
use crate::report::{self, Failure};
use std::collections::BTreeMap;
use std::time::Duration;

/// Where the signals the tables do not hold are counted.
const IN_MEMORY: &str = "duplicates answered, keys reused with another body, conflicts and \
     the fast path's hits leave no row: see the metrics (ops/prometheus/idem-alerts.yml)";

pub(crate) async fn run(database: &Database, window: Duration, json: bool) -> Result<(), Failure> {
    let (activity, groups, backlog) = with_pool!(database, pool => async {
        let tables = idem::existing_tables(pool, &["idem_inbox", "idem_outbox"]).await?;
        let has = |table: &str| tables.iter().any(|t| t == table);
        let (activity, groups) = if has("idem_inbox") {
            (
                idem::inbox::activity(pool, window).await?,
                idem::inbox::groups(pool).await?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let backlog = if has("idem_outbox") {
            Some(idem::outbox::backlog(pool).await?)
        } else {
            None
        };
        Ok::<_, sqlx::Error>((activity, groups, backlog))
    }.await)
    .map_err(Failure::database)?;
    let stuck: BTreeMap<&str, u64> = groups.iter().map(|g| (g.group.as_str(), g.stuck)).collect();
    let rate = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{:.0}%", r * 100.0));
    let rows: Vec<Vec<String>> = activity
        .iter()
        .map(|a| {
            vec![
                a.group.clone(),
                a.first_delivered.to_string(),
                a.succeeded.to_string(),
                a.retried.to_string(),
                rate(a.retry_success_rate()),
                a.failed.to_string(),
                a.dead.to_string(),
                stuck
                    .get(a.group.as_str())
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
            ]
        })
        .collect();
    let header = [
        "group",
        "delivered",
        "done",
        "retried",
        "retry success",
        "failed",
        "parked",
        "stuck now",
    ];
    let inbox = if rows.is_empty() {
        "no inbox record was touched in the window".to_owned()
    } else {
        report::table(&header, &rows)
    };
    let outbox = match &backlog {
        Some(b) => format!(
            "outbox: {} pending, {} dead, {} held; oldest {}",
            b.pending,
            b.dead,
            b.held,
            b.oldest
                .map_or("-".to_owned(), |d| format!("{:.0}s", d.as_secs_f64())),
        ),
        None => "outbox: none in this database".to_owned(),
    };
    let text = format!("{inbox}\n\n{outbox}\n\n{IN_MEMORY}");
    report::done(
        json,
        &text,
        serde_json::json!({
            "window_seconds": window.as_secs_f64(),
            "inbox": activity.iter().map(|a| serde_json::json!({
                "group": a.group,
                "touched": a.touched,
                "first_delivered": a.first_delivered,
                "succeeded": a.succeeded,
                "succeeded_after_retry": a.succeeded_after_retry,
                "retried": a.retried,
                "retry_success_rate": a.retry_success_rate(),
                "failed": a.failed,
                "dead": a.dead,
                "stuck_now": stuck.get(a.group.as_str()).copied().unwrap_or(0),
            })).collect::<Vec<_>>(),
            "outbox": backlog.as_ref().map(|b| serde_json::json!({
                "pending": b.pending,
                "dead": b.dead,
                "held": b.held,
                "oldest_seconds": b.oldest.map(|d| d.as_secs_f64()),
            })),
            "not_in_the_tables": IN_MEMORY,
        }),
    );
    Ok(())
}
