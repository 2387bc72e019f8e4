//! The attribute's arguments, in two groups that can be combined:
//!
//! - a state transition: `key = "order_id", from = "CREATED", to = "PAID"`, with
//!   `machine = Order` unless the handler is in the machine's `impl` (then `Self`), and
//!   optionally `version = "expected_version"` and the columns its UPDATE also sets,
//!   `set(paid_at = now(), amount = "amount", note)`;
//! - an inbox delivery: `inbox = "inbox", message = "message_key", payload = "payload"`,
//!   each naming a parameter.

use super::signature::Handler;
use crate::ctxt::Ctxt;
use crate::keys::KeyNames;
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{LitStr, Path};

pub const KEYS: [&str; 11] = [
    "machine",
    "key",
    "from",
    "to",
    "version",
    "watermark",
    "create",
    "set",
    "inbox",
    "message",
    "payload",
];

/// The machine a handler moves: named by `machine = …`, or, without it, the type of the
/// `impl` the handler is an associated function of.
pub enum MachineName {
    Named(Path),
    /// `Self`, spanned at the attribute: outside an `impl` (or in one of a type that is no
    /// machine), that is where rustc reports it.
    OfImpl(Span),
}

impl MachineName {
    /// The machine as written, for docs: `Order`, `crate::orders::Order`, `Self`.
    pub fn text(&self) -> String {
        match self {
            MachineName::Named(path) => {
                let text = path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect::<Vec<_>>()
                    .join("::");
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

pub struct Args {
    pub transition: Option<TransitionArgs>,
    pub inbox: Option<InboxArgs>,
    pub creation: Option<CreationArgs>,
}

/// A creation: `machine = Order, key = "out_trade_no", create = "CREATED"`, and the columns
/// it writes besides the key, state and version, `set(…)`.
pub struct CreationArgs {
    pub machine: MachineName,
    pub key: KeyNames,
    /// The initial state the row is created in.
    pub state: LitStr,
    pub set: Vec<SetColumn>,
}

pub struct TransitionArgs {
    pub machine: MachineName,
    /// The parameters holding the row's key: one per key column of the machine.
    pub key: KeyNames,
    pub from: LitStr,
    pub to: LitStr,
    pub version: Option<LitStr>,
    /// The parameter holding an event's version: the row must be below it, and takes it.
    pub watermark: Option<LitStr>,
    /// The columns the UPDATE also sets, in the attribute's order.
    pub set: Vec<SetColumn>,
}

/// One column of `set(…)`.
pub struct SetColumn {
    /// The column's name (a raw identifier without its `r#`), spanned at the user's token.
    pub column: LitStr,
    pub value: SetValue,
}

pub enum SetValue {
    /// `column = "param"`, or `column` alone for the parameter of the same name.
    Param(LitStr),
    /// `column = now()`.
    Now,
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
        let mut watermark = None;
        let mut create = None;
        let mut set: Option<Vec<SetColumn>> = None;
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
            if name == "set" {
                if set.is_some() {
                    cx.error_spanned_by(
                        &meta.path,
                        "`set` is given twice: list every column in one `set(…)`",
                    );
                }
                let mut columns = Vec::new();
                if !meta.input.peek(syn::token::Paren) {
                    return Err(meta.error(SET_FORM));
                }
                meta.parse_nested_meta(|inner| {
                    let column = set_column(cx, &inner.path)?;
                    let value = if inner.input.peek(syn::Token![=]) {
                        set_value(inner.value()?)?
                    } else {
                        SetValue::Param(column.clone())
                    };
                    if columns
                        .iter()
                        .any(|c: &SetColumn| c.column.value() == column.value())
                    {
                        cx.error_spanned_by(
                            &column,
                            format!("`set` names the column `{}` twice", column.value()),
                        );
                    } else {
                        columns.push(SetColumn { column, value });
                    }
                    Ok(())
                })?;
                if columns.is_empty() {
                    cx.error_spanned_by(&meta.path, format!("`set()` names no column; {SET_FORM}"));
                }
                set.get_or_insert_with(Vec::new).extend(columns);
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
                "watermark" => &mut watermark,
                "create" => &mut create,
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
                        crate::suggest::unknown_argument("argument", &shown, &KEYS),
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
        if let Some(state) = create {
            for (name, given) in [
                ("from", &from),
                ("to", &to),
                ("version", &version),
                ("watermark", &watermark),
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
            if let Some(lit) = inbox.as_ref().or(message.as_ref()).or(payload.as_ref()) {
                cx.error_spanned_by(
                    lit,
                    "a creation is deduplicated by its key (a unique key of the table): it takes no inbox",
                );
            }
            missing_arguments(
                cx,
                &[("key", key.is_none())],
                "`key` names the parameter holding the new row's key, e.g. \
                 `#[idempotent(key = \"out_trade_no\", create = \"CREATED\", set(amount))]`",
            );
            return Some(Args {
                transition: None,
                inbox: None,
                creation: Some(CreationArgs {
                    machine: machine_name(machine),
                    key: key?,
                    state,
                    set: set.unwrap_or_default(),
                }),
            });
        }
        let wants_transition = machine.is_some()
            || key.is_some()
            || from.is_some()
            || to.is_some()
            || version.is_some()
            || watermark.is_some()
            || set.is_some();
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
                    ("key", key.is_none()),
                    ("from", from.is_none()),
                    ("to", to.is_none()),
                ],
                "`key` names the parameter holding the row's key, `from` and `to` the states, e.g. \
                 `#[idempotent(key = \"order_id\", from = \"CREATED\", to = \"PAID\")]`",
            );
        }
        if let (Some(f), Some(t), None) = (&from, &to, &watermark)
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
        if let (Some(_), Some(w)) = (&version, &watermark) {
            cx.error_spanned_by(
                w,
                "`version` and `watermark` both guard the version column: `version` an expected version (optimistic locking), `watermark` an event's version (a stream, which the row takes); give one",
            );
        }
        if let (Some(w), true) = (&watermark, wants_inbox) {
            cx.error_spanned_by(
                w,
                "a watermark already tells a redelivered event by its version: drop the inbox arguments, or the watermark",
            );
        }
        let transition = if wants_transition || !wants_inbox {
            Some(TransitionArgs {
                machine: machine_name(machine),
                key: key?,
                from: from?,
                to: to?,
                version,
                watermark,
                set: set.unwrap_or_default(),
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
        Some(Args {
            transition,
            inbox,
            creation: None,
        })
    }
}

const SET_FORM: &str = "`set` lists the columns the transition's UPDATE also sets, each from a \
     parameter or the database's clock, e.g. `set(amount = \"amount_cents\", paid_at = now(), note)` \
     (`note` alone: the parameter `note`)";

/// The column of one entry of `set(…)`: a plain identifier, a valid SQL column name.
fn set_column(cx: &mut Ctxt, path: &Path) -> syn::Result<LitStr> {
    let Some(ident) = path.get_ident() else {
        return Err(syn::Error::new_spanned(
            path,
            format!("a column of `set` is one identifier; {SET_FORM}"),
        ));
    };
    let name = syn::ext::IdentExt::unraw(ident).to_string();
    if let Some(problem) = crate::ident::sql_identifier_problem(&name) {
        cx.error_spanned_by(ident, format!("column name `{name}` {problem}"));
    }
    Ok(LitStr::new(&name, ident.span()))
}

/// What one entry of `set(…)` sets its column to: `"param"` or `now()`.
fn set_value(input: syn::parse::ParseStream<'_>) -> syn::Result<SetValue> {
    let expr: syn::Expr = input.parse()?;
    match &expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(param),
            ..
        }) => Ok(SetValue::Param(param.clone())),
        syn::Expr::Call(call)
            if call.args.is_empty()
                && matches!(&*call.func, syn::Expr::Path(p) if p.path.is_ident("now")) =>
        {
            Ok(SetValue::Now)
        }
        syn::Expr::Path(p) if p.path.get_ident().is_some() => {
            let name = p
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            Err(syn::Error::new_spanned(
                &expr,
                format!(
                    "a column of `set` names its parameter as a string: write `= \"{name}\"`, or the column alone when it has the parameter's name"
                ),
            ))
        }
        _ => Err(syn::Error::new_spanned(
            &expr,
            format!(
                "a column of `set` takes a parameter's name as a string (`= \"amount\"`) or the database's clock (`= now()`); {SET_FORM}"
            ),
        )),
    }
}

/// `machine = …` as given or, without it, the type of the handler's `impl`.
fn machine_name(machine: Option<Path>) -> MachineName {
    match machine {
        Some(path) => MachineName::Named(path),
        None => MachineName::OfImpl(Span::call_site()),
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
    if handler.tx_type.is_none() && args.inbox.is_some() {
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
    let mut named: Vec<(&str, &LitStr)> = Vec::new();
    if let Some(c) = &args.creation {
        named.extend(c.key.names.iter().map(|k| ("key", k)));
    }
    if let Some(t) = &args.transition {
        named.extend(t.key.names.iter().map(|k| ("key", k)));
        named.extend(t.version.as_ref().map(|v| ("version", v)));
        named.extend(t.watermark.as_ref().map(|w| ("watermark", w)));
    }
    if let Some(i) = &args.inbox {
        named.extend([
            ("inbox", &i.inbox),
            ("message", &i.message),
            ("payload", &i.payload),
        ]);
    }
    let set_columns = args
        .transition
        .iter()
        .flat_map(|t| t.set.iter())
        .chain(args.creation.iter().flat_map(|c| c.set.iter()));
    let set_params = set_columns.filter_map(|c| match &c.value {
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
