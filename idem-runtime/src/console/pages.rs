//! The console's pages: an overview, the outbox, the inbox, idem's tables. Each reads
//! through idem's public functions, and none shows a payload or a result.

use super::Shared;
use super::chart;
use super::guard::{Actor, note_is_signed, token};
use super::html::{self, Frame, ago, button, escape, table};
use crate::backend::Backend;
use crate::inbox::{self, RecordStatus};
use crate::outbox;
use axum::Extension;
use axum::extract::{OriginalUri, State};
use axum::response::{Html, IntoResponse, Response};
use http::{StatusCode, Uri};
use std::fmt::Display;
use std::sync::Arc;

/// What every page's handler extracts.
pub(crate) type Looked<DB> = (State<Arc<Shared<DB>>>, Extension<Actor>, OriginalUri, Uri);

/// The path the console is nested at: the original path without the router's own.
pub(crate) fn base(original: &Uri, uri: &Uri) -> String {
    let full = original.path();
    let own = uri.path();
    let base = if own == "/" {
        full.trim_end_matches('/')
    } else {
        full.strip_suffix(own).unwrap_or("")
    };
    base.to_owned()
}

/// Renders `body` (or the error that kept it from being read) as the page `here`.
fn render<E: Display>(
    (State(shared), Extension(actor), OriginalUri(original), uri): Looked<impl Backend>,
    here: &str,
    title: &str,
    body: impl FnOnce(&Frame<'_>) -> Result<String, E>,
) -> Response {
    let base = base(&original, &uri);
    let token = token(&shared.secret, &actor.0);
    // A note shows only with its signature: a link from elsewhere cannot make the console
    // say what it did not do.
    let query = uri.query().unwrap_or("").as_bytes();
    let field = |name| crate::http::token::form_field(query, name);
    let note = field("note")
        .filter(|note| field("sig").is_some_and(|sig| note_is_signed(&shared.secret, note, &sig)));
    let frame = Frame {
        base: &base,
        actor: &actor.0,
        token: (!shared.read_only).then_some(token.as_str()),
        note: note.as_deref(),
    };
    match body(&frame) {
        Ok(body) => Html(html::page(&frame, here, title, &body)).into_response(),
        Err(e) => {
            let body = format!(
                "<p class=\"bad\">The database could not be read: {}</p>",
                escape(&e.to_string())
            );
            let page = html::page(&frame, here, title, &body);
            (StatusCode::INTERNAL_SERVER_ERROR, Html(page)).into_response()
        }
    }
}

fn tile(label: &str, value: impl Display, bad: bool) -> String {
    let class = if bad { " class=\"bad\"" } else { "" };
    format!(
        "<div class=\"tile\"><b{class}>{}</b>{}</div>",
        escape(&value.to_string()),
        escape(label)
    )
}

/// The outbox's backlog as tiles, their labels after `prefix`.
fn backlog_tiles(backlog: &outbox::Backlog, prefix: &str) -> String {
    let oldest = backlog
        .oldest
        .map_or("-".to_owned(), |d| html::span(d.as_millis() as i64));
    [
        tile(&format!("{prefix}pending"), backlog.pending, false),
        tile(&format!("{prefix}dead"), backlog.dead, backlog.dead > 0),
        tile("held behind a dead one", backlog.held, backlog.held > 0),
        tile("oldest pending", oldest, false),
    ]
    .concat()
}

/// `/`: the outbox's backlog, each inbox group, the tables' migration.
pub(crate) async fn overview<DB: Backend>(looked: Looked<DB>) -> Response {
    let pool = &looked.0.pool;
    let read = async {
        let tables = crate::schema::tables::check_tables(pool, None).await?;
        let backlog = match tables.has("idem_outbox") {
            true => Some(outbox::backlog(pool).await?),
            false => None,
        };
        let (groups, activity, series) = match tables.has("idem_inbox") {
            true => (
                inbox::groups(pool).await?,
                inbox::activity(pool, HOUR).await?,
                inbox::activity_series(pool, HOUR / BUCKETS, BUCKETS).await?,
            ),
            false => (Vec::new(), Vec::new(), Vec::new()),
        };
        Ok::<_, sqlx::Error>((backlog, groups, tables, activity, series))
    }
    .await;
    let watched: Vec<(String, crate::inbox::InboxCounters)> = looked
        .0
        .watched
        .iter()
        .map(|inbox| (inbox.group().to_owned(), inbox.counters()))
        .collect();
    render(looked, "/", "Overview", |frame| {
        let (backlog, groups, tables, activity, series) = read?;
        let (stuck, dead) = groups
            .iter()
            .fold((0, 0), |(s, d), g| (s + g.stuck, d + g.dead));
        let mut out = String::from("<div class=\"tiles\" id=\"tiles\">");
        if let Some(backlog) = &backlog {
            out.push_str(&backlog_tiles(backlog, "outbox "));
        }
        out.push_str(&tile("inbox stuck", stuck, stuck > 0));
        out.push_str(&tile("inbox parked", dead, dead > 0));
        out.push_str(&tile(
            "tables",
            tables.current().unwrap_or("not migrated"),
            !tables.is_ok(),
        ));
        out.push_str("</div><h2>Inbox groups</h2>");
        out.push_str(&groups_table(&groups));
        out.push_str("<h2>The last hour, from the tables</h2>");
        out.push_str(&activity_table(&activity, &series));
        out.push_str(
            "<p>Each bar is five minutes, the newest on the right; a record shows in the bar \
             of its last touch, with its status now (the table keeps no history). Duplicates \
             answered, keys reused with another body, conflicts and the fast path's hits \
             leave no row: the metrics count them, and so does each inbox the console \
             watches (<code>Console::watch</code>), in this instance.</p>",
        );
        out.push_str(&watched_table(&watched));
        let _ = frame;
        Ok::<_, sqlx::Error>(out)
    })
}

fn groups_table(groups: &[inbox::GroupRecords]) -> String {
    if groups.is_empty() {
        return "<p>The inbox has no records.</p>".to_owned();
    }
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                escape(&g.group),
                g.processing.to_string(),
                g.stuck.to_string(),
                g.succeeded.to_string(),
                g.failed.to_string(),
                g.dead.to_string(),
                g.last_at_millis.map_or("-".to_owned(), ago),
            ]
        })
        .collect();
    table(
        "groups",
        &[
            "group",
            "processing",
            "stuck",
            "done",
            "failed",
            "parked",
            "last touched",
        ],
        &[1, 2, 3, 4, 5],
        &rows,
    )
}

