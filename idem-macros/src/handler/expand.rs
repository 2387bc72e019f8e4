//! The code `#[idempotent]` generates: the user's function, with the transaction
//! parameter turned into the pool transactions come from, the transition attempted first,
//! the body (as an async block) run only if the row moved, and compile-time checks of the
//! transition spanned at the user's tokens.

use super::args::Args;
use super::signature::Handler;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, parse_quote, parse_quote_spanned};

pub fn expand(
    args: &Args,
    handler: &Handler,
    output: &syn::Type,
    function: &ItemFn,
) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let Args {
        machine,
        from,
        to,
        key,
        version,
    } = args;
    let Handler {
        tx,
        tx_type,
        database,
        ..
    } = handler;

    let mut outer = sig.clone();
    for input in outer.inputs.iter_mut() {
        if let FnArg::Typed(param) = input
            && matches!(&*param.pat, syn::Pat::Ident(p) if p.ident == *tx)
        {
            *param.ty = parse_quote!(&::idem::__private::Pool<#database>);
            break;
        }
    }
    // Spanned at the user's return type: a type that is not a `Result` is reported there.
    outer.output = parse_quote_spanned!(output.span()=> -> ::idem::Handled<#output, #machine>);

    // `machine = …` must name a state machine and the result must be storable: each bound
    // is required once, on the user's token, so a mistake is one error, not one per use.
    let machine_ref = quote_spanned! {machine.span()=>
        const __IDEM_MACHINE: ::idem::__private::MachineRef<#machine> =
            ::idem::__private::machine::<#machine>();
    };
    let codec = quote_spanned! {output.span()=>
        const __IDEM_CODEC: ::idem::__private::Codec<<#output as ::idem::Fallible>::Ok> =
            ::idem::__private::codec::<#output>();
    };
    // Each check is its own constant so that every mistake is reported, each on its token.
    let check_from = state_check(from);
    let check_to = state_check(to);
    let check_transition = quote_spanned! {to.span()=>
        const _: () = if let ::idem::__private::Some(message) =
            ::idem::__private::transition_error(__IDEM_MACHINE.definition(), #from, #to)
        {
            ::core::panic!("{}", message.as_str())
        };
    };
    let into_result = quote_spanned!(output.span()=> ::idem::Fallible::into_result);

    let key_ident = Ident::new(&key.value(), key.span());
    let key_expr = quote_spanned! {key.span()=>
        ::idem::CallKey::from(::idem::ToKey::to_key(&#key_ident))
    };
    let version_expr = match version {
        Some(v) => {
            let ident = Ident::new(&v.value(), v.span());
            quote_spanned!(v.span()=> ::idem::ToVersion::to_version(&#ident))
        }
        None => quote!(::idem::__private::None),
    };
    let doc = handler_doc(args, handler);
    // The expansion's locals are invisible to the body (mixed-site hygiene), so a user
    // parameter named like one of them is not shadowed.
    let [key_local, version_local, applying, result] = [
        "__idem_key",
        "__idem_version",
        "__idem_applying",
        "__idem_result",
    ]
    .map(|name| Ident::new(name, Span::mixed_site()));

    quote! {
        #(#attrs)*
        #[doc = ""]
        #[doc = #doc]
        #vis #outer {
            #machine_ref
            #codec
            #check_from
            #check_to
            #check_transition
            const __IDEM_TRANSITION: ::idem::Transition =
                ::idem::__private::resolve(__IDEM_MACHINE.definition(), #from, #to);
            let #key_local = #key_expr;
            let #version_local = #version_expr;
            let mut #applying = match ::idem::__private::begin(
                __IDEM_MACHINE,
                __IDEM_CODEC,
                #tx,
                __IDEM_TRANSITION,
                #key_local,
                #version_local,
            )
            .await
            {
                ::idem::__private::Begun::Apply(applying) => applying,
                ::idem::__private::Begun::Done(done) => return done,
            };
            // The body, as written, in the transition's transaction.
            let #result = {
                let #tx: #tx_type = #applying.transaction();
                ::idem::__private::body::<#output, _>(async move #block).await
            };
            #applying.finish(__IDEM_CODEC, #into_result(#result)).await
        }
    }
}

fn state_check(state: &syn::LitStr) -> TokenStream {
    quote_spanned! {state.span()=>
        const _: () = if let ::idem::__private::Some(message) =
            ::idem::__private::state_error(__IDEM_MACHINE.definition(), #state)
        {
            ::core::panic!("{}", message.as_str())
        };
    }
}

fn handler_doc(args: &Args, handler: &Handler) -> String {
    let machine = args
        .machine
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    let machine = if args.machine.leading_colon.is_some() {
        format!("::{machine}")
    } else {
        machine
    };
    let (from, to, key) = (args.from.value(), args.to.value(), args.key.value());
    let guard = match &args.version {
        Some(v) => format!(
            " and, when `{}` is given, the guard `version = {}`",
            v.value(),
            v.value()
        ),
        None => String::new(),
    };
    format!(
        "# Idempotent transition `{from}` → `{to}`\n\n\
         Generated by `#[idempotent]` for the state machine [`{machine}`]. The row is the one whose key is \
         `{key}`. One transaction (from the pool `{tx}`) runs the conditional UPDATE \
         ([`{machine}::IDEM_SQL`]) with `$1 = {key}`, `$2 = '{from}'`, `$3 = '{to}'`{guard}; \
         then, only if it moved the row, this function's body; then stores the body's result; \
         then commits. The result reaches the caller only after the commit.\n\n\
         Returns [`Outcome::Applied`](::idem::Outcome::Applied) with the body's result, \
         [`Outcome::AlreadyDone`](::idem::Outcome::AlreadyDone) with the first result for a \
         duplicate, [`Outcome::IllegalState`](::idem::Outcome::IllegalState), \
         [`Outcome::NotFound`](::idem::Outcome::NotFound) or \
         [`Outcome::StaleVersion`](::idem::Outcome::StaleVersion); an error from the body rolls \
         everything back and comes back as [`Error::Handler`](::idem::Error::Handler).",
        tx = handler.tx,
    )
}
