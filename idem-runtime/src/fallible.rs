//! The handler's return type, seen as a `Result`.

use crate::error::Error;
use crate::inbox::Delivery;
use crate::transition::creation::Creation;
use crate::transition::outcome::{Outcome, Refusal};

/// The return type of an `#[idempotent]` handler whose body returns `R`
/// (`Result<T, E>`): `Result<Outcome<T, M>, Error<E>>`.
pub type Handled<R, M> = Result<Outcome<<R as Fallible>::Ok, M>, Error<<R as Fallible>::Err>>;

/// What a creation handler (`create = "…"`) returns: `Result<Creation<T, M>, Error<E>>`
/// for a body returning `Result<T, E>`.
pub type Created<R, M> = Result<Creation<<R as Fallible>::Ok, M>, Error<<R as Fallible>::Err>>;

/// The return type of an `#[idempotent]` message handler (`inbox`, `message`, `payload`)
/// whose body returns `R` (`Result<T, E>`): `Result<Delivery<T>, Error<E>>`.
pub type Consumed<R> = Result<Delivery<<R as Fallible>::Ok>, Error<<R as Fallible>::Err>>;

/// The return type of an `#[idempotent]` handler that is both a message handler and a
/// transition of machine `M`: `Result<Delivery<T, Refusal<M>>, Error<E>>`.
///
/// [`Delivery::Processed`] when this delivery moved the row and ran the body;
/// [`Delivery::Duplicate`] with the transition's first result when the message, or the
/// transition, was done before; [`Delivery::Refused`] when the row is not in the source
/// state (not yet, illegal, not found, stale), with nothing recorded.
pub type ConsumedTransition<R, M> =
    Result<Delivery<<R as Fallible>::Ok, Refusal<M>>, Error<<R as Fallible>::Err>>;

/// A `Result`, seen through its success and error types; lets [`Handled`] accept a
/// handler's return type written as any alias of `Result`.
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
