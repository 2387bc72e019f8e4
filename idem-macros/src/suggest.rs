//! "Did you mean": a message about an unknown name, with the nearest declared one first
//! (see `idem_sql::spelling` for what counts as near).

/// `rest`, preceded by "did you mean `…`? " when one of `candidates` is near `name` (and
/// then capitalized, as a new sentence).
pub fn did_you_mean(name: &str, candidates: &[&str], rest: &str) -> String {
    match idem_sql::spelling::nearest(name, candidates) {
        Some(i) => {
            let mut chars = rest.chars();
            let rest = match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect(),
                None => String::new(),
            };
            format!("did you mean `{}`? {rest}", candidates[i])
        }
        None => rest.to_owned(),
    }
}

/// "unknown {what} `name`; valid arguments are: …", with a "did you mean" first when one
/// of `valid` is near.
pub fn unknown_argument(what: &str, name: &str, valid: &[&str]) -> String {
    let listed = format!("valid arguments are: {}", valid.join(", "));
    format!(
        "unknown {what} `{name}`; {}",
        did_you_mean(name, valid, &listed)
    )
}

/// An argument's name as written: `from`, or `a::b` for a path.
pub fn path_name(path: &syn::Path) -> String {
    path.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn prefixes_the_near_name() {
        assert_eq!(
            did_you_mean("form", &["from", "to"], "valid arguments are: from, to"),
            "did you mean `from`? Valid arguments are: from, to"
        );
        assert_eq!(
            did_you_mean("retries", &["from", "to"], "valid arguments are: from, to"),
            "valid arguments are: from, to"
        );
    }
}
