//! The rules the arguments must satisfy, checked in one place: among themselves first
//! ([`form`]: which form of handler they make), then against the handler's signature
//! ([`parameters`]: the parameters they name). In between, the signature is parsed, so
//! that the errors come in the attribute's order, then the function's.

use super::args::{Args, SetColumn, SetValue};
use super::signature::Handler;
use crate::ctxt::Ctxt;
use crate::keys::KeyNames;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{LitStr, Path};

/// What a handler does, by its arguments; each form returns its own type.
pub enum Form {
    /// `key`, `from`, `to`: the row moves (`Handled`).
    Transition(Transition),
    /// `key`, `create`: the row is inserted (`Created`).
    Creation(Creation),
    /// `inbox`, `message`, `payload` alone: a message is recorded (`Consumed`).
    Message(Inbox),
    /// Both groups: the message is recorded and the row moves, in one transaction
    /// (`ConsumedTransition`).
    ConsumerTransition(Inbox, Transition),
}

impl Form {
    /// The inbox a message is recorded in, for the forms that have one.
    pub fn inbox(&self) -> Option<&Inbox> {
        match self {
            Form::Message(inbox) | Form::ConsumerTransition(inbox, _) => Some(inbox),
            Form::Transition(_) | Form::Creation(_) => None,
        }
    }
}

/// A transition: `machine = Order, key = "order_id", from = "CREATED", to = "PAID"`, its
/// guard of the version column and the columns its UPDATE also sets, `set(…)`.
pub struct Transition {
    pub machine: MachineName,
    /// The parameters holding the row's key: one per key column of the machine.
    pub key: KeyNames,
    pub from: LitStr,
    pub to: LitStr,
    pub guard: Guard,
    /// The columns the UPDATE also sets, in the attribute's order.
    pub set: Vec<SetColumn>,
}

/// What a transition requires of the version column besides its state.
pub enum Guard {
    /// Nothing: every transition increments it.
    None,
    /// `version = "param"`: the parameter holding the version the caller read; the row must
    /// still have it.
    Version(LitStr),
    /// `watermark = "param"`: the parameter holding an event's version; the row must be
    /// below it, and takes it.
    Watermark(LitStr),
}

/// A creation: `machine = Order, key = "out_trade_no", create = "CREATED"`, and the columns
/// it writes besides the key, state and version, `set(…)`.
pub struct Creation {
    pub machine: MachineName,
    pub key: KeyNames,
    /// The initial state the row is created in.
    pub state: LitStr,
    pub set: Vec<SetColumn>,
}

/// Parameter names: the `&Inbox`, the `&MessageKey`, the payload bytes.
pub struct Inbox {
    pub inbox: LitStr,
    pub message: LitStr,
    pub payload: LitStr,
}

/// The machine a handler moves: named by `machine = …`, or, without it, the type of the
/// `impl` the handler is an associated function of.
pub enum MachineName {
    Named(Path),
    /// `Self`, spanned at the attribute: outside an `impl` (or in one of a type that is no
    /// machine), that is where rustc reports it.
    OfImpl(Span),
}

impl MachineName {
    /// `machine = …` as given or, without it, the type of the handler's `impl`.
    fn of(machine: &Option<Path>) -> MachineName {
        match machine {
            Some(path) => MachineName::Named(path.clone()),
            None => MachineName::OfImpl(Span::call_site()),
        }
    }

    /// The machine as written, for docs: `Order`, `crate::orders::Order`, `Self`.
    pub fn text(&self) -> String {
        match self {
            MachineName::Named(path) => {
                let text = crate::suggest::path_name(path);
                if path.leading_colon.is_some() {
                    format!("::{text}")
                } else {
                    text
                }
            }
            MachineName::OfImpl(_) => "Self".to_owned(),
        }
    }
}

impl ToTokens for MachineName {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        match self {
            MachineName::Named(path) => path.to_tokens(tokens),
            MachineName::OfImpl(span) => syn::Token![Self](*span).to_tokens(tokens),
        }
    }
}

