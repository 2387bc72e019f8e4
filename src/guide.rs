//! The guide: idem in depth, a page a topic. Every Rust block of every page is compiled (and,
//! unless it needs a server, run) as a doc test, so none drifts from the API; the README is the
//! landing page that links here.
//!
//! - [`inbox`]: message consumers, exactly-once effects from at-least-once brokers.
//! - [`http`]: idempotent HTTP requests, the `Idempotency-Key` layer (feature `http`).
//!
//! The pages are Markdown files in the repository's `docs/guide/`.

#[doc = include_str!("../docs/guide/inbox.md")]
pub mod inbox {}

#[doc = include_str!("../docs/guide/http.md")]
pub mod http {}
