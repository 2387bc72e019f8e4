//! Compile-error suite: every mistake a user can make at a machine declaration or a handler
//! site, one per file under `tests/ui/fail/`, with the exact message pinned in its
//! `.stderr`; and the hygiene regressions under `tests/ui/pass/`, each a program of a user's
//! that must keep compiling (shadowed prelude names, a machine by path, `Send` futures, …).
//!
//! The passing cases are modules of this test, compiled with it, rather than programs built
//! one by one by trybuild: a trybuild run with passing cases builds each case as a crate of
//! its own and gives up checking the failing cases together. With failing cases only,
//! trybuild checks them all in one `cargo check`.
//!
//! Regenerate the snapshots after a deliberate wording change with
//! `TRYBUILD=overwrite cargo test -p idem-ui`, then read every changed `.stderr`.

// A user's handlers, as written (one takes eight arguments); each case's `main` is unused.
#![allow(dead_code, clippy::too_many_arguments)]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}

#[path = "ui/pass/card_form.rs"]
mod card_form;
#[path = "ui/pass/creation.rs"]
mod creation;
#[path = "ui/pass/http_layer_scoped.rs"]
mod http_layer_scoped;
#[path = "ui/pass/hygiene_shadowed_names.rs"]
mod hygiene_shadowed_names;
#[path = "ui/pass/machine_by_path.rs"]
mod machine_by_path;
#[path = "ui/pass/method_with_self.rs"]
mod method_with_self;
#[path = "ui/pass/optional_version.rs"]
mod optional_version;
#[path = "ui/pass/result_alias.rs"]
mod result_alias;
#[path = "ui/pass/send_future.rs"]
mod send_future;
#[path = "ui/pass/set_columns.rs"]
mod set_columns;
#[path = "ui/pass/statement_form.rs"]
mod statement_form;
#[path = "ui/pass/text_keys.rs"]
mod text_keys;
#[path = "ui/pass/watermark.rs"]
mod watermark;

/// Every file under `tests/ui/pass/` is a module above: a new case is not left out.
#[test]
fn every_passing_case_is_compiled() {
    let mut found: Vec<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/pass"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter_map(|name| name.strip_suffix(".rs").map(str::to_owned))
            .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "card_form",
            "creation",
            "http_layer_scoped",
            "hygiene_shadowed_names",
            "machine_by_path",
            "method_with_self",
            "optional_version",
            "result_alias",
            "send_future",
            "set_columns",
            "statement_form",
            "text_keys",
            "watermark",
        ],
        "add each case under tests/ui/pass/ as a module of tests/ui.rs"
    );
}
