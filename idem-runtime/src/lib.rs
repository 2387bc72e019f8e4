//! Runtime of [idem](https://docs.rs/idem): outcomes, errors, backends and the transition
//! engine. Depend on the `idem` crate, which re-exports this one with the macros.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Layers (see `work`'s module docs; checked by tests/layers.rs): `work`, `backend`,
// `machine`, `value`, `schema`, `error` and `fault` name none of the stages `transition`,
// `inbox`, `outbox`, `cache` and `http`, which sit on them.
mod backend;
#[cfg(feature = "redis")]
pub mod cache;
#[cfg(feature = "console")]
pub mod console;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault;
#[cfg(feature = "http")]
pub mod http;
pub mod inbox;
pub mod lease;
mod machine;
pub mod outbox;
pub mod reconcile;
#[cfg(feature = "schedule")]
pub mod schedule;
mod schema;
#[cfg(feature = "testing")]
pub mod testing;
mod transition;
mod value;
mod work;

#[cfg(feature = "postgres")]
pub use backend::refuse_standby;
#[cfg(feature = "sqlite")]
pub use backend::sqlite_options;
pub use backend::{
    Backend, Dialect, PostgresStatements, is_conflict_source, is_transient, set_postgres_statements,
};
pub use error::{Error, RowProblem};
pub use inbox::delivery::{Consumed, ConsumedTransition};
pub use machine::definition::{Definition, Machine};
pub use machine::enforce::enforce;
pub use machine::results::create_results_table;
pub use machine::sql::{MachineSql, Statements};
pub use machine::verify::{SchemaReport, verify};
pub use schema::migrate;
pub use schema::tables::{
    ColumnRole, DEFAULT_RESULTS_TABLE, Migration, SchemaProblem, TablesReport, check_tables,
    existing_tables,
};
pub use transition::classification::{Classification, set_postgres_classification};
pub use transition::creation::{Created, Creation};
pub use transition::declared::{Transition, TransitionError};
pub use transition::outcome::{Handled, Outcome, OutcomeKind, Refusal};
pub use transition::plan::run;
pub use transition::stage::CallKey;
pub use value::column::{ColumnProblem, ColumnType, ColumnValue, ToColumn};
pub use value::key::{
    CompositeKey, Key, KeyError, MAX_KEY_LEN, MAX_KEY_TEXT_LEN, ToKey, ToVersion, ToWatermark,
};
pub use work::observe::{Labels, set_trace_keys};
pub use work::retry::{retry, retry_when};
pub use work::source::Source;
pub use work::stored::{Fallible, MAX_RESULT_LEN, Storable};

/// Glue for the code `#[idempotent]` and `#[derive(StateMachine)]` generate. Not a
/// public API: names and signatures change without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::backend::Dialect;
    pub use crate::inbox::{AsInbox, AsMessageKey, ConsumerTransitionPlan, InboxPlan, InboxStage};
    pub use crate::machine::reference::{MachineRef, machine, machine_of_impl, picture};
    pub use crate::transition::creation::CreationPlan;
    pub use crate::transition::declared::{creation_error, state_index};
    pub use crate::transition::plan::TransitionPlan;
    pub use crate::transition::set::{SetColumns, column_error};
    pub use crate::transition::stage::TransitionStage;
    pub use crate::work::source::{Origin, PoolOf};
    pub use crate::work::statement::{NoDatabaseInTheBody, statement};
    pub use crate::work::stored::{Codec, codec};
    pub use crate::work::unit::{Begun, Entered, Held, Kept, Plan, Work, begin, begin_in, start};
    pub use core::convert::AsRef;
    pub use idem_sql::transition::{Assignment, SetTo};
    pub use sqlx::Pool;

    /// Fixes the output type of the handler's body, so `?` inside it converts errors into
    /// the handler's declared error type.
    pub fn body<R, F: core::future::Future<Output = R>>(body: F) -> F {
        body
    }
    pub use crate::transition::declared::{key_error, resolve, state_error, transition_error};
    pub use crate::value::key::composite_key;
    pub use core::option::Option::{None, Some};
    pub use core::panic;
    pub use core::result::Result;
    pub use sqlx::Transaction;
}
