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
#[path = "common/pgbouncer.rs"]
mod pgbouncer;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{DbError, IdempotencyLayer, Tx};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use idem::{Creation, Outcome, PostgresStatements, StateMachine};
use order::Order;
use pgbouncer::{Alias, OwnPgbouncer, Pooling};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tickets", key = "code", state = "state")]
pub enum Ticket {
    #[state(name = "OPEN")]
    Open,
}

/// A body's statement, as a transaction pooler needs it: unnamed, inside the transaction.
async fn effect(tx: &mut PgConnection, order_id: i64, kind: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 0)")
        .bind(order_id)
        .bind(kind)
        .persistent(false)
        .execute(tx)
        .await
        .map(drop)
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<String, sqlx::Error> {
    effect(tx, order_id, "pay").await?;
    Ok(format!("receipt {order_id}"))
}

/// The one-statement form: no transaction of its own, so one idem begins around it.
#[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
async fn ship(pool: &PgPool, order_id: i64) -> Result<String, String> {
    Ok(format!("parcel {order_id}"))
}

/// Cancels the order and stages a message for the relay.
#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
async fn cancel(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<String, sqlx::Error> {
    let message = Message::bytes("orders.cancelled", format!("cancelled {order_id}"));
    Ok(outbox::stage(tx, message).await?.to_string())
}

#[idem::idempotent(machine = Ticket, key = "code", create = "OPEN", set(seats))]
async fn open(
    tx: &mut Transaction<'_, Postgres>,
    code: &str,
    seats: i64,
) -> Result<String, sqlx::Error> {
    let _ = tx;
    Ok(format!("ticket {code} for {seats}"))
}

#[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
async fn consume(
    tx: &mut Transaction<'_, Postgres>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<i64, sqlx::Error> {
    let _ = payload;
    effect(tx, order_id, "consume").await?;
    Ok(order_id * 10)
}

async fn charge(mut tx: Tx<Postgres>) -> Result<(StatusCode, String), DbError> {
    effect(&mut tx, 0, "charge").await?;
    Ok((StatusCode::CREATED, "{\"charged\":true}".to_owned()))
}

/// A publisher that keeps what it was given.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Outgoing>>>);

impl Publisher for Recorder {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        self.0.lock().unwrap().push(message.clone());
        Ok(Published::Acked)
    }
}

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
    sqlx::query(
        "CREATE TABLE tickets (code TEXT PRIMARY KEY, state TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0, seats BIGINT NOT NULL)",
    )
    .execute(&direct)
    .await
    .unwrap();
    idem::migrate(&direct).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, $1) g",
    )
    .bind(orders)
    .execute(&direct)
    .await
    .unwrap();
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

