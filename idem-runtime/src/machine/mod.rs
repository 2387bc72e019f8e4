//! The declared state machine and its tables: the definition the derive produces, its SQL
//! per backend, and what idem installs and checks in a database (the results table, the
//! enforcement, [`verify`](crate::verify)).

pub(crate) mod definition;
pub(crate) mod enforce;
pub(crate) mod reference;
pub(crate) mod results;
pub(crate) mod sql;
pub(crate) mod verify;
