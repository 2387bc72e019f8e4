//! The attribute's arguments as written, parsed; which form of handler they make, and
//! whether they make one, is [`check`](super::check)'s. They come in two groups that can be
//! combined:
//!
//! - a state transition: `key = "order_id", from = "CREATED", to = "PAID"`, with
//!   `machine = Order` unless the handler is in the machine's `impl` (then `Self`), and
//!   optionally `version = "expected_version"` and the columns its UPDATE also sets,
//!   `set(paid_at = now(), amount = "amount", note)`; or, instead of `from` and `to`, a
//!   creation: `create = "CREATED"`;
//! - an inbox delivery: `inbox = "inbox", message = "message_key", payload = "payload"`,
//!   each naming a parameter.

use crate::ctxt::Ctxt;
use crate::keys::KeyNames;
use proc_macro2::TokenStream;
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

/// Every argument, as given (the first of one given twice).
#[derive(Default)]
pub struct Args {
    pub machine: Option<Path>,
    pub key: Option<KeyNames>,
    pub from: Option<LitStr>,
    pub to: Option<LitStr>,
    pub version: Option<LitStr>,
    pub watermark: Option<LitStr>,
    pub create: Option<LitStr>,
    /// The columns of every `set(…)`, in the attribute's order.
    pub set: Option<Vec<SetColumn>>,
    pub inbox: Option<LitStr>,
    pub message: Option<LitStr>,
    pub payload: Option<LitStr>,
}

/// One column of `set(…)`.
#[derive(Clone)]
pub struct SetColumn {
    /// The column's name (a raw identifier without its `r#`), spanned at the user's token.
    pub column: LitStr,
    pub value: SetValue,
}

#[derive(Clone)]
pub enum SetValue {
    /// `column = "param"`, or `column` alone for the parameter of the same name.
    Param(LitStr),
    /// `column = now()`.
    Now,
}

impl Args {
    /// Parses the arguments, recording every error in `cx`. `None` after a syntax error.
    pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Option<Args> {
        let mut args = Args::default();
        let parser = syn::meta::parser(|meta| {
            let name = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            let slot = match name.as_str() {
                "machine" => {
                    let value: Path = meta.value()?.parse()?;
                    cx.once(&meta.path, &mut args.machine, value);
                    return Ok(());
                }
                "key" => {
                    let value =
                        KeyNames::parse("the parameters holding the row's key", meta.value()?)?;
                    cx.once(&meta.path, &mut args.key, value);
                    return Ok(());
                }
                "set" => {
                    if args.set.is_some() {
                        cx.given_twice(&meta.path, ": list every column in one `set(…)`");
                    }
                    let columns = set_columns(cx, &meta)?;
                    args.set.get_or_insert_with(Vec::new).extend(columns);
                    return Ok(());
                }
                "from" => &mut args.from,
                "to" => &mut args.to,
                "version" => &mut args.version,
                "watermark" => &mut args.watermark,
                "create" => &mut args.create,
                "inbox" => &mut args.inbox,
                "message" => &mut args.message,
                "payload" => &mut args.payload,
                _ => {
                    let shown = crate::suggest::path_name(&meta.path);
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
            cx.once(&meta.path, slot, value);
            Ok(())
        });
        if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
            cx.push(e);
            return None;
        }
        Some(args)
    }
}

const SET_FORM: &str = "`set` lists the columns the transition's UPDATE also sets, each from a \
     parameter or the database's clock, e.g. `set(amount = \"amount_cents\", paid_at = now(), note)` \
     (`note` alone: the parameter `note`)";

/// The columns of one `set(…)`, each named once.
fn set_columns(
    cx: &mut Ctxt,
    meta: &syn::meta::ParseNestedMeta<'_>,
) -> syn::Result<Vec<SetColumn>> {
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
    Ok(columns)
}

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
