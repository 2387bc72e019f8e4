//! A `tracing` subscriber that does what a log formatter does: formats every field of every
//! span and event it is enabled for into text, then drops the text. Shared by the
//! benchmarks that measure what idem's span costs.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::field::{Field, Visit};

struct Format(String);

impl Visit for Format {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

/// The subscriber: for idem's spans only (`only_idem`), or for everything, sqlx's statement
/// logs included.
pub struct Formatting {
    next: AtomicU64,
    only_idem: bool,
}

impl Formatting {
    pub fn new(only_idem: bool) -> Formatting {
        Formatting {
            next: AtomicU64::new(0),
            only_idem,
        }
    }

    fn format(fields: impl FnOnce(&mut Format)) {
        let mut line = Format(String::with_capacity(128));
        fields(&mut line);
        std::hint::black_box(&line.0);
    }
}

impl tracing::Subscriber for Formatting {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        !self.only_idem || metadata.target().starts_with("idem")
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        Self::format(|line| span.record(line));
        tracing::span::Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        Self::format(|line| values.record(line));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        Self::format(|line| event.record(line));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
