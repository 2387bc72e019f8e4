//! What an inbox did, for a service to export as metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Running totals of one [`Inbox`](super::Inbox) (shared by its clones), since it was made.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    group: String,
    applied: AtomicU64,
    duplicates: AtomicU64,
    conflicts: AtomicU64,
    in_progress: AtomicU64,
    takeovers: AtomicU64,
    dead: AtomicU64,
    purged: AtomicU64,
    refused: AtomicU64,
    illegal: AtomicU64,
    sweep_failures: AtomicU64,
}

/// A reading of an inbox's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxCounters {
    /// Deliveries that ran the handler and committed.
    pub applied: u64,
    /// Deliveries absorbed as duplicates: of a processed message, or (for a handler that is
    /// also a transition) of a transition that had already happened.
    pub duplicates: u64,
    /// Deliveries refused: same key, different payload.
    pub conflicts: u64,
    /// Deliveries turned away while another delivery of the message held it.
    pub in_progress: u64,
    /// Expired leases taken over by a later delivery.
    pub takeovers: u64,
    /// Messages parked as dead after their last allowed attempt.
    pub dead: u64,
    /// Records deleted by retention.
    pub purged: u64,
    /// Deliveries of a handler that is also a transition whose transition was refused
    /// (not yet, illegal, not found, stale): rolled back and not acked.
    pub refused: u64,
    /// Of the refused, those in an illegal state: defects to alert on.
    pub illegal: u64,
    /// Purges of a sweeper ([`Inbox::spawn_sweeper`](super::Inbox::spawn_sweeper)) that
    /// failed (each logged as a warning, and tried again at the next tick): alert when it
    /// grows, or the table grows with it.
    pub sweep_failures: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Applied,
    Duplicates,
    Conflicts,
    InProgress,
    Takeovers,
    Dead,
    Purged,
    Refused,
    Illegal,
    SweepFailures,
}

impl Counters {
    pub(crate) fn new(group: &str) -> Counters {
        Counters {
            group: group.to_owned(),
            ..Counters::default()
        }
    }

    pub(crate) fn add(&self, counter: Counter, n: u64) {
        // The events a call's outcome does not already tell (see `observe`).
        let event = match counter {
            Counter::Takeovers => Some("lease_takeover"),
            Counter::Dead => Some("dead"),
            Counter::Purged => Some("purged"),
            Counter::SweepFailures => Some("sweep_failed"),
            _ => None,
        };
        if let Some(event) = event
            && n > 0
        {
            crate::work::observe::inbox_event(&self.group, event, n);
        }
        let cell = match counter {
            Counter::Applied => &self.applied,
            Counter::Duplicates => &self.duplicates,
            Counter::Conflicts => &self.conflicts,
            Counter::InProgress => &self.in_progress,
            Counter::Takeovers => &self.takeovers,
            Counter::Dead => &self.dead,
            Counter::Purged => &self.purged,
            Counter::Refused => &self.refused,
            Counter::Illegal => &self.illegal,
            Counter::SweepFailures => &self.sweep_failures,
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> InboxCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        InboxCounters {
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            conflicts: get(&self.conflicts),
            in_progress: get(&self.in_progress),
            takeovers: get(&self.takeovers),
            dead: get(&self.dead),
            purged: get(&self.purged),
            refused: get(&self.refused),
            illegal: get(&self.illegal),
            sweep_failures: get(&self.sweep_failures),
        }
    }
}
