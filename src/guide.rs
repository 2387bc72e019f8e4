//! The guide: idem in depth, a page a topic. Every Rust block of every page is compiled (and,
//! unless it needs a server, run) as a doc test, and every SQL block is compared with what idem
//! generates, so none drifts from the code; the README is the landing page that links here.
//!
//! - [`transitions`]: transitions and keys — the machine, the handler, keys, `set(…)`, the
//!   one-statement form, watermarks, creations, your own transaction, conflicts, compile errors.
//! - [`sql`]: the SQL reference — every statement each form sends, on each backend.
//! - [`inbox`]: message consumers, exactly-once effects from at-least-once brokers.
//! - [`http`]: idempotent HTTP requests, the `Idempotency-Key` layer (feature `http`).
//! - [`outbox`]: messages that commit with their effect, and the relay that publishes them.
//! - [`cache`]: the Redis fast path: duplicates answered without a transaction (feature
//!   `redis`).
//! - [`schedule`]: scheduled jobs that run once per occurrence (feature `schedule`), leases
//!   with fencing tokens, and timeouts as delayed messages.
//! - [`scaling`]: past one database server — the ambiguous commit, MariaDB Galera, PostgreSQL
//!   failover, pgbouncer, the test clusters.
//! - [`observability`]: the span of every call, and its counters (feature `metrics`).
//! - [`operating`]: operating idem — the `idem` command for the people on call, from an
//!   alert to a repair.
//! - [`schema`]: bad data is an error, never a guess; checking the schema at start-up, and
//!   letting the database enforce the machine.
//! - [`testing`]: testing your own handlers (feature `testing`).
//! - [`proofs`]: what idem's own tests prove, on which databases and brokers.
//!
//! The pages are Markdown files in the repository's `docs/guide/`.

#[doc = include_str!("../docs/guide/transitions.md")]
pub mod transitions {}

#[doc = include_str!("../docs/guide/sql.md")]
pub mod sql {}

#[doc = include_str!("../docs/guide/inbox.md")]
pub mod inbox {}

#[doc = include_str!("../docs/guide/http.md")]
pub mod http {}

#[doc = include_str!("../docs/guide/outbox.md")]
pub mod outbox {}

#[doc = include_str!("../docs/guide/cache.md")]
pub mod cache {}

#[doc = include_str!("../docs/guide/schedule.md")]
pub mod schedule {}

#[doc = include_str!("../docs/guide/scaling.md")]
pub mod scaling {}

#[doc = include_str!("../docs/guide/observability.md")]
pub mod observability {}

#[doc = include_str!("../docs/guide/operating.md")]
pub mod operating {}

#[doc = include_str!("../docs/guide/schema.md")]
pub mod schema {}

#[doc = include_str!("../docs/guide/testing.md")]
pub mod testing {}

#[doc = include_str!("../docs/guide/proofs.md")]
pub mod proofs {}

/// The README's Rust blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct Readme;