/// The effects of `kind`, per order, counted on the server directly.
async fn effects(direct: &PgPool, kind: &str) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id")
        .bind(kind)
        .fetch_all(direct)
        .await
        .unwrap()
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
    assert!(
        idem::verify::<Order, _>(&pool).await.unwrap().is_ok(),
        "the schema check"
    );
    assert_eq!(
        pay(&pool, 1).await.unwrap(),
        Outcome::Applied("receipt 1".into())
    );
    assert_eq!(
        pay(&pool, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some("receipt 1".into())
        }
    );
    assert_eq!(
        ship(&pool, 1).await.unwrap(),
        Outcome::Applied("parcel 1".into())
    );
    assert_eq!(
        ship(&pool, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Order::Shipped,
            first_result: Some("parcel 1".into())
        }
    );
    assert_eq!(
        open(&pool, "T-1", 2).await.unwrap(),
        Creation::Created("ticket T-1 for 2".into())
    );
    assert_eq!(
        open(&pool, "T-1", 2).await.unwrap(),
        Creation::Duplicate {
            current: Ticket::Open,
            first_result: Some("ticket T-1 for 2".into())
        }
    );

    let inbox = Inbox::new("bouncer").unwrap();
    let key = MessageKey::business("order:2", "paid").unwrap();
    assert_eq!(
        consume(&pool, &inbox, &key, b"m", 2).await.unwrap(),
        Delivery::Processed(20)
    );
    assert_eq!(
        consume(&pool, &inbox, &key, b"m", 2).await.unwrap(),
        Delivery::Duplicate {
            first_result: Some(20)
        }
    );
    let leased = MessageKey::business("order:3", "paid").unwrap();
    let Claimed::Work(lease) = inbox.claim::<_, i64>(&pool, &leased, b"m").await.unwrap() else {
        panic!("a first delivery works")
    };
    assert_eq!(
        inbox.stuck(&pool).await.unwrap().count,
        0,
        "leased, not stuck"
    );
    assert_eq!(
        lease.complete(&pool, Ok::<_, String>(30)).await.unwrap(),
        Delivery::Processed(30)
    );
    match inbox.claim::<_, i64>(&pool, &leased, b"m").await.unwrap() {
        Claimed::Done(done) => assert_eq!(
            done,
            Delivery::Duplicate {
                first_result: Some(30)
            }
        ),
        Claimed::Work(_) => panic!("a completed message claimed again"),
    }
    // Retention: nothing is an hour old yet; with nothing kept, both records go.
    let hour = Duration::from_secs(3600);
    assert_eq!(inbox.purge(&pool, hour, 100).await.unwrap(), 0);
    assert_eq!(inbox.purge(&pool, Duration::ZERO, 100).await.unwrap(), 2);

    let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("bouncer-http").unwrap()).unscoped();
    let addr = http_client::serve(Router::new().route("/charges", post(charge).layer(layer))).await;
    let first = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let again = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!(
        (again.status, again.replayed(), again.body.as_str()),
        (201, true, "{\"charged\":true}")
    );

    let id = match cancel(&pool, 4).await.unwrap() {
        Outcome::Applied(id) => id,
        other => panic!("cancel 4: {other:?}"),
    };
    assert!(matches!(
        cancel(&pool, 4).await.unwrap(),
        Outcome::AlreadyDone { .. }
    ));
    assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 1);
    let recorder = Recorder::default();
    let relay = Relay::new(pool.clone(), recorder.clone());
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(
        seen.iter()
            .map(|m| (m.id(), m.payload()))
            .collect::<Vec<_>>(),
        vec![(id.as_str(), b"cancelled 4".as_slice())]
    );
    assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 0);
    assert!(outbox::dead(&pool, 10).await.unwrap().is_empty());

    assert_eq!(effects(&direct, "pay").await, vec![(1, 1)]);
    assert_eq!(effects(&direct, "consume").await, vec![(2, 1)]);
    assert_eq!(effects(&direct, "charge").await, vec![(0, 1)]);
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
    for ship_them in [false, true] {
        let calls: Vec<i64> = (1..=KEYS).flat_map(|k| [k, k, k, k]).collect();
        let calls = Arc::new(Mutex::new(calls));
        let mut tasks = JoinSet::new();
        for _ in 0..32 {
            let (pool, calls) = (pool.clone(), calls.clone());
            tasks.spawn(async move {
                let mut applied = Vec::new();
                loop {
                    let Some(k) = calls.lock().unwrap().pop() else {
                        return applied;
                    };
                    let (outcome, first) = if ship_them {
                        (
                            ship(&pool, k).await.map_err(|e| e.to_string()),
                            format!("parcel {k}"),
                        )
                    } else {
                        (
                            pay(&pool, k).await.map_err(|e| e.to_string()),
                            format!("receipt {k}"),
                        )
                    };
                    match outcome.unwrap() {
                        Outcome::Applied(result) => {
                            assert_eq!(result, first);
                            applied.push(k);
                        }
                        Outcome::AlreadyDone { first_result, .. } => {
                            assert_eq!(first_result, Some(first));
                        }
                        other => panic!("order {k}: {other:?}"),
                    }
                }
            });
        }
        let mut applied = Vec::new();
        while let Some(each) = tasks.join_next().await {
            applied.extend(each.unwrap());
        }
        applied.sort_unstable();
        assert_eq!(applied, (1..=KEYS).collect::<Vec<_>>(), "ship: {ship_them}");
    }
    assert_eq!(
        effects(&direct, "pay").await,
        (1..=KEYS).map(|k| (k, 1)).collect::<Vec<_>>()
    );
    let shipped: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE status = 'SHIPPED'")
        .fetch_one(&direct)
        .await
        .unwrap();
    assert_eq!(shipped, KEYS);
}
