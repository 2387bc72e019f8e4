//! Runtime of [idem](https://docs.rs/idem): outcomes, errors, backends and the transition
//! engine. Depend on the `idem` crate, which re-exports this one with the macros.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod classification;
mod classify;
mod column;
mod conflict;
mod creation;
mod enforce;
mod engine;
mod error;
mod fallible;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault;
mod glue;
mod hex;
#[cfg(feature = "http")]
pub mod http;
pub mod inbox;
mod key;
mod machine;
mod observe;
mod outcome;
mod retry;
mod schema;
mod sql;
mod statement;
mod stored;
#[cfg(feature = "testing")]
pub mod testing;
mod transition;
mod verify;
mod work;

#[cfg(feature = "sqlite")]
pub use backend::sqlite_options;
pub use backend::{Backend, Dialect, is_transient};
pub use classification::{Classification, set_postgres_classification};
pub use column::{ColumnProblem, ColumnType, ColumnValue, ToColumn};
pub use conflict::is_conflict_source;
pub use creation::Creation;
pub use enforce::enforce;
pub use engine::{CallKey, run};
pub use error::{Error, RowProblem};
pub use fallible::{Consumed, ConsumedTransition, Created, Fallible, Handled};
pub use glue::Storable;
pub use inbox::migrate;
pub use key::{
    CompositeKey, Key, KeyError, MAX_KEY_LEN, MAX_KEY_TEXT_LEN, ToKey, ToVersion, ToWatermark,
};
pub use machine::{Definition, Machine};
pub use observe::{Labels, set_trace_keys};
pub use outcome::{Outcome, OutcomeKind, Refusal};
pub use retry::{retry, retry_when};
pub use schema::create_results_table;
pub use sql::{MachineSql, Statements};
pub use stored::MAX_RESULT_LEN;
pub use transition::{Transition, TransitionError};
pub use verify::{ColumnRole, SchemaProblem, SchemaReport, verify};
pub use work::Source;

/// Glue for the code `#[idempotent]` and `#[derive(StateMachine)]` generate. Not a
/// public API: names and signatures change without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::backend::Dialect;
    pub use crate::column::{SetColumns, column_error};
    pub use crate::creation::CreationPlan;
    pub use crate::engine::{TransitionPlan, TransitionStage};
    pub use crate::glue::{
        Codec, MachineRef, NoDatabaseInTheBody, PoolOf, codec, machine, machine_of_impl, picture,
    };
    pub use crate::inbox::{AsInbox, AsMessageKey, ConsumerTransitionPlan, InboxPlan, InboxStage};
    pub use crate::statement::statement;
    pub use crate::transition::{creation_error, state_index};
    pub use crate::work::{
        Begun, Entered, Held, Origin, Plan, Staged, Work, begin, begin_in, start,
    };
    pub use core::convert::AsRef;
    pub use idem_sql::transition::{Assignment, SetTo};
    pub use sqlx::Pool;

    /// Fixes the output type of the handler's body, so `?` inside it converts errors into
    /// the handler's declared error type.
    pub fn body<R, F: core::future::Future<Output = R>>(body: F) -> F {
        body
    }
    pub use crate::key::composite_key;
    pub use crate::transition::{key_error, resolve, state_error, transition_error};
    pub use core::option::Option::{None, Some};
    pub use core::panic;
    pub use core::result::Result;
    pub use sqlx::Transaction;
}
