//! PostgreSQL failover (`scripts/pg-failover`: Patroni with etcd, a synchronous standby,
//! HAProxy sending connections to the current primary): 1,000 at-least-once deliveries — an
//! inbox consumer's messages and clients' transitions, each twice, shuffled — by 16 tasks
//! while the primary is SIGKILLed and the standby promoted. Callers see transient errors
//! (connections cut, none to be had while no node is primary) and retry; at the end every
//! message and every order has exactly one effect, on the promoted node. Meanwhile two
//! scheduler instances run a job every 200 ms (`Missed::RunEach`) on the same pair: every
//! occurrence from the first to the last has exactly one effect, those that came due while
//! no node was primary run once it answered again.

use crate::common;
use crate::order::Order;
use crate::pg_forms::{consume, pay};
use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::schedule::{Job, Missed, Schedule};
use idem::{Error, Outcome};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The URL through HAProxy, or `None` (test skipped) when it is unset and servers are
/// optional.
fn failover_url() -> Option<String> {
    match std::env::var("IDEM_TEST_FAILOVER_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if common::require_servers() => panic!(
            "IDEM_TEST_FAILOVER_URL is not set (scripts/pg-failover start; scripts/pg-failover url), \
             and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
        ),
        _ => {
            eprintln!(
                "skipped: start scripts/pg-failover and set IDEM_TEST_FAILOVER_URL to run the failover test"
            );
            None
        }
    }
}

/// Runs `scripts/pg-failover` with `args`, and fails the test if it fails.
async fn script(args: &[&str]) {
    common::script("pg-failover", args).await;
}

