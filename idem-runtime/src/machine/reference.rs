//! A machine as the code `#[derive(StateMachine)]` and `#[idempotent]` generate refers to
//! it: a [`MachineRef`] carries the bound `M: Machine`, checked once where the macro builds
//! it (spanned at the user's token), so the rest of the generated code needs no bound and a
//! mistake produces one error, not one per use; and the machine's picture.

use crate::machine::definition::{Definition, Machine};

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
