//! The Prometheus alert rules shipped in `ops/prometheus/`:
//!
//! - every metric their expressions read is one idem emits (a metric renamed in the
//!   runtime and not in the rules fails here, before an alert goes silent in production);
//! - `promtool check rules` accepts them and `promtool test rules` passes their unit tests
//!   (`idem-alerts.test.yml`: series shaped as idem's exporter writes them). promtool comes
//!   with Debian's `prometheus`; without it the test is skipped, unless
//!   `IDEM_TEST_REQUIRE_SERVERS=1` (CI), which makes it a failure.

use crate::common;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ops() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/prometheus")
}

/// The names that start with `idem_` in `text`.
fn idem_names(text: &str) -> impl Iterator<Item = String> + '_ {
    text.match_indices("idem_").filter_map(|(at, _)| {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        Some(name)
    })
}

/// The metrics the rules' expressions read (`expr:` and the lines continuing it).
fn metrics_read() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(ops().join("idem-alerts.yml")).unwrap();
    let mut read = BTreeSet::new();
    let mut in_expr: Option<usize> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if let Some(expr) = trimmed.strip_prefix("expr:") {
            in_expr = Some(indent);
            read.extend(idem_names(expr));
        } else if in_expr.is_some_and(|at| indent > at && !trimmed.is_empty()) {
            read.extend(idem_names(trimmed));
        } else {
            in_expr = None;
        }
    }
    read
}

/// The metrics the runtime emits: the name given to each `counter!`, `gauge!` and
/// `histogram!` in its sources.
fn metrics_emitted() -> BTreeSet<String> {
    fn walk(dir: &Path, found: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).unwrap();
                for macro_name in ["counter!(", "gauge!(", "histogram!("] {
                    for (at, _) in source.match_indices(macro_name) {
                        let after = source[at + macro_name.len()..].trim_start();
                        if let Some(literal) = after.strip_prefix('"') {
                            let name = literal.split('"').next().unwrap();
                            found.insert(name.to_owned());
                        }
                    }
                }
            }
        }
    }
    let mut found = BTreeSet::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("idem-runtime/src"),
        &mut found,
    );
    found
}

#[test]
fn the_alert_rules_read_only_metrics_idem_emits() {
    let read = metrics_read();
    let emitted = metrics_emitted();
    assert!(
        read.len() >= 10,
        "the rules read too few metrics to be parsed right: {read:?}"
    );
    assert!(
        emitted.contains("idem_outcomes_total") && emitted.len() >= 10,
        "the runtime's metrics were not found: {emitted:?}"
    );
    let unknown: Vec<_> = read.difference(&emitted).collect();
    assert!(
        unknown.is_empty(),
        "ops/prometheus/idem-alerts.yml reads metrics idem does not emit: {unknown:?} (it emits {emitted:?})"
    );
}

/// promtool, or `None` (skipped) when it is missing and servers are optional.
fn promtool() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file());
    match found {
        Some(found) => Some(found),
        None if common::require_servers() => {
            panic!(
                "promtool is not installed (Debian's `prometheus`), and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
            )
        }
        None => {
            eprintln!("skipped: install promtool (Debian's `prometheus`) to check the alert rules");
            None
        }
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let Some(promtool) = promtool() else {
        return;
    };
    for args in [
        ["check", "rules", "idem-alerts.yml"],
        ["test", "rules", "idem-alerts.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(ops())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
