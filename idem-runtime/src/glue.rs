//! Values that carry a trait bound, checked once where the macro builds them (spanned at
//! the user's token), so the rest of the generated code needs no bound and a mistake
//! produces one error, not one per use.

use crate::fallible::Fallible;
use crate::machine::definition::{Definition, Machine};
use serde::Serialize;
use serde::de::DeserializeOwned;

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

/// The machine of a handler without `machine = …`: the type of its `impl` (`Self`), which
/// must be a state machine. Its own trait, so that the error says how to fix that.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idem state machine, and this handler names no `machine`",
    label = "without `machine = …`, `#[idempotent]` moves the type of the handler's `impl`: `{Self}`",
    note = "name the machine, `#[idempotent(machine = Order, …)]`, or make `{Self}` one: `#[derive(idem::StateMachine)] #[machine(table = \"…\", key = \"…\")]`"
)]
pub trait MachineOfImpl: Machine {}

impl<M: Machine> MachineOfImpl for M {}

/// [`machine`] for a handler that names no machine: `M` is `Self`.
pub const fn machine_of_impl<M: MachineOfImpl>() -> MachineRef<M> {
    machine::<M>()
}

/// A machine's picture, as the derive drew it. A call rather than the literal, so that
/// rustdoc does not print the whole SVG source as the constant's value.
pub const fn picture(svg: &'static str) -> &'static str {
    svg
}

/// The database of a pool type (`PgPool` → `Postgres`): how a handler whose first
/// parameter is a pool, under whatever alias, learns its backend.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a pool of a database idem runs on",
    label = "the first parameter of a handler is `&mut Transaction<'_, DB>` or `&Pool<DB>`",
    note = "DB is one of `Sqlite`, `Postgres`, `Any`: `&SqlitePool`, `&PgPool`, `&AnyPool`"
)]
pub trait PoolOf {
    /// The pool's database.
    type Database: crate::Backend;
}

impl<DB: crate::Backend> PoolOf for sqlx::Pool<DB> {
    type Database = DB;
}

/// What the name of a one-statement handler's pool means inside its body: nothing. The
/// body runs before any statement, outside any transaction, so it has no database to use
/// (take a transaction parameter instead, `&mut Transaction<'_, DB>`, for a body that
/// writes).
#[derive(Debug, Clone, Copy)]
pub struct NoDatabaseInTheBody;

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
