//! Business keys: what identifies the row a transition acts on.

/// The longest text key idem accepts, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// The longest key text the results table stores with a first result, in bytes, on every
/// backend ([`Key::to_text`]: a composite key's JSON array of its parts; an event
/// stream's key followed by U+001F and the event's version). A key whose text is longer is
/// [`KeyError::TextTooLong`], before any statement runs. Five text parts of 255 bytes can
/// exceed it (a `"` takes two bytes in JSON); two cannot.
pub const MAX_KEY_TEXT_LEN: usize = idem_sql::limits::KEY_TEXT;

/// A business key, bound as a parameter of the transition statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Key {
    /// An integer key (`BIGINT` / `INTEGER` column).
    Int(i64),
    /// A text key (`TEXT` / `VARCHAR` column), validated by [`Key::text`].
    Text(String),
    /// A UUID key (feature `uuid`), bound as the driver binds `uuid::Uuid`: a PostgreSQL
    /// `uuid` column, or on SQLite the 16-byte blob sqlx stores. Its text, in the results
    /// table, is the hyphenated lowercase form.
    #[cfg(feature = "uuid")]
    Uuid(uuid::Uuid),
    /// A key of several columns (`key = ("tenant_id", "order_id")`), made by
    /// [`Key::composite`]: its parts are bound column by column, in the machine's order.
    /// Its text, in the results table, is a JSON array of the parts (`["acme",7]`).
    Composite(CompositeKey),
}

/// The parts of a [`Key::Composite`]: two or more scalar keys (integer, text or UUID), each
/// validated as a key of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompositeKey(Vec<Key>);

impl CompositeKey {
    /// The parts, in the order of the machine's key columns.
    pub fn parts(&self) -> &[Key] {
        &self.0
    }
}

impl Key {
    /// A text key: 1 to [`MAX_KEY_LEN`] bytes, no control characters.
    pub fn text(key: impl Into<String>) -> Result<Key, KeyError> {
        valid_text(key.into()).map(Key::Text)
    }

    /// A key of several columns, from its parts in the order of the machine's key columns
    /// (`Key::composite([Key::text("acme")?, Key::Int(7)])`). Each part is validated as a
    /// key of its own; a part that is itself composite contributes its parts. One part is
    /// that part; none is [`KeyError::Empty`].
    pub fn composite(parts: impl IntoIterator<Item = Key>) -> Result<Key, KeyError> {
        let mut flat = Vec::new();
        for part in parts {
            match part {
                Key::Composite(inner) => flat.extend(inner.0),
                scalar => flat.push(scalar.to_key()?),
            }
        }
        match flat.len() {
            0 => Err(KeyError::Empty),
            1 => Ok(flat.remove(0)),
            _ => Ok(Key::Composite(CompositeKey(flat))),
        }
    }

    /// The scalar parts of the key, in column order: one for a key of one column.
    pub fn parts(&self) -> &[Key] {
        match self {
            Key::Composite(parts) => parts.parts(),
            scalar => core::slice::from_ref(scalar),
        }
    }

    /// The key as text, as stored in the results table.
    pub fn to_text(&self) -> String {
        match self {
            Key::Int(n) => n.to_string(),
            Key::Text(s) => s.clone(),
            #[cfg(feature = "uuid")]
            Key::Uuid(id) => id.hyphenated().to_string(),
            Key::Composite(parts) => {
                let parts = parts.parts().iter().map(|part| match part {
                    Key::Int(n) => serde_json::Value::from(*n),
                    other => serde_json::Value::from(other.to_text()),
                });
                serde_json::Value::Array(parts.collect()).to_string()
            }
        }
    }
}

impl core::fmt::Display for Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Key::Int(n) => write!(f, "{n}"),
            Key::Text(s) => write!(f, "{s:?}"),
            #[cfg(feature = "uuid")]
            Key::Uuid(id) => write!(f, "{}", id.hyphenated()),
            Key::Composite(parts) => {
                f.write_str("(")?;
                for (i, part) in parts.parts().iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{part}")?;
                }
                f.write_str(")")
            }
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
    /// An integer key outside the range of a signed 64-bit column (`BIGINT`, SQLite's
    /// `INTEGER`).
    OutOfRange {
        /// The key, in decimal.
        value: String,
    },
    /// The key's text, as the results table stores it with the first result
    /// ([`Key::to_text`]), is longer than [`MAX_KEY_TEXT_LEN`] bytes: a composite key of
    /// many long parts.
    TextTooLong {
        /// The text's length in bytes.
        len: usize,
    },
    /// The key has a different number of parts than the machine has key columns.
    WrongArity {
        /// The machine's key columns.
        columns: usize,
        /// The key's parts.
        parts: usize,
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
            KeyError::OutOfRange { value } => write!(
                f,
                "the integer key {value} does not fit a signed 64-bit column (at most {})",
                i64::MAX
            ),
            KeyError::TextTooLong { len } => write!(
                f,
                "the key's text, stored with its first result, is {len} bytes long; it may be at most {MAX_KEY_TEXT_LEN} bytes (use shorter parts, or hash long ones)"
            ),
            KeyError::WrongArity { columns, parts } => write!(
                f,
                "the machine is keyed by {columns} column{}, and the key has {parts} part{}: give one part per key column, in order",
                if *columns == 1 { "" } else { "s" },
                if *parts == 1 { "" } else { "s" }
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// A type usable as the `key` parameter of an `#[idempotent]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "the parameter named by `key = \"…\"` has this type",
    note = "use an integer (`i64`, `u64`, `i32`, …), text (`String`, `&str`) or `uuid::Uuid` (feature `uuid`) key, or implement `idem::ToKey` for a type of yours"
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
int_keys!(i64, i32, i16, i8, u32, u16, u8);

macro_rules! wide_int_keys {
    ($($t:ty),*) => {$(
        impl ToKey for $t {
            fn to_key(&self) -> Result<Key, KeyError> {
                i64::try_from(*self)
                    .map(Key::Int)
                    .map_err(|_| KeyError::OutOfRange { value: self.to_string() })
            }
        }
    )*};
}
wide_int_keys!(u64, usize, isize, i128, u128);

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
            Key::Text(s) => Key::text(s.as_str()),
            Key::Composite(parts) => Key::composite(parts.parts().iter().cloned()),
            other => Ok(other.clone()),
        }
    }
}

