//! What the model-based tests share: a runtime and a pool made once for all the cases of a
//! test, and proptest's configuration (failures kept in `<test>.regressions` next to the
//! test's source, replayed first on every run).
//!
//! Include it with `#[path = "common/harness.rs"] mod harness;`.

#![allow(dead_code)]

use proptest::test_runner::{Config, FileFailurePersistence};

/// A runtime and a pool, made once for all the cases of a test.
pub struct Harness<P> {
    pub runtime: tokio::runtime::Runtime,
    pub pool: P,
}

/// A two-thread runtime, and the pool `make` builds on it.
pub fn harness<P>(make: impl AsyncFnOnce() -> P) -> Harness<P> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pool = runtime.block_on(make());
    Harness { runtime, pool }
}

/// `PROPTEST_CASES` cases (48 by default), failures persisted beside the source.
pub fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..Config::default()
    }
}
