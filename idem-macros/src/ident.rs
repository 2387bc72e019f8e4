//! SQL identifiers and state names: what the macros accept and how they are quoted.

pub use idem_sql::ident::{sql_identifier_problem, table_name_problem};

/// The longest state name, in bytes: the results table's `from_state` and `to_state`
/// columns.
pub const MAX_STATE_LEN: usize = idem_sql::limits::STATE;

/// Why `s` is not a state name (`[A-Za-z0-9_-]`, 1 to 64 bytes).
pub fn state_name_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("is empty".into());
    }
    if s.len() > MAX_STATE_LEN {
        return Some(format!(
            "is {} bytes long; state names may be at most {MAX_STATE_LEN} (the results table's `from_state` and `to_state` columns hold that many)",
            s.len()
        ));
    }
    s.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        .map(|bad| format!("contains {bad:?}; use only ASCII letters, digits, `_` and `-`"))
}

/// `InTransit` → `IN_TRANSIT`: the default database name of a state.
pub fn screaming_snake(variant: &str) -> String {
    let mut out = String::with_capacity(variant.len() + 4);
    let mut prev_lower = false;
    for c in variant.chars() {
        if c.is_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        out.extend(c.to_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names() {
        assert_eq!(state_name_problem("IN_TRANSIT"), None);
        assert_eq!(state_name_problem("in-transit-2"), None);
        assert!(state_name_problem("PAID ").is_some());
        assert!(state_name_problem("").is_some());
        assert!(state_name_problem("'x'").is_some());
    }

    #[test]
    fn default_names() {
        assert_eq!(screaming_snake("InTransit"), "IN_TRANSIT");
        assert_eq!(screaming_snake("Created"), "CREATED");
        assert_eq!(screaming_snake("Step2Done"), "STEP2_DONE");
    }
}
