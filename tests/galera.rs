//! idem on a three-node MariaDB Galera cluster (`scripts/galera`), every node a primary.
//!
//! A write conflict between two nodes is found when the second commits: Galera's
//! certification refuses it with 1213 at COMMIT (first test, deterministic), the whole
//! transaction rolled back, and its retry is a duplicate of the first. Then 32 tasks spread
//! over three pools, one per node, race on the same keys with transitions, creations, an
//! inbox consumer and the HTTP key layer, retrying what the cluster refused: exactly one
//! `Applied` (`Created`, `Processed`, first response) per key, every duplicate the first
//! result, one effect per key on every node. Last, a node SIGKILLed in the middle of a run:
//! its clients move to the other nodes, nothing is lost or doubled, and the node rejoins
//! holding the same rows.

use crate::common;
use crate::galera_cluster::{self, CLUSTER};
use crate::http_client;
use crate::order::Order;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{Committed, DbError, IdempotencyLayer, Tx};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use idem::{Creation, Error, Outcome, StateMachine};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sqlx::{MySql, MySqlPool, Transaction};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;

/// A machine whose rows the creation makes.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tickets", key = "code", state = "state")]
pub enum Ticket {
    #[state(name = "OPEN")]
    Open,
}

fn tables() -> String {
    format!(
        "{} CREATE TABLE tickets (
            code VARCHAR(64) PRIMARY KEY,
            state VARCHAR(16) NOT NULL,
            version BIGINT NOT NULL DEFAULT 0,
            seats BIGINT NOT NULL
        );",
        common::MYSQL_TABLES
    )
}

const TASKS: usize = 32;

