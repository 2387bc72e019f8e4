//! The attribute's arguments: `machine = Order, key = "order_id", from = "CREATED", to = "PAID"`,
//! and optionally `version = "expected_version"`.

use super::signature::Handler;
use crate::ctxt::Ctxt;
use proc_macro2::{Span, TokenStream};
use syn::{LitStr, Path};

pub const KEYS: &str = "machine, key, from, to, version";

pub struct Args {
    pub machine: Path,
    pub key: LitStr,
    pub from: LitStr,
    pub to: LitStr,
    pub version: Option<LitStr>,
}

impl Args {
    pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Option<Args> {
        let mut machine: Option<Path> = None;
        let mut key = None;
        let mut from = None;
        let mut to = None;
        let mut version = None;
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
            let slot = match name.as_str() {
                "key" => &mut key,
                "from" => &mut from,
                "to" => &mut to,
                "version" => &mut version,
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
        let missing: Vec<&str> = [
            ("machine", machine.is_none()),
            ("key", key.is_none()),
            ("from", from.is_none()),
            ("to", to.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, absent)| absent.then_some(name))
        .collect();
        if !missing.is_empty() {
            let list = missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let plural = if missing.len() == 1 { "" } else { "s" };
            cx.error_at(
                Span::call_site(),
                format!(
                    "missing argument{plural} {list}: `machine` names the `#[derive(StateMachine)]` enum, \
                     `key` the parameter holding the row's key, `from` and `to` the states, e.g. \
                     `#[idempotent(machine = Order, key = \"order_id\", from = \"CREATED\", to = \"PAID\")]`"
                ),
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
        Some(Args {
            machine: machine?,
            key: key?,
            from: from?,
            to: to?,
            version,
        })
    }
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
    for (what, lit) in [("key", Some(&args.key)), ("version", args.version.as_ref())] {
        let Some(lit) = lit else { continue };
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
    if let Some(version) = &args.version
        && version.value() == args.key.value()
    {
        cx.error_spanned_by(
            version,
            "the key and the expected version must be different parameters",
        );
    }
}
