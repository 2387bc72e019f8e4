//! Procedural macros of [idem](https://docs.rs/idem). Use them through the `idem` crate,
//! which documents them: `#[derive(idem::StateMachine)]` and `#[idem::idempotent]`.
//!
//! Each entry point calls an `*_inner` function over `proc_macro2` (parse → validate →
//! expand); every error is reported at once, on the token that is wrong.

mod ctxt;
mod handler;
mod ident;
mod machine;
mod sql;

use proc_macro::TokenStream;

/// Declares a state machine on an enum of states. See the `idem` crate.
#[proc_macro_derive(StateMachine, attributes(machine, state))]
pub fn derive_state_machine(input: TokenStream) -> TokenStream {
    machine::derive_inner(input.into()).into()
}

/// Makes an `async fn` an idempotent state transition. See the `idem` crate.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::idempotent_inner(args.into(), item.into()).into()
}
