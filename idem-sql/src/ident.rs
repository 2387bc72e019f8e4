//! SQL identifiers: which names idem accepts, and how they are quoted.

/// The longest identifier PostgreSQL keeps without truncating (NAMEDATALEN - 1).
pub const MAX_IDENT_LEN: usize = 63;

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

/// The identifier quoted for SQL (`"orders"`, `"billing"."orders"`), each `"` in it
/// doubled. Only called on names that passed validation, which hold no quote; escaping
/// anyway keeps a name that did not (a caller's bug) one identifier, never SQL.
pub fn quoted(s: &str) -> String {
    quoted_with(s, '"')
}

/// The identifier quoted with `quote`: `"` in standard SQL, a backtick on MySQL
/// (`` `billing`.`orders` ``), each `quote` in a part doubled (`a"b` → `"a""b"`).
pub fn quoted_with(s: &str, quote: char) -> String {
    let doubled = format!("{quote}{quote}");
    s.split('.')
        .map(|part| format!("{quote}{}{quote}", part.replace(quote, &doubled)))
        .collect::<Vec<_>>()
        .join(".")
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
    fn quoting() {
        assert_eq!(quoted("orders"), "\"orders\"");
        assert_eq!(quoted("billing.orders"), "\"billing\".\"orders\"");
        // A quote, were one ever to get here, stays inside the identifier.
        assert_eq!(quoted("a\"b"), "\"a\"\"b\"");
        assert_eq!(
            quoted("x\"; DROP TABLE t; --"),
            "\"x\"\"; DROP TABLE t; --\""
        );
        assert_eq!(quoted_with("a`b", '`'), "`a``b`");
        assert_eq!(quoted_with("s.a`b", '`'), "`s`.`a``b`");
        assert_eq!(quoted_with("a\"b", '`'), "`a\"b`");
    }
}
