//! The fast path in front of the database, on SQLite, PostgreSQL and MariaDB, with a
//! `redis-server` of each test's own: a duplicate is answered from Redis once its first
//! result committed (proven with the pool closed), nothing reaches Redis that did not
//! commit, a value that is not idem's is a miss, and a Redis that dies, is flushed or
//! sleeps in the middle of 32 tasks delivering every key 5 times costs no error and no
//! effect twice.

use crate::common;
use crate::http_client;
use crate::order::Order;
use crate::redis_server::OwnRedis;
use idem::cache::{self, Redis};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use idem::{Error, Outcome};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: i64 = 64;
const COPIES: usize = 5;
const TASKS: usize = 32;

/// A fast path on `redis` under `namespace`, whose breaker opens after 3 failures for
/// 200 ms (the tests do not wait out the default 5 s), and whose reads wait up to 250 ms:
/// these tests share two cores with the rest of the suite, where the default 5 ms is
/// sometimes exceeded by the scheduler alone (the slow Redis's test keeps the default).
fn fast_path(redis: &OwnRedis, namespace: &str) -> Redis {
    quick_fast_path(redis, namespace).read_timeout(Duration::from_millis(250))
}

/// [`fast_path`] with the default read timeout.
fn quick_fast_path(redis: &OwnRedis, namespace: &str) -> Redis {
    Redis::open(&redis.url(), namespace)
        .unwrap()
        .breaker(3, Duration::from_millis(200))
}