/// The form the arguments make, each mistake among them recorded in `cx`; `None` when a
/// required argument is missing. A form is returned after other mistakes (`from == to`,
/// both guards, a watermark with an inbox) so that [`parameters`] still checks what the
/// arguments name; the handler is not expanded then.
pub fn form(cx: &mut Ctxt, args: &Args) -> Option<Form> {
    let given_inbox = [&args.inbox, &args.message, &args.payload];
    if let Some(state) = &args.create {
        for (name, given) in [
            ("from", &args.from),
            ("to", &args.to),
            ("version", &args.version),
            ("watermark", &args.watermark),
        ] {
            if let Some(lit) = given {
                cx.error_spanned_by(
                    lit,
                    format!(
                        "`create` makes the row, in its initial state: it takes no `{name}`; move the row with another handler"
                    ),
                );
            }
        }
        if let Some(lit) = given_inbox.into_iter().flatten().next() {
            cx.error_spanned_by(
                lit,
                "a creation is deduplicated by its key (a unique key of the table): it takes no inbox",
            );
        }
        missing_arguments(
            cx,
            &[("key", args.key.is_none())],
            "`key` names the parameter holding the new row's key, e.g. \
             `#[idempotent(key = \"out_trade_no\", create = \"CREATED\", set(amount))]`",
        );
        return Some(Form::Creation(Creation {
            machine: MachineName::of(&args.machine),
            key: args.key.clone()?,
            state: state.clone(),
            set: args.set.clone().unwrap_or_default(),
        }));
    }
    let wants_transition = args.machine.is_some()
        || args.key.is_some()
        || args.from.is_some()
        || args.to.is_some()
        || args.version.is_some()
        || args.watermark.is_some()
        || args.set.is_some();
    let wants_inbox = given_inbox.iter().any(|given| given.is_some());
    if wants_inbox {
        missing_arguments(
            cx,
            &[
                ("inbox", args.inbox.is_none()),
                ("message", args.message.is_none()),
                ("payload", args.payload.is_none()),
            ],
            "`inbox`, `message` and `payload` name the parameters holding the `&Inbox`, the \
             `&MessageKey` and the payload bytes, e.g. \
             `#[idempotent(inbox = \"inbox\", message = \"key\", payload = \"payload\")]`",
        );
    }
    if wants_transition || !wants_inbox {
        missing_arguments(
            cx,
            &[
                ("key", args.key.is_none()),
                ("from", args.from.is_none()),
                ("to", args.to.is_none()),
            ],
            "`key` names the parameter holding the row's key, `from` and `to` the states, e.g. \
             `#[idempotent(key = \"order_id\", from = \"CREATED\", to = \"PAID\")]`",
        );
    }
    if let (Some(f), Some(t), None) = (&args.from, &args.to, &args.watermark)
        && f.value() == t.value()
    {
        cx.error_spanned_by(
            t,
            format!(
                "`from` and `to` are both {:?}: a transition must change the state, or a duplicate could not be told from a first call; for an event of a stream that keeps the state, give the event's version: `watermark = \"…\"`",
                t.value()
            ),
        );
    }
    if let (Some(_), Some(w)) = (&args.version, &args.watermark) {
        cx.error_spanned_by(
            w,
            "`version` and `watermark` both guard the version column: `version` an expected version (optimistic locking), `watermark` an event's version (a stream, which the row takes); give one",
        );
    }
    if let (Some(w), true) = (&args.watermark, wants_inbox) {
        cx.error_spanned_by(
            w,
            "a watermark already tells a redelivered event by its version: drop the inbox arguments, or the watermark",
        );
    }
    let transition = || {
        Some(Transition {
            machine: MachineName::of(&args.machine),
            key: args.key.clone()?,
            from: args.from.clone()?,
            to: args.to.clone()?,
            // With both (reported above), either: the handler is not expanded.
            guard: match (&args.version, &args.watermark) {
                (Some(version), _) => Guard::Version(version.clone()),
                (None, Some(watermark)) => Guard::Watermark(watermark.clone()),
                (None, None) => Guard::None,
            },
            set: args.set.clone().unwrap_or_default(),
        })
    };
    let inbox = || {
        Some(Inbox {
            inbox: args.inbox.clone()?,
            message: args.message.clone()?,
            payload: args.payload.clone()?,
        })
    };
    Some(match (wants_transition, wants_inbox) {
        (_, false) => Form::Transition(transition()?),
        (false, true) => Form::Message(inbox()?),
        (true, true) => Form::ConsumerTransition(inbox()?, transition()?),
    })
}

