//! The `Idempotency-Key` request header: one value, a Structured Field string
//! (`"8e03978e-…"`, RFC 8941) or, as most clients send it, a bare token; 1 to 255
//! characters of visible ASCII.

use http::HeaderMap;
use http::header::HeaderName;

/// The header's name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters.
pub const MAX_HTTP_KEY_LEN: usize = 255;

/// Why a request's `Idempotency-Key` was refused (a 400, nothing runs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyProblem {
    /// The route requires a key and the request has none.
    Missing,
    /// The header is given more than once.
    Repeated,
    /// The value is empty (`""` or nothing).
    Empty,
    /// The key is longer than [`MAX_HTTP_KEY_LEN`] characters.
    TooLong {
        /// Its length in characters.
        len: usize,
    },
    /// The value has a character outside visible ASCII (a control character, a space in a
    /// bare token, a byte above 0x7E) at this position.
    InvalidCharacter {
        /// Its position in the header value, in bytes.
        position: usize,
    },
    /// A quoted value that is not one well-formed Structured Field string (an unclosed
    /// quote, a bad escape, something after the closing quote).
    MalformedString,
}

impl core::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyProblem::Missing => f.write_str(
                "this request requires an Idempotency-Key header, e.g. Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
            ),
            KeyProblem::Repeated => f.write_str("the Idempotency-Key header is given more than once; send exactly one"),
            KeyProblem::Empty => f.write_str("the Idempotency-Key is empty"),
            KeyProblem::TooLong { len } => write!(
                f,
                "the Idempotency-Key is {len} characters long; at most {MAX_HTTP_KEY_LEN} are allowed"
            ),
            KeyProblem::InvalidCharacter { position } => write!(
                f,
                "the Idempotency-Key has a character that is not visible ASCII at byte {position}"
            ),
            KeyProblem::MalformedString => f.write_str(
                "the Idempotency-Key is not a valid Structured Field string: a quoted key is one string, closed by a quote with nothing after it, in which only a quote or a backslash may be escaped",
            ),
        }
    }
}

impl std::error::Error for KeyProblem {}

/// The request's key: `Ok(None)` when there is no header, the key's text otherwise. A
/// quoted value is unquoted (`"abc"` and `abc` are the same key).
pub fn request_key(headers: &HeaderMap) -> Result<Option<String>, KeyProblem> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    parse(value.as_bytes()).map(Some)
}

/// Parses one header value.
fn parse(raw: &[u8]) -> Result<String, KeyProblem> {
    // Structured Fields ignore leading and trailing spaces; HTTP already strips them, but
    // a `HeaderValue` built by hand may keep them.
    let start = raw.iter().take_while(|b| **b == b' ').count();
    let end = raw.len() - raw.iter().rev().take_while(|b| **b == b' ').count();
    let value = &raw[start..end.max(start)];
    let key = match value.first() {
        Some(b'"') => unquote(value, start)?,
        _ => bare(value, start)?,
    };
    if key.is_empty() {
        return Err(KeyProblem::Empty);
    }
    if key.len() > MAX_HTTP_KEY_LEN {
        return Err(KeyProblem::TooLong { len: key.len() });
    }
    Ok(key)
}

/// A bare token: visible ASCII, no spaces, no quotes.
fn bare(value: &[u8], offset: usize) -> Result<String, KeyProblem> {
    if let Some(position) = value
        .iter()
        .position(|b| !(0x21..=0x7e).contains(b) || *b == b'"')
    {
        return Err(KeyProblem::InvalidCharacter {
            position: offset + position,
        });
    }
    Ok(value.iter().map(|&b| b as char).collect())
}

/// An RFC 8941 sf-string: `"` then printable ASCII with `\"` and `\\` escaped, then `"`,
/// then nothing.
fn unquote(value: &[u8], offset: usize) -> Result<String, KeyProblem> {
    let mut key = String::new();
    let mut i = 1;
    while i < value.len() {
        match value[i] {
            b'\\' => match value.get(i + 1) {
                Some(&c @ (b'"' | b'\\')) => {
                    key.push(c as char);
                    i += 2;
                }
                _ => return Err(KeyProblem::MalformedString),
            },
            b'"' => {
                return if i + 1 == value.len() {
                    Ok(key)
                } else {
                    Err(KeyProblem::MalformedString)
                };
            }
            c if (0x20..=0x7e).contains(&c) => {
                key.push(c as char);
                i += 1;
            }
            _ => {
                return Err(KeyProblem::InvalidCharacter {
                    position: offset + i,
                });
            }
        }
    }
    Err(KeyProblem::MalformedString)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(value: &[u8]) -> Result<Option<String>, KeyProblem> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
        request_key(&headers)
    }

    #[test]
    fn structured_strings_and_bare_tokens_are_the_same_key() {
        assert_eq!(
            key(b"\"8e03978e-40d5\"").unwrap().as_deref(),
            Some("8e03978e-40d5")
        );
        assert_eq!(
            key(b"8e03978e-40d5").unwrap().as_deref(),
            Some("8e03978e-40d5")
        );
        assert_eq!(
            key(b"\"a \\\"b\\\\ c\"").unwrap().as_deref(),
            Some("a \"b\\ c")
        );
        assert_eq!(request_key(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert_eq!(key(b"\"\""), Err(KeyProblem::Empty));
        assert_eq!(key(b"\"abc"), Err(KeyProblem::MalformedString));
        assert_eq!(key(b"\"abc\";p=1"), Err(KeyProblem::MalformedString));
        assert_eq!(key(b"\"a\\nb\""), Err(KeyProblem::MalformedString));
        assert_eq!(key(b"\"a\", \"b\""), Err(KeyProblem::MalformedString));
        assert_eq!(
            key(b"a b"),
            Err(KeyProblem::InvalidCharacter { position: 1 })
        );
        assert_eq!(
            key(b"a\tb"),
            Err(KeyProblem::InvalidCharacter { position: 1 })
        );
        assert_eq!(
            key("é".as_bytes()),
            Err(KeyProblem::InvalidCharacter { position: 0 })
        );
        assert_eq!(
            key("x".repeat(255).as_bytes()).unwrap().map(|k| k.len()),
            Some(255)
        );
        assert_eq!(
            key("x".repeat(256).as_bytes()),
            Err(KeyProblem::TooLong { len: 256 })
        );
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("b"));
        assert_eq!(request_key(&headers), Err(KeyProblem::Repeated));
    }
}
