//! How a transition that matched no row is classified on PostgreSQL: in the same statement,
//! or by a second one.

use crate::transition::declared::Transition;
use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};

/// How idem classifies a PostgreSQL transition that matched no row.
///
/// PostgreSQL can attempt a transition and, if it matched nothing, report the row and its
/// stored first result in **one** statement (`WITH upd AS (UPDATE …) SELECT … WHERE NOT
/// EXISTS (SELECT FROM upd)`). That saves a round trip on every duplicate, but the
/// statement is heavier to execute than a plain `UPDATE` even when the
/// transition applies (measured on a 2-core PostgreSQL 15: 9–12 % fewer applied
/// transactions per second; see BENCHMARKS.md). The plain UPDATE followed, only on a miss, by a
/// classifying SELECT is what a careful hand-writer does: cheapest when misses are rare, one
/// round trip more per miss.
///
/// By default idem lets the workload decide, per transition: it keeps a moving average of
/// how often recent calls missed (duplicates, illegal states, not found, stale versions)
/// and uses the one-statement form while more than half did. A process that knows its
/// workload can pin either form with [`set_postgres_classification`]. Both forms return
/// the same outcomes; SQLite always uses the plain UPDATE (its statements cost no round
/// trip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Classification {
    /// The one-statement form while more than half of the transition's recent calls
    /// missed; otherwise the plain UPDATE. The default.
    #[default]
    Adaptive,
    /// Always the one-statement form: duplicates cost no extra round trip.
    Inline,
    /// Always the plain UPDATE, then a classifying SELECT on a miss.
    OnMiss,
}

static POLICY: AtomicU8 = AtomicU8::new(0);

/// Sets how this process classifies PostgreSQL transitions that match no row (the default
/// is [`Classification::Adaptive`]). Process-wide; it changes statements, never outcomes.
pub fn set_postgres_classification(classification: Classification) {
    let code = match classification {
        Classification::Adaptive => 0,
        Classification::Inline => 1,
        Classification::OnMiss => 2,
    };
    POLICY.store(code, Ordering::Relaxed);
}

/// Slots of the miss-rate table; transitions that share one only share an estimate.
const SLOTS: usize = 256;
/// Each call moves the rate 1/16 of the way to 0 (applied) or 1 (missed).
const SHIFT: u32 = 4;

static MISS_RATES: [AtomicU16; SLOTS] = [const { AtomicU16::new(0) }; SLOTS];

/// The recent miss rate of one transition, as a fraction of `u16::MAX`.
#[derive(Clone, Copy)]
pub(crate) struct MissRate(&'static AtomicU16);

impl MissRate {
    pub(crate) fn of(transition: &Transition) -> MissRate {
        let machine = transition.definition as *const _ as usize;
        let mut h = (machine as u64) ^ ((transition.from as u64) << 32) ^ (transition.to as u64);
        // A 64-bit mix (splitmix64's finalizer), so nearby pointers spread over the slots.
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        MissRate(&MISS_RATES[(h as usize) % SLOTS])
    }

    /// Whether the next call should use the one-statement form.
    pub(crate) fn inline(self) -> bool {
        match POLICY.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => self.0.load(Ordering::Relaxed) > u16::MAX / 2,
        }
    }

    /// Counts a call: it missed, or it applied.
    pub(crate) fn record(self, missed: bool) {
        // A lost update between concurrent callers only blurs an estimate.
        let rate = self.0.load(Ordering::Relaxed);
        let next = if missed {
            rate + ((u16::MAX - rate) >> SHIFT)
        } else {
            rate - (rate >> SHIFT)
        };
        self.0.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_follows_the_recent_calls() {
        static RATE: AtomicU16 = AtomicU16::new(0);
        let rate = MissRate(&RATE);
        assert!(!rate.inline(), "starts assuming first deliveries");
        let mut misses = 0;
        while !rate.inline() {
            rate.record(true);
            misses += 1;
        }
        // More than half of the last calls missed: about 11 misses in a row.
        assert!((8..=16).contains(&misses), "{misses}");
        let mut applied = 0;
        while rate.inline() {
            rate.record(false);
            applied += 1;
        }
        assert!((1..=16).contains(&applied), "{applied}");
        // Never out of range.
        for _ in 0..1000 {
            rate.record(true);
        }
        assert!(RATE.load(Ordering::Relaxed) < u16::MAX);
        for _ in 0..1000 {
            rate.record(false);
        }
        assert!(RATE.load(Ordering::Relaxed) < 16);
    }
}
