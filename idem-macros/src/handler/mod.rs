//! `#[idempotent(...)]` on an `async fn`: parse → check → expand.

mod args;
mod check;
mod expand;
mod signature;

use crate::ctxt::{Ctxt, with_fallback};
use proc_macro2::TokenStream;

/// The attribute over `proc_macro2`, callable from tests.
pub fn idempotent_inner(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let e = syn::Error::new_spanned(
                &item,
                "#[idempotent] goes on an `async fn` handler; this is not a function",
            );
            return with_fallback(e, item);
        }
    };
    let mut cx = Ctxt::new();
    let args = args::Args::parse(&mut cx, args);
    let form = args.as_ref().and_then(|args| check::form(&mut cx, args));
    let signature = signature::Handler::parse(&mut cx, &function);
    if let (Some(args), Some(form), Some(signature)) = (&args, &form, &signature) {
        check::parameters(&mut cx, args, form, signature);
    }
    match (cx.check(), form, signature) {
        (Ok(()), Some(form), Some(signature)) => {
            let output = signature
                .output
                .clone()
                .expect("a missing output records an error");
            expand::expand(&form, &signature, &output, &function)
        }
        // Keep the user's function so the IDE and the rest of the crate still see it. Its
        // key parameter is used only by the expansion: no "unused variable" on top of the error.
        (Err(e), _, _) => with_fallback(e, quote::quote!(#[allow(unused_variables)] #function)),
        (Ok(()), _, _) => unreachable!("a failed parse records an error"),
    }
}
