//! Expansion snapshots: what `#[idempotent]` generates for each form of handler, pinned in
//! reviewed files so that a change in generated code shows up in review.
//!
//! Each `snapshots/<name>.rs` holds one handler as a user writes it (with its attribute);
//! `snapshots/<name>.expanded.rs` is its expansion by [`idempotent_inner`], formatted. After
//! a deliberate change, regenerate with `IDEM_SNAPSHOTS=overwrite cargo test -p idem-macros`
//! and read every changed file.

use crate::handler::idempotent_inner;
use quote::ToTokens;
use std::path::{Path, PathBuf};

/// The expansion of the one `#[idempotent(…)]` function in `source`, formatted; the
/// function may sit in an `impl` (the card's form), whose other items are kept.
fn expand(source: &str) -> String {
    let mut file = syn::parse_file(source).expect("a snapshot input is Rust");
    let mut expanded = 0;
    for item in &mut file.items {
        match item {
            syn::Item::Fn(function) => {
                if let Some(tokens) = expand_fn(function) {
                    *item = syn::Item::Verbatim(tokens);
                    expanded += 1;
                }
            }
            syn::Item::Impl(block) => {
                for member in &mut block.items {
                    if let syn::ImplItem::Fn(method) = member {
                        let mut function = syn::ItemFn {
                            attrs: method.attrs.clone(),
                            vis: method.vis.clone(),
                            sig: method.sig.clone(),
                            block: Box::new(method.block.clone()),
                        };
                        if let Some(tokens) = expand_fn(&mut function) {
                            *member = syn::ImplItem::Verbatim(tokens);
                            expanded += 1;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        expanded, 1,
        "a snapshot input holds one #[idempotent] function"
    );
    // Re-parse, so that the expansion is formatted like the rest.
    let file: syn::File = syn::parse2(file.into_token_stream())
        .expect("the expansion of a valid handler parses as Rust");
    prettyplease::unparse(&file)
}

/// The expansion of `function` if it carries `#[idempotent(…)]`, which is removed from it.
fn expand_fn(function: &mut syn::ItemFn) -> Option<proc_macro2::TokenStream> {
    let position = function
        .attrs
        .iter()
        .position(|a| a.path().is_ident("idempotent"))?;
    let attribute = function.attrs.remove(position);
    let args = match attribute.meta {
        syn::Meta::List(list) => list.tokens,
        _ => proc_macro2::TokenStream::new(),
    };
    Some(idempotent_inner(args, function.to_token_stream()))
}

fn snapshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots")
}

#[test]
fn expansions_match_their_snapshots() {
    let overwrite = std::env::var("IDEM_SNAPSHOTS").as_deref() == Ok("overwrite");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(snapshots())
        .expect("idem-macros/snapshots exists")
        .map(|entry| entry.expect("a readable directory").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "rs")
                && !p.to_string_lossy().ends_with(".expanded.rs")
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 4, "the snapshot inputs are missing");
    let mut failures = Vec::new();
    for input in &inputs {
        let source = std::fs::read_to_string(input).expect("a readable input");
        let expanded = expand(&source);
        let snapshot = input.with_extension("expanded.rs");
        match std::fs::read_to_string(&snapshot) {
            Ok(pinned) if pinned == expanded => {}
            Err(_) => {
                std::fs::write(&snapshot, &expanded).expect("a writable snapshot");
                failures.push(format!(
                    "{}: new snapshot written; review it and commit it",
                    snapshot.display()
                ));
            }
            Ok(_) if overwrite => {
                std::fs::write(&snapshot, &expanded).expect("a writable snapshot");
            }
            Ok(pinned) => {
                let line = pinned
                    .lines()
                    .zip(expanded.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| pinned.lines().count().min(expanded.lines().count()));
                failures.push(format!(
                    "{}: the expansion differs from line {}:\n  pinned:   {}\n  expanded: {}\n\
                     (regenerate with IDEM_SNAPSHOTS=overwrite cargo test -p idem-macros, and review the diff)",
                    snapshot.display(),
                    line + 1,
                    pinned.lines().nth(line).unwrap_or("<end>"),
                    expanded.lines().nth(line).unwrap_or("<end>"),
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The snapshots are of handlers that compile: an expansion with a compile error (which
/// the snapshot would pin) is a broken input, not a snapshot.
#[test]
fn snapshot_inputs_expand_without_errors() {
    for input in std::fs::read_dir(snapshots()).expect("idem-macros/snapshots exists") {
        let path = input.expect("a readable directory").path();
        if path.to_string_lossy().ends_with(".expanded.rs") {
            continue;
        }
        let expanded = expand(&std::fs::read_to_string(&path).expect("a readable input"));
        assert!(
            !expanded.contains("compile_error"),
            "{}: the input does not expand cleanly:\n{expanded}",
            path.display()
        );
    }
}
