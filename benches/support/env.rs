//! The settings a benchmark reads from its environment (`IDEM_BENCH_KEYS`,
//! `IDEM_BENCH_ROUNDS`, …). Shared by the benchmarks.

/// The number in the environment variable `name`, or `default` when it is unset or not a
/// number.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
