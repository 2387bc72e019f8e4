//! The integration tests, one module a file, linked into one binary: the dependency tree is
//! linked once instead of once per file. `tests/model.rs` (it installs a panic hook and the
//! fault hook for its whole process), `tests/statements.rs` (a global tracing subscriber
//! logs every statement), `tests/observability.rs` (its subscribers must see every span,
//! and a callsite first hit by another test's thread while one is being set up can stay
//! disabled for it: a span went missing so, once in a full run),
//! `tests/pgbouncer_transaction.rs` (it sets `idem::set_postgres_statements` for its whole
//! process) stay binaries of their own; the compile errors (trybuild) are `ui/`'s package.
//!
//! One file's tests: `cargo test -p idem --test suite -- http::` (its module's name).

#[path = "common/brokers.rs"]
mod brokers;
#[path = "common/child.rs"]
mod child;
mod common;
#[path = "common/galera.rs"]
mod galera_cluster;
#[path = "common/harness.rs"]
mod harness;
#[path = "common/http_client.rs"]
mod http_client;
#[path = "common/order.rs"]
mod order;
#[path = "common/pg_forms.rs"]
mod pg_forms;
#[path = "common/pgbouncer.rs"]
mod pgbouncer;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/redis.rs"]
mod redis_server;

mod alerts;
mod ambiguous_commit;
mod batches;
mod cache;
mod chain;
mod clocks;
mod composite_keys;
mod composition;
mod concurrency;
mod conformance;
mod console;
mod consumer_handlers;
mod crashes;
mod creation;
mod enforce;
mod event_streams;
mod failover;
mod faults;
mod galera;
mod http;
mod http_crashes;
mod http_optimistic;
mod http_stacks;
mod inbox;
mod inbox_admin;
mod inbox_kafka;
mod kafka_faults;
mod key_lengths;
mod keys;
mod leases;
mod migrations;
mod nats;
mod order_timeouts;
mod outbox;
mod outbox_brokers;
mod outbox_delayed;
mod outbox_kafka;
mod partitions;
mod pgbouncer_session;
mod postgres_types;
mod rabbitmq;
mod races;
mod readme;
mod reconcile;
mod schedule;
mod schedule_processes;
mod serializable;
mod set_columns;
mod statement_form;
mod tables;
mod testing;
mod transitions;
mod verify;
mod writers;
