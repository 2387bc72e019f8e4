//! Time, as the inbox sees it: milliseconds since the Unix epoch.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A clock that replaces the database's for an inbox's leases and retention
/// ([`Inbox::clock`](super::Inbox::clock)): by default the database's clock decides, in the
/// statement that decides; a `Clock` is for tests ([`ManualClock`]).
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> i64;
}

/// This instance's system clock. Not the default: given to
/// [`Inbox::clock`](super::Inbox::clock) it makes this instance's clock decide leases and
/// retention instead of the database's, so instances whose clocks disagree disagree on them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told to: for tests of leases, replays and retention
/// without waiting.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock reading `start_millis`.
    pub fn new(start_millis: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start_millis)))
    }

    /// Moves every copy of this clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(millis(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A duration in whole milliseconds rounded up, saturating: for a time that must not come
/// early (a due time, a window that must cover a span).
pub(crate) fn millis_up(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}
