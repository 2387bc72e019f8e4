//! The Prometheus alert rules shipped in `ops/prometheus/` and the Grafana dashboard in
//! `ops/grafana/`:
//!
//! - every metric their expressions read is one idem emits (a metric renamed in the
//!   runtime and not in them fails here, before an alert goes silent or a chart empty in
//!   production), and the dashboard charts every metric idem emits;
//! - `promtool check rules` accepts the rules and `promtool test rules` passes their unit
//!   tests (`idem-alerts.test.yml`: series shaped as idem's exporter writes them), and every
//!   query of the dashboard parses as PromQL. promtool comes with Debian's `prometheus`;
//!   without it those tests are skipped, unless `IDEM_TEST_REQUIRE_SERVERS=1` (CI), which
//!   makes it a failure.

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

/// The dashboard's queries, with Grafana's `$__rate_interval` as a plain range.
fn dashboard_queries() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/grafana/idem-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            queries.push(expr.replace("$__rate_interval", "5m"));
        }
    }
    queries
}

#[test]
fn the_dashboard_charts_every_metric_idem_emits_and_no_other() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let charted: BTreeSet<String> = queries
        .iter()
        .flat_map(|query| idem_names(query).collect::<Vec<_>>())
        .map(|name| {
            // A histogram's (or summary's) series.
            ["_sum", "_count", "_bucket"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .map_or(name.clone(), str::to_owned)
        })
        .collect();
    let emitted = metrics_emitted();
    let unknown: Vec<_> = charted.difference(&emitted).collect();
    assert!(
        unknown.is_empty(),
        "ops/grafana/idem-dashboard.json charts metrics idem does not emit: {unknown:?}"
    );
    let missing: Vec<_> = emitted.difference(&charted).collect();
    assert!(
        missing.is_empty(),
        "ops/grafana/idem-dashboard.json does not chart {missing:?}"
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

#[test]
fn the_dashboards_queries_parse() {
    let Some(promtool) = promtool() else {
        return;
    };
    // As recording rules, which promtool parses.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in dashboard_queries().iter().enumerate() {
        rules.push_str(&format!(
            "      - record: idem:dashboard_query_{i}\n        expr: {}\n",
            serde_json::to_string(query).unwrap()
        ));
    }
    let file = common::scratch_file("dashboard-queries.yml");
    std::fs::write(&file, rules).unwrap();
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a query of ops/grafana/idem-dashboard.json does not parse:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
