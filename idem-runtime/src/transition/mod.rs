//! Transitions: a handler's transition resolved at compile time, the stage that moves one
//! row with a conditional UPDATE (or creates it) and classifies a miss, the plans of
//! transition and creation handlers, and what they reply.

pub(crate) mod classification;
pub(crate) mod classify;
pub(crate) mod creation;
pub(crate) mod declared;
pub(crate) mod outcome;
pub(crate) mod params;
pub(crate) mod plan;
pub(crate) mod set;
pub(crate) mod stage;
