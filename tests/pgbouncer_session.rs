//! PostgreSQL through pgbouncer in session pooling (a `pgbouncer` of each test's own, run as
//! `postgres`): every form works as it is — a transition, the one-statement form, a creation,
//! the inbox in both modes, the HTTP layer — and 32 tasks paying 48 orders 4 times each
//! apply each once.

use crate::common;
use crate::http_client;
use crate::order::Order;
use crate::pgbouncer::{OwnPgbouncer, Pooling};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{DbError, IdempotencyLayer, Tx};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use idem::{Creation, Outcome, StateMachine};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::{Arc, Mutex};
use tokio::task::JoinSet;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tickets", key = "code", state = "state")]
pub enum Ticket {
    #[state(name = "OPEN")]
    Open,
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(format!("receipt {order_id}"))
}

/// The one-statement form: no transaction of its own.
#[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
async fn ship(pool: &PgPool, order_id: i64) -> Result<String, String> {
    Ok(format!("parcel {order_id}"))
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
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'consume', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(order_id * 10)
}

async fn charge(mut tx: Tx<Postgres>) -> Result<(StatusCode, String), DbError> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (0, 'charge', 0)")
        .execute(&mut **tx)
        .await?;
    Ok((StatusCode::CREATED, "{\"charged\":true}".to_owned()))
}

/// A schema of its own (made on the server directly), and a pool on it through a
/// pgbouncer in session pooling: the schema is each session's `search_path`.
async fn setup(name: &str, orders: i64) -> Option<(PgPool, OwnPgbouncer)> {
    let direct = common::postgres(name, 1).await?;
    let options = (*direct.connect_options()).clone();
    let upstream = (options.get_host().to_owned(), options.get_port());
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
    direct.close().await;
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
    Some((pool, bouncer))
}

async fn effects(pool: &PgPool, kind: &str) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id")
        .bind(kind)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Every form through session pooling, each first call and its duplicate.
#[tokio::test]
async fn every_form_works_through_session_pooling() {
    let Some((pool, _bouncer)) = setup("pgbouncer_session_forms", 4).await else {
        return;
    };
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
    let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("bouncer-http").unwrap()).unscoped();
    let addr = http_client::serve(Router::new().route("/charges", post(charge).layer(layer))).await;
    let first = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let again = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!(
        (again.status, again.replayed(), again.body.as_str()),
        (201, true, "{\"charged\":true}")
    );
    assert_eq!(effects(&pool, "pay").await, vec![(1, 1)]);
    assert_eq!(effects(&pool, "consume").await, vec![(2, 1)]);
    assert_eq!(effects(&pool, "charge").await, vec![(0, 1)]);
}

/// 32 tasks, 48 orders paid 4 times each, through session pooling: one `Applied` a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_through_session_pooling_apply_once() {
    const KEYS: i64 = 48;
    let Some((pool, _bouncer)) = setup("pgbouncer_session_race", KEYS).await else {
        return;
    };
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
                match pay(&pool, k).await.unwrap() {
                    Outcome::Applied(_) => applied.push(k),
                    Outcome::AlreadyDone { first_result, .. } => {
                        assert_eq!(first_result, Some(format!("receipt {k}")));
                    }
                    other => panic!("pay {k}: {other:?}"),
                }
            }
        });
    }
    let mut applied = Vec::new();
    while let Some(each) = tasks.join_next().await {
        applied.extend(each.unwrap());
    }
    applied.sort_unstable();
    assert_eq!(applied, (1..=KEYS).collect::<Vec<_>>());
    assert_eq!(
        effects(&pool, "pay").await,
        (1..=KEYS).map(|k| (k, 1)).collect::<Vec<_>>()
    );
}
