//! The rules a declaration must satisfy, checked in one place.

use super::ast::Machine;
use crate::ctxt::Ctxt;
use crate::ident::{sql_identifier_problem, state_name_problem, table_name_problem};
use proc_macro2::Span;
use std::collections::HashMap;
use syn::{Ident, LitStr};

/// A declaration that passed every check.
pub struct Checked {
    pub ident: Ident,
    pub table: String,
    /// The key's columns, in order (several for a composite key).
    pub key: Vec<String>,
    pub state: String,
    pub version: String,
    pub results: String,
    /// The scope of the machine's stored results.
    pub id: String,
    /// Variant identifiers and database names, in declaration order.
    pub states: Vec<(Ident, String)>,
    pub transitions: Vec<(u16, u16)>,
    pub reachable: Vec<(u16, u16)>,
}

/// `#[machine(id = "…")]`: stored with every first result, so it must fit the results
/// table's `machine` column ([`idem_sql::limits::MACHINE_ID`] bytes, on every backend) and
/// stay readable in it. Checked here, so that no handler of the machine can fail on it
/// after its body ran (or, on MySQL outside strict mode, be truncated into another
/// machine's id).
fn machine_id(cx: &mut Ctxt, lit: &LitStr) -> Option<String> {
    const MAX: usize = idem_sql::limits::MACHINE_ID;
    let id = lit.value();
    if id.len() > MAX {
        cx.error_spanned_by(
            lit,
            format!(
                "`id` is {} bytes long; the results table's `machine` column holds at most {MAX} bytes: use a shorter id, e.g. `id = \"orders\"` (it scopes the machine's stored results, so keep it stable)",
                id.len()
            ),
        );
        return None;
    }
    if id.is_empty() || id.chars().any(char::is_control) {
        cx.error_spanned_by(
            lit,
            format!(
                "`id` must be 1 to {MAX} bytes without control characters, e.g. `id = \"orders\"`; it scopes the machine's stored results, so keep it stable"
            ),
        );
        return None;
    }
    Some(id)
}

