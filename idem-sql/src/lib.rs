//! The SQL of [idem](https://docs.rs/idem): how each backend spells the statements of a
//! state machine's transitions.
//!
//! One builder, used in two places: `#[derive(StateMachine)]` runs it at compile time for
//! the machine's own statements (the constants on `idem::Statements`), and the runtime runs
//! it once per handler that sets columns in its transition (`set(…)`), with those columns.
//! So a statement idem runs is spelled in one place, whichever of the two built it.
//!
//! Identifiers are validated before they get here ([`ident`]) and are quoted; every value
//! is a bound parameter. [`dialect`] is what each backend is called, how it begins a write
//! transaction and what its error codes mean. [`limits`] is how long a stored value may be.
//! [`spelling`] finds the declared name nearest
//! to a misspelled one, for the compile errors of the macros and the runtime's checks.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cache;
pub mod catalog;
pub mod dialect;
pub mod enforce;
pub mod ident;
pub mod inbox;
pub mod lease;
pub mod limits;
pub mod outbox;
pub mod partition;
pub mod placeholder;
pub mod reconcile;
pub mod spelling;
pub mod transition;
