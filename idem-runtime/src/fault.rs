//! Named points in a call where a crash test can stop the process.
//!
//! Compiled in only with the `fault-injection` feature, which exists for idem's own crash
//! tests: a test process installs a [hook](set_hook) that, at the point under test, tells
//! its parent where it is and waits to be killed (SIGKILL), so the kill lands exactly
//! there — never a sleep that hopes to be killed at the right time. Without the feature
//! the points compile to nothing.

#![cfg_attr(not(feature = "fault-injection"), allow(dead_code))]

/// A point in a call, in the order a call passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPoint {
    /// Transactional inbox: the delivery's record is inserted, in the open transaction;
    /// the handler has not run.
    Recorded,
    /// Leased inbox: the claim (PROCESSING, with its lease) is committed; the work has not
    /// started.
    Claimed,
    /// The conditional UPDATE moved the row, in the open transaction; the body has not run.
    Transitioned,
    /// The body (or the handler) returned `Ok`; its result is not stored and nothing is
    /// committed.
    BodyDone,
    /// Leased inbox: the work is done (the outside call returned); its outcome is not
    /// recorded.
    WorkDone,
    /// COMMIT returned; the caller has not seen the outcome.
    Committed,
    /// Outbox relay: the broker acknowledged one message of the batch; the others may not
    /// be yet, and nothing is marked.
    Acked,
    /// Outbox relay: every message of the batch was published (acknowledged or failed);
    /// nothing is marked.
    Published,
}

impl FaultPoint {
    /// Every point, in order.
    pub const ALL: [FaultPoint; 8] = [
        FaultPoint::Recorded,
        FaultPoint::Claimed,
        FaultPoint::Transitioned,
        FaultPoint::BodyDone,
        FaultPoint::WorkDone,
        FaultPoint::Committed,
        FaultPoint::Acked,
        FaultPoint::Published,
    ];

    /// The point's name in snake case (`"body_done"`), for logs and environment variables.
    pub const fn name(self) -> &'static str {
        match self {
            FaultPoint::Recorded => "recorded",
            FaultPoint::Claimed => "claimed",
            FaultPoint::Transitioned => "transitioned",
            FaultPoint::BodyDone => "body_done",
            FaultPoint::WorkDone => "work_done",
            FaultPoint::Committed => "committed",
            FaultPoint::Acked => "acked",
            FaultPoint::Published => "published",
        }
    }

    /// The point named `name` (see [`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<FaultPoint> {
        FaultPoint::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[cfg(feature = "fault-injection")]
static HOOK: std::sync::OnceLock<fn(FaultPoint)> = std::sync::OnceLock::new();

/// Installs the process's hook, called (synchronously, on the task making the call) at
/// every point every call passes. Once per process: `false` if a hook was already set.
#[cfg(feature = "fault-injection")]
pub fn set_hook(hook: fn(FaultPoint)) -> bool {
    HOOK.set(hook).is_ok()
}

/// A call passes `point`.
#[inline(always)]
pub(crate) fn reached(point: FaultPoint) {
    #[cfg(feature = "fault-injection")]
    if let Some(hook) = HOOK.get() {
        hook(point);
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}

#[cfg(test)]
mod tests {
    use super::FaultPoint;

    #[test]
    fn names_round_trip() {
        for point in FaultPoint::ALL {
            assert_eq!(FaultPoint::from_name(point.name()), Some(point));
        }
        assert_eq!(FaultPoint::from_name("nowhere"), None);
    }
}