/// The counters of the inboxes the console watches: what this instance answered without a
/// row to show for it.
fn watched_table(watched: &[(String, crate::inbox::InboxCounters)]) -> String {
    if watched.is_empty() {
        return String::new();
    }
    let flag = |n: u64| {
        if n > 0 {
            format!("<span class=\"bad\">{n}</span>")
        } else {
            n.to_string()
        }
    };
    let rows: Vec<Vec<String>> = watched
        .iter()
        .map(|(group, c)| {
            // As the alert `IdemDuplicateMessagesHigh` reads it: of the deliveries that
            // found a record or made one.
            let deliveries = c.applied + c.duplicates + c.conflicts;
            let share = match deliveries {
                0 => "-".to_owned(),
                n => format!("{:.0}%", c.duplicates as f64 * 100.0 / n as f64),
            };
            vec![
                escape(group),
                c.applied.to_string(),
                c.duplicates.to_string(),
                share,
                flag(c.conflicts),
                c.in_progress.to_string(),
                c.takeovers.to_string(),
                c.refused.to_string(),
                flag(c.illegal),
            ]
        })
        .collect();
    format!(
        "<h2>This instance, since it started</h2>{}",
        table(
            "watched",
            &[
                "group",
                "applied",
                "duplicates answered",
                "duplicate share",
                "another body",
                "turned away (in progress)",
                "leases taken over",
                "refused",
                "illegal",
            ],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &rows,
        )
    )
}

/// The window of the overview's signals and charts, and the charts' bars in it.
const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
const BUCKETS: u32 = 12;

fn activity_table(activity: &[inbox::GroupActivity], series: &[inbox::GroupSeries]) -> String {
    if activity.is_empty() {
        return "<p>No inbox record was touched in the last hour.</p>".to_owned();
    }
    let rows: Vec<Vec<String>> = activity
        .iter()
        .map(|a| {
            let bars = series
                .iter()
                .find(|s| s.group == a.group)
                .map_or_else(String::new, chart::bars);
            vec![
                escape(&a.group),
                bars,
                a.first_delivered.to_string(),
                a.succeeded.to_string(),
                a.retried.to_string(),
                a.retry_success_rate()
                    .map_or("-".to_owned(), |r| format!("{:.0}%", r * 100.0)),
                a.failed.to_string(),
                a.dead.to_string(),
            ]
        })
        .collect();
    table(
        "activity",
        &[
            "group",
            "by 5 minutes",
            "delivered",
            "done",
            "retried",
            "retry success",
            "failed",
            "parked",
        ],
        &[2, 3, 4, 5, 6, 7],
        &rows,
    ) + &chart::legend()
}

