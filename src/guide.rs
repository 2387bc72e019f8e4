//! The guide: idem in depth, a page a topic. Every Rust block of every page is compiled (and,
//! unless it needs a server, run) as a doc test, so none drifts from the API; the README is the
//! landing page that links here.
//!
//! - [`inbox`]: message consumers, exactly-once effects from at-least-once brokers.
//! - [`http`]: idempotent HTTP requests, the `Idempotency-Key` layer (feature `http`).
//! - [`observability`]: the span of every call, and its counters (feature `metrics`).
//! - [`schema`]: bad data is an error, never a guess; checking the schema at start-up, and
//!   letting the database enforce the machine.
//! - [`testing`]: testing your own handlers (feature `testing`).
//!
//! The pages are Markdown files in the repository's `docs/guide/`.

#[doc = include_str!("../docs/guide/inbox.md")]
pub mod inbox {}

#[doc = include_str!("../docs/guide/http.md")]
pub mod http {}

#[doc = include_str!("../docs/guide/observability.md")]
pub mod observability {}

#[doc = include_str!("../docs/guide/schema.md")]
pub mod schema {}

#[doc = include_str!("../docs/guide/testing.md")]
pub mod testing {}
