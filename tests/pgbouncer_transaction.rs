//! PostgreSQL through pgbouncer in transaction pooling (a `pgbouncer` of each test's own,
//! run as `postgres`), with `idem::set_postgres_statements(PostgresStatements::Unnamed)`:
//! named prepared statements break there (shown first, with sqlx alone), and every form of
//! idem works — transitions, the one-statement form, creations, the inbox in both modes and
//! its retention, the HTTP layer, the outbox and its relay, the schema check and the
//! gauges — with its duplicate answered by the first result; 32 tasks over 16 client
//! connections that pgbouncer shares out among 4 server connections pay and ship 48 orders
//! 4 times each, one `Applied` a key and move.
//!
//! A binary of its own: the switch is process-wide.

mod common;
#[path = "common/http_client.rs"]
mod http_client;
#[path = "common/order.rs"]
mod order;
#[path = "common/pg_forms.rs"]
mod pg_forms;
#[path = "common/pgbouncer.rs"]
mod pgbouncer;

use idem::PostgresStatements;
use pgbouncer::{Alias, OwnPgbouncer, Pooling};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// A test's databases: a pool on the server directly (to set up and to count), and the
/// pool idem runs on, through a pgbouncer in transaction pooling with at most
/// `server_connections` server connections, `client_connections` client connections.
struct Through {
    direct: PgPool,
    pool: PgPool,
    _bouncer: OwnPgbouncer,
}

async fn setup(
    name: &str,
    orders: i64,
    server_connections: u32,
    client_connections: u32,
) -> Option<Through> {
    idem::set_postgres_statements(PostgresStatements::Unnamed);
    let direct = common::postgres(name, 2).await?;
    let options = (*direct.connect_options()).clone();
    pg_forms::prepare(&direct, orders).await;
    let schema = format!("idem_test_{name}");
    let alias = Alias {
        name: &schema,
        database: options.get_database().unwrap_or("test"),
        search_path: &schema,
    };
    let upstream = (options.get_host(), options.get_port());
    let bouncer = OwnPgbouncer::start_with(
        upstream,
        Pooling::Transaction,
        server_connections,
        Some(alias),
    )?;
    let through = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(bouncer.port())
        .username(options.get_username())
        .database(&schema);
    let pool = PgPoolOptions::new()
        .max_connections(client_connections)
        .connect_with(through)
        .await
        .unwrap();
    Some(Through {
        direct,
        pool,
        _bouncer: bouncer,
    })
}

/// What the switch is for, with sqlx alone: through transaction pooling (one server
/// connection, so the two clients' statements meet on it), the second client's named
/// statement collides with the first's, while unnamed statements in a transaction work.
#[tokio::test]
async fn named_statements_collide_through_transaction_pooling() {
    let Some(through) = setup("pgbouncer_tx_named", 0, 1, 2).await else {
        return;
    };
    let options = (*through.pool.connect_options()).clone();
    let mut first = PgConnection::connect_with(&options).await.unwrap();
    let mut second = PgConnection::connect_with(&options).await.unwrap();
    let one: i64 = sqlx::query_scalar("SELECT 1::int8")
        .fetch_one(&mut first)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let collided = sqlx::query_scalar::<_, i64>("SELECT 2::int8")
        .fetch_one(&mut second)
        .await
        .expect_err("a named statement of a second client on the same server connection");
    assert!(
        collided.to_string().contains("already exists"),
        "{collided}"
    );
    for conn in [&mut first, &mut second] {
        let mut tx = conn.begin().await.unwrap();
        let three: i64 = sqlx::query_scalar("SELECT 3::int8")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(three, 3);
    }
}

/// Every form through transaction pooling, each first call and its duplicate.
#[tokio::test]
async fn every_form_works_through_transaction_pooling() {
    let Some(Through {
        direct,
        pool,
        _bouncer,
    }) = setup("pgbouncer_tx_forms", 4, 2, 8).await
    else {
        return;
    };
    pg_forms::every_form(&pool, &direct).await;
}

/// 32 tasks over 16 client connections, which pgbouncer shares out among 4 server
/// connections: 48 orders paid 4 times each, then shipped (the one-statement form) 4
/// times each; one `Applied` a key and move, one effect a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_through_transaction_pooling_apply_once() {
    const KEYS: i64 = 48;
    let Some(Through {
        direct,
        pool,
        _bouncer,
    }) = setup("pgbouncer_tx_race", KEYS, 4, 16).await
    else {
        return;
    };
    pg_forms::race(&pool, &direct, KEYS).await;
}
