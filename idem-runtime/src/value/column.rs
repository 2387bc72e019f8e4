//! The values of the columns a handler sets in its transition's own UPDATE, besides the state
//! and the version: `set(paid_at = now(), amount = "amount")`.
//!
//! The values are bound parameters of the one conditional UPDATE, so they are written
//! exactly when the row moves, by the statement that moves it: a duplicate or a refusal
//! writes none of them.

/// A value bound to a column set in the transition's UPDATE, see [`ToColumn`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ColumnValue {
    /// An integer, bound as a 64-bit integer (PostgreSQL `int8`, assigned to `int2`, `int4`,
    /// `int8` and `numeric` columns; a value out of the column's range is the database's
    /// error).
    Int(i64),
    /// A floating-point number (PostgreSQL `float8`, assigned to `real`, `double precision`
    /// and `numeric` columns).
    Float(f64),
    /// A boolean (SQLite: 0 or 1).
    Bool(bool),
    /// Text (PostgreSQL `text`, assigned to `text` and `varchar` columns).
    Text(String),
    /// Bytes (PostgreSQL `bytea`, SQLite a blob).
    Bytes(Vec<u8>),
    /// A UUID, bound as the driver binds `uuid::Uuid` (PostgreSQL `uuid`, SQLite a 16-byte
    /// blob; `sqlx::Any`: its text).
    #[cfg(feature = "uuid")]
    Uuid(uuid::Uuid),
    /// NULL, typed as the column's values would be (PostgreSQL refuses a NULL of another
    /// type where no cast applies).
    Null(ColumnType),
}

/// The type of a [`ColumnValue`], for a typed NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ColumnType {
    /// [`ColumnValue::Int`].
    Int,
    /// [`ColumnValue::Float`].
    Float,
    /// [`ColumnValue::Bool`].
    Bool,
    /// [`ColumnValue::Text`].
    Text,
    /// [`ColumnValue::Bytes`].
    Bytes,
    /// [`ColumnValue::Uuid`].
    #[cfg(feature = "uuid")]
    Uuid,
}

/// Why a parameter's value cannot be bound to the column `set(…)` names, see
/// [`Error::InvalidColumn`](crate::Error::InvalidColumn).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ColumnProblem {
    /// An integer outside the 64-bit signed range the databases store.
    OutOfRange {
        /// The value, as text.
        value: String,
    },
    /// Text holding a NUL character, which PostgreSQL cannot store in a text column (and
    /// SQLite would cut the text at).
    NulInText,
}

impl core::fmt::Display for ColumnProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ColumnProblem::OutOfRange { value } => {
                write!(f, "{value} is outside the 64-bit signed integer range")
            }
            ColumnProblem::NulInText => f.write_str("the text holds a NUL character"),
        }
    }
}

impl std::error::Error for ColumnProblem {}

/// A type whose values a handler can set a column to in its transition's UPDATE
/// (`set(amount = "amount")`).
///
/// Implemented for integers, `f32` and `f64`, `bool`, text (`String`, `str`), bytes
/// (`Vec<u8>`, `[u8]`), `uuid::Uuid` (feature `uuid`), references to them and `Option`s of
/// them (`None` binds NULL). For a type of yours, map it to one of those:
///
/// ```
/// use idem::{ColumnProblem, ColumnType, ColumnValue, ToColumn};
///
/// /// An amount of money in cents.
/// struct Cents(i64);
///
/// impl ToColumn for Cents {
///     const TYPE: ColumnType = ColumnType::Int;
///     fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
///         Ok(ColumnValue::Int(self.0))
///     }
/// }
/// ```
///
/// A timestamp the database should take from its own clock is `set(paid_at = now())`, no
/// parameter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be bound to a column set in the transition",
    label = "`set(…)` binds this parameter to a column of the machine's table",
    note = "use an integer, a float, `bool`, text (`String`, `&str`), bytes (`Vec<u8>`), `uuid::Uuid` (feature `uuid`) or an `Option` of one, or implement `idem::ToColumn` for a type of yours; for the database's clock, write `set(column = now())`"
)]
pub trait ToColumn {
    /// The type of the values it binds (a `None` of `Option<Self>` binds a NULL of it).
    const TYPE: ColumnType;

    /// The value to bind, or why it cannot be stored.
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem>;
}

macro_rules! int_columns {
    ($($t:ty),*) => {$(
        impl ToColumn for $t {
            const TYPE: ColumnType = ColumnType::Int;
            fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
                Ok(ColumnValue::Int(i64::from(*self)))
            }
        }
    )*};
}
int_columns!(i64, i32, i16, i8, u32, u16, u8);

macro_rules! wide_int_columns {
    ($($t:ty),*) => {$(
        impl ToColumn for $t {
            const TYPE: ColumnType = ColumnType::Int;
            fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
                i64::try_from(*self)
                    .map(ColumnValue::Int)
                    .map_err(|_| ColumnProblem::OutOfRange { value: self.to_string() })
            }
        }
    )*};
}
wide_int_columns!(u64, usize, isize, i128, u128);

impl ToColumn for f64 {
    const TYPE: ColumnType = ColumnType::Float;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        Ok(ColumnValue::Float(*self))
    }
}

impl ToColumn for f32 {
    const TYPE: ColumnType = ColumnType::Float;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        Ok(ColumnValue::Float(f64::from(*self)))
    }
}

impl ToColumn for bool {
    const TYPE: ColumnType = ColumnType::Bool;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        Ok(ColumnValue::Bool(*self))
    }
}

impl ToColumn for str {
    const TYPE: ColumnType = ColumnType::Text;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        if self.contains('\0') {
            return Err(ColumnProblem::NulInText);
        }
        Ok(ColumnValue::Text(self.to_owned()))
    }
}

impl ToColumn for String {
    const TYPE: ColumnType = ColumnType::Text;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        self.as_str().to_column()
    }
}

impl ToColumn for [u8] {
    const TYPE: ColumnType = ColumnType::Bytes;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        Ok(ColumnValue::Bytes(self.to_vec()))
    }
}

impl ToColumn for Vec<u8> {
    const TYPE: ColumnType = ColumnType::Bytes;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        self.as_slice().to_column()
    }
}

#[cfg(feature = "uuid")]
impl ToColumn for uuid::Uuid {
    const TYPE: ColumnType = ColumnType::Uuid;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        Ok(ColumnValue::Uuid(*self))
    }
}

impl<T: ToColumn> ToColumn for Option<T> {
    const TYPE: ColumnType = T::TYPE;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        match self {
            Some(value) => value.to_column(),
            None => Ok(ColumnValue::Null(T::TYPE)),
        }
    }
}

impl<T: ToColumn + ?Sized> ToColumn for &T {
    const TYPE: ColumnType = T::TYPE;
    fn to_column(&self) -> Result<ColumnValue, ColumnProblem> {
        (**self).to_column()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_before_binding() {
        assert_eq!(7u8.to_column(), Ok(ColumnValue::Int(7)));
        assert_eq!(
            u64::MAX.to_column(),
            Err(ColumnProblem::OutOfRange {
                value: u64::MAX.to_string()
            })
        );
        assert_eq!("a\0b".to_column(), Err(ColumnProblem::NulInText));
        assert_eq!(
            None::<String>.to_column(),
            Ok(ColumnValue::Null(ColumnType::Text))
        );
        assert_eq!(Some(&1.5f64).to_column(), Ok(ColumnValue::Float(1.5)));
    }
}