/// Waits until the fast path wrote `n` first results (its writes run on tasks of their
/// own, after the commit).
async fn written(cache: &Redis, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache.stats().writes < n {
        assert!(
            Instant::now() < deadline,
            "the cache wrote {} of {n} first results: {:?}",
            cache.stats().writes,
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What is done to Redis in the middle of a storm.
#[derive(Clone, Copy, Debug)]
enum Disruption {
    /// SIGKILL at a third of the deliveries, restarted (empty) at two thirds.
    Kill,
    /// FLUSHALL at half of them.
    Flush,
}

fn message_key(order_id: i64) -> MessageKey {
    MessageKey::business(format!("order:{order_id}"), "paid").unwrap()
}

macro_rules! cache_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// Pays the order, with an effect; fails after it when told to.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                fail: bool,
            ) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                if fail {
                    return Err(sqlx::Error::Protocol("declined".into()));
                }
                Ok(format!("receipt {order_id}"))
            }

            /// A consumer: one effect per message.
            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn consume(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'consume', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id * 10)
            }

            /// How many times its body ran (the one-statement form's body runs first).
            static SHIPPED_BODIES: AtomicUsize = AtomicUsize::new(0);

            /// The one-statement form: no transaction parameter.
            #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
            async fn ship(pool: &sqlx::Pool<$db>, order_id: i64) -> Result<String, String> {
                SHIPPED_BODIES.fetch_add(1, Ordering::Relaxed);
                Ok(format!("parcel {order_id}"))
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                for order_id in 1..=KEYS {
                    sqlx::query(common::placed($positional, "INSERT INTO orders (order_id, status) VALUES ($1, 'CREATED')"))
                        .bind(order_id)
                        .execute(&pool)
                        .await
                        .unwrap();
                }
                Some(pool)
            }

            /// The effects of `kind`, per order.
            async fn effects(pool: &$pool, kind: &str) -> Vec<(i64, i64)> {
                sqlx::query_as(common::placed($positional, "SELECT order_id, COUNT(*) FROM effects WHERE kind = $1 GROUP BY order_id ORDER BY order_id"))
                    .bind(kind)
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }

            fn once_each() -> Vec<(i64, i64)> {
                (1..=KEYS).map(|order_id| (order_id, 1)).collect()
            }

            /// A duplicate of a committed call is answered with its first result from the
            /// cache: with the pool closed, so without the database.
            #[tokio::test]
            async fn duplicates_are_answered_from_the_cache_without_the_database() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "hits");
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("billing").unwrap();

                assert_eq!(pay(&pool, 1, false).await.unwrap(), Outcome::Applied("receipt 1".into()));
                let delivery = consume(&pool, &inbox, &message_key(1), b"p1", 1).await.unwrap();
                assert_eq!(delivery, Delivery::Processed(10));
                sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_id = 2")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(ship(&pool, 2).await.unwrap(), Outcome::Applied("parcel 2".into()));
                written(&cache, 3).await;
                assert_eq!(redis.keys("hits").await.len(), 3);

                pool.close().await;
                let bodies = SHIPPED_BODIES.load(Ordering::Relaxed);
                assert_eq!(
                    pay(&pool, 1, false).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Paid, first_result: Some("receipt 1".into()) }
                );
                assert_eq!(
                    consume(&pool, &inbox, &message_key(1), b"p1", 1).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(10) }
                );
                assert_eq!(
                    ship(&pool, 2).await.unwrap(),
                    Outcome::AlreadyDone { current: Order::Shipped, first_result: Some("parcel 2".into()) }
                );
                assert_eq!(SHIPPED_BODIES.load(Ordering::Relaxed), bodies, "a cached duplicate runs no body");
                assert_eq!(cache.stats().hits, 3);
                assert_eq!(inbox.counters().duplicates, 1);
                // The pool is closed indeed: a call the cache cannot answer fails.
                assert!(matches!(pay(&pool, 3, false).await, Err(Error::Database(_))));
            }

            /// A body that fails, a refusal, a handler inside the caller's transaction
            /// (committed or rolled back): nothing in Redis.
            #[tokio::test]
            async fn nothing_reaches_the_cache_that_idem_did_not_commit() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "uncommitted");
                cache.attach(&pool).await.unwrap();

                assert!(matches!(pay(&pool, 1, true).await, Err(Error::Handler(_))));
                assert_eq!(pay(&pool, KEYS + 1, false).await.unwrap(), Outcome::NotFound);
                sqlx::query("UPDATE orders SET status = 'CANCELLED' WHERE order_id = 2")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert!(matches!(pay(&pool, 2, false).await.unwrap(), Outcome::IllegalState { .. }));
                let mut tx = pool.begin().await.unwrap();
                assert!(pay(&mut tx, 3, false).await.unwrap().is_applied());
                tx.rollback().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                assert!(pay(&mut tx, 4, false).await.unwrap().is_applied());
                tx.commit().await.unwrap();
                // Any write would have been spawned by now; give it time to land.
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert_eq!(redis.keys("uncommitted").await, Vec::<String>::new());
                assert_eq!(cache.stats().writes, 0);
                // The database agrees: the failed and the rolled back calls left nothing.
                assert!(pay(&pool, 1, false).await.unwrap().is_applied());
                assert!(pay(&pool, 3, false).await.unwrap().is_applied());
                assert_eq!(pay(&pool, 4, false).await.unwrap().kind(), idem::OutcomeKind::AlreadyDone);
            }

            /// A value under idem's key that idem did not write (another program's text,
            /// another type, an unreadable result) is a miss, counted, and the database
            /// answers.
            #[tokio::test]
            async fn a_value_that_is_not_idems_is_a_miss() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "foreign");
                cache.attach(&pool).await.unwrap();
                assert!(pay(&pool, 1, false).await.unwrap().is_applied());
                written(&cache, 1).await;
                let keys = redis.keys("foreign").await;
                assert_eq!(keys.len(), 1);
                let key = keys[0].as_str();
                // The namespace and a digest: nothing of the call's own.
                assert_eq!(key.len(), "foreign:".len() + 64, "{key}");
                assert!(key.starts_with("foreign:"), "{key}");
                let duplicate = Outcome::AlreadyDone { current: Order::Paid, first_result: Some("receipt 1".to_owned()) };

                redis.run("SET", &[key, "not idem's"]).await;
                assert_eq!(pay(&pool, 1, false).await.unwrap(), duplicate);
                redis.run("DEL", &[key]).await;
                redis.run("RPUSH", &[key, "a list"]).await;
                assert_eq!(pay(&pool, 1, false).await.unwrap(), duplicate);
                redis.run("SET", &[key, "idem/1\n{\"not\": \"a string\"}"]).await;
                assert_eq!(pay(&pool, 1, false).await.unwrap(), duplicate);
                let stats = cache.stats();
                assert_eq!((stats.foreign, stats.hits, stats.errors), (3, 0, 0), "{stats:?}");
                // The database's answer was written back: the next duplicate is a hit.
                written(&cache, 4).await;
                assert_eq!(pay(&pool, 1, false).await.unwrap(), duplicate);
                assert_eq!(cache.stats().hits, 1);
                assert_eq!(effects(&pool, "pay").await, vec![(1, 1)]);
            }

            /// A message redelivered with another payload is left to the database (a
            /// conflict), even with the first one's result in the cache.
            #[tokio::test]
            async fn another_payload_under_a_cached_message_key_is_a_conflict() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "payloads");
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("billing").unwrap();
                let key = message_key(1);
                assert!(consume(&pool, &inbox, &key, b"first", 1).await.unwrap().is_processed());
                written(&cache, 1).await;
                assert_eq!(consume(&pool, &inbox, &key, b"other", 1).await.unwrap(), Delivery::Conflict);
                assert_eq!(
                    consume(&pool, &inbox, &key, b"first", 1).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(10) }
                );
                let stats = cache.stats();
                assert_eq!((stats.hits, stats.foreign), (1, 1), "{stats:?}");
            }

            /// Redis asleep (`DEBUG SLEEP`): calls give up on it after the read timeout and
            /// the database answers; none waits for Redis to wake.
            #[tokio::test]
            async fn a_slow_redis_sends_calls_to_the_database() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = quick_fast_path(&redis, "slow");
                cache.attach(&pool).await.unwrap();
                assert!(pay(&pool, 1, false).await.unwrap().is_applied());
                written(&cache, 1).await;
                let port = redis.port().to_string();
                let sleeping = tokio::task::spawn_blocking(move || {
                    let slept = std::process::Command::new("redis-cli")
                        .args(["-p", &port, "DEBUG", "SLEEP", "3"])
                        .output()
                        .expect("redis-cli");
                    assert!(slept.status.success(), "{slept:?}");
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Calls for 1.5 s of the 3 s Redis sleeps (whenever `redis-cli` got there):
                // each is answered by the database, none waits for Redis to wake.
                let started = Instant::now();
                let mut calls = 0u64;
                while started.elapsed() < Duration::from_millis(1500) {
                    let call = Instant::now();
                    assert_eq!(pay(&pool, 1, false).await.unwrap().kind(), idem::OutcomeKind::AlreadyDone);
                    assert!(call.elapsed() < Duration::from_millis(1000), "a call waited {:?} for a sleeping Redis", call.elapsed());
                    calls += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let stats = cache.stats();
                assert!(stats.timeouts >= 1, "no read timed out: {stats:?}");
                assert!(stats.skipped >= 1, "the breaker never opened: {stats:?}");
                assert_eq!(stats.hits + stats.timeouts + stats.skipped + stats.misses, calls + 1, "the first call missed, every other read is counted once: {stats:?}");
                sleeping.await.unwrap();
            }

            /// The HTTP layer, in both modes: a repeat of a request whose response committed
            /// is replayed from the cache (with the pool closed); the same key with another
            /// body is not, it is left to the database.
            #[tokio::test]
            async fn a_repeated_request_is_replayed_from_the_cache() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "http");
                cache.attach(&pool).await.unwrap();
                async fn pay_route(
                    axum::extract::Path(id): axum::extract::Path<i64>,
                    mut tx: idem::http::Tx<$db>,
                ) -> idem::http::Committed<String> {
                    let answer = match pay(&mut *tx, id, false).await {
                        Ok(outcome) => format!("{:?}", outcome.into_result()),
                        Err(e) => e.to_string(),
                    };
                    tx.commit(answer)
                }
                /// The leased mode's route: a call outside the database.
                async fn charge_route(axum::extract::Path(id): axum::extract::Path<i64>) -> String {
                    format!("charged {id}")
                }
                let layer = idem::http::IdempotencyLayer::new(pool.clone(), Inbox::new("api").unwrap()).unscoped();
                let leased = idem::http::IdempotencyLayer::new(pool.clone(), Inbox::new("api-leased").unwrap())
                    .unscoped()
                    .leased(Duration::from_secs(30));
                let app = axum::Router::new()
                    .route("/orders/{id}/pay", axum::routing::post(pay_route).layer(layer))
                    .route("/charges/{id}", axum::routing::post(charge_route).layer(leased));
                let addr = http_client::serve(app).await;
                let request = |body: &'static str| {
                    http_client::send(addr, "POST", "/orders/1/pay", &[("idempotency-key", b"k-1")], body)
                };
                let charge = || http_client::send(addr, "POST", "/charges/5", &[("idempotency-key", b"c-5")], "");
                let first = request("card 4242").await;
                assert_eq!((first.status, first.body.as_str(), first.replayed()), (200, "Some(\"receipt 1\")", false));
                let charged = charge().await;
                assert_eq!((charged.status, charged.body.as_str(), charged.replayed()), (200, "charged 5", false));
                written(&cache, 2).await;

                pool.close().await;
                let repeat = request("card 4242").await;
                assert_eq!((repeat.status, repeat.body.as_str(), repeat.replayed()), (200, "Some(\"receipt 1\")", true));
                let charged = charge().await;
                assert_eq!((charged.status, charged.body.as_str(), charged.replayed()), (200, "charged 5", true));
                assert_eq!(cache.stats().hits, 2);
                // Another body under the key: the cache does not answer it; the database
                // would (a 422), but it is closed.
                let other = request("card 0000").await;
                assert!(other.status >= 500 && !other.replayed(), "{other:?}");
                assert_eq!(cache.stats().foreign, 1);
            }

            /// The leased mode: a message whose attempt completed is answered from the
            /// cache at its claim (pool closed); a failed attempt writes nothing.
            #[tokio::test]
            async fn a_completed_leased_message_is_answered_from_the_cache() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "leased");
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("leased").unwrap();
                let claim = async |key: &MessageKey, payload: &[u8]| {
                    inbox.claim::<_, i64>(&pool, key, payload).await
                };
                let Claimed::Work(failing) = claim(&message_key(2), b"p2").await.unwrap() else {
                    panic!("a first delivery works")
                };
                assert!(failing.complete(&pool, Err::<i64, _>("declined")).await.is_err());
                let Claimed::Work(lease) = claim(&message_key(1), b"p1").await.unwrap() else {
                    panic!("a first delivery works")
                };
                assert_eq!(lease.complete(&pool, Ok::<_, String>(10)).await.unwrap(), Delivery::Processed(10));
                written(&cache, 1).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert_eq!(cache.stats().writes, 1, "the failed attempt wrote nothing");

                pool.close().await;
                match claim(&message_key(1), b"p1").await.unwrap() {
                    Claimed::Done(delivery) => assert_eq!(delivery, Delivery::Duplicate { first_result: Some(10) }),
                    Claimed::Work(_) => panic!("a completed message claimed again"),
                }
                assert_eq!(cache.stats().hits, 1);
                // Another payload, and the failed message: only the database can answer.
                assert!(claim(&message_key(1), b"other").await.is_err());
                assert!(claim(&message_key(2), b"p2").await.is_err());
            }

            /// Two inboxes of one server in two places of their own (PostgreSQL: two
            /// schemas of one database, each on its pool's `search_path`, as the inbox guide
            /// recommends; MariaDB: two databases; SQLite: two files), one cache attached to
            /// both: the same message delivered to each is processed in each.
            #[tokio::test]
            async fn two_schemas_never_share_an_entry() {
                let Some(redis) = OwnRedis::start() else { return };
                let (Some(a), Some(b)) = (setup().await, setup().await) else { return };
                let cache = fast_path(&redis, "schemas");
                cache.attach(&a).await.unwrap();
                cache.attach(&b).await.unwrap();
                let inbox = Inbox::new("billing").unwrap();
                for (n, pool) in [&a, &b].into_iter().enumerate() {
                    let delivery = consume(pool, &inbox, &message_key(1), b"p1", 1).await.unwrap();
                    assert_eq!(delivery, Delivery::Processed(10), "schema {n}");
                    written(&cache, 2 * n as u64 + 1).await;
                    assert_eq!(pay(pool, 1, false).await.unwrap(), Outcome::Applied("receipt 1".into()), "schema {n}");
                    written(&cache, 2 * n as u64 + 2).await;
                }
                for pool in [&a, &b] {
                    assert_eq!(effects(pool, "consume").await, [(1, 1)]);
                    assert_eq!(effects(pool, "pay").await, [(1, 1)]);
                }
                assert_eq!(redis.keys("schemas").await.len(), 4);
            }

            /// A duplicate the database answers (its entry flushed from Redis) writes the
            /// entry again for the rest of the TTL counted from its record's last change,
            /// never a fresh TTL: with the retention at the TTL, a purged record is never
            /// answered from the cache, and its message runs again, as the database says.
            #[tokio::test]
            async fn an_entry_written_again_never_outlives_its_record() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let ttl = Duration::from_secs(2);
                let cache = fast_path(&redis, "aged").ttl(ttl);
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("aging").unwrap();
                assert_eq!(consume(&pool, &inbox, &message_key(1), b"p1", 1).await.unwrap(), Delivery::Processed(10));
                written(&cache, 1).await;
                redis.run("FLUSHALL", &[]).await;
                tokio::time::sleep(Duration::from_millis(1200)).await;
                assert_eq!(
                    consume(&pool, &inbox, &message_key(1), b"p1", 1).await.unwrap(),
                    Delivery::Duplicate { first_result: Some(10) }
                );
                assert_eq!(cache.stats().hits, 0, "the database answered");
                written(&cache, 2).await;
                // Past the record's retention (= the TTL): purged.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                assert_eq!(inbox.purge(&pool, ttl, 100).await.unwrap(), 1);
                assert_eq!(
                    consume(&pool, &inbox, &message_key(1), b"p1", 1).await.unwrap(),
                    Delivery::Processed(10),
                    "the cache answered for a record the database no longer has"
                );
                assert_eq!(effects(&pool, "consume").await, [(1, 2)]);
            }

            /// `Inbox::purge` refuses a retention shorter than the cache's entries live.
            #[tokio::test]
            async fn a_purge_shorter_than_the_cache_ttl_is_refused() {
                let Some(redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "retention").ttl(Duration::from_secs(600));
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("billing").unwrap();
                match inbox.purge(&pool, Duration::from_secs(60), 100).await {
                    Err(Error::RetentionBelowCache { retention, ttl }) => {
                        assert_eq!((retention, ttl), (Duration::from_secs(60), Duration::from_secs(600)));
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(inbox.purge(&pool, Duration::from_secs(600), 100).await.unwrap(), 0);
                cache::detach(&pool);
                assert_eq!(inbox.purge(&pool, Duration::from_secs(60), 100).await.unwrap(), 0);
            }

            /// 32 tasks deliver every key 5 times (a transition and a message each) while
            /// Redis is SIGKILLed and restarted empty: no call fails, every effect happens
            /// once, and once Redis is back, duplicates are answered from it again.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_killed_in_a_storm_costs_no_error_and_no_second_effect() {
                storm(Disruption::Kill).await;
            }

            /// The same storm with `FLUSHALL` in the middle of it.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_flushed_in_a_storm_costs_no_second_effect() {
                storm(Disruption::Flush).await;
            }

            async fn storm(disruption: Disruption) {
                let Some(mut redis) = OwnRedis::start() else { return };
                let Some(pool) = setup().await else { return };
                let cache = fast_path(&redis, "storm");
                cache.attach(&pool).await.unwrap();
                let inbox = Inbox::new("billing").unwrap();
                let mut deliveries: Vec<i64> = (1..=KEYS)
                    .flat_map(|k| std::iter::repeat_n(k, COPIES))
                    .collect();
                deliveries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(23));
                let total = deliveries.len();
                let queue = Arc::new(Mutex::new(deliveries));
                let done = Arc::new(AtomicUsize::new(0));
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..TASKS {
                    let (pool, inbox, queue, done) = (pool.clone(), inbox.clone(), queue.clone(), done.clone());
                    tasks.spawn(async move {
                        loop {
                            let Some(order_id) = queue.lock().unwrap().pop() else { return };
                            let paid = pay(&pool, order_id, false).await.expect("a call failed");
                            assert!(paid.is_done(), "{paid:?}");
                            let payload = format!("paid {order_id}");
                            let consumed = consume(&pool, &inbox, &message_key(order_id), payload.as_bytes(), order_id)
                                .await
                                .expect("a delivery failed");
                            assert!(consumed.should_ack(), "{consumed:?}");
                            done.fetch_add(1, Ordering::Relaxed);
                            tokio::task::yield_now().await;
                        }
                    });
                }
                let until = |n: usize| {
                    let done = done.clone();
                    async move {
                        while done.load(Ordering::Relaxed) < n {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                };
                let before = match disruption {
                    Disruption::Kill => {
                        until(total / 3).await;
                        let before = cache.stats();
                        redis.kill();
                        until(2 * total / 3).await;
                        redis.restart();
                        before
                    }
                    Disruption::Flush => {
                        until(total / 2).await;
                        let before = cache.stats();
                        redis.run("FLUSHALL", &[]).await;
                        before
                    }
                };
                while let Some(joined) = tasks.join_next().await {
                    joined.unwrap();
                }
                assert_eq!(effects(&pool, "pay").await, once_each(), "{disruption:?}");
                assert_eq!(effects(&pool, "consume").await, once_each(), "{disruption:?}");
                assert!(before.hits > 0, "no duplicate was answered from the cache before the {disruption:?}: {before:?}");
                let after = cache.stats();
                if let Disruption::Kill = disruption {
                    assert!(
                        after.errors + after.timeouts + after.skipped > before.errors + before.timeouts + before.skipped,
                        "Redis was down and no call noticed: {after:?}"
                    );
                }
                // Redis is back (and empty): duplicates are answered from it again, once
                // the database's answers were written back.
                let deadline = Instant::now() + Duration::from_secs(15);
                let hits = cache.stats().hits;
                while cache.stats().hits == hits {
                    assert!(Instant::now() < deadline, "no hit after Redis came back: {:?}", cache.stats());
                    assert!(pay(&pool, 1, false).await.unwrap().is_done());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(effects(&pool, "pay").await, once_each());
            }
        }
    };
}

