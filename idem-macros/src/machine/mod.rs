//! `#[derive(StateMachine)]`: parse → check → expand.

mod ast;
mod check;
mod expand;
mod graph;

use crate::ctxt::{Ctxt, with_fallback};
use proc_macro2::TokenStream;

/// The derive over `proc_macro2`, callable from tests.
pub fn derive_inner(input: TokenStream) -> TokenStream {
    let input = match syn::parse2::<syn::DeriveInput>(input) {
        Ok(input) => input,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Ctxt::new();
    let machine = ast::Machine::parse(&mut cx, &input);
    let checked = machine.and_then(|m| check::check(&mut cx, m));
    match (cx.check(), checked) {
        (Ok(()), Some(checked)) => expand::expand(&checked),
        (Err(e), _) => with_fallback(e, expand::fallback(&input)),
        (Ok(()), None) => unreachable!("a failed check records an error"),
    }
}