/// The backlog of each destination with unpublished messages.
fn destinations_table(destinations: &[outbox::DestinationBacklog]) -> String {
    if destinations.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = destinations
        .iter()
        .map(|d| {
            let b = &d.backlog;
            vec![
                escape(&d.destination),
                b.pending.to_string(),
                b.dead.to_string(),
                b.held.to_string(),
                b.oldest
                    .map_or("-".to_owned(), |age| html::span(age.as_millis() as i64)),
            ]
        })
        .collect();
    format!(
        "<h2>By destination</h2>{}",
        table(
            "destinations",
            &["destination", "pending", "dead", "held", "oldest pending"],
            &[1, 2, 3, 4],
            &rows,
        )
    )
}

/// `/outbox`: the backlog (in all, per destination), the dead messages by error and one by
/// one, with their actions.
pub(crate) async fn outbox<DB: Backend>(looked: Looked<DB>) -> Response {
    let pool = &looked.0.pool;
    let limit = looked.0.limit;
    let read = async {
        if crate::existing_tables(pool, &["idem_outbox"])
            .await?
            .is_empty()
        {
            return Ok(None);
        }
        Ok::<_, sqlx::Error>(Some((
            outbox::backlog(pool).await?,
            outbox::backlog_by_destination(pool).await?,
            outbox::dead(pool, 100_000).await?,
        )))
    }
    .await;
    render(looked, "/outbox", "Outbox", |frame| {
        let Some((backlog, destinations, dead)) = read? else {
            return Ok("<p>This database has no outbox (<code>idem_outbox</code>).</p>".to_owned());
        };
        let mut out = String::from("<div class=\"tiles\">");
        out.push_str(&backlog_tiles(&backlog, ""));
        out.push_str("</div>");
        out.push_str(&destinations_table(&destinations));
        if dead.is_empty() {
            out.push_str("<h2>Dead messages</h2><p>No dead messages.</p>");
            return Ok::<_, sqlx::Error>(out);
        }
        let groups = outbox::by_error(dead.clone());
        let rows: Vec<Vec<String>> = groups
            .iter()
            .map(|group| {
                let (error, n) = (group.error.as_str(), group.messages.len());
                vec![
                    n.to_string(),
                    escape(error),
                    format!(
                        "{} {}",
                        button(
                            frame,
                            "/outbox",
                            &[("action", "requeue"), ("error", error)],
                            &format!("Requeue {n}"),
                            false
                        ),
                        button(
                            frame,
                            "/outbox",
                            &[("action", "discard"), ("error", error)],
                            &format!("Discard {n}"),
                            true
                        )
                    ),
                ]
            })
            .collect();
        out.push_str("<h2>Dead messages by their last error</h2>");
        out.push_str(&table(
            "dead-groups",
            &["count", "last error", ""],
            &[0],
            &rows,
        ));
        let rows: Vec<Vec<String>> = dead
            .iter()
            .take(limit as usize)
            .map(|m| {
                vec![
                    escape(&m.id),
                    escape(&m.ordering_key),
                    escape(&m.destination),
                    m.attempts.to_string(),
                    escape(m.last_error.as_deref().unwrap_or("")),
                    ago(m.dead_at_millis),
                    format!(
                        "{} {}",
                        button(
                            frame,
                            "/outbox",
                            &[("action", "requeue"), ("id", &m.id)],
                            "Requeue",
                            false
                        ),
                        button(
                            frame,
                            "/outbox",
                            &[("action", "discard"), ("id", &m.id)],
                            "Discard",
                            true
                        )
                    ),
                ]
            })
            .collect();
        out.push_str(&format!(
            "<h2>Dead messages ({} of {})</h2>",
            rows.len(),
            dead.len()
        ));
        out.push_str(&table(
            "dead",
            &[
                "id",
                "ordering key",
                "destination",
                "attempts",
                "last error",
                "died",
                "",
            ],
            &[3],
            &rows,
        ));
        Ok(out)
    })
}

