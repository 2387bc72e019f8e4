//! SQL identifiers and state names: what the macros accept and how they are quoted.

/// The longest identifier PostgreSQL keeps without truncating (NAMEDATALEN - 1).
pub const MAX_IDENT_LEN: usize = 63;

/// The longest state name.
pub const MAX_STATE_LEN: usize = 64;

/// Why `s` is not a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes).
pub fn sql_identifier_problem(s: &str) -> Option<String> {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return Some("is empty".into());
    };
    if s.len() > MAX_IDENT_LEN {
        return Some(format!(
            "is {} bytes long; PostgreSQL truncates identifiers after {MAX_IDENT_LEN}",
            s.len()
        ));
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return Some(format!("starts with {first:?}; start with a letter or `_`"));
    }
    if let Some(bad) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Some(format!(
            "contains {bad:?}; use only ASCII letters, digits and `_`"
        ));
    }
    None
}

/// Why `s` is not a table name: an identifier, optionally qualified by a schema.
pub fn table_name_problem(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 2 {
        return Some("has more than one `.`; write `table` or `schema.table`".into());
    }
    parts.iter().find_map(|part| {
        sql_identifier_problem(part).map(|p| {
            if parts.len() == 2 {
                format!("part `{part}` {p}")
            } else {
                p
            }
        })
    })
}

/// Why `s` is not a state name (`[A-Za-z0-9_-]`, 1 to 64 bytes).
pub fn state_name_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("is empty".into());
    }
    if s.len() > MAX_STATE_LEN {
        return Some(format!(
            "is {} bytes long; state names may be at most {MAX_STATE_LEN}",
            s.len()
        ));
    }
    s.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        .map(|bad| format!("contains {bad:?}; use only ASCII letters, digits, `_` and `-`"))
}

/// The identifier quoted for SQL (`"orders"`, `"billing"."orders"`). Only called on names
/// that passed validation, so they contain no quote to escape.
pub fn quoted(s: &str) -> String {
    s.split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
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
    fn identifiers() {
        assert_eq!(sql_identifier_problem("order_id"), None);
        assert_eq!(sql_identifier_problem("_x9"), None);
        assert!(sql_identifier_problem("").is_some());
        assert!(sql_identifier_problem("9lives").is_some());
        assert!(sql_identifier_problem("orders; DROP TABLE x").is_some());
        assert!(sql_identifier_problem("naïve").is_some());
        assert!(sql_identifier_problem(&"a".repeat(64)).is_some());
        assert_eq!(table_name_problem("billing.orders"), None);
        assert!(table_name_problem("a.b.c").is_some());
        assert!(table_name_problem("billing.").is_some());
    }

    #[test]
    fn state_names() {
        assert_eq!(state_name_problem("IN_TRANSIT"), None);
        assert_eq!(state_name_problem("in-transit-2"), None);
        assert!(state_name_problem("PAID ").is_some());
        assert!(state_name_problem("").is_some());
        assert!(state_name_problem("'x'").is_some());
    }

    #[test]
    fn quoting_and_default_names() {
        assert_eq!(quoted("orders"), "\"orders\"");
        assert_eq!(quoted("billing.orders"), "\"billing\".\"orders\"");
        assert_eq!(screaming_snake("InTransit"), "IN_TRANSIT");
        assert_eq!(screaming_snake("Created"), "CREATED");
        assert_eq!(screaming_snake("Step2Done"), "STEP2_DONE");
    }
}
