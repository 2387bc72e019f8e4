//! Numbered placeholders (`$1`, `$2`, …), as idem writes every statement, and MySQL's
//! positional `?`.
//!
//! idem spells each statement once, with numbered parameters: a value used twice (the
//! `from` state in the UPDATE and in the classifying read) is one parameter. MySQL and
//! MariaDB number nothing: each `?` takes the next bound value, so a value used twice is
//! bound twice. [`positional`] rewrites a statement for them and says which parameter each
//! `?` takes; the runtime binds in that order.

use std::borrow::Cow;

/// A statement with positional `?` placeholders, and the parameter each one takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Positional<'a> {
    /// The statement, each `$n` replaced by `?`.
    pub text: Cow<'a, str>,
    /// For each `?` in order, the index (from 0) of the numbered parameter it takes:
    /// `$1` is 0.
    pub order: Vec<usize>,
}

/// `sql` with each `$n` outside quotes and comments replaced by `?`, and the order to bind
/// the parameters in. Text in single quotes, double quotes and backticks, and `--` comments
/// to the end of their line, are left alone; a statement without `$` is returned as it is.
/// So are `$0` and a number too large for `usize`: no parameter has them. Never panics, on
/// any text.
///
/// ```
/// use idem_sql::placeholder::positional;
/// let p = positional("UPDATE `t` SET s = $3 WHERE k = $1 AND s = $2 AND v < $4 AND w = $4");
/// assert_eq!(p.text, "UPDATE `t` SET s = ? WHERE k = ? AND s = ? AND v < ? AND w = ?");
/// assert_eq!(p.order, [2, 0, 1, 3, 3]);
/// ```
pub fn positional(sql: &str) -> Positional<'_> {
    if !sql.contains('$') {
        return Positional {
            text: Cow::Borrowed(sql),
            order: Vec::new(),
        };
    }
    let bytes = sql.as_bytes();
    let mut text = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut quote: Option<u8> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            // A doubled quote inside quotes is an escaped one: the next byte reopens.
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if matches!(b, b'\'' | b'"' | b'`') => quote = Some(b),
            None if b == b'-' && bytes.get(i + 1) == Some(&b'-') => {
                i += bytes[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .unwrap_or(bytes.len() - i);
                continue;
            }
            None if b == b'$' => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|d| d.is_ascii_digit())
                    .count();
                // No digits, `$0`, or a number too large for `usize` names no parameter
                // anyone can bind: left alone (and the server refuses the statement).
                let number = sql[i + 1..i + 1 + digits].parse::<usize>().unwrap_or(0);
                if number > 0 {
                    text.push_str(&sql[copied..i]);
                    text.push('?');
                    order.push(number - 1);
                    i += 1 + digits;
                    copied = i;
                    continue;
                }
            }
            None => {}
        }
        i += 1;
    }
    text.push_str(&sql[copied..]);
    Positional {
        text: Cow::Owned(text),
        order,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_use_of_a_value_is_a_placeholder_of_its_own() {
        let p = positional("SELECT $1, $12, $1 FROM t WHERE a = $2");
        assert_eq!(p.text, "SELECT ?, ?, ? FROM t WHERE a = ?");
        assert_eq!(p.order, [0, 11, 0, 1]);
    }

    #[test]
    fn quoted_text_and_other_dollars_are_left_alone() {
        let p = positional("SELECT '$1', \"$2\", `$3`, 'it''s $4', $0, $ , $5");
        assert_eq!(p.text, "SELECT '$1', \"$2\", `$3`, 'it''s $4', $0, $ , ?");
        assert_eq!(p.order, [4]);
        let huge = positional("SELECT $99999999999999999999, $1");
        assert_eq!(huge.text, "SELECT $99999999999999999999, ?");
        assert_eq!(huge.order, [0]);
        let commented = positional("SELECT $1 -- it's $2\n, $2");
        assert_eq!(commented.text, "SELECT ? -- it's $2\n, ?");
        assert_eq!(commented.order, [0, 1]);
        let none = positional("SELECT 1");
        assert!(matches!(none.text, Cow::Borrowed(_)));
        assert!(none.order.is_empty());
    }

    mod any_text {
        use super::*;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, FileFailurePersistence};

        /// Failures kept in `placeholder.regressions` beside this file, replayed first.
        fn config() -> Config {
            Config {
                cases: 1024,
                failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
                    "regressions",
                ))),
                ..Config::default()
            }
        }

        /// Text made of what the scanner looks at: `$`, digits (a run long enough to
        /// overflow any integer), quotes, `--`, newlines, multi-byte UTF-8, and anything.
        fn text() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("$".to_owned()),
                "[0-9]{1,30}",
                Just("$99999999999999999999".to_owned()),
                Just("$0".to_owned()),
                Just("$1".to_owned()),
                Just("'".to_owned()),
                Just("''".to_owned()),
                Just("\"".to_owned()),
                Just("`".to_owned()),
                Just("-".to_owned()),
                Just("--".to_owned()),
                Just("\n".to_owned()),
                Just("?".to_owned()),
                Just("é".to_owned()),
                Just("日本".to_owned()),
                Just("🦀".to_owned()),
                Just(" ".to_owned()),
                any::<String>(),
            ];
            proptest::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
        }

        proptest! {
            #![proptest_config(config())]

            /// Never a panic; each `?` it writes has its parameter, and text without `$`
            /// comes back as it was.
            #[test]
            fn positional_never_panics(sql in text()) {
                let p = positional(&sql);
                let written = p.text.matches('?').count() - sql.matches('?').count();
                prop_assert_eq!(written, p.order.len());
                if !sql.contains('$') {
                    prop_assert_eq!(&*p.text, sql.as_str());
                }
            }
        }
    }
}