/// `/inbox`: each group, then the records in flight (with the stuck ones), parked and
/// failed, with their actions.
pub(crate) async fn inbox<DB: Backend>(looked: Looked<DB>) -> Response {
    let pool = &looked.0.pool;
    let limit = looked.0.limit;
    let read = async {
        if crate::existing_tables(pool, &["idem_inbox"])
            .await?
            .is_empty()
        {
            return Ok(None);
        }
        Ok::<_, sqlx::Error>(Some((
            inbox::groups(pool).await?,
            inbox::records(pool, None, RecordStatus::Processing, limit).await?,
            inbox::records(pool, None, RecordStatus::Dead, limit).await?,
            inbox::records(pool, None, RecordStatus::Failed, limit).await?,
        )))
    }
    .await;
    render(looked, "/inbox", "Inbox", |frame| {
        let Some((groups, processing, dead, failed)) = read? else {
            return Ok("<p>This database has no inbox (<code>idem_inbox</code>).</p>".to_owned());
        };
        let now = html::now_millis();
        let mut out = String::from("<h2>Groups</h2>");
        out.push_str(&groups_table(&groups));
        let records = |id: &str, records: &[inbox::InboxRecord], action: Option<(&str, &str)>| {
            if records.is_empty() {
                return "<p>None.</p>".to_owned();
            }
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    let lease = match r.lease_until_millis {
                        Some(until) if until <= now => {
                            format!("<span class=\"bad\">stuck: ended {}</span>", ago(until))
                        }
                        Some(until) => format!("ends in {}", html::span(until - now)),
                        None => "-".to_owned(),
                    };
                    let act = action.map_or(String::new(), |(action, label)| {
                        button(
                            frame,
                            "/inbox",
                            &[("action", action), ("group", &r.group), ("key", &r.key)],
                            label,
                            false,
                        )
                    });
                    vec![
                        escape(&r.group),
                        escape(&r.key),
                        r.attempts.to_string(),
                        lease,
                        ago(r.updated_at_millis),
                        escape(r.error.as_deref().unwrap_or("")),
                        act,
                    ]
                })
                .collect();
            table(
                id,
                &[
                    "group",
                    "key",
                    "attempts",
                    "lease",
                    "last touched",
                    "error",
                    "",
                ],
                &[2],
                &rows,
            )
        };
        out.push_str("<h2>In flight (PROCESSING), the HTTP layer's keys among them</h2>");
        out.push_str(&records(
            "processing",
            &processing,
            Some(("release", "Release lease")),
        ));
        out.push_str("<h2>Parked (DEAD) after their last attempt</h2>");
        out.push_str(&records("parked", &dead, Some(("revive", "Revive"))));
        out.push_str("<h2>Failed, waiting for their next delivery</h2>");
        out.push_str(&records("failed", &failed, None));
        Ok::<_, sqlx::Error>(out)
    })
}

/// `/tables`: the migrations the database has, and the problems of idem's tables.
pub(crate) async fn tables<DB: Backend>(looked: Looked<DB>) -> Response {
    let read = crate::schema::tables::check_tables(&looked.0.pool, None).await;
    render(looked, "/tables", "Tables", |_| {
        let report = read?;
        let rows: Vec<Vec<String>> = report
            .migrations
            .iter()
            .map(|m| {
                let state = if m.applied {
                    "<span class=\"ok\">applied</span>"
                } else {
                    "<span class=\"bad\">not applied</span>"
                };
                vec![escape(m.name), state.to_owned()]
            })
            .collect();
        let mut out = format!(
            "<p id=\"current\">{}</p>",
            escape(&match report.current() {
                Some(current) => format!("On migration {current}."),
                None => "Not migrated.".to_owned(),
            })
        );
        out.push_str(&table("migrations", &["migration", "state"], &[], &rows));
        out.push_str("<h2>Problems</h2>");
        if report.problems.is_empty() {
            out.push_str("<p class=\"ok\">None.</p>");
        } else {
            out.push_str("<ul id=\"problems\">");
            for problem in &report.problems {
                out.push_str(&format!("<li>{}</li>", escape(&problem.to_string())));
            }
            out.push_str("</ul>");
        }
        Ok::<_, sqlx::Error>(out)
    })
}
