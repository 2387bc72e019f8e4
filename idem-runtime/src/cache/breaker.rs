//! The circuit breaker in front of the cache: after `threshold` failures in a row, the
//! cache is skipped for `cool_down`, then tried again; the next failure opens it again, a
//! success closes it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cool_down: Duration,
    failures: AtomicU32,
    /// Until when it is open, in nanoseconds since [`epoch`].
    open_until: AtomicU64,
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
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    /// Whether the cache may be asked now.
    pub(crate) fn allows(&self) -> bool {
        now() >= self.open_until.load(Ordering::Relaxed)
    }

    /// A request failed (an error or a timeout).
    pub(crate) fn failed(&self) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failures >= self.threshold {
            let until =
                now().saturating_add(u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX));
            self.open_until.store(until, Ordering::Relaxed);
        }
    }

    /// A request succeeded.
    pub(crate) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_and_closes_after_a_success() {
        let breaker = Breaker::new(3, Duration::from_millis(30));
        breaker.failed();
        breaker.failed();
        assert!(breaker.allows(), "two failures of three: still closed");
        breaker.failed();
        assert!(!breaker.allows(), "the third opens it");
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.allows(), "tried again after the cool-down");
        breaker.failed();
        assert!(
            !breaker.allows(),
            "a failure after the cool-down opens it again"
        );
        std::thread::sleep(Duration::from_millis(40));
        breaker.succeeded();
        breaker.failed();
        assert!(breaker.allows(), "a success counts from zero again");
    }
}
