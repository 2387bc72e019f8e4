//! The circuit breaker in front of the cache: when, within a second, at least `threshold`
//! requests failed and they are at least half of the requests, the cache is skipped for
//! `cool_down`, then tried again.
//!
//! A ratio, not a run of failures: under a saturated CPU a few reads of many concurrent ones
//! exceed a tight timeout together, and a breaker counting failures in a row would turn the
//! cache off for its whole cool-down while nearly every read succeeds. A Redis that is down
//! or asleep fails every request, and opens it after `threshold` of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The window requests are counted in.
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    window: Mutex<Window>,
    /// Until when it is open, in nanoseconds since [`epoch`].
    open_until: AtomicU64,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    requests: u32,
    failures: u32,
}

impl Window {
    fn new() -> Window {
        Window {
            started: Instant::now(),
            requests: 0,
            failures: 0,
        }
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Breaker {
        epoch();
        Breaker {
            threshold: threshold.max(1),
            cool_down,
            window: Mutex::new(Window::new()),
            open_until: AtomicU64::new(0),
        }
    }

    /// Whether the cache may be asked now.
    pub(crate) fn allows(&self) -> bool {
        now() >= self.open_until.load(Ordering::Relaxed)
    }

    /// A request failed (an error or a timeout).
    pub(crate) fn failed(&self) {
        self.record(true);
    }

    /// A request succeeded.
    pub(crate) fn succeeded(&self) {
        self.record(false);
    }

    fn record(&self, failed: bool) {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if window.started.elapsed() >= WINDOW {
            *window = Window::new();
        }
        window.requests = window.requests.saturating_add(1);
        if !failed {
            return;
        }
        window.failures = window.failures.saturating_add(1);
        if window.failures >= self.threshold && window.failures * 2 >= window.requests {
            let cool_down = u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX);
            self.open_until
                .store(now().saturating_add(cool_down), Ordering::Relaxed);
            // Counted afresh once it is tried again.
            *window = Window::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_when_failures_reach_the_threshold_and_half_the_requests() {
        let breaker = Breaker::new(3, Duration::from_millis(30));
        breaker.failed();
        breaker.failed();
        assert!(breaker.allows(), "two failures of three: still closed");
        breaker.failed();
        assert!(!breaker.allows(), "the third opens it");
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.allows(), "tried again after the cool-down");
        for _ in 0..3 {
            breaker.failed();
        }
        assert!(
            !breaker.allows(),
            "failing again after the cool-down opens it again"
        );
    }

    #[test]
    fn a_few_failures_among_many_successes_keep_it_closed() {
        let breaker = Breaker::new(3, Duration::from_secs(60));
        for _ in 0..20 {
            breaker.succeeded();
        }
        for _ in 0..10 {
            breaker.failed();
        }
        assert!(
            breaker.allows(),
            "10 failures of 30 requests are under half"
        );
        for _ in 0..10 {
            breaker.failed();
        }
        assert!(!breaker.allows(), "20 failures of 40 are half");
    }
}