pub fn check(cx: &mut Ctxt, machine: Machine) -> Option<Checked> {
    let table = required(
        cx,
        &machine,
        machine.table.as_ref(),
        "table",
        table_name_problem,
    );
    let (key, key_literals) = key_columns(cx, &machine);
    let state = optional(cx, machine.state.as_ref(), "state", "state");
    let version = optional(cx, machine.version.as_ref(), "version", "version");
    let results = match &machine.results {
        Some(lit) => named(cx, lit, "results", table_name_problem),
        None => Some("idem_results".to_owned()),
    };
    let id = match &machine.id {
        Some(lit) => machine_id(cx, lit),
        None => table.clone(),
    };
    distinct_columns(cx, &machine, &key_literals, [&state, &version]);

    if machine.states.len() > u16::MAX as usize {
        cx.error_spanned_by(
            &machine.ident,
            "a state machine may declare at most 65535 states",
        );
        return None;
    }
    if machine.states.is_empty() {
        cx.error_spanned_by(
            &machine.ident,
            "a state machine needs states: add variants to the enum",
        );
        return None;
    }

    let mut index_of_variant = HashMap::new();
    let mut index_of_name: HashMap<&str, usize> = HashMap::new();
    for (i, s) in machine.states.iter().enumerate() {
        index_of_variant.insert(s.ident.to_string(), i);
        if let Some(problem) = state_name_problem(&s.name) {
            cx.error_at(s.name_span, format!("state name {:?} {problem}", s.name));
        }
        if let Some(&first) = index_of_name.get(s.name.as_str()) {
            cx.error_at(
                s.name_span,
                format!(
                    "duplicate state name {:?}: `{}` already uses it; every state needs its own database name",
                    s.name, machine.states[first].ident
                ),
            );
        } else {
            index_of_name.insert(&s.name, i);
        }
    }

    let variant_names = machine
        .states
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>();
    let variant_refs = variant_names.iter().map(String::as_str).collect::<Vec<_>>();
    let variants = variant_names.join(", ");
    let mut transitions = Vec::new();
    let mut edge_span: HashMap<(usize, usize), Span> = HashMap::new();
    for (from, s) in machine.states.iter().enumerate() {
        for target in &s.targets {
            let Some(&to) = index_of_variant.get(&target.to_string()) else {
                cx.error_spanned_by(
                    target,
                    format!(
                        "`{target}` is not a state of `{}`; {}",
                        machine.ident,
                        crate::suggest::did_you_mean(
                            &target.to_string(),
                            &variant_refs,
                            &format!("its states are: {variants}")
                        )
                    ),
                );
                continue;
            };
            if to == from {
                cx.error_spanned_by(
                    target,
                    format!(
                        "`{target}` cannot transition to itself: idempotency by state needs every transition to make progress"
                    ),
                );
                continue;
            }
            if edge_span.insert((from, to), target.span()).is_some() {
                cx.error_spanned_by(target, format!("`{target}` is listed twice in `to(...)`"));
                continue;
            }
            transitions.push((from as u16, to as u16));
        }
    }

    let n = machine.states.len();
    let adjacency = {
        let mut adj = vec![Vec::new(); n];
        for &(a, b) in &transitions {
            adj[a as usize].push(b as usize);
        }
        adj
    };
    if let Some(cycle) = find_cycle(&adjacency) {
        let path = cycle
            .iter()
            .map(|&i| machine.states[i].name.as_str())
            .collect::<Vec<_>>()
            .join(" -> ");
        let last = (cycle[cycle.len() - 2], cycle[cycle.len() - 1]);
        cx.error_at(
            edge_span[&last],
            format!(
                "the transitions form a cycle: {path}. A state machine for idempotency must make progress: \
                 a duplicate of an old transition could apply again after the row came back. \
                 Model the repetition as a new row, or as distinct states"
            ),
        );
    }
    // A misspelt target or argument is the usual reason a state looks unreachable: report
    // reachability only once the rest of the declaration is clean.
    if n > 1 && !cx.has_errors() {
        for (i, s) in machine.states.iter().enumerate() {
            let connected = transitions
                .iter()
                .any(|&(a, b)| a as usize == i || b as usize == i);
            if !connected {
                cx.error_spanned_by(
                    &s.ident,
                    format!(
                        "state `{}` is unreachable: no transition leads to it or leaves it; add it to a `to(...)` list or remove it",
                        s.ident
                    ),
                );
            }
        }
    }
    if cx.has_errors() {
        return None;
    }
    let reachable = closure(&adjacency);
    Some(Checked {
        ident: machine.ident,
        table: table?,
        key: key?,
        state: state?,
        version: version?,
        results: results?,
        id: id?,
        states: machine
            .states
            .into_iter()
            .map(|s| (s.ident, s.name))
            .collect(),
        transitions,
        reachable,
    })
}

fn required(
    cx: &mut Ctxt,
    machine: &Machine,
    lit: Option<&LitStr>,
    what: &str,
    problem: fn(&str) -> Option<String>,
) -> Option<String> {
    match lit {
        Some(lit) => named(cx, lit, what, problem),
        None => {
            // Without `#[machine(...)]` at all, that is the one error already reported.
            if machine.has_machine_attr {
                cx.error_spanned_by(
                    &machine.ident,
                    format!(
                        "missing `{what} = \"…\"` in `#[machine(...)]` on `{}`",
                        machine.ident
                    ),
                );
            }
            None
        }
    }
}

fn optional(cx: &mut Ctxt, lit: Option<&LitStr>, what: &str, default: &str) -> Option<String> {
    match lit {
        Some(lit) => named(cx, lit, what, sql_identifier_problem),
        None => Some(default.to_owned()),
    }
}

fn named(
    cx: &mut Ctxt,
    lit: &LitStr,
    what: &str,
    problem: fn(&str) -> Option<String>,
) -> Option<String> {
    let value = lit.value();
    match problem(&value) {
        None => Some(value),
        Some(p) => {
            cx.error_spanned_by(
                lit,
                format!("`{what}` must be a plain SQL identifier, and {value:?} {p}"),
            );
            None
        }
    }
}

