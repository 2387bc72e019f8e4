//! The runtime's layering, checked from its own source: the unit of work and what lies
//! below it (`work/`, `backend/`, `machine/`, `value/`, `schema/`, `error.rs`,
//! `fault.rs`) name no stage (`transition/`, `inbox/`, `outbox/`, `cache/`, `http/`).
//!
//! A stage sits on the unit of work and names it; a stage's type, migration or cache that
//! the unit of work needed would make every new stage edit `work/` to exist, and every
//! change to a stage able to break the unit of work. What every stage needs lives in
//! `work/` or below, and a stage registers what it brings (`work::fast::attach` for a
//! cache).
//!
//! Every path in the code is read (imports, grouped imports, paths in expressions and
//! types, `super::` chains, and the tokens of macros), doc comments are not. Set
//! `IDEM_LAYERS_SRC` to check another copy of `idem-runtime/src`.

use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The stages: the modules the lower layers must not name.
const STAGES: [&str; 5] = ["transition", "inbox", "outbox", "cache", "http"];

/// The lower layers: folders and files under `src/`.
const LOWER: [&str; 7] = [
    "work", "backend", "machine", "value", "schema", "error.rs", "fault.rs",
];

/// A path that names a stage, in `file`.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    path: String,
}

/// The module a file is, as path segments from the crate's root.
fn module_of(relative: &Path) -> Vec<String> {
    let mut segments: Vec<String> = relative
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = segments.pop().expect("a file");
    if last != "mod.rs" && last != "lib.rs" {
        segments.push(last.trim_end_matches(".rs").to_owned());
    }
    segments
}

struct Paths<'a> {
    file: &'a str,
    /// The module the code being visited is in (the file's, then inline `mod`s).
    module: Vec<String>,
    found: Vec<Violation>,
}

impl Paths<'_> {
    /// Checks a path whose segments are `segments` (as written), from the current module.
    fn check(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let resolved: Vec<String> = match first.as_str() {
            "crate" | "$crate" => segments[1..].to_vec(),
            "self" => {
                let mut module = self.module.clone();
                module.extend_from_slice(&segments[1..]);
                module
            }
            "super" => {
                let mut module = self.module.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
                module.extend_from_slice(rest);
                module
            }
            _ => return,
        };
        if resolved
            .first()
            .is_some_and(|m| STAGES.contains(&m.as_str()))
        {
            self.found.push(Violation {
                file: self.file.to_owned(),
                path: segments.join("::"),
            });
        }
    }

    /// Every path a `use` tree imports.
    fn uses(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.uses(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.check(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.check(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.check(&prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.uses(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.uses(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.check(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

impl Paths<'_> {
    /// A macro's tokens are not parsed into paths: reads them as `a :: b` sequences, in
    /// every group.
    fn tokens(&mut self, stream: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let tokens: Vec<TokenTree> = stream.into_iter().collect();
        let text = |i: usize| match tokens.get(i) {
            Some(TokenTree::Ident(ident)) => Some(ident.to_string()),
            Some(TokenTree::Punct(punct)) => Some(punct.as_char().to_string()),
            _ => None,
        };
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(group) = &tokens[i] {
                self.tokens(group.stream());
                i += 1;
                continue;
            }
            let first = match (text(i).as_deref(), text(i + 1).as_deref()) {
                (Some("$"), Some("crate")) => {
                    i += 1;
                    "$crate".to_owned()
                }
                (Some(word @ ("crate" | "self" | "super")), _) => word.to_owned(),
                _ => {
                    i += 1;
                    continue;
                }
            };
            let mut segments = vec![first];
            let mut j = i + 1;
            while text(j).as_deref() == Some(":") && text(j + 1).as_deref() == Some(":") {
                match text(j + 2) {
                    Some(next) if next != ":" => segments.push(next),
                    _ => break,
                }
                j += 3;
            }
            if segments.len() > 1 {
                self.check(&segments);
            }
            i = j;
        }
    }
}

/// The paths of `source` (the file `relative` under `src/`) that name a stage.
fn violations(relative: &Path, source: &str) -> Vec<Violation> {
    let file = syn::parse_file(source)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", relative.display()));
    let mut paths = Paths {
        file: &relative.display().to_string(),
        module: module_of(relative),
        found: Vec::new(),
    };
    paths.visit_file(&file);
    paths.found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if dir.is_file() {
        out.push(dir.to_owned());
        return;
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            rust_files(&entry, out);
        } else if entry.extension().is_some_and(|e| e == "rs") {
            out.push(entry);
        }
    }
}

#[test]
fn no_lower_layer_names_a_stage() {
    let src = std::env::var_os("IDEM_LAYERS_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // The stages exist where this test looks for them (a renamed folder would make the
    // check vacuous).
    for stage in STAGES {
        assert!(
            src.join(stage).is_dir() || src.join(format!("{stage}.rs")).is_file(),
            "no stage `{stage}` under {}",
            src.display()
        );
    }
    let mut files = Vec::new();
    for lower in LOWER {
        rust_files(&src.join(lower), &mut files);
    }
    assert!(files.len() > 20, "{} files read", files.len());
    let mut found = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        found.extend(violations(file.strip_prefix(&src).unwrap(), &source));
    }
    assert!(
        found.is_empty(),
        "the unit of work and the layers below it name these stages (move what they need \
         into `work/` or below, and let the stage name it):\n{}",
        found
            .iter()
            .map(|v| format!("  {}: {}", v.file, v.path))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Each way of naming a stage is caught, and doc comments and strings are not.
#[test]
fn every_form_of_a_path_is_read() {
    let found = |file: &str, source: &str| -> Vec<String> {
        violations(Path::new(file), source)
            .into_iter()
            .map(|v| v.path)
            .collect()
    };
    assert_eq!(
        found("work/unit.rs", "use crate::inbox::record::Ended;"),
        ["crate::inbox::record::Ended"]
    );
    assert_eq!(
        found(
            "work/unit.rs",
            "use crate::{backend::Backend, outbox::{effect::CallScope, Message}};"
        ),
        ["crate::outbox::effect::CallScope", "crate::outbox::Message"]
    );
    assert_eq!(
        found("work/unit.rs", "use super::super::cache::*;"),
        ["super::super::cache"]
    );
    assert_eq!(
        found("work/mod.rs", "use super::http::Tx;"),
        ["super::http::Tx"]
    );
    assert_eq!(
        found(
            "work/fast.rs",
            "fn f() { let _ = crate::cache::attached(); }"
        ),
        ["crate::cache::attached"]
    );
    assert_eq!(
        found(
            "machine/verify.rs",
            "mod tests { use super::super::super::inbox::X; }"
        ),
        ["super::super::super::inbox::X"]
    );
    assert_eq!(
        found(
            "work/unit.rs",
            "macro_rules! m { () => { $crate::transition::Moved }; }"
        ),
        ["$crate::transition::Moved"]
    );
    assert_eq!(
        found(
            "work/fast.rs",
            "/// [`Recorded`](crate::inbox::Recorded)\n\
             fn f() -> &'static str { \"crate::inbox\" }\n\
             use crate::work::effect::CallScope;\n\
             use super::unit::Plan;"
        ),
        Vec::<String>::new()
    );
}