fn placed(sql: &'static str) -> &'static str {
    common::placed(true, sql)
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(
    tx: &mut Transaction<'_, MySql>,
    order_id: i64,
    node: usize,
) -> Result<String, sqlx::Error> {
    sqlx::query(placed(
        "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)",
    ))
    .bind(order_id)
    .bind(node as i64)
    .execute(&mut **tx)
    .await?;
    Ok(format!("receipt {order_id} from node {node}"))
}

#[idem::idempotent(machine = Ticket, key = "code", create = "OPEN", set(seats))]
async fn open(
    tx: &mut Transaction<'_, MySql>,
    code: &str,
    seats: i64,
    node: usize,
) -> Result<String, sqlx::Error> {
    sqlx::query(placed(
        "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'open', $2)",
    ))
    .bind(seats)
    .bind(node as i64)
    .execute(&mut **tx)
    .await?;
    Ok(format!("ticket {code} from node {node}"))
}

#[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
async fn consume(
    tx: &mut Transaction<'_, MySql>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
    node: usize,
) -> Result<String, sqlx::Error> {
    let _ = payload;
    sqlx::query(placed(
        "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'consume', $2)",
    ))
    .bind(order_id)
    .bind(node as i64)
    .execute(&mut **tx)
    .await?;
    Ok(format!("message {order_id} on node {node}"))
}

/// The HTTP route: an effect, and a body naming the node that ran it. Its statement fails
/// with 1213 when a concurrent request with the same key committed on another node first
/// (the replicated write aborts this transaction): a 503, which the client retries.
async fn charge(
    State(node): State<usize>,
    mut tx: Tx<MySql>,
) -> Result<Committed<(StatusCode, String)>, DbError> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (0, 'charge', ?)")
        .bind(node as i64)
        .execute(&mut **tx)
        .await?;
    Ok(tx.commit((StatusCode::CREATED, format!("{{\"node\":{node}}}"))))
}

fn message_key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

/// Calls `call` on the node `node` says again while the cluster refuses it with an error a
/// retry may cure (a certification failure at COMMIT, a node gone), as a client does; `move_on`
/// is told each failure (to take the client to another node). At most 200 attempts.
async fn until_answered<
    T,
    E: std::fmt::Debug + 'static,
    F: Future<Output = Result<T, Error<E>>>,
>(
    mut call: impl FnMut() -> F,
    mut move_on: impl FnMut(&Error<E>),
    conflicts: &AtomicUsize,
) -> T {
    for _ in 0..200 {
        match call().await {
            Ok(answer) => return answer,
            Err(e) if e.is_transient() || e.is_conflict() => {
                if e.is_conflict() {
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                move_on(&e);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("not an error a retry cures: {e:?}"),
        }
    }
    panic!("no answer after 200 attempts")
}

async fn insert_orders(pool: &MySqlPool, keys: i64) {
    let values: Vec<String> = (1..=keys).map(|k| format!("({k}, 'CREATED')")).collect();
    sqlx::raw_sql(&format!(
        "INSERT INTO orders (order_id, status) VALUES {}",
        values.join(", ")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// The effects of `kind` per key (the `order_id` column), as node `pool` has them.
async fn effects(pool: &MySqlPool, kind: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(
        "SELECT order_id, COUNT(*) FROM effects WHERE kind = ? GROUP BY order_id ORDER BY order_id",
    )
    .bind(kind)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn once_each(keys: i64) -> Vec<(i64, i64)> {
    (1..=keys).map(|k| (k, 1)).collect()
}

/// A transition held open on node 1 while node 2 commits the same one: node 1's COMMIT
/// is refused with 1213 (a conflict, everything rolled back), and its retry is a
/// duplicate of node 2's, with node 2's result.
#[tokio::test]
async fn a_conflict_between_nodes_fails_at_commit_and_its_retry_is_a_duplicate() {
    let _turn = CLUSTER.lock().await;
    let Some(pools) = galera_cluster::pools("galera_commit", &tables(), 4).await else {
        return;
    };
    insert_orders(&pools[0], 2).await;

    let mut tx = pools[0].begin().await.unwrap();
    assert_eq!(
        pay(&mut tx, 1, 1).await.unwrap(),
        Outcome::Applied("receipt 1 from node 1".into())
    );
    // Node 2 has not seen node 1's uncommitted UPDATE: it applies too, and commits first.
    assert_eq!(
        pay(&pools[1], 1, 2).await.unwrap(),
        Outcome::Applied("receipt 1 from node 2".into())
    );
    let refused = tx.commit().await.unwrap_err();
    let as_idem = Error::<sqlx::Error>::Database(refused);
    assert!(as_idem.is_conflict(), "{as_idem:?}");
    let Error::Database(sqlx::Error::Database(db)) = &as_idem else {
        panic!("{as_idem:?}")
    };
    assert_eq!(db.code().as_deref(), Some("40001"), "{db}");
    assert!(db.message().contains("Deadlock"), "{db}");

    assert_eq!(
        pay(&pools[0], 1, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some("receipt 1 from node 2".into())
        }
    );
    for pool in &pools {
        let on_node: Vec<(i64, i64)> = sqlx::query_as("SELECT order_id, amount FROM effects")
            .fetch_all(pool)
            .await
            .unwrap();
        assert_eq!(on_node, vec![(1, 2)], "only node 2's effect, on every node");
    }
}

/// One call of the storm.
#[derive(Clone, Copy, Debug)]
enum Call {
    Pay(i64),
    Open(i64),
    Consume(i64),
    Charge(i64),
}

/// What a call answered, reduced to: did it run the body, and the first result it names.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    ran: bool,
    result: String,
}

async fn serve(pool: MySqlPool, node: usize) -> SocketAddr {
    let layer = IdempotencyLayer::new(pool, Inbox::new("galera-http").unwrap()).unscoped();
    http_client::serve(
        Router::new()
            .route("/charges", post(charge).layer(layer))
            .with_state(node),
    )
    .await
}

/// 32 tasks over three nodes (task `t` on node `t % 3`), racing on 24 keys, each key
/// called 4 times at once in each form, the keys and forms in a shuffled order: the
/// cluster refuses the losers of each race at COMMIT, they retry, and each key is applied
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_on_three_nodes_applies_each_key_once() {
    const KEYS: i64 = 24;
    const COPIES: usize = 4;
    let _turn = CLUSTER.lock().await;
    let Some(pools) = galera_cluster::pools("galera_race", &tables(), 12).await else {
        return;
    };
    insert_orders(&pools[0], KEYS).await;
    let inbox = Inbox::new("galera-race").unwrap();
    let mut servers = Vec::new();
    for (node, pool) in pools.iter().enumerate() {
        servers.push(serve(pool.clone(), node + 1).await);
    }
    let mut calls: Vec<Call> = (1..=KEYS)
        .flat_map(|k| {
            [
                Call::Pay(k),
                Call::Open(k),
                Call::Consume(k),
                Call::Charge(k),
            ]
        })
        .collect();
    calls.shuffle(&mut rand::rngs::StdRng::seed_from_u64(24));
    // The copies of a call side by side: consecutive tasks, on different nodes, take them
    // at the same moment.
    let calls: Vec<Call> = calls
        .into_iter()
        .flat_map(|call| std::iter::repeat_n(call, COPIES))
        .collect();
    let calls = Arc::new(Mutex::new(calls));
    let conflicts = Arc::new(AtomicUsize::new(0));

    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let node = t % 3;
        let (pool, server, inbox) = (pools[node].clone(), servers[node], inbox.clone());
        let (calls, conflicts) = (calls.clone(), conflicts.clone());
        let n = node + 1;
        tasks.spawn(async move {
            let mut answers = Vec::new();
            loop {
                let Some(call) = calls.lock().unwrap().pop() else {
                    return answers;
                };
                let answer = match call {
                    Call::Pay(k) => {
                        match until_answered(|| pay(&pool, k, n), |_| {}, &conflicts).await {
                            Outcome::Applied(result) => Answer { ran: true, result },
                            Outcome::AlreadyDone {
                                current: Order::Paid,
                                first_result: Some(result),
                            } => Answer { ran: false, result },
                            other => panic!("pay {k}: {other:?}"),
                        }
                    }
                    Call::Open(k) => {
                        let code = format!("T-{k}");
                        match until_answered(|| open(&pool, &code, k, n), |_| {}, &conflicts).await
                        {
                            Creation::Created(result) => Answer { ran: true, result },
                            Creation::Duplicate {
                                first_result: Some(result),
                                ..
                            } => Answer { ran: false, result },
                            other => panic!("open {k}: {other:?}"),
                        }
                    }
                    Call::Consume(k) => {
                        let key = message_key(k);
                        match until_answered(
                            || consume(&pool, &inbox, &key, b"m", k, n),
                            |_| {},
                            &conflicts,
                        )
                        .await
                        {
                            Delivery::Processed(result) => Answer { ran: true, result },
                            Delivery::Duplicate {
                                first_result: Some(result),
                            } => Answer { ran: false, result },
                            other => panic!("consume {k}: {other:?}"),
                        }
                    }
                    Call::Charge(k) => {
                        let key = format!("\"charge-{k}\"");
                        let mut attempts = 0;
                        loop {
                            let reply = http_client::post(server, "/charges", &key, "{}").await;
                            attempts += 1;
                            match reply.status {
                                201 => {
                                    break Answer {
                                        ran: !reply.replayed(),
                                        result: reply.body,
                                    };
                                }
                                // The first still runs (409), or the cluster refused the
                                // request's transaction (503): retry with the same key.
                                409 | 503 if attempts < 200 => {
                                    if reply.status == 503 {
                                        conflicts.fetch_add(1, Ordering::Relaxed);
                                    }
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                                _ => panic!("charge {k}: {reply:?}"),
                            }
                        }
                    }
                };
                answers.push((call, answer));
            }
        });
    }
    let mut by_key: HashMap<String, Vec<Answer>> = HashMap::new();
    while let Some(answers) = tasks.join_next().await {
        for (call, answer) in answers.unwrap() {
            let key = match call {
                Call::Pay(k) => format!("pay {k}"),
                Call::Open(k) => format!("open {k}"),
                Call::Consume(k) => format!("consume {k}"),
                Call::Charge(k) => format!("charge {k}"),
            };
            by_key.entry(key).or_default().push(answer);
        }
    }
    assert_eq!(by_key.len(), 4 * KEYS as usize);
    for (key, answers) in &by_key {
        assert_eq!(answers.len(), COPIES, "{key}");
        let ran: Vec<&Answer> = answers.iter().filter(|a| a.ran).collect();
        assert_eq!(
            ran.len(),
            1,
            "{key}: exactly one call ran the body: {answers:?}"
        );
        assert!(
            answers.iter().all(|a| a.result == ran[0].result),
            "{key}: every duplicate replays the first result: {answers:?}"
        );
    }
    for pool in &pools {
        assert_eq!(effects(pool, "pay").await, once_each(KEYS));
        assert_eq!(effects(pool, "open").await, once_each(KEYS));
        assert_eq!(effects(pool, "consume").await, once_each(KEYS));
        assert_eq!(effects(pool, "charge").await, vec![(0, KEYS)]);
    }
    eprintln!(
        "galera race: {} calls, {} refused by the cluster and retried",
        4 * KEYS as usize * COPIES,
        conflicts.load(Ordering::Relaxed)
    );
}

/// 24 tasks pay 150 orders and consume their messages, 3 times each, over three nodes; node
/// 3 is SIGKILLed once a third of the calls answered. Its clients move to the next node on
/// each error; the others stall while the cluster decides node 3 is gone (about 5 s) and go
/// on. Nothing is lost or doubled, and node 3, restarted, rejoins (IST) with the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_mid_run_loses_nothing_and_rejoins_with_the_same_rows() {
    const KEYS: i64 = 150;
    const COPIES: usize = 3;
    let _turn = CLUSTER.lock().await;
    let Some(pools) = galera_cluster::pools("galera_kill", &tables(), 8).await else {
        return;
    };
    insert_orders(&pools[0], KEYS).await;
    let inbox = Inbox::new("galera-kill").unwrap();
    let mut calls: Vec<i64> = (1..=KEYS)
        .flat_map(|k| std::iter::repeat_n(k, COPIES))
        .collect();
    calls.shuffle(&mut rand::rngs::StdRng::seed_from_u64(60));
    let total = calls.len();
    let calls = Arc::new(Mutex::new(calls));
    let answered = Arc::new(AtomicUsize::new(0));
    let conflicts = Arc::new(AtomicUsize::new(0));
    let moved = Arc::new(AtomicUsize::new(0));
    // While the kill runs (its SIGKILL, then the wait for the process to go), no task takes
    // a new call: the calls in flight meet the dead node, and calls are left for after it.
    let killing = Arc::new(AtomicBool::new(false));

    let mut tasks = JoinSet::new();
    for t in 0..24 {
        let (pools, inbox, calls) = (pools.clone(), inbox.clone(), calls.clone());
        let (answered, conflicts, moved) = (answered.clone(), conflicts.clone(), moved.clone());
        let killing = killing.clone();
        tasks.spawn(async move {
            let node = AtomicUsize::new(t % 3);
            let node = &node;
            let moved = &moved;
            let move_on = |e: &Error<sqlx::Error>| {
                if !e.is_conflict() {
                    node.store((node.load(Ordering::Relaxed) + 1) % 3, Ordering::Relaxed);
                    moved.fetch_add(1, Ordering::Relaxed);
                }
            };
            let mut outcomes = Vec::new();
            loop {
                while killing.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let Some(k) = calls.lock().unwrap().pop() else {
                    return outcomes;
                };
                let paid = until_answered(
                    || {
                        pay(
                            &pools[node.load(Ordering::Relaxed)],
                            k,
                            node.load(Ordering::Relaxed) + 1,
                        )
                    },
                    move_on,
                    &conflicts,
                )
                .await;
                let key = message_key(k);
                let consumed = until_answered(
                    || {
                        consume(
                            &pools[node.load(Ordering::Relaxed)],
                            &inbox,
                            &key,
                            b"m",
                            k,
                            node.load(Ordering::Relaxed) + 1,
                        )
                    },
                    move_on,
                    &conflicts,
                )
                .await;
                answered.fetch_add(1, Ordering::SeqCst);
                outcomes.push((k, paid, consumed));
            }
        });
    }
    while answered.load(Ordering::SeqCst) < total / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = answered.load(Ordering::SeqCst);
    killing.store(true, Ordering::SeqCst);
    galera_cluster::script(&["kill", "3"]).await;
    let queued_after_kill = calls.lock().unwrap().len();
    killing.store(false, Ordering::SeqCst);

    let mut applied = vec![0; KEYS as usize + 1];
    let mut processed = vec![0; KEYS as usize + 1];
    while let Some(outcomes) = tasks.join_next().await {
        for (k, paid, consumed) in outcomes.unwrap() {
            match paid {
                Outcome::Applied(_) => applied[k as usize] += 1,
                Outcome::AlreadyDone {
                    current: Order::Paid,
                    first_result: Some(_),
                } => {}
                other => panic!("pay {k}: {other:?}"),
            }
            match consumed {
                Delivery::Processed(_) => processed[k as usize] += 1,
                Delivery::Duplicate {
                    first_result: Some(_),
                } => {}
                other => panic!("consume {k}: {other:?}"),
            }
        }
    }
    assert!(
        queued_after_kill > 0,
        "node 3 was dead before the run ended ({killed_at} of {total} answered at the kill)"
    );
    // A call whose COMMIT node 3 had replicated and not yet answered when it died was
    // answered by its retry as a duplicate: at most one Applied per key, one effect always.
    assert!(
        applied.iter().chain(&processed).all(|n| *n <= 1),
        "{applied:?} {processed:?}"
    );
    assert_eq!(effects(&pools[0], "pay").await, once_each(KEYS));
    assert_eq!(effects(&pools[0], "consume").await, once_each(KEYS));

    galera_cluster::script(&["restart", "3"]).await;
    let rows = |pool: MySqlPool| async move {
        let orders: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT order_id, status, version FROM orders ORDER BY order_id")
                .fetch_all(&pool)
                .await
                .unwrap();
        let effects: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT order_id, kind, amount FROM effects ORDER BY order_id, kind")
                .fetch_all(&pool)
                .await
                .unwrap();
        let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
            .fetch_one(&pool)
            .await
            .unwrap();
        (orders, effects, records)
    };
    // Node 3's pool: its connections died with the server, and it opens new ones.
    let rejoined = pools[2].clone();
    let first = rows(pools[0].clone()).await;
    assert!(first.0.iter().all(|(_, status, _)| status == "PAID"));
    assert_eq!(first.2, KEYS);
    assert_eq!(
        rows(rejoined).await,
        first,
        "node 3 holds the same rows as node 1"
    );
    eprintln!(
        "galera kill: node 3 killed after {killed_at} of {total} keys; {} moves to another node, {} conflicts retried",
        moved.load(Ordering::Relaxed),
        conflicts.load(Ordering::Relaxed)
    );
}

/// The leased inbox on three nodes: every message claimed by three tasks at once, one per
/// node. A claim commits at once, with no body: when the cluster refuses its COMMIT (the
/// same record inserted on another node first), idem begins it again, and it finds the
/// other claim. No call fails; exactly one claim per message gets the work, and each
/// message completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leased_claims_racing_on_three_nodes_are_retried_by_idem() {
    const MESSAGES: i64 = 40;
    let _turn = CLUSTER.lock().await;
    let Some(pools) = galera_cluster::pools("galera_leased", &tables(), 4).await else {
        return;
    };
    let inbox = Inbox::new("galera-leased")
        .unwrap()
        .lease(Duration::from_secs(30));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let mut tasks = JoinSet::new();
    for (node, pool) in pools.iter().enumerate() {
        let (pool, inbox, barrier) = (pool.clone(), inbox.clone(), barrier.clone());
        tasks.spawn(async move {
            let mut worked = Vec::new();
            for k in 1..=MESSAGES {
                // The three claims of a message leave at the same moment.
                barrier.wait().await;
                let key = message_key(k);
                match inbox.claim::<_, i64>(&pool, &key, b"m").await {
                    Ok(Claimed::Work(lease)) => {
                        let done = lease.complete(&pool, Ok::<_, String>(k)).await.unwrap();
                        assert_eq!(done, Delivery::Processed(k));
                        worked.push(k);
                    }
                    Ok(Claimed::Done(Delivery::InProgress { .. } | Delivery::Duplicate { .. })) => {
                    }
                    other => panic!("message {k} on node {}: {other:?}", node + 1),
                }
            }
            worked
        });
    }
    let mut worked = Vec::new();
    while let Some(each) = tasks.join_next().await {
        worked.extend(each.unwrap());
    }
    worked.sort_unstable();
    assert_eq!(
        worked,
        (1..=MESSAGES).collect::<Vec<_>>(),
        "each message worked once"
    );
}

/// Batches of deliveries (`Inbox::batch`) racing on three nodes: each node's consumer takes
/// the same 40 messages in batches of 10, at the same moment. Two nodes recording the same
/// message find out at the second's COMMIT (a certification failure, which runs the batch
/// again) or when the first's write reaches the second (its transaction aborted: the batch
/// fails whole, nothing of it acked, and is delivered again). Each message is processed once,
/// its effect written once, every delivery in the end acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_racing_on_three_nodes_apply_each_message_once() {
    const MESSAGES: i64 = 40;
    let _turn = CLUSTER.lock().await;
    let Some(pools) = galera_cluster::pools("galera_batches", &tables(), 4).await else {
        return;
    };
    let inbox = Inbox::new("galera-batches").unwrap();
    let conflicts_before = conflicts(&pools).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let mut tasks = JoinSet::new();
    for (node, pool) in pools.iter().enumerate() {
        let (pool, inbox, barrier) = (pool.clone(), inbox.clone(), barrier.clone());
        tasks.spawn(async move {
            let mut processed = Vec::new();
            let mut refused = 0;
            for first in (1..=MESSAGES).step_by(10) {
                let mut pending: Vec<(MessageKey, Vec<u8>)> = (first..first + 10)
                    .map(|k| (message_key(k), b"m".to_vec()))
                    .collect();
                // The three nodes' batches of the same messages leave at the same moment.
                barrier.wait().await;
                for _ in 0..200 {
                    if pending.is_empty() {
                        break;
                    }
                    let settled = inbox
                        .batch(&pool, &pending, |tx, (key, _)| {
                            Box::pin(async move {
                                let order: i64 = key.as_str()[6..].trim_end_matches(":paid").parse().unwrap();
                                sqlx::query(placed(
                                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'batch', $2)",
                                ))
                                .bind(order)
                                .bind(node as i64)
                                .execute(&mut **tx)
                                .await?;
                                Ok::<_, sqlx::Error>(order)
                            })
                        })
                        .await;
                    let Ok(settled) = settled else {
                        // Refused whole by the cluster: nothing acked, delivered again.
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    let mut again = Vec::new();
                    for (message, settled) in pending.into_iter().zip(settled) {
                        match settled {
                            Ok(Delivery::Processed(order)) => processed.push(order),
                            Ok(Delivery::Duplicate { .. }) => {}
                            // Its handler's statement met the other node's write: tried again.
                            _ => again.push(message),
                        }
                    }
                    pending = again;
                }
                assert!(pending.is_empty(), "node {}: {pending:?}", node + 1);
            }
            (processed, refused)
        });
    }
    let (mut processed, mut refused) = (Vec::new(), 0);
    while let Some(each) = tasks.join_next().await {
        let (mine, times) = each.unwrap();
        processed.extend(mine);
        refused += times;
    }
    processed.sort_unstable();
    eprintln!(
        "batches refused whole by the cluster: {refused}; the nodes' certification failures \
         and aborted transactions meanwhile: {}",
        conflicts(&pools).await - conflicts_before
    );
    assert_eq!(
        processed,
        (1..=MESSAGES).collect::<Vec<_>>(),
        "each message processed once"
    );
    for pool in &pools {
        assert_eq!(
            effects(pool, "batch").await,
            once_each(MESSAGES),
            "on every node"
        );
    }
}

/// The certification failures and the transactions aborted by replicated writes, summed over
/// the nodes: the conflicts Galera found.
async fn conflicts(pools: &[MySqlPool]) -> i64 {
    let mut total = 0;
    for pool in pools {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        total += rows
            .iter()
            .map(|(_, v)| v.parse::<i64>().unwrap_or(0))
            .sum::<i64>();
    }
    total
}
