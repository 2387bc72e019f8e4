//! The unit of work every call runs as (begin → stages → body → finish), and what it is
//! made of: the conflict retry, the span and counters, the stored first results, and the
//! one-statement form of a handler without a transaction.
//!
//! # Layers
//!
//! The stages (`transition/`, `inbox/`, `outbox/`, `cache/`, `http/`) sit on this module
//! and name it; this module, and everything below it (`backend/`, `machine/`, `value/`,
//! `schema/`, `error.rs`, `fault.rs`), names no stage. What every stage needs is defined
//! here or below: the call's scope and the keys derived in it (`effect`), what a stage
//! found when another call took its key at the commit (`unit::Lost`, which carries it
//! without knowing its type), the store of first results and which pool has one
//! (`fast`, where the cache registers itself), idem's tables and migrations (`schema`).
//! A new stage, or a new source of calls (a broker's consumer, a scheduler), adds its
//! module on top and changes nothing here. `idem-runtime/tests/layers.rs` fails on a path
//! from a lower layer into a stage.

pub(crate) mod effect;
pub(crate) mod fast;
pub(crate) mod observe;
pub(crate) mod retry;
pub(crate) mod source;
pub(crate) mod statement;
pub(crate) mod stored;
pub(crate) mod unit;
pub(crate) mod unwind;