/// Calls `call` until it answers, retrying every transient error (counted) for up to 60 s.
async fn until_answered<T, F: Future<Output = Result<T, Error<sqlx::Error>>>>(
    mut call: impl FnMut() -> F,
    transient: &AtomicUsize,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(e) if (e.is_transient() || e.is_conflict()) && Instant::now() < deadline => {
                transient.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("not transient, or no answer within 60 s: {e:?}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Call {
    Pay(i64),
    Consume(i64),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_deliveries_across_a_failover_lose_nothing_and_double_nothing() {
    const ORDERS: i64 = 200;
    const MESSAGES: i64 = 300;
    let Some(url) = failover_url() else { return };
    // A node an earlier run killed and did not rejoin (it failed) follows the primary again.
    script(&["heal"]).await;
    let before = refused_nodes(&url).await;
    let schema = "idem_test_failover";
    let admin = PgPool::connect(&url).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", schema)]);
    // Connections that fail soon while no node is primary (the callers retry), and none to
    // a standby: HAProxy sends connections to the node Patroni calls the primary, a moment
    // before its promotion ends (a write there fails with 25006, read-only), so the pool
    // refuses a connection that lands on a node still in recovery, as the guide shows.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(2))
        .after_connect(|conn, _| Box::pin(idem::refuse_standby(conn)))
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql(common::TABLES).execute(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(&format!(
        "INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, {ORDERS}) g"
    ))
    .execute(&pool)
    .await
    .unwrap();

    let mut calls: Vec<Call> = (1..=ORDERS)
        .map(Call::Pay)
        .chain((1..=MESSAGES).map(Call::Consume))
        .flat_map(|call| [call, call])
        .collect();
    calls.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1000));
    let total = calls.len();
    assert_eq!(total, 1000);
    let calls = Arc::new(Mutex::new(calls));
    let answered = Arc::new(AtomicUsize::new(0));
    let transient = Arc::new(AtomicUsize::new(0));
    let inbox = Inbox::new("failover").unwrap();
    // Two scheduler instances, each occurrence's effect an `effects` row of kind `job`.
    let schedulers: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let every = Schedule::every(Duration::from_millis(200)).unwrap();
                let job = Job::new("failover-job", every)
                    .unwrap()
                    .missed(Missed::RunEach)
                    .retry_delay(Duration::from_millis(200));
                job.run(&pool, |tx, occurrence| {
                    let n = occurrence.at_millis() / 200;
                    Box::pin(async move {
                        sqlx::query(
                            "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'job', 1)",
                        )
                        .bind(n)
                        .execute(&mut **tx)
                        .await?;
                        Ok::<_, sqlx::Error>(())
                    })
                })
                .await
            })
        })
        .collect();
    let mut tasks = JoinSet::new();
    for _ in 0..16 {
        let (pool, inbox, calls) = (pool.clone(), inbox.clone(), calls.clone());
        let (answered, transient) = (answered.clone(), transient.clone());
        tasks.spawn(async move {
            let (mut applied, mut processed) = (Vec::new(), Vec::new());
            loop {
                let Some(call) = calls.lock().unwrap().pop() else {
                    return (applied, processed);
                };
                match call {
                    Call::Pay(k) => match until_answered(|| pay(&pool, k), &transient).await {
                        Outcome::Applied(_) => applied.push(k),
                        Outcome::AlreadyDone {
                            current: Order::Paid,
                            first_result,
                        } => {
                            assert_eq!(first_result, Some(format!("receipt {k}")));
                        }
                        other => panic!("pay {k}: {other:?}"),
                    },
                    Call::Consume(k) => {
                        let key = MessageKey::business(format!("message:{k}"), "paid").unwrap();
                        match until_answered(|| consume(&pool, &inbox, &key, b"m", k), &transient)
                            .await
                        {
                            Delivery::Processed(_) => processed.push(k),
                            Delivery::Duplicate { first_result } => {
                                assert_eq!(first_result, Some(k * 10))
                            }
                            other => panic!("consume {k}: {other:?}"),
                        }
                    }
                }
                answered.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while answered.load(Ordering::SeqCst) < total / 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    script(&["kill"]).await;
    let queued_after_kill = calls.lock().unwrap().len();

    let (mut applied, mut processed) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (a, p) = done.unwrap();
        applied.extend(a);
        processed.extend(p);
    }
    assert!(
        queued_after_kill > 0,
        "the primary died before the run ended"
    );
    // The schedulers catch up with what came due during the failover, then stop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for scheduler in &schedulers {
        scheduler.abort();
    }
    for scheduler in schedulers {
        let _ = scheduler.await;
    }
    assert!(
        transient.load(Ordering::Relaxed) > 0,
        "the failover interrupted no call"
    );
    // A call whose COMMIT the old primary made durable on the standby and did not answer
    // was answered by its retry as a duplicate: at most one Applied per key.
    applied.sort_unstable();
    processed.sort_unstable();
    assert!(applied.windows(2).all(|w| w[0] != w[1]), "{applied:?}");
    assert!(processed.windows(2).all(|w| w[0] != w[1]), "{processed:?}");
    let effects = |kind: &'static str| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(i64, i64)> = sqlx::query_as(
                "SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id",
            )
            .bind(kind)
            .fetch_all(&pool)
            .await
            .unwrap();
            rows
        }
    };
    assert_eq!(
        effects("pay").await,
        (1..=ORDERS).map(|k| (k, 1)).collect::<Vec<_>>()
    );
    assert_eq!(
        effects("consume").await,
        (1..=MESSAGES).map(|k| (k, 1)).collect::<Vec<_>>()
    );
    let occurrences = effects("job").await;
    let (first, last) = (occurrences[0].0, occurrences.last().unwrap().0);
    assert!(last - first >= 20, "{occurrences:?}");
    assert_eq!(
        occurrences,
        (first..=last).map(|n| (n, 1)).collect::<Vec<_>>(),
        "each occurrence once, none missing"
    );
    eprintln!(
        "failover: the primary killed with {queued_after_kill} of {total} calls not yet begun; {} transient errors retried",
        transient.load(Ordering::Relaxed)
    );
    pool.close().await;
    script(&["rejoin"]).await;
    // The killed node came back as the standby: the check now refuses it, and admits the
    // promoted one.
    let after = refused_nodes(&url).await;
    assert_eq!(
        after,
        before.iter().map(|refused| !refused).collect::<Vec<_>>(),
        "the roles swapped"
    );
}

/// Which of the pair's two nodes (on the two ports after HAProxy's) `idem::refuse_standby`
/// refuses, each asked on a connection of its own: exactly one, the standby, with an error
/// a caller retries.
async fn refused_nodes(url: &str) -> Vec<bool> {
    let through = PgConnectOptions::from_str(url).unwrap();
    let mut refused = Vec::new();
    for node in 1..=2 {
        let options = through.clone().port(through.get_port() + node);
        let mut conn = sqlx::PgConnection::connect_with(&options).await.unwrap();
        match idem::refuse_standby(&mut conn).await {
            Ok(()) => refused.push(false),
            Err(e) => {
                assert!(idem::is_transient(&e), "{e}");
                refused.push(true);
            }
        }
    }
    assert_eq!(
        refused.iter().filter(|r| **r).count(),
        1,
        "one primary, one standby: {refused:?}"
    );
    refused
}