cache_tests!(
    sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("cache-{}", common::next_id()), 4).await),
    positional = false
);
cache_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("cache_{}", common::next_id()), 8).await,
    positional = false
);
cache_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("cache_{}", common::next_id()), 8).await,
    positional = true
);

/// Two databases with the same machine and the same key, one cache attached to both: a
/// key applied in one is not a duplicate in the other.
#[tokio::test]
async fn two_databases_never_share_an_entry() {
    let Some(redis) = OwnRedis::start() else {
        return;
    };
    let cache = fast_path(&redis, "shared");
    let mut pools = Vec::new();
    for _ in 0..2 {
        let pool = common::sqlite_file(&format!("cache-two-{}", common::next_id()), 2).await;
        idem::migrate(&pool).await.unwrap();
        sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
            .execute(&pool)
            .await
            .unwrap();
        cache.attach(&pool).await.unwrap();
        pools.push(pool);
    }
    const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
    for (n, pool) in pools.iter().enumerate() {
        let outcome: Outcome<i64, Order> = idem::run(
            pool,
            PAY,
            idem::Key::Int(1).into(),
            None,
            async |_: &mut sqlx::Transaction<'static, sqlx::Sqlite>| Ok::<_, sqlx::Error>(7),
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Applied(7), "database {n}");
        written(&cache, n as u64 + 1).await;
    }
    assert_eq!(redis.keys("shared").await.len(), 2);
}

