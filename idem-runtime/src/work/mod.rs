//! The unit of work every call runs as (begin → stages → body → finish), and what it is
//! made of: the conflict retry, the span and counters, the stored first results, and the
//! one-statement form of a handler without a transaction.

pub(crate) mod fast;
pub(crate) mod observe;
pub(crate) mod retry;
pub(crate) mod source;
pub(crate) mod statement;
pub(crate) mod stored;
pub(crate) mod unit;
pub(crate) mod unwind;
