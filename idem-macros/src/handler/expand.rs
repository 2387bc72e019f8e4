//! The code `#[idempotent]` generates: the user's function, with the transaction
//! parameter turned into the pool transactions come from, the transition attempted first,
//! the body (as an async block) run only if the row moved, and compile-time checks of the
//! transition spanned at the user's tokens.

use super::args::{SetColumn, SetValue};
use super::check::{Creation, Form, Guard, Inbox, MachineName, Transition};
use super::signature::Handler;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, parse_quote_spanned};

pub fn expand(
    form: &Form,
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
            // A pool (idem begins and commits) or the caller's transaction (a savepoint).
            // Spanned at the user's type: a first parameter that is no pool is reported there.
            let span = param.ty.span();
            *param.ty = parse_quote_spanned!(span=> impl ::idem::Source<'_, #database>);
            break;
        }
    }
    // Spanned at the user's return type: a type that is not a `Result` is reported there.
    outer.output = match form {
        Form::Transition(t) => {
            let machine = &t.machine;
            parse_quote_spanned!(output.span()=> -> ::idem::Handled<#output, #machine>)
        }
        Form::Creation(c) => {
            let machine = &c.machine;
            parse_quote_spanned!(output.span()=> -> ::idem::Created<#output, #machine>)
        }
        Form::Message(_) => parse_quote_spanned!(output.span()=> -> ::idem::Consumed<#output>),
        Form::ConsumerTransition(_, t) => {
            let machine = &t.machine;
            parse_quote_spanned!(output.span()=> -> ::idem::ConsumedTransition<#output, #machine>)
        }
    };

    // The result must be storable: required once, on the user's return type.
    let codec = quote_spanned! {output.span()=>
        <<#output as ::idem::Fallible>::Ok as ::idem::Storable>::CODEC
    };
    let into_result = quote_spanned!(output.span()=> ::idem::Fallible::into_result);
    // The expansion's locals are invisible to the body (mixed-site hygiene), so a user
    // parameter named like one of them is not shadowed.
    let [plan, work, result, held] = ["__idem_plan", "__idem_work", "__idem_result", "__idem_held"]
        .map(|name| Ident::new(name, Span::mixed_site()));
    let doc = handler_doc(form, handler);

    // The stages of the unit of work, before the body.
    let (checks, make_plan) = match form {
        Form::Transition(t) => {
            let (checks, stage) = transition_checks(t, handler);
            let make = quote!(::idem::__private::TransitionPlan::new(#stage, #codec));
            (checks, make)
        }
        Form::Creation(c) => creation_checks(c, handler, &codec),
        Form::Message(i) => {
            let stage = inbox_stage(i);
            let make = quote!(::idem::__private::InboxPlan::new(#stage, #codec));
            (TokenStream::new(), make)
        }
        Form::ConsumerTransition(i, t) => {
            let (checks, transition) = transition_checks(t, handler);
            let stage = inbox_stage(i);
            let make = quote! {
                ::idem::__private::ConsumerTransitionPlan::new(#stage, #transition, #codec)
            };
            (checks, make)
        }
    };

    let Some(tx_type) = tx_type else {
        // The one-statement form: no transaction, the body first, then one statement.
        let origin = Ident::new("__idem_origin", Span::mixed_site());
        return quote! {
            #(#attrs)*
            #[doc = ""]
            #[doc = #doc]
            #vis #outer {
                #checks
                let #plan = #make_plan;
                let #origin = ::idem::Source::origin(#tx);
                // The body has no database: the pool's name means nothing in it.
                #[allow(unused_variables)]
                let #tx = ::idem::__private::NoDatabaseInTheBody;
                ::idem::__private::statement(#origin, #plan, async move {
                    #into_result(::idem::__private::body::<#output, _>(async move #block).await)
                })
                .await
            }
        };
    };
    quote! {
        #(#attrs)*
        #[doc = ""]
        #[doc = #doc]
        #vis #outer {
            #checks
            let #plan = #make_plan;
            let mut #work = match ::idem::__private::start(::idem::Source::origin(#tx), &#plan).await {
                ::idem::__private::Begun::Run(work) => work,
                ::idem::__private::Begun::Done(done) => {
                    return done.map_err(::idem::Error::widen);
                }
            };
            let #result = {
                let #held = #work.held();
                let #tx: #tx_type = #work.transaction();
                #held.run_unwound(::idem::__private::body::<#output, _>(async move #block)).await
            };
            #work.finish_unwound(&#plan, #result.map(#into_result)).await
        }
    }
}

/// The compile-time checks of a transition, its stage (`TransitionStage::new(…)`, with the
/// key, the expected version, the watermark) and the columns it sets (`.set(…)`, or
/// nothing).
fn transition_checks(t: &Transition, handler: &Handler) -> (TokenStream, TokenStream) {
    let Transition {
        machine,
        from,
        to,
        key,
        guard,
        set,
    } = t;
    let machine = machine_ref(machine);
    let definition = quote!(#machine.definition());
    // Each check is its own constant so that every mistake is reported, each on its token.
    let check_from = state_check(&definition, from);
    let check_to = state_check(&definition, to);
    // An event that keeps the state (`from == to`, with a watermark) is no transition of
    // the machine's graph: it needs no declared edge.
    let keeps_state = matches!(guard, Guard::Watermark(_)) && from.value() == to.value();
    let check_transition = if keeps_state {
        TokenStream::new()
    } else {
        check(
            to.span(),
            quote!(::idem::__private::transition_error(#definition, #from, #to)),
        )
    };
    let param_type = |name: &syn::LitStr| param_type(handler, name);
    let (check_key, key_expr) = key_checks(&definition, key, &param_type);
    let version_expr = match guard {
        Guard::Version(v) => {
            let ident = Ident::new(&v.value(), v.span());
            match param_type(v) {
                Some(ty) => quote_spanned! {ty.span()=>
                    <#ty as ::idem::ToVersion>::to_version(&#ident)
                },
                None => quote_spanned!(v.span()=> ::idem::ToVersion::to_version(&#ident)),
            }
        }
        Guard::None | Guard::Watermark(_) => quote!(::idem::__private::None),
    };
    let (check_set, mut set_call) = set_columns(&definition, set, &param_type);
    if let Guard::Watermark(w) = guard {
        let ident = Ident::new(&w.value(), w.span());
        let value = match param_type(w) {
            Some(ty) => quote_spanned! {ty.span()=>
                <#ty as ::idem::ToWatermark>::to_watermark(&#ident)
            },
            None => quote_spanned!(w.span()=> ::idem::ToWatermark::to_watermark(&#ident)),
        };
        set_call.extend(quote!(.watermark(#value)));
    }
    let checks = quote! {
        #check_from
        #check_to
        #check_transition
        #check_key
        #check_set
    };
    let stage = quote! {
        ::idem::__private::TransitionStage::new(
            #machine,
            const { ::idem::__private::resolve(#definition, #from, #to) },
            #key_expr,
            #version_expr,
        )#set_call
    };
    (checks, stage)
}

/// The machine, as a value: `machine = …` must name a state machine, and without it the
/// type of the handler's `impl` must be one. Every use is spanned at the same token, so
/// that a type that is no machine is reported once, there.
fn machine_ref(machine: &MachineName) -> TokenStream {
    match machine {
        MachineName::Named(path) => quote_spanned! {path.span()=>
            ::idem::__private::machine::<#path>()
        },
        MachineName::OfImpl(span) => quote_spanned! {*span=>
            ::idem::__private::machine_of_impl::<#machine>()
        },
    }
}

/// One compile-time check: `error`, an `Option` of a message, evaluated in a constant that
/// fails the build with the message, spanned at `span` (the user's token). An array
/// length, so that it is evaluated when the handler is type-checked (`cargo check` too) and
/// may name `Self`, which an item inside the function may not.
fn check(span: Span, error: TokenStream) -> TokenStream {
    quote_spanned! {span=>
        let _: [(); {
            if let ::idem::__private::Some(message) = #error {
                ::core::panic!("{}", message.as_str())
            }
            0
        }];
    }
}

/// The type of the parameter `name`, to span a check of it there: a type that cannot be a
/// key (or a version, a column value) is reported on it, once.
fn param_type(handler: &Handler, name: &syn::LitStr) -> Option<syn::Type> {
    handler
        .params
        .iter()
        .find(|p| p.ident == name.value())
        .filter(|p| !matches!(p.ty, syn::Type::ImplTrait(_)))
        .map(|p| p.ty.clone())
}

/// The check that `key` names one parameter per key column of the machine (reported on
/// the `key` argument), and the call's key.
fn key_checks(
    definition: &TokenStream,
    key: &crate::keys::KeyNames,
    param_type: &dyn Fn(&syn::LitStr) -> Option<syn::Type>,
) -> (TokenStream, TokenStream) {
    let parts: Vec<TokenStream> = key
        .names
        .iter()
        .map(|name| {
            let ident = Ident::new(&name.value(), name.span());
            match param_type(name) {
                Some(ty) => quote_spanned!(ty.span()=> <#ty as ::idem::ToKey>::to_key(&#ident)),
                None => quote_spanned!(name.span()=> ::idem::ToKey::to_key(&#ident)),
            }
        })
        .collect();
    let key_expr = match parts.as_slice() {
        [one] => quote!(::idem::CallKey::from(#one)),
        many => quote!(::idem::CallKey::from(::idem::__private::composite_key([#(#many),*]))),
    };
    let names = &key.names;
    let check_key = check(
        key.span,
        quote!(::idem::__private::key_error(#definition, &[#(#names),*])),
    );
    (check_key, key_expr)
}

/// The compile-time checks of a creation and the plan that runs it, whose result is stored
/// with `codec`.
fn creation_checks(
    c: &Creation,
    handler: &Handler,
    codec: &TokenStream,
) -> (TokenStream, TokenStream) {
    let Creation {
        machine,
        key,
        state,
        set,
    } = c;
    let machine = machine_ref(machine);
    let definition = quote!(#machine.definition());
    let check_state = state_check(&definition, state);
    let check_initial = check(
        state.span(),
        quote!(::idem::__private::creation_error(#definition, #state)),
    );
    let param_type = |name: &syn::LitStr| param_type(handler, name);
    let (check_key, key_expr) = key_checks(&definition, key, &param_type);
    let (check_set, set_call) = set_columns(&definition, set, &param_type);
    let checks = quote! {
        #check_state
        #check_initial
        #check_key
        #check_set
    };
    let make = quote! {
        ::idem::__private::CreationPlan::new(
            #machine,
            #codec,
            const { ::idem::__private::state_index(#definition, #state) },
            #key_expr,
        )#set_call
    };
    (checks, make)
}

/// The columns of `set(…)`: their static (the handler's statements are built from it once
/// per backend) and a check per column that the machine does not own it, on the column's
/// token; and the call that adds them and their values to the stage.
fn set_columns(
    definition: &TokenStream,
    set: &[SetColumn],
    param_type: &dyn Fn(&syn::LitStr) -> Option<syn::Type>,
) -> (TokenStream, TokenStream) {
    if set.is_empty() {
        return (TokenStream::new(), TokenStream::new());
    }
    let assignments = set.iter().map(|c| {
        let column = &c.column;
        let value = match c.value {
            SetValue::Param(_) => quote!(Bound),
            SetValue::Now => quote!(Now),
        };
        quote! {
            ::idem::__private::Assignment {
                column: #column,
                value: ::idem::__private::SetTo::#value,
            }
        }
    });
    let checks = set.iter().map(|c| {
        let column = &c.column;
        check(
            column.span(),
            quote!(::idem::__private::column_error(#definition, #column)),
        )
    });
    let values = set.iter().filter_map(|c| match &c.value {
        SetValue::Param(param) => {
            let ident = Ident::new(&param.value(), param.span());
            Some(match param_type(param) {
                Some(ty) => {
                    quote_spanned!(ty.span()=> <#ty as ::idem::ToColumn>::to_column(&#ident))
                }
                None => quote_spanned!(param.span()=> ::idem::ToColumn::to_column(&#ident)),
            })
        }
        SetValue::Now => None,
    });
    let checks = quote! {
        static __IDEM_SET: ::idem::__private::SetColumns =
            ::idem::__private::SetColumns::new(&[#(#assignments),*]);
        #(#checks)*
    };
    (checks, quote!(.set(&__IDEM_SET, ::std::vec![#(#values),*])))
}

/// The inbox stage of a message handler, from the parameters its arguments name.
fn inbox_stage(i: &Inbox) -> TokenStream {
    let param = |lit: &syn::LitStr| Ident::new(&lit.value(), lit.span());
    let (inbox, message, payload) = (param(&i.inbox), param(&i.message), param(&i.payload));
    let inbox = quote_spanned! {i.inbox.span()=>
        ::idem::__private::AsInbox::as_inbox(&#inbox)
    };
    let message = quote_spanned! {i.message.span()=>
        ::idem::__private::AsMessageKey::as_message_key(&#message)
    };
    let payload = quote_spanned! {i.payload.span()=>
        ::idem::__private::AsRef::<[u8]>::as_ref(&#payload)
    };
    quote!(::idem::__private::InboxStage::new(#inbox, #message, #payload))
}

/// The check that `state` is declared by the machine, on the user's string.
fn state_check(definition: &TokenStream, state: &syn::LitStr) -> TokenStream {
    check(
        state.span(),
        quote!(::idem::__private::state_error(#definition, #state)),
    )
}

/// The generated function's rustdoc: what it runs, and what it returns.
fn handler_doc(form: &Form, handler: &Handler) -> String {
    match form {
        Form::Transition(t) => transition_doc(t, handler),
        Form::Creation(c) => creation_doc(c, handler),
        Form::Message(i) => format!(
            "# Idempotent message handler\n\n\
             Generated by `#[idempotent]`. `{tx}` is a pool (one transaction of its own records \
             the delivery and runs this function's body, and commits only if the body \
             succeeds; the result reaches the caller only after the commit) or the caller's \
             transaction (a savepoint in it; the caller commits). {}",
            inbox_doc(i),
            tx = handler.tx,
        ),
        Form::ConsumerTransition(i, t) => {
            let machine = t.machine.text();
            let mut doc = transition_doc(t, handler);
            doc.push_str(&format!(
                "\n\n{} Returns [`Delivery`](::idem::inbox::Delivery)`<T, `\
                 [`Refusal`](::idem::Refusal)`<{machine}>>`: `Processed` when this delivery moved \
                 the row; `Duplicate` with the transition's first result when the message or the \
                 transition was done before (the record is kept); `Refused` — not yet, illegal, not \
                 found, stale — with the record rolled back and nothing applied, so a redelivery \
                 (say, after the message it depends on) is evaluated again: do not ack it.",
                inbox_doc(i)
            ));
            doc
        }
    }
}

fn inbox_doc(i: &Inbox) -> String {
    format!(
        "The delivery is recorded in the inbox `{inbox}` under the message key `{message}`, \
         with the SHA-256 of `{payload}`, in the same transaction: a redelivery is absorbed as \
         [`Delivery::Duplicate`](::idem::inbox::Delivery::Duplicate) with the first result, \
         the same key with another payload is a \
         [`Delivery::Conflict`](::idem::inbox::Delivery::Conflict).",
        inbox = i.inbox.value(),
        message = i.message.value(),
        payload = i.payload.value(),
    )
}

fn creation_doc(c: &Creation, handler: &Handler) -> String {
    let tx = &handler.tx;
    let machine = c.machine.text();
    let sets = c
        .set
        .iter()
        .map(|col| match &col.value {
            SetValue::Param(p) => format!("`{}` from `{}`", col.column.value(), p.value()),
            SetValue::Now => format!("`{}` as `CURRENT_TIMESTAMP`", col.column.value()),
        })
        .collect::<Vec<_>>();
    let sets = if sets.is_empty() {
        String::new()
    } else {
        format!(", with {}", sets.join(", "))
    };
    let how = if handler.tx_type.is_none() {
        format!(
            "The handler takes no transaction: this function's body runs **first**, before \
                 any statement (an error from it writes nothing; it also runs for a duplicate, \
                 so keep it free of effects). Then the row whose key is `key = {key}` is \
                 inserted in the state `{state}`{sets} with the body's result: on PostgreSQL in \
                 one autocommit statement ([`{machine}::IDEM_SQL`]: `create_storing`), on \
                 SQLite with the result's insert in one transaction (`{tx}` is a pool, or the \
                 caller's transaction: a savepoint in it).",
            state = c.state.value(),
            key = c.key.shown(),
        )
    } else {
        format!(
            "One transaction (from the pool `{tx}`, or a savepoint in the caller's \
                 transaction) inserts the row whose key is `key = {key}` in the state \
                 `{state}`{sets} ([`{machine}::IDEM_SQL`]: `create`, `INSERT … ON CONFLICT \
                 (key) DO NOTHING`); only if it inserted the row, runs this function's body, \
                 stores its result and commits.",
            state = c.state.value(),
            key = c.key.shown(),
        )
    };
    format!(
        "# Idempotent creation in `{state}`\n\n\
             Generated by `#[idempotent]` for the state machine [`{machine}`]. {how}\n\n\
             Returns [`Creation::Created`](::idem::Creation::Created) with the body's result; \
             [`Creation::Duplicate`](::idem::Creation::Duplicate) with the first result when a row \
             has the key and the values this call would write; \
             [`Creation::Conflict`](::idem::Creation::Conflict) when it has other values (the \
             first stays, nothing is written); an error from the body rolls everything back and \
             comes back as [`Error::Handler`](::idem::Error::Handler).",
        state = c.state.value(),
    )
}

/// A transition's doc; a consumer transition's adds its inbox's.
fn transition_doc(t: &Transition, handler: &Handler) -> String {
    let tx = &handler.tx;
    let machine = t.machine.text();
    let (from, to) = (t.from.value(), t.to.value());
    let n = t.key.names.len();
    let key = t.key.shown();
    let bound_key = t
        .key
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("`${} = {}`", i + 1, name.value()))
        .collect::<Vec<_>>()
        .join(", ");
    let guard = match &t.guard {
        Guard::Version(v) => format!(
            " and, when `{}` is given, the guard `version = {}`",
            v.value(),
            v.value()
        ),
        Guard::Watermark(w) => format!(
            " and the event's watermark: `version < {w}`, and the row takes `version = {w}` \
             (an event older than the row is [`Outcome::Superseded`](::idem::Outcome::Superseded), \
             the same event again [`Outcome::AlreadyDone`](::idem::Outcome::AlreadyDone) with its \
             first result)",
            w = w.value()
        ),
        Guard::None => String::new(),
    };
    let sets = t
        .set
        .iter()
        .map(|c| match &c.value {
            SetValue::Param(p) => {
                format!("`{}` to the parameter `{}`", c.column.value(), p.value())
            }
            SetValue::Now => format!("`{}` to `CURRENT_TIMESTAMP`", c.column.value()),
        })
        .collect::<Vec<_>>();
    let sets = if sets.is_empty() {
        String::new()
    } else {
        format!(
            " The same UPDATE also sets {} (bound after the statement's own parameters), so \
             they are written exactly when the row moves.",
            sets.join(", ")
        )
    };
    let doc = format!(
        "# Idempotent transition `{from}` → `{to}`\n\n\
         Generated by `#[idempotent]` for the state machine [`{machine}`]. The row is the one whose key is \
         `key = {key}`. One transaction (from the pool `{tx}`, or a savepoint in the caller's \
         transaction `{tx}`) runs the conditional UPDATE \
         ([`{machine}::IDEM_SQL`]) with {bound_key}, `${f} = '{from}'`, `${t} = '{to}'`{guard}.{sets} \
         Then, only if it moved the row, it runs this function's body, stores the body's result \
         and commits (the caller's transaction: releases the savepoint). The result reaches \
         the caller only after the commit.\n\n\
         Returns [`Outcome::Applied`](::idem::Outcome::Applied) with the body's result, \
         [`Outcome::AlreadyDone`](::idem::Outcome::AlreadyDone) with the first result for a \
         duplicate, [`Outcome::NotYet`](::idem::Outcome::NotYet) when the row can still reach \
         `{from}`, [`Outcome::IllegalState`](::idem::Outcome::IllegalState), \
         [`Outcome::NotFound`](::idem::Outcome::NotFound) or \
         [`Outcome::StaleVersion`](::idem::Outcome::StaleVersion); an error from the body rolls \
         everything back and comes back as [`Error::Handler`](::idem::Error::Handler).",
        f = n + 1,
        t = n + 2,
    );
    if handler.tx_type.is_none() {
        return format!(
            "# Idempotent transition `{from}` → `{to}`, in one statement\n\n\
             Generated by `#[idempotent]` for the state machine [`{machine}`]. The row is the one whose key is \
             `key = {key}`. The handler takes no transaction: `{tx}` is a pool (or the caller's \
             transaction: a savepoint in it). This function's body runs **first**, before any \
             statement, outside any transaction: it computes the result, and an error from it \
             ends the call as [`Error::Handler`](::idem::Error::Handler) with nothing written \
             (it also runs for a duplicate, whose own result is then dropped: keep it free of \
             effects). Then the conditional UPDATE ([`{machine}::IDEM_SQL`]) with {bound_key}, \
             `${f} = '{from}'`, `${t} = '{to}'`{guard}.{sets} It moves the row and stores the \
             result together: on PostgreSQL in one autocommit statement (`transition_storing`, \
             which also classifies a miss); on SQLite in autocommit when the result is `null` \
             (`()`), else in one `BEGIN IMMEDIATE` transaction with the result's INSERT.\n\n\
             Returns [`Outcome::Applied`](::idem::Outcome::Applied) with the body's result, \
             [`Outcome::AlreadyDone`](::idem::Outcome::AlreadyDone) with the first result for a \
             duplicate, [`Outcome::NotYet`](::idem::Outcome::NotYet), \
             [`Outcome::IllegalState`](::idem::Outcome::IllegalState), \
             [`Outcome::NotFound`](::idem::Outcome::NotFound) or \
             [`Outcome::StaleVersion`](::idem::Outcome::StaleVersion).",
            f = n + 1,
            t = n + 2,
        );
    }
    doc
}
