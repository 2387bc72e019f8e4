//! `key = "order_id"` or, for a composite key, `key = ("tenant_id", "order_id")`: in the
//! machine declaration the key's columns, in a handler the parameters holding them.

use proc_macro2::Span;
use syn::parse::ParseStream;
use syn::{LitStr, Token};

/// The names `key` lists, in order, and the span of the whole value.
#[derive(Clone)]
pub struct KeyNames {
    pub names: Vec<LitStr>,
    pub span: Span,
}

impl KeyNames {
    /// Parses the value after `key =`: a string, or a parenthesized list of strings.
    pub fn parse(what: &str, input: ParseStream<'_>) -> syn::Result<KeyNames> {
        let example = format!(
            "`key` takes a string or, for a composite key, a list of strings: `key = \"order_id\"` or `key = (\"tenant_id\", \"order_id\")` ({what})"
        );
        if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            return Ok(KeyNames {
                span: lit.span(),
                names: vec![lit],
            });
        }
        if !input.peek(syn::token::Paren) {
            return Err(input.error(example));
        }
        let content;
        let parens = syn::parenthesized!(content in input);
        let list = content
            .parse_terminated(|p: ParseStream<'_>| p.parse::<LitStr>(), Token![,])
            .map_err(|e| syn::Error::new(e.span(), &example))?;
        if list.is_empty() {
            return Err(syn::Error::new(parens.span.join(), example));
        }
        Ok(KeyNames {
            span: parens.span.join(),
            names: list.into_iter().collect(),
        })
    }

    /// The names as written, for messages: `"order_id"` or `("tenant_id", "order_id")`.
    pub fn shown(&self) -> String {
        let names: Vec<String> = self
            .names
            .iter()
            .map(|n| format!("{:?}", n.value()))
            .collect();
        match names.as_slice() {
            [one] => one.clone(),
            many => format!("({})", many.join(", ")),
        }
    }
}