macro_rules! tuple_keys {
    ($(($($t:ident $v:ident),+)),*) => {$(
        /// A composite key, one part per element, in the order of the machine's key columns.
        // Not listed among the key types when a parameter's type is no key: a tuple is
        // rarely what a handler's single parameter should be.
        #[diagnostic::do_not_recommend]
        impl<$($t: ToKey),+> ToKey for ($($t,)+) {
            fn to_key(&self) -> Result<Key, KeyError> {
                let ($($v,)+) = self;
                Key::composite([$($v.to_key()?),+])
            }
        }
    )*};
}
tuple_keys!((A a, B b), (A a, B b, C c), (A a, B b, C c, D d));

/// The key of a handler whose `key = ("…", "…")` names several parameters (generated code
/// only).
#[doc(hidden)]
pub fn composite_key<const N: usize>(parts: [Result<Key, KeyError>; N]) -> Result<Key, KeyError> {
    let parts = parts.into_iter().collect::<Result<Vec<_>, _>>()?;
    Key::composite(parts)
}

#[cfg(feature = "uuid")]
impl ToKey for uuid::Uuid {
    fn to_key(&self) -> Result<Key, KeyError> {
        Ok(Key::Uuid(*self))
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

/// A type usable as the `watermark` parameter of an `#[idempotent]` handler: the version
/// an event of a stream carries, which the row takes when the event applies.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an event's version",
    label = "the parameter named by `watermark = \"…\"` has this type",
    note = "use an integer type (`i64`, `u32`, …): the event's position in its stream, counting from 1"
)]
pub trait ToWatermark {
    /// The event's version, or the text of one that is no version (0, negative, out of
    /// the 64-bit range).
    fn to_watermark(&self) -> Result<i64, String>;
}

macro_rules! watermarks {
    ($($t:ty),*) => {$(
        impl ToWatermark for $t {
            fn to_watermark(&self) -> Result<i64, String> {
                match i64::try_from(*self) {
                    Ok(version) if version > 0 => Ok(version),
                    _ => Err(self.to_string()),
                }
            }
        }
    )*};
}
watermarks!(
    i64, i32, i16, i8, u64, u32, u16, u8, usize, isize, i128, u128
);

impl<T: ToWatermark + ?Sized> ToWatermark for &T {
    fn to_watermark(&self) -> Result<i64, String> {
        (**self).to_watermark()
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
    fn every_integer_width_is_a_key_within_range() {
        assert_eq!(7u8.to_key(), Ok(Key::Int(7)));
        assert_eq!((-7i8).to_key(), Ok(Key::Int(-7)));
        assert_eq!((i64::MAX as u64).to_key(), Ok(Key::Int(i64::MAX)));
        assert_eq!(
            u64::MAX.to_key(),
            Err(KeyError::OutOfRange {
                value: u64::MAX.to_string()
            })
        );
        assert_eq!(42usize.to_key(), Ok(Key::Int(42)));
        assert!(i128::MIN.to_key().is_err());
    }

    #[test]
    fn composite_keys_are_validated_part_by_part() {
        let key = ("acme", 7i32).to_key().unwrap();
        assert_eq!(key.parts(), &[Key::Text("acme".into()), Key::Int(7)]);
        assert_eq!(key.to_text(), r#"["acme",7]"#);
        assert_eq!(key.to_string(), r#"("acme", 7)"#);
        assert_eq!(("", 7).to_key(), Err(KeyError::Empty));
        assert_eq!(
            ("a\nb", 7).to_key(),
            Err(KeyError::ControlCharacter { position: 1 })
        );
        assert_eq!(Key::composite([]), Err(KeyError::Empty));
        assert_eq!(Key::composite([Key::Int(7)]), Ok(Key::Int(7)));
        // nested parts are flattened, so a key's parts are always scalar
        let nested = Key::composite([key.clone(), Key::Int(1)]).unwrap();
        assert_eq!(nested.parts().len(), 3);
        assert!(Key::Int(7).parts() == [Key::Int(7)]);
    }

    #[test]
    fn composite_key_text_cannot_be_confused() {
        // a separator inside a part cannot make two different keys look alike
        let a = ("a\",b", "c").to_key().unwrap().to_text();
        let b = ("a", "b\",\"c").to_key().unwrap().to_text();
        assert_ne!(a, b);
        assert_ne!(
            ("1", 2).to_key().unwrap().to_text(),
            (1, 2).to_key().unwrap().to_text()
        );
    }

    #[test]
    fn integer_keys_render_as_decimal() {
        assert_eq!(42i32.to_key().unwrap().to_text(), "42");
        assert_eq!((-7i64).to_key().unwrap().to_text(), "-7");
    }
}
