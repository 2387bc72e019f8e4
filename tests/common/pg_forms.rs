//! PostgreSQL handlers of every form of idem, their own statements written as a pooler in
//! transaction mode needs them (unnamed, inside the transaction), and the checks that each
//! works with its duplicate: shared by the tests that put something between idem and the
//! server (pgbouncer in either pooling mode, a failover).
//!
//! Include it with `#[path = "common/pg_forms.rs"] mod pg_forms;`, beside `common`,
//! `order` and `http_client`.

#![allow(dead_code)]

use crate::http_client;
use crate::order::Order;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{Committed, DbError, IdempotencyLayer, Tx};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use idem::{Creation, Outcome, StateMachine};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
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
pub async fn pay(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<String, sqlx::Error> {
    effect(tx, order_id, "pay").await?;
    Ok(format!("receipt {order_id}"))
}

/// The one-statement form: no transaction of its own, so one idem begins around it.
#[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
pub async fn ship(pool: &PgPool, order_id: i64) -> Result<String, String> {
    Ok(format!("parcel {order_id}"))
}

/// Cancels the order and stages a message for the relay.
#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
pub async fn cancel(
    tx: &mut Transaction<'_, Postgres>,
    order_id: i64,
) -> Result<String, sqlx::Error> {
    let message = Message::bytes("orders.cancelled", format!("cancelled {order_id}"));
    Ok(outbox::stage(tx, message).await?.to_string())
}

#[idem::idempotent(machine = Ticket, key = "code", create = "OPEN", set(seats))]
pub async fn open(
    tx: &mut Transaction<'_, Postgres>,
    code: &str,
    seats: i64,
) -> Result<String, sqlx::Error> {
    let _ = tx;
    Ok(format!("ticket {code} for {seats}"))
}

#[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
pub async fn consume(
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

pub async fn charge(mut tx: Tx<Postgres>) -> Result<Committed<(StatusCode, String)>, DbError> {
    effect(&mut tx, 0, "charge").await?;
    Ok(tx.commit((StatusCode::CREATED, "{\"charged\":true}".to_owned())))
}

/// A publisher that keeps what it was given.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<Outgoing>>>);

impl Publisher for Recorder {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        self.0.lock().unwrap().push(message.clone());
        Ok(Published::Acked)
    }
}

/// On the server directly: the tickets table, idem's tables, and orders 1 to `orders`.
pub async fn prepare(direct: &PgPool, orders: i64) {
    sqlx::query(
        "CREATE TABLE tickets (code TEXT PRIMARY KEY, state TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0, seats BIGINT NOT NULL)",
    )
    .execute(direct)
    .await
    .unwrap();
    idem::migrate(direct).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, $1) g",
    )
    .bind(orders)
    .execute(direct)
    .await
    .unwrap();
}

/// The effects of `kind`, per order, counted on the server directly.
pub async fn effects(direct: &PgPool, kind: &str) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id")
        .bind(kind)
        .fetch_all(direct)
        .await
        .unwrap()
}

/// Every form through `pool`, each first call and its duplicate, its effects counted on
/// `direct` (the server itself): a transition, the one-statement form, a creation, the
/// inbox in both modes and its retention, the HTTP layer, the outbox and its relay,
/// `verify` and the gauges. Needs [`prepare`]'s tables and orders 1 to 4.
pub async fn every_form(pool: &PgPool, direct: &PgPool) {
    assert!(
        idem::verify::<Order, _>(pool).await.unwrap().is_ok(),
        "the schema check"
    );
    assert_eq!(
        pay(pool, 1).await.unwrap(),
        Outcome::Applied("receipt 1".into())
    );
    assert_eq!(
        pay(pool, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some("receipt 1".into())
        }
    );
    assert_eq!(
        ship(pool, 1).await.unwrap(),
        Outcome::Applied("parcel 1".into())
    );
    assert_eq!(
        ship(pool, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Order::Shipped,
            first_result: Some("parcel 1".into())
        }
    );
    assert_eq!(
        open(pool, "T-1", 2).await.unwrap(),
        Creation::Created("ticket T-1 for 2".into())
    );
    assert_eq!(
        open(pool, "T-1", 2).await.unwrap(),
        Creation::Duplicate {
            current: Ticket::Open,
            first_result: Some("ticket T-1 for 2".into())
        }
    );

    let inbox = Inbox::new("bouncer").unwrap();
    let key = MessageKey::business("order:2", "paid").unwrap();
    assert_eq!(
        consume(pool, &inbox, &key, b"m", 2).await.unwrap(),
        Delivery::Processed(20)
    );
    assert_eq!(
        consume(pool, &inbox, &key, b"m", 2).await.unwrap(),
        Delivery::Duplicate {
            first_result: Some(20)
        }
    );
    let leased = MessageKey::business("order:3", "paid").unwrap();
    let Claimed::Work(lease) = inbox.claim::<_, i64>(pool, &leased, b"m").await.unwrap() else {
        panic!("a first delivery works")
    };
    assert_eq!(
        inbox.stuck(pool).await.unwrap().count,
        0,
        "leased, not stuck"
    );
    assert_eq!(
        lease.complete(pool, Ok::<_, String>(30)).await.unwrap(),
        Delivery::Processed(30)
    );
    match inbox.claim::<_, i64>(pool, &leased, b"m").await.unwrap() {
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
    assert_eq!(inbox.purge(pool, hour, 100).await.unwrap(), 0);
    assert_eq!(inbox.purge(pool, Duration::ZERO, 100).await.unwrap(), 2);

    let layer = IdempotencyLayer::new(pool.clone(), Inbox::new("bouncer-http").unwrap()).unscoped();
    let addr = http_client::serve(Router::new().route("/charges", post(charge).layer(layer))).await;
    let first = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let again = http_client::post(addr, "/charges", "\"c-1\"", "{}").await;
    assert_eq!(
        (again.status, again.replayed(), again.body.as_str()),
        (201, true, "{\"charged\":true}")
    );

    let id = match cancel(pool, 4).await.unwrap() {
        Outcome::Applied(id) => id,
        other => panic!("cancel 4: {other:?}"),
    };
    assert!(matches!(
        cancel(pool, 4).await.unwrap(),
        Outcome::AlreadyDone { .. }
    ));
    assert_eq!(outbox::backlog(pool).await.unwrap().pending, 1);
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
    assert_eq!(outbox::backlog(pool).await.unwrap().pending, 0);
    assert!(outbox::dead(pool, 10).await.unwrap().is_empty());

    assert_eq!(effects(direct, "pay").await, vec![(1, 1)]);
    assert_eq!(effects(direct, "consume").await, vec![(2, 1)]);
    assert_eq!(effects(direct, "charge").await, vec![(0, 1)]);
}

/// 32 tasks paying `keys` orders 4 times each through `pool`, then shipping them (the
/// one-statement form) 4 times each: one `Applied` a key and move, every other call
/// answered with the first result, one effect a key (counted on `direct`). Needs
/// [`prepare`]'s orders 1 to `keys`.
pub async fn race(pool: &PgPool, direct: &PgPool, keys: i64) {
    for ship_them in [false, true] {
        let calls: Vec<i64> = (1..=keys).flat_map(|k| [k, k, k, k]).collect();
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
        assert_eq!(applied, (1..=keys).collect::<Vec<_>>(), "ship: {ship_them}");
    }
    assert_eq!(
        effects(direct, "pay").await,
        (1..=keys).map(|k| (k, 1)).collect::<Vec<_>>()
    );
    let shipped: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE status = 'SHIPPED'")
        .fetch_one(direct)
        .await
        .unwrap();
    assert_eq!(shipped, keys);
}
