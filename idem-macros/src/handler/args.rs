//! The attribute's arguments, in two groups that can be combined:
//!
//! - a state transition: `machine = Order, key = "order_id", from = "CREATED", to = "PAID"`,
//!   and optionally `version = "expected_version"`;
//! - an inbox delivery: `inbox = "inbox", message = "message_key", payload = "payload"`,
//!   each naming a parameter.

use super::signature::Handler;
use crate::ctxt::Ctxt;
use crate::keys::KeyNames;
use proc_macro2::{Span, TokenStream};
use syn::{LitStr, Path};

pub const KEYS: &str = "machine, key, from, to, version, inbox, message, payload";

pub struct Args {
    pub transition: Option<TransitionArgs>,
    pub inbox: Option<InboxArgs>,
}

pub struct TransitionArgs {
    pub machine: Path,
    /// The parameters holding the row's key: one per key column of the machine.
    pub key: KeyNames,
    pub from: LitStr,
    pub to: LitStr,
    pub version: Option<LitStr>,
}

/// Parameter names: the `&Inbox`, the `&MessageKey`, the payload bytes.
pub struct InboxArgs {
    pub inbox: LitStr,
    pub message: LitStr,
    pub payload: LitStr,
}

impl Args {
    pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Option<Args> {
        let mut machine: Option<Path> = None;
        let mut key = None;
        let mut from = None;
        let mut to = None;
        let mut version = None;
        let mut inbox = None;
        let mut message = None;
        let mut payload = None;
        let parser = syn::meta::parser(|meta| {
            let name = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            if name == "machine" {
                let value: Path = meta.value()?.parse()?;
                if machine.is_some() {
                    cx.error_spanned_by(&meta.path, "`machine` is given twice");
                } else {
                    machine = Some(value);
                }
                return Ok(());
            }
            if name == "key" {
                let value = KeyNames::parse("the parameters holding the row's key", meta.value()?)?;
                if key.is_some() {
                    cx.error_spanned_by(&meta.path, "`key` is given twice");
                } else {
                    key = Some(value);
                }
                return Ok(());
            }
            let slot = match name.as_str() {
                "from" => &mut from,
                "to" => &mut to,
                "version" => &mut version,
                "inbox" => &mut inbox,
                "message" => &mut message,
                "payload" => &mut payload,
                _ => {
                    let shown = meta
                        .path
                        .segments
                        .iter()
                        .map(|s| s.ident.to_string())
                        .collect::<Vec<_>>()
                        .join("::");
                    cx.error_spanned_by(
                        &meta.path,
                        format!("unknown argument `{shown}`; valid arguments are: {KEYS}"),
                    );
                    if meta.input.peek(syn::Token![=]) {
                        let _: syn::Expr = meta.value()?.parse()?;
                    }
                    return Ok(());
                }
            };
            let value: LitStr = meta.value().and_then(|v| v.parse()).map_err(|_| {
                meta.error(format!("`{name}` takes a string, e.g. `{name} = \"…\"`"))
            })?;
            if slot.is_some() {
                cx.error_spanned_by(&meta.path, format!("`{name}` is given twice"));
            } else {
                *slot = Some(value);
            }
            Ok(())
        });
        if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
            cx.push(e);
            return None;
        }
        let wants_transition = machine.is_some()
            || key.is_some()
            || from.is_some()
            || to.is_some()
            || version.is_some();
        let wants_inbox = inbox.is_some() || message.is_some() || payload.is_some();
        if wants_inbox {
            missing_arguments(
                cx,
                &[
                    ("inbox", inbox.is_none()),
                    ("message", message.is_none()),
                    ("payload", payload.is_none()),
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
                    ("machine", machine.is_none()),
                    ("key", key.is_none()),
                    ("from", from.is_none()),
                    ("to", to.is_none()),
                ],
                "`machine` names the `#[derive(StateMachine)]` enum, `key` the parameter holding the \
                 row's key, `from` and `to` the states, e.g. \
                 `#[idempotent(machine = Order, key = \"order_id\", from = \"CREATED\", to = \"PAID\")]`",
            );
        }
        if let (Some(f), Some(t)) = (&from, &to)
            && f.value() == t.value()
        {
            cx.error_spanned_by(
                t,
                format!(
                    "`from` and `to` are both {:?}: a transition must change the state, or a duplicate could not be told from a first call",
                    t.value()
                ),
            );
        }
        let transition = if wants_transition || !wants_inbox {
            Some(TransitionArgs {
                machine: machine?,
                key: key?,
                from: from?,
                to: to?,
                version,
            })
        } else {
            None
        };
        let inbox = if wants_inbox {
            Some(InboxArgs {
                inbox: inbox?,
                message: message?,
                payload: payload?,
            })
        } else {
            None
        };
        Some(Args { transition, inbox })
    }
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

/// The arguments that name parameters must name real ones.
pub fn check_against(cx: &mut Ctxt, args: &Args, handler: &Handler) {
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
    let mut named: Vec<(&str, &LitStr)> = Vec::new();
    if let Some(t) = &args.transition {
        named.extend(t.key.names.iter().map(|k| ("key", k)));
        named.extend(t.version.as_ref().map(|v| ("version", v)));
    }
    if let Some(i) = &args.inbox {
        named.extend([
            ("inbox", &i.inbox),
            ("message", &i.message),
            ("payload", &i.payload),
        ]);
    }
    for (what, lit) in &named {
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
                format!("`{name}` is the transaction, not a business value; {listed}"),
            );
        } else if !handler.params.iter().any(|p| p.ident == name) {
            cx.error_spanned_by(
                lit,
                format!(
                    "`{what} = {name:?}` names no parameter of `{}`; {listed}",
                    handler.name
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
