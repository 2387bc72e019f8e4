//! A body's result as idem stores it and replays it: seen as a `Result` ([`Fallible`]),
//! encoded as JSON ([`Codec`], one bound, [`Storable`]), bounded in size, and decoded for a
//! duplicate.

use crate::error::Error;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest first result idem stores, in bytes of JSON (1 MiB). A larger result is
/// refused with [`Error::ResultTooLarge`] before anything commits: first results are
/// replayed to every duplicate, so keep them small (an id, a receipt) and keep large data
/// in tables of your own.
pub const MAX_RESULT_LEN: usize = 1 << 20;

/// `json`, if it fits under [`MAX_RESULT_LEN`].
pub(crate) fn bounded<E>(json: String) -> Result<String, Error<E>> {
    if json.len() > MAX_RESULT_LEN {
        return Err(Error::ResultTooLarge {
            len: json.len(),
            max: MAX_RESULT_LEN,
        });
    }
    Ok(json)
}

/// A `Result`, seen through its success and error types; lets [`Handled`](crate::Handled)
/// accept a handler's return type written as any alias of `Result`.
#[diagnostic::on_unimplemented(
    message = "an idempotent handler must return `Result<T, E>`, not `{Self}`",
    label = "the body's error rolls the transition back, so it must be able to fail",
    note = "return `Result<(), E>` if the body has no result to replay"
)]
pub trait Fallible {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
    /// The value as a `Result`.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<T, E> Fallible for Result<T, E> {
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Result<T, E> {
        self
    }
}

/// How a handler's result is stored and replayed.
pub struct Codec<T> {
    pub(crate) encode: fn(&T) -> serde_json::Result<String>,
    pub(crate) decode: fn(&str) -> serde_json::Result<T>,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Codec<T> {}

/// A handler's result type, which idem stores as JSON and replays to duplicates: any type
/// that is `serde::Serialize + serde::Deserialize` (implemented for all of them; do not
/// implement it yourself). One bound, so that a result type that is
/// neither gets one error, in these words.
#[diagnostic::on_unimplemented(
    message = "the result type `{Self}` cannot be stored and replayed to duplicates",
    label = "idem stores the first result as JSON and replays it, so it must be `Serialize` and `Deserialize`",
    note = "derive both on it: `#[derive(serde::Serialize, serde::Deserialize)]`; return `Result<(), E>` if there is nothing to replay"
)]
pub trait Storable: Sized {
    /// How idem stores and replays it (generated code only).
    #[doc(hidden)]
    const CODEC: Codec<Self>;
}

// Not recommended in errors: a type that is neither gets one error, about `Storable`,
// instead of one per serde trait.
#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> Storable for T {
    const CODEC: Codec<T> = Codec {
        encode: encode::<T>,
        decode: decode::<T>,
    };
}

/// The codec of the success type of `R`; the only place generated code requires the
/// result to be storable.
pub const fn codec<R>() -> Codec<R::Ok>
where
    R: Fallible,
    R::Ok: Storable,
{
    <R::Ok as Storable>::CODEC
}

fn encode<T: Serialize>(value: &T) -> serde_json::Result<String> {
    serde_json::to_string(value)
}

fn decode<T: DeserializeOwned>(json: &str) -> serde_json::Result<T> {
    serde_json::from_str(json)
}

/// The first result, decoded; `None` when nothing was stored (no result was recorded for
/// this transition, or it serialized to `null`, or retention removed it).
pub(crate) fn replay<T, E>(codec: Codec<T>, stored: Option<String>) -> Result<Option<T>, Error<E>> {
    stored
        .map(|json| (codec.decode)(&json).map_err(Error::Result))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_up_to_the_limit_are_stored() {
        let fits = "x".repeat(MAX_RESULT_LEN);
        assert_eq!(bounded::<()>(fits.clone()).unwrap(), fits);
        match bounded::<()>("x".repeat(MAX_RESULT_LEN + 1)) {
            Err(Error::ResultTooLarge { len, max }) => {
                assert_eq!((len, max), (MAX_RESULT_LEN + 1, MAX_RESULT_LEN));
            }
            other => panic!("{other:?}"),
        }
    }
}