fn missing_arguments(cx: &mut Ctxt, arguments: &[(&str, bool)], explanation: &str) {
    let missing: Vec<String> = arguments
        .iter()
        .filter(|(_, absent)| *absent)
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    if missing.is_empty() {
        return;
    }
    let plural = if missing.len() == 1 { "" } else { "s" };
    cx.error_at(
        Span::call_site(),
        format!(
            "missing argument{plural} {}: {explanation}",
            missing.join(", ")
        ),
    );
}

/// The arguments of `form` that name parameters must name real ones, each its own; and a
/// message handler needs a transaction.
pub fn parameters(cx: &mut Ctxt, args: &Args, form: &Form, handler: &Handler) {
    if handler.tx_type.is_none() && form.inbox().is_some() {
        cx.error_spanned_by(
            &handler.tx,
            format!(
                "a message handler needs a transaction: the inbox record commits with what the body writes; take `tx: &mut Transaction<'_, DB>` instead of the pool `{}`",
                handler.tx
            ),
        );
    }
    let names = handler
        .params
        .iter()
        .map(|p| format!("`{}`", p.ident))
        .collect::<Vec<_>>();
    let listed = if names.is_empty() {
        "the handler has no parameter besides the transaction".to_owned()
    } else {
        format!("its parameters are: {}", names.join(", "))
    };
    let named = parameter_arguments(args, form);
    let set_params = args.set.iter().flatten().filter_map(|c| match &c.value {
        SetValue::Param(param) => Some(("set", param)),
        SetValue::Now => None,
    });
    for (what, lit) in named.iter().copied().chain(set_params) {
        let name = lit.value();
        if syn::parse_str::<syn::Ident>(&name).is_err() {
            cx.error_spanned_by(
                lit,
                format!(
                    "`{what}` names a parameter, and {name:?} is not a Rust identifier; {listed}"
                ),
            );
        } else if handler.tx == name {
            cx.error_spanned_by(
                lit,
                format!(
                    "`{name}` is the handler's first parameter, its transaction or pool, not a business value; {listed}"
                ),
            );
        } else if !handler.params.iter().any(|p| p.ident == name) {
            let shown = if what == "set" {
                format!(
                    "`set` takes `{name}` from a parameter, and `{}` has none of that name",
                    handler.name
                )
            } else {
                format!(
                    "`{what} = {name:?}` names no parameter of `{}`",
                    handler.name
                )
            };
            let params = handler
                .params
                .iter()
                .map(|p| p.ident.to_string())
                .collect::<Vec<_>>();
            let params = params.iter().map(String::as_str).collect::<Vec<_>>();
            cx.error_spanned_by(
                lit,
                format!(
                    "{shown}; {}",
                    crate::suggest::did_you_mean(&name, &params, &listed)
                ),
            );
        }
    }
    for (i, (what, lit)) in named.iter().enumerate() {
        if let Some((first, _)) = named[..i]
            .iter()
            .find(|(_, other)| other.value() == lit.value())
        {
            let message = if *first == "key" && *what == "key" {
                format!(
                    "`key` names the parameter `{}` twice: a composite key names one parameter per key column",
                    lit.value()
                )
            } else {
                format!(
                    "`{first}` and `{what}` both name the parameter `{}`: they must be different parameters",
                    lit.value()
                )
            };
            cx.error_spanned_by(lit, message);
        }
    }
}

/// The arguments that name parameters (but `set`'s), as given, in the order they are
/// checked: the key's; unless the form is a creation, whose other arguments were rejected
/// already, the guards (both, when both are given) and the inbox's.
fn parameter_arguments<'a>(args: &'a Args, form: &Form) -> Vec<(&'static str, &'a LitStr)> {
    let mut named: Vec<(&str, &LitStr)> = args
        .key
        .iter()
        .flat_map(|key| &key.names)
        .map(|name| ("key", name))
        .collect();
    if !matches!(form, Form::Creation(_)) {
        for (what, given) in [
            ("version", &args.version),
            ("watermark", &args.watermark),
            ("inbox", &args.inbox),
            ("message", &args.message),
            ("payload", &args.payload),
        ] {
            named.extend(given.as_ref().map(|lit| (what, lit)));
        }
    }
    named
}
