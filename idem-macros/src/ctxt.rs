//! Collects every error of one expansion, so one build shows all mistakes.

use proc_macro2::TokenStream;
use quote::ToTokens;
use std::fmt::Display;

/// Errors found so far. Must be consumed with [`Ctxt::check`]; dropping it unchecked is a
/// bug in the macro and panics.
#[derive(Default)]
pub struct Ctxt {
    errors: Option<Vec<syn::Error>>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt {
            errors: Some(Vec::new()),
        }
    }

    /// Records an error spanning `tokens`.
    pub fn error_spanned_by<T: ToTokens, M: Display>(&mut self, tokens: T, message: M) {
        self.push(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    /// Records an error at `span`.
    pub fn error_at<M: Display>(&mut self, span: proc_macro2::Span, message: M) {
        self.push(syn::Error::new(span, message));
    }

    /// Records a `syn` error.
    pub fn push(&mut self, error: syn::Error) {
        self.errors
            .as_mut()
            .expect("Ctxt used after check")
            .push(error);
    }

    /// Stores the value of an argument given at `path`; if it was given before, the first
    /// value stays and this one is reported, [given twice](Ctxt::given_twice).
    pub fn once<T>(&mut self, path: &syn::Path, slot: &mut Option<T>, value: T) {
        if slot.is_some() {
            self.given_twice(path, "");
        } else {
            *slot = Some(value);
        }
    }

    /// Records "`argument` is given twice" on its second `path`, followed by `hint`.
    pub fn given_twice(&mut self, path: &syn::Path, hint: &str) {
        let name = crate::suggest::path_name(path);
        self.error_spanned_by(path, format!("`{name}` is given twice{hint}"));
    }

    /// Whether any error has been recorded.
    pub fn has_errors(&self) -> bool {
        self.errors.as_ref().is_some_and(|e| !e.is_empty())
    }

    /// All errors combined into one, or `Ok` if there were none.
    pub fn check(mut self) -> Result<(), syn::Error> {
        let mut errors = self.errors.take().expect("Ctxt checked twice").into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for rest in errors {
            combined.combine(rest);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.is_some() {
            panic!("idem-macros: Ctxt dropped without check");
        }
    }
}

/// The compile errors of `error`, followed by `fallback` so the rest of the user's code
/// still type-checks against the item.
pub fn with_fallback(error: syn::Error, fallback: TokenStream) -> TokenStream {
    let mut tokens = error.to_compile_error();
    tokens.extend(fallback);
    tokens
}
