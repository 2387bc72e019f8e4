//! sqlx's statement log, captured: a `tracing` subscriber that keeps the SQL text of every
//! `sqlx::query` event, process-wide. Used by the statement tests and the benchmarks.
//!
//! Include it with `#[path = "common/statement_log.rs"] mod statement_log;`.

#![allow(dead_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::field::{Field, Visit};

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RECORDING: AtomicBool = AtomicBool::new(true);

/// Turns recording on or off (on at first). The subscriber stays installed; off, it only
/// answers `false` to sqlx's "is anyone listening?".
pub fn set_recording(on: bool) {
    RECORDING.store(on, Ordering::SeqCst);
}

/// Records the SQL text of every `sqlx::query` event.
pub struct StatementLog;

impl tracing::Subscriber for StatementLog {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // Asked again at every event, so recording can be turned on and off.
        if metadata.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query" && RECORDING.load(Ordering::Relaxed)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        #[derive(Default)]
        struct Sql {
            summary: String,
            statement: String,
        }
        impl Visit for Sql {
            fn record_str(&mut self, field: &Field, value: &str) {
                match field.name() {
                    "summary" => self.summary = value.to_owned(),
                    "db.statement" => self.statement = value.to_owned(),
                    _ => {}
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "summary" || field.name() == "db.statement" {
                    self.record_str(field, format!("{value:?}").trim_matches('"'));
                }
            }
        }
        let mut sql = Sql::default();
        event.record(&mut sql);
        // sqlx logs short statements as a summary only, long ones framed by newlines.
        let text = if sql.statement.trim().is_empty() {
            sql.summary
        } else {
            sql.statement.trim_matches('\n').to_owned()
        };
        LOG.lock().unwrap().push(text);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

pub fn take_log() -> Vec<String> {
    std::mem::take(&mut *LOG.lock().unwrap())
}

/// The statements between BEGIN and COMMIT/ROLLBACK, without those.
pub fn inside_transaction(log: &[String]) -> Vec<&str> {
    log.iter()
        .map(String::as_str)
        .filter(|s| {
            !matches!(
                s.split_whitespace().next(),
                Some("BEGIN" | "COMMIT" | "ROLLBACK")
            )
        })
        .collect()
}