/// A detached pool's calls go to the database.
#[tokio::test]
async fn a_detached_pool_goes_to_the_database() {
    let Some(redis) = OwnRedis::start() else {
        return;
    };
    let pool = common::sqlite_file(&format!("cache-detached-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    let cache = fast_path(&redis, "detached");
    cache.attach(&pool).await.unwrap();
    const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
    let pay = async |pool: &sqlx::SqlitePool| -> Result<Outcome<i64, Order>, Error<sqlx::Error>> {
        idem::run(
            pool,
            PAY,
            idem::Key::Int(1).into(),
            None,
            async |_: &mut sqlx::Transaction<'static, sqlx::Sqlite>| Ok::<_, sqlx::Error>(7),
        )
        .await
    };
    assert_eq!(pay(&pool).await.unwrap(), Outcome::Applied(7));
    written(&cache, 1).await;
    cache::detach(&pool);
    pool.close().await;
    assert!(matches!(pay(&pool).await, Err(Error::Database(_))));
    assert_eq!(cache.stats().hits, 0);
}

/// Redis down from the start (nothing listens on its port): every call goes to the
/// database, the breaker opens, and nothing fails.
#[tokio::test]
async fn a_redis_that_never_answered_costs_nothing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = common::sqlite_file(&format!("cache-down-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    let cache = Redis::open(&format!("redis://127.0.0.1:{port}"), "down")
        .unwrap()
        .breaker(3, Duration::from_secs(60));
    cache.attach(&pool).await.unwrap();
    const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
    for n in 0..10 {
        let outcome: Outcome<i64, Order> = idem::run(
            &pool,
            PAY,
            idem::Key::Int(1).into(),
            None,
            async |_: &mut sqlx::Transaction<'static, sqlx::Sqlite>| Ok::<_, sqlx::Error>(7),
        )
        .await
        .unwrap();
        assert_eq!(outcome.is_applied(), n == 0, "{outcome:?}");
    }
    // Three failures (reads, or the first call's write) open the breaker for a minute:
    // the rest skip Redis at once.
    let stats = cache.stats();
    assert_eq!(
        stats.errors + stats.timeouts + stats.skipped,
        10,
        "{stats:?}"
    );
    assert!(stats.skipped >= 7, "{stats:?}");
}
