//! Values that carry a trait bound, checked once where the macro builds them (spanned at
//! the user's token), so the rest of the generated code needs no bound and a mistake
//! produces one error, not one per use.

use crate::fallible::Fallible;
use crate::machine::{Definition, Machine};
use crate::outcome::Outcome;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A machine's definition and its state decoder.
pub struct MachineRef<M> {
    pub(crate) definition: &'static Definition,
    pub(crate) from_index: fn(usize) -> M,
}

impl<M> Clone for MachineRef<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for MachineRef<M> {}

impl<M> MachineRef<M> {
    /// The definition, for the compile-time checks.
    pub const fn definition(&self) -> &'static Definition {
        self.definition
    }
}

/// The machine `M`; the only place generated code requires `M: Machine`.
pub const fn machine<M: Machine>() -> MachineRef<M> {
    MachineRef {
        definition: M::DEFINITION,
        from_index: M::from_index,
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

/// The codec of the success type of `R`; the only place generated code requires the
/// result to be `Serialize + DeserializeOwned`.
pub const fn codec<R>() -> Codec<R::Ok>
where
    R: Fallible,
    R::Ok: Serialize + DeserializeOwned,
{
    Codec {
        encode: encode::<R::Ok>,
        decode: decode::<R::Ok>,
    }
}

fn encode<T: Serialize>(value: &T) -> serde_json::Result<String> {
    serde_json::to_string(value)
}

fn decode<T: DeserializeOwned>(json: &str) -> serde_json::Result<T> {
    serde_json::from_str(json)
}

/// The codec of a transition's outcome, stored as the result of an inbox delivery when a
/// handler is both a consumer and a transition. States are stored by their names.
pub const fn outcome_codec<R, M>() -> Codec<Outcome<R::Ok, M>>
where
    R: Fallible,
    R::Ok: Serialize + DeserializeOwned,
    M: Machine,
{
    Codec {
        encode: encode_outcome::<R::Ok, M>,
        decode: decode_outcome::<R::Ok, M>,
    }
}

/// [`Outcome`] as stored: states by name.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoredOutcome<T> {
    Applied(T),
    AlreadyDone {
        current: String,
        first_result: Option<T>,
    },
    IllegalState {
        current: String,
        from: String,
        to: String,
    },
    NotFound,
    StaleVersion {
        expected: i64,
        actual: i64,
    },
}

fn encode_outcome<T: Serialize, M: Machine>(outcome: &Outcome<T, M>) -> serde_json::Result<String> {
    let name = |state: &M| state.as_db().to_owned();
    let stored: StoredOutcome<&T> = match outcome {
        Outcome::Applied(result) => StoredOutcome::Applied(result),
        Outcome::AlreadyDone {
            current,
            first_result,
        } => StoredOutcome::AlreadyDone {
            current: name(current),
            first_result: first_result.as_ref(),
        },
        Outcome::IllegalState { current, from, to } => StoredOutcome::IllegalState {
            current: name(current),
            from: name(from),
            to: name(to),
        },
        Outcome::NotFound => StoredOutcome::NotFound,
        Outcome::StaleVersion { expected, actual } => StoredOutcome::StaleVersion {
            expected: *expected,
            actual: *actual,
        },
    };
    serde_json::to_string(&stored)
}

fn decode_outcome<T: DeserializeOwned, M: Machine>(
    json: &str,
) -> serde_json::Result<Outcome<T, M>> {
    let state = |name: String| {
        M::from_db(&name).ok_or_else(|| {
            <serde_json::Error as serde::de::Error>::custom(format!(
                "state {name:?} is not declared by `{}`",
                M::DEFINITION.name
            ))
        })
    };
    Ok(match serde_json::from_str::<StoredOutcome<T>>(json)? {
        StoredOutcome::Applied(result) => Outcome::Applied(result),
        StoredOutcome::AlreadyDone {
            current,
            first_result,
        } => Outcome::AlreadyDone {
            current: state(current)?,
            first_result,
        },
        StoredOutcome::IllegalState { current, from, to } => Outcome::IllegalState {
            current: state(current)?,
            from: state(from)?,
            to: state(to)?,
        },
        StoredOutcome::NotFound => Outcome::NotFound,
        StoredOutcome::StaleVersion { expected, actual } => {
            Outcome::StaleVersion { expected, actual }
        }
    })
}
