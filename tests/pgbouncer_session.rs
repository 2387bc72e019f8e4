//! PostgreSQL through pgbouncer in session pooling (a `pgbouncer` of each test's own, run as
//! `postgres`): every form works as it is — a transition, the one-statement form, a creation,
//! the inbox in both modes and its retention, the HTTP layer, the outbox and its relay, the
//! schema check and the gauges — and 32 tasks paying and shipping 48 orders 4 times each
//! apply each once.

use crate::common;
use crate::pg_forms;
use crate::pgbouncer::{OwnPgbouncer, Pooling};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// A schema of its own (made on the server directly, and counted there), and a pool on it
/// through a pgbouncer in session pooling: the schema is each session's `search_path`.
async fn setup(name: &str, orders: i64) -> Option<(PgPool, PgPool, OwnPgbouncer)> {
    let direct = common::postgres(name, 1).await?;
    let options = (*direct.connect_options()).clone();
    let upstream = (options.get_host().to_owned(), options.get_port());
    pg_forms::prepare(&direct, orders).await;
    let bouncer = OwnPgbouncer::start((&upstream.0, upstream.1), Pooling::Session)?;
    let schema = format!("idem_test_{name}");
    // pgbouncer passes no `options` startup parameter: the search path is set per session.
    let through = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(bouncer.port())
        .username(options.get_username())
        .database(options.get_database().unwrap_or("test"));
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .after_connect(move |conn, _| {
            let set = format!("SET search_path TO {schema}");
            Box::pin(async move {
                sqlx::Executor::execute(conn, set.as_str()).await?;
                Ok(())
            })
        })
        .connect_with(through)
        .await
        .unwrap();
    Some((direct, pool, bouncer))
}

/// Every form through session pooling, each first call and its duplicate.
#[tokio::test]
async fn every_form_works_through_session_pooling() {
    let Some((direct, pool, _bouncer)) = setup("pgbouncer_session_forms", 4).await else {
        return;
    };
    pg_forms::every_form(&pool, &direct).await;
}

/// 32 tasks, 48 orders paid and then shipped 4 times each, through session pooling: one
/// `Applied` a key and move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_through_session_pooling_apply_once() {
    const KEYS: i64 = 48;
    let Some((direct, pool, _bouncer)) = setup("pgbouncer_session_race", KEYS).await else {
        return;
    };
    pg_forms::race(&pool, &direct, KEYS).await;
}
