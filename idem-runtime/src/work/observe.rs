//! What idem tells the outside while it works: one `tracing` span per call, and, with the
//! feature `metrics`, counters through the `metrics` facade.
//!
//! Every unit of work runs in an INFO span named `idem` with OpenTelemetry's field names
//! where they fit, and its outcome is counted (feature `metrics`). The fields, their values and
//! the counters are documented once, for users, on the guide's observability page
//! ([`idem::guide::observability`](https://docs.rs/idem/latest/idem/guide/observability/index.html)):
//! a field, value or counter changed here is changed on that page too. `tests/observability.rs`
//! checks the spans and counters themselves.

use crate::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::field::Empty;

static TRACE_KEYS: AtomicBool = AtomicBool::new(false);

/// Whether idem's spans record the call's key (`idem.key`). Off by default: business keys
/// and message keys may be personal data. Process-wide.
pub fn set_trace_keys(on: bool) {
    TRACE_KEYS.store(on, Ordering::Relaxed);
}

/// What a call is about, for its span and counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Labels<'a> {
    /// The machine's id.
    pub machine: Option<&'static str>,
    /// The transition's source and target state names.
    pub transition: Option<(&'static str, &'static str)>,
    /// The inbox's consumer group.
    pub group: Option<&'a str>,
    /// The key, recorded only if [`set_trace_keys`] allows.
    pub key: Option<&'a str>,
}

impl Labels<'_> {
    /// The span of a call.
    pub(crate) fn span(&self) -> tracing::Span {
        let transition = self
            .transition
            .map(|(from, to)| tracing::field::display(Arrow(from, to)));
        let span = tracing::info_span!(
            "idem",
            db.system.name = Empty,
            idem.machine = self.machine,
            idem.transition = transition,
            messaging.consumer.group.name = self.group,
            idem.key = Empty,
            idem.outcome = Empty,
            idem.retries = Empty,
            idem.cache = Empty,
            error.type = Empty,
        );
        if let Some(key) = self.key
            && TRACE_KEYS.load(Ordering::Relaxed)
        {
            span.record("idem.key", key);
        }
        span
    }

    /// Records how the call ended, in its span and (feature `metrics`) the counters.
    pub(crate) fn ended<E>(&self, span: &tracing::Span, outcome: Result<&'static str, &Error<E>>) {
        let name = match outcome {
            Ok(name) => name,
            Err(e) => {
                span.record("error.type", error_type(e));
                "error"
            }
        };
        span.record("idem.outcome", name);
        #[cfg(feature = "metrics")]
        metrics::counter!("idem_outcomes_total", self.metric_labels(Some(name))).increment(1);
    }

    /// Records `retries` conflicts retried before the body.
    pub(crate) fn retried(&self, span: &tracing::Span, retries: u32) {
        if retries == 0 {
            return;
        }
        span.record("idem.retries", retries);
        #[cfg(feature = "metrics")]
        metrics::counter!("idem_retries_total", self.metric_labels(None))
            .increment(u64::from(retries));
    }

    #[cfg(feature = "metrics")]
    fn metric_labels(&self, outcome: Option<&'static str>) -> Vec<metrics::Label> {
        let mut labels = Vec::with_capacity(4);
        if let Some(machine) = self.machine {
            labels.push(metrics::Label::from_static_parts("machine", machine));
        }
        if let Some((from, to)) = self.transition {
            labels.push(metrics::Label::new("transition", format!("{from}->{to}")));
        }
        if let Some(group) = self.group {
            labels.push(metrics::Label::new("consumer_group", group.to_owned()));
        }
        if let Some(outcome) = outcome {
            labels.push(metrics::Label::from_static_parts("outcome", outcome));
        }
        labels
    }
}

/// Counts an inbox event (`lease_takeover`, `dead`, `purged`) for `group`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn inbox_event(group: &str, event: &'static str, n: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idem_inbox_events_total",
        "consumer_group" => group.to_owned(),
        "event" => event
    )
    .increment(n);
}

/// Sets the gauge of `group`'s records stuck in PROCESSING past their lease.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn inbox_stuck(group: &str, stuck: u64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("idem_inbox_stuck", "consumer_group" => group.to_owned()).set(stuck as f64);
}

struct Arrow(&'static str, &'static str);

impl core::fmt::Display for Arrow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}->{}", self.0, self.1)
    }
}

fn error_type<E>(error: &Error<E>) -> &'static str {
    match error {
        Error::Handler(_) => "handler",
        Error::Panicked(_) => "panicked",
        Error::Database(_) => "database",
        Error::Contention { .. } => "contention",
        Error::Busy { .. } => "busy",
        Error::InvalidKey(_) => "invalid_key",
        Error::InvalidColumn { .. } => "invalid_column",
        Error::InvalidWatermark { .. } => "invalid_watermark",
        Error::CorruptRow { .. } => "corrupt_row",
        Error::CorruptRecord { .. } => "corrupt_record",
        Error::LeaseLost { .. } => "lease_lost",
        Error::ResultTooLarge { .. } => "result_too_large",
        Error::RetentionBelowCache { .. } => "retention_below_cache",
        Error::Result(_) => "result",
    }
}
