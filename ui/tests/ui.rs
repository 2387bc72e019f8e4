//! Compile-error suite: every mistake a user can make at a machine declaration or a handler
//! site, one per file under `tests/ui/fail/`, with the exact message pinned in its
//! `.stderr`. (The hygiene regressions under `tests/ui/pass/`, which must keep compiling,
//! are modules of `tests/pass.rs`: with no passing case here, trybuild checks every failing
//! case in one `cargo check` instead of one build per case.)
//!
//! Regenerate the snapshots after a deliberate wording change with
//! `TRYBUILD=overwrite cargo test -p idem-ui`, then read every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