/// The key's columns: each a plain identifier, none named twice. `None` after an error;
/// the columns that are valid either way, with the literal naming each, for the checks
/// that compare them with the other columns.
fn key_columns<'a>(
    cx: &mut Ctxt,
    machine: &'a Machine,
) -> (Option<Vec<String>>, Vec<(String, &'a LitStr)>) {
    let Some(key) = &machine.key else {
        // Without `#[machine(...)]` at all, that is the one error already reported.
        if machine.has_machine_attr {
            cx.error_spanned_by(
                &machine.ident,
                format!(
                    "missing `key = \"…\"` in `#[machine(...)]` on `{}`",
                    machine.ident
                ),
            );
        }
        return (None, Vec::new());
    };
    let mut columns: Vec<(String, &LitStr)> = Vec::new();
    let mut ok = true;
    for lit in &key.names {
        match named(cx, lit, "key", sql_identifier_problem) {
            Some(column) if columns.iter().any(|(c, _)| *c == column) => {
                cx.error_spanned_by(
                    lit,
                    format!("the key column `{column}` is listed twice; a composite key names each column once"),
                );
                ok = false;
            }
            Some(column) => columns.push((column, lit)),
            None => ok = false,
        }
    }
    let checked = ok.then(|| columns.iter().map(|(c, _)| c.clone()).collect());
    (checked, columns)
}

/// Two columns that must differ: names, values, and the argument to blame.
type Pair<'a> = (
    &'a str,
    Option<&'a String>,
    &'a str,
    Option<&'a String>,
    Option<&'a LitStr>,
);

/// The key's columns, the state column and the version column are different columns.
/// The error is on the argument that names the column a second time (a key column when
/// the other is a default).
fn distinct_columns(
    cx: &mut Ctxt,
    machine: &Machine,
    keys: &[(String, &LitStr)],
    [state, version]: [&Option<String>; 2],
) {
    let mut pairs: Vec<Pair<'_>> = vec![(
        "state",
        state.as_ref(),
        "version",
        version.as_ref(),
        machine.version.as_ref().or(machine.state.as_ref()),
    )];
    for (column, lit) in keys {
        pairs.push((
            "key",
            Some(column),
            "state",
            state.as_ref(),
            machine.state.as_ref().or(Some(lit)),
        ));
        pairs.push((
            "key",
            Some(column),
            "version",
            version.as_ref(),
            machine.version.as_ref().or(Some(lit)),
        ));
    }
    for (a, va, b, vb, blame) in pairs {
        if let (Some(x), Some(y)) = (va, vb)
            && x == y
        {
            let message = format!(
                "the `{a}` and `{b}` columns are both `{x}`; they must be different columns"
            );
            match blame {
                Some(lit) => cx.error_spanned_by(lit, message),
                None => cx.error_spanned_by(&machine.ident, message),
            }
        }
    }
}

/// A cycle as a path of state indices whose first and last elements are equal.
fn find_cycle(adjacency: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit(
        node: usize,
        adj: &[Vec<usize>],
        marks: &mut [Mark],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        marks[node] = Mark::OnPath;
        path.push(node);
        for &next in &adj[node] {
            match marks[next] {
                Mark::OnPath => {
                    let start = path.iter().position(|&p| p == next).expect("on path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next);
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, adj, marks, path) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks[node] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; adjacency.len()];
    (0..adjacency.len()).find_map(|start| {
        if marks[start] == Mark::New {
            visit(start, adjacency, &mut marks, &mut Vec::new())
        } else {
            None
        }
    })
}

/// Every pair `(a, b)` with `b` reachable from `a` in one or more steps.
fn closure(adjacency: &[Vec<usize>]) -> Vec<(u16, u16)> {
    let mut pairs = Vec::new();
    for start in 0..adjacency.len() {
        let mut seen = vec![false; adjacency.len()];
        let mut stack = adjacency[start].clone();
        while let Some(node) = stack.pop() {
            if !seen[node] {
                seen[node] = true;
                stack.extend(&adjacency[node]);
            }
        }
        pairs.extend(
            seen.iter()
                .enumerate()
                .filter(|(_, s)| **s)
                .map(|(b, _)| (start as u16, b as u16)),
        );
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_found_with_their_path() {
        let adj = vec![vec![1], vec![2], vec![1]];
        assert_eq!(find_cycle(&adj), Some(vec![1, 2, 1]));
        assert_eq!(find_cycle(&[vec![1, 2], vec![2], vec![]]), None);
    }

    #[test]
    fn closure_is_transitive() {
        let adj = vec![vec![1, 3], vec![2], vec![], vec![]];
        assert_eq!(closure(&adj), vec![(0, 1), (0, 2), (0, 3), (1, 2)]);
    }
}
