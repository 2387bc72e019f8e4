//! The machine declaration as written: `#[machine(...)]` on the enum, `#[state(...)]` on
//! its variants.

use crate::ctxt::Ctxt;
use crate::ident::screaming_snake;
use crate::keys::KeyNames;
use crate::suggest::path_name;
use proc_macro2::Span;
use syn::{Ident, LitStr};

pub const MACHINE_KEYS: [&str; 6] = ["table", "key", "state", "version", "results", "id"];
pub const STATE_KEYS: [&str; 2] = ["name", "to"];

pub struct Machine {
    pub ident: Ident,
    pub table: Option<LitStr>,
    pub key: Option<KeyNames>,
    pub state: Option<LitStr>,
    pub version: Option<LitStr>,
    pub results: Option<LitStr>,
    pub id: Option<LitStr>,
    pub states: Vec<State>,
    /// Whether `#[machine(...)]` is present at all (if not, that is the one error to report).
    pub has_machine_attr: bool,
}

pub struct State {
    pub ident: Ident,
    /// The database name and the token to blame for it.
    pub name: String,
    pub name_span: Span,
    pub targets: Vec<Ident>,
}

impl Machine {
    /// Parses the declaration, recording every error in `cx`. `None` if the input is not
    /// an enum at all.
    pub fn parse(cx: &mut Ctxt, input: &syn::DeriveInput) -> Option<Machine> {
        let syn::Data::Enum(data) = &input.data else {
            cx.error_spanned_by(
                &input.ident,
                "`StateMachine` derives on an enum whose variants are the states, e.g. `enum Order { Created, Paid }`",
            );
            return None;
        };
        if !input.generics.params.is_empty() {
            cx.error_spanned_by(
                &input.generics,
                "a state machine cannot be generic: its table and states are fixed at compile time",
            );
        }
        let mut machine = Machine {
            ident: input.ident.clone(),
            table: None,
            key: None,
            state: None,
            version: None,
            results: None,
            id: None,
            states: Vec::new(),
            has_machine_attr: false,
        };
        let mut seen_machine_attr = false;
        for attr in input.attrs.iter().filter(|a| a.path().is_ident("machine")) {
            seen_machine_attr = true;
            let result = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("key") {
                    let value = KeyNames::parse("the key's columns", meta.value()?)?;
                    cx.once(&meta.path, &mut machine.key, value);
                    return Ok(());
                }
                let slot = match meta.path.get_ident().map(Ident::to_string).as_deref() {
                    Some("table") => &mut machine.table,
                    Some("state") => &mut machine.state,
                    Some("version") => &mut machine.version,
                    Some("results") => &mut machine.results,
                    Some("id") => &mut machine.id,
                    _ => {
                        let name = path_name(&meta.path);
                        cx.error_spanned_by(
                            &meta.path,
                            crate::suggest::unknown_argument(
                                "`machine` argument",
                                &name,
                                &MACHINE_KEYS,
                            ),
                        );
                        // consume the value so parsing continues with the next argument
                        if meta.input.peek(syn::Token![=]) {
                            let _: syn::Expr = meta.value()?.parse()?;
                        }
                        return Ok(());
                    }
                };
                let value: LitStr = meta.value()?.parse()?;
                cx.once(&meta.path, slot, value);
                Ok(())
            });
            if let Err(e) = result {
                cx.push(e);
            }
        }
        machine.has_machine_attr = seen_machine_attr;
        if !seen_machine_attr {
            cx.error_spanned_by(
                &input.ident,
                format!(
                    "missing `#[machine(table = \"…\", key = \"…\")]` on `{}`: name the table and its key column",
                    input.ident
                ),
            );
        }
        for variant in &data.variants {
            if let Some(state) = State::parse(cx, variant) {
                machine.states.push(state);
            }
        }
        Some(machine)
    }
}

impl State {
    fn parse(cx: &mut Ctxt, variant: &syn::Variant) -> Option<State> {
        if !matches!(variant.fields, syn::Fields::Unit) {
            cx.error_spanned_by(
                &variant.fields,
                format!(
                    "state `{}` has fields; states are unit variants (the row holds the data)",
                    variant.ident
                ),
            );
        }
        if let Some((_, discriminant)) = &variant.discriminant {
            cx.error_spanned_by(
                discriminant,
                "states have no discriminant; name them with `#[state(name = \"…\")]`",
            );
        }
        let mut name: Option<LitStr> = None;
        let mut targets: Option<Vec<Ident>> = None;
        for attr in variant.attrs.iter().filter(|a| a.path().is_ident("state")) {
            let result = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("name") {
                    let value: LitStr = meta.value()?.parse()?;
                    cx.once(&meta.path, &mut name, value);
                } else if meta.path.is_ident("to") {
                    let mut list = Vec::new();
                    meta.parse_nested_meta(|target| {
                        match target.path.get_ident() {
                            Some(ident) => list.push(ident.clone()),
                            None => cx.error_spanned_by(
                                &target.path,
                                "a target is a variant of this enum, e.g. `to(Paid, Cancelled)`",
                            ),
                        }
                        Ok(())
                    })?;
                    if targets.is_some() {
                        cx.given_twice(&meta.path, "; list all targets in one `to(...)`");
                    } else {
                        targets = Some(list);
                    }
                } else {
                    let name = path_name(&meta.path);
                    cx.error_spanned_by(
                        &meta.path,
                        crate::suggest::unknown_argument("`state` argument", &name, &STATE_KEYS),
                    );
                    if meta.input.peek(syn::Token![=]) {
                        let _: syn::Expr = meta.value()?.parse()?;
                    } else if meta.input.peek(syn::token::Paren) {
                        meta.parse_nested_meta(|_| Ok(()))?;
                    }
                }
                Ok(())
            });
            if let Err(e) = result {
                cx.push(e);
            }
        }
        let (name, name_span) = match name {
            Some(lit) => (lit.value(), lit.span()),
            None => (
                screaming_snake(&variant.ident.to_string()),
                variant.ident.span(),
            ),
        };
        Some(State {
            ident: variant.ident.clone(),
            name,
            name_span,
            targets: targets.unwrap_or_default(),
        })
    }
}
