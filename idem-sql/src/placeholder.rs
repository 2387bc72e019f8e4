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
                if digits > 0 {
                    let number: usize = sql[i + 1..i + 1 + digits].parse().expect("ASCII digits");
                    if number > 0 {
                        text.push_str(&sql[copied..i]);
                        text.push('?');
                        order.push(number - 1);
                        i += 1 + digits;
                        copied = i;
                        continue;
                    }
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
        let commented = positional("SELECT $1 -- it's $2\n, $2");
        assert_eq!(commented.text, "SELECT ? -- it's $2\n, ?");
        assert_eq!(commented.order, [0, 1]);
        let none = positional("SELECT 1");
        assert!(matches!(none.text, Cow::Borrowed(_)));
        assert!(none.order.is_empty());
    }
}
