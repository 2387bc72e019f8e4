//! Business keys: what identifies the row a transition acts on.

/// The longest text key idem accepts, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A business key, bound as a parameter of the transition statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// An integer key (`BIGINT` / `INTEGER` column).
    Int(i64),
    /// A text key (`TEXT` / `VARCHAR` column), validated by [`Key::text`].
    Text(String),
}

impl Key {
    /// A text key: 1 to [`MAX_KEY_LEN`] bytes, no control characters.
    pub fn text(key: impl Into<String>) -> Result<Key, KeyError> {
        valid_text(key.into()).map(Key::Text)
    }

    /// The key as text, as stored in the results table.
    pub fn to_text(&self) -> String {
        match self {
            Key::Int(n) => n.to_string(),
            Key::Text(s) => s.clone(),
        }
    }
}

impl core::fmt::Display for Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Key::Int(n) => write!(f, "{n}"),
            Key::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// `key`, if it is 1 to [`MAX_KEY_LEN`] bytes without control characters.
pub(crate) fn valid_text(key: String) -> Result<String, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    if let Some(position) = key.chars().position(char::is_control) {
        return Err(KeyError::ControlCharacter { position });
    }
    Ok(key)
}

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key contains a control character (newline, NUL, …).
    ControlCharacter {
        /// Its position, in characters.
        position: usize,
    },
}

impl core::fmt::Display for KeyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyError::Empty => f.write_str("the key is empty"),
            KeyError::TooLong { len } => write!(
                f,
                "the key is {len} bytes long; keys may be at most {MAX_KEY_LEN} bytes (hash longer identifiers)"
            ),
            KeyError::ControlCharacter { position } => {
                write!(f, "the key has a control character at position {position}")
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// A type usable as the `key` parameter of an `#[idempotent]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "the parameter named by `key = \"…\"` has this type",
    note = "use an integer (`i64`, `i32`, `u32`, …) or text (`String`, `&str`) key, or implement `idem::ToKey`"
)]
pub trait ToKey {
    /// Converts the parameter into a bound key, validating text.
    fn to_key(&self) -> Result<Key, KeyError>;
}

macro_rules! int_keys {
    ($($t:ty),*) => {$(
        impl ToKey for $t {
            fn to_key(&self) -> Result<Key, KeyError> {
                Ok(Key::Int(i64::from(*self)))
            }
        }
    )*};
}
int_keys!(i64, i32, i16, u32, u16);

impl ToKey for str {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::text(self)
    }
}

impl ToKey for String {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::text(self.as_str())
    }
}

impl ToKey for Key {
    fn to_key(&self) -> Result<Key, KeyError> {
        match self {
            Key::Int(_) => Ok(self.clone()),
            Key::Text(s) => Key::text(s.as_str()),
        }
    }
}

impl<T: ToKey + ?Sized> ToKey for &T {
    fn to_key(&self) -> Result<Key, KeyError> {
        (**self).to_key()
    }
}

/// A type usable as the `version` parameter of an `#[idempotent]` handler: the version
/// the caller read, or `None` to skip the guard.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an expected version",
    label = "the parameter named by `version = \"…\"` has this type",
    note = "use `i64` (always guarded) or `Option<i64>` (guarded when `Some`)"
)]
pub trait ToVersion {
    /// The expected version, if any.
    fn to_version(&self) -> Option<i64>;
}

impl ToVersion for i64 {
    fn to_version(&self) -> Option<i64> {
        Some(*self)
    }
}

impl ToVersion for Option<i64> {
    fn to_version(&self) -> Option<i64> {
        *self
    }
}

impl<T: ToVersion + ?Sized> ToVersion for &T {
    fn to_version(&self) -> Option<i64> {
        (**self).to_version()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_are_bounded() {
        assert_eq!(Key::text(""), Err(KeyError::Empty));
        assert_eq!(
            Key::text("x".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(Key::text("x".repeat(255)).is_ok());
        assert_eq!(
            Key::text("a\nb"),
            Err(KeyError::ControlCharacter { position: 1 })
        );
        assert_eq!(Key::text("order-7"), Ok(Key::Text("order-7".into())));
    }

    #[test]
    fn integer_keys_render_as_decimal() {
        assert_eq!(42i32.to_key().unwrap().to_text(), "42");
        assert_eq!((-7i64).to_key().unwrap().to_text(), "-7");
    }
}
