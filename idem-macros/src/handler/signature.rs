//! The handler's signature: which parameter is the transaction, which are business values.

use crate::ctxt::Ctxt;
use syn::{FnArg, GenericArgument, Ident, Pat, PathArguments, Type};

pub struct Handler {
    pub name: Ident,
    /// The first parameter's name: the transaction (`tx: &mut Transaction<'_, Sqlite>`)
    /// or, in the one-statement form, the pool (`pool: &PgPool`).
    pub tx: Ident,
    /// The transaction's type; `None` in the one-statement form (a pool, no transaction).
    pub tx_type: Option<Type>,
    /// The backend: the last type argument of `Transaction`, or the pool's database.
    pub database: Type,
    /// The result type of the body as written (`Result<Receipt, PayError>`); `None` after
    /// an error (the other checks still run).
    pub output: Option<Type>,
    /// The parameters after the transaction that are plain identifiers.
    pub params: Vec<Param>,
}

pub struct Param {
    pub ident: Ident,
    /// Its type as written, to blame a key or version of the wrong type on.
    pub ty: Type,
}

const TX_EXAMPLE: &str = "tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>";
const FIRST_PARAM: &str = "the first parameter of an idempotent handler is its transaction, \
     `&mut Transaction<'_, DB>` with DB one of `Sqlite`, `Postgres`, `Any` (the body runs in it), \
     or a pool, `&Pool<DB>` (`&SqlitePool`, `&PgPool`, `&AnyPool`: no transaction, the \
     transition is one statement)";

impl Handler {
    pub fn parse(cx: &mut Ctxt, function: &syn::ItemFn) -> Option<Handler> {
        let sig = &function.sig;
        if sig.asyncness.is_none() {
            cx.error_spanned_by(
                sig.fn_token,
                format!(
                    "`{}` must be an `async fn`: an idempotent handler runs a database transaction; write `async fn {}`",
                    sig.ident, sig.ident
                ),
            );
        }
        if let Some(constness) = &sig.constness {
            cx.error_spanned_by(constness, "an idempotent handler cannot be a `const fn`");
        }
        if let Some(variadic) = &sig.variadic {
            cx.error_spanned_by(variadic, "an idempotent handler cannot be variadic");
        }
        let output = match &sig.output {
            syn::ReturnType::Type(_, ty) if !could_be_result(ty) => {
                cx.error_spanned_by(
                    ty,
                    format!(
                        "`{}` must return `Result<T, E>`: an error from the body rolls the transition back, and `T` is the result replayed to duplicates; write `Result<{}, E>`",
                        sig.ident,
                        quote::quote!(#ty).to_string().replace(' ', "")
                    ),
                );
                None
            }
            syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
            syn::ReturnType::Default => {
                cx.error_spanned_by(
                    &sig.ident,
                    format!(
                        "`{}` must return `Result<T, E>`: an error from the body rolls the transition back; return `Result<(), E>` if there is no result to replay",
                        sig.ident
                    ),
                );
                None
            }
        };

        let mut typed = sig.inputs.iter().filter_map(|arg| match arg {
            FnArg::Typed(pat_type) => Some(pat_type),
            FnArg::Receiver(_) => None,
        });
        let Some(first) = typed.next() else {
            cx.error_spanned_by(&sig.ident, format!("{FIRST_PARAM}; e.g. `{TX_EXAMPLE}`"));
            return None;
        };
        let tx = match &*first.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => Some(p.ident.clone()),
            _ => {
                cx.error_spanned_by(
                    &first.pat,
                    "name the transaction (or pool) parameter with a plain identifier, e.g. `tx`",
                );
                None
            }
        };
        let (database, tx_type) = match (transaction_database(&first.ty), pool_database(&first.ty))
        {
            (Some(db), _) => (Some(db), Some((*first.ty).clone())),
            (None, Some(db)) => (Some(db), None),
            (None, None) => {
                cx.error_spanned_by(&first.ty, format!("{FIRST_PARAM}; e.g. `{TX_EXAMPLE}`"));
                (None, None)
            }
        };
        let params = typed
            .filter_map(|p| match &*p.pat {
                Pat::Ident(i) => Some(Param {
                    ident: i.ident.clone(),
                    ty: (*p.ty).clone(),
                }),
                _ => None,
            })
            .collect();
        Some(Handler {
            name: sig.ident.clone(),
            tx: tx?,
            tx_type,
            database: database?,
            output,
            params,
        })
    }
}

/// `false` for return types that are certainly not a `Result` (the common mistakes), so
/// they get one clear error here; anything else (an alias of `Result`, say) is left to the
/// type checker and the `Fallible` bound.
fn could_be_result(ty: &Type) -> bool {
    const NOT_RESULTS: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Option", "Vec", "Box", "HashMap",
    ];
    match ty {
        Type::Path(path) => {
            path.qself.is_some()
                || path
                    .path
                    .segments
                    .last()
                    .is_none_or(|last| !NOT_RESULTS.contains(&last.ident.to_string().as_str()))
        }
        Type::Paren(inner) => could_be_result(&inner.elem),
        Type::Group(inner) => could_be_result(&inner.elem),
        Type::Macro(_) | Type::Verbatim(_) => true,
        _ => false,
    }
}

/// A shared reference to a named type — `&Pool<DB>` or any alias of one (`&PgPool`,
/// `&SqlitePool`, a type alias of yours) — → its database, `<Pool<DB> as
/// PoolOf>::Database`. A type that is no pool is reported on it by `PoolOf`.
fn pool_database(ty: &Type) -> Option<Type> {
    let Type::Reference(reference) = ty else {
        return None;
    };
    if reference.mutability.is_some() || !matches!(&*reference.elem, Type::Path(_)) {
        return None;
    }
    let pool = &reference.elem;
    Some(
        syn::parse_quote_spanned! {syn::spanned::Spanned::span(pool)=>
            <#pool as ::idem::__private::PoolOf>::Database
        },
    )
}

/// `&mut Transaction<'_, DB>` (any path ending in `Transaction`) → `DB`.
fn transaction_database(ty: &Type) -> Option<Type> {
    let Type::Reference(reference) = ty else {
        return None;
    };
    reference.mutability?;
    let Type::Path(path) = &*reference.elem else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != "Transaction" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().rev().find_map(|arg| match arg {
        GenericArgument::Type(db) => Some(db.clone()),
        _ => None,
    })
}
