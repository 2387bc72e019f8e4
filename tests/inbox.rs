//! The inbox on real databases: duplicates absorbed with the first result, conflicts
//! refused, rollbacks redelivered, leases taken over, dead letters parked, retention.

use crate::common;

use idem::Error;
use idem::inbox::{Claimed, Delivery, Inbox, ManualClock, MessageKey, Received};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

fn key(s: &str) -> MessageKey {
    MessageKey::new(s).unwrap()
}

macro_rules! inbox_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        inbox_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                Some(pool)
            }

            /// The handler's effect: one row in `effects`, in the delivery's transaction.
            async fn deliver(
                inbox: &Inbox,
                pool: &$pool,
                key: &MessageKey,
                order_id: i64,
                amount: i64,
            ) -> Result<Delivery<i64>, Error<sqlx::Error>> {
                let payload = format!("{{\"order\":{order_id},\"amount\":{amount}}}");
                match inbox.receive(pool, key, payload.as_bytes()).await.map_err(Error::widen)? {
                    Received::New(mut receipt) => {
                        let result = sqlx::query(
                            common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"),
                        )
                        .bind(order_id)
                        .bind(amount)
                        .execute(&mut **receipt.transaction())
                        .await
                        .map(|_| order_id * 100 + amount);
                        receipt.finish(result).await
                    }
                    Received::Done(delivery) => Ok(delivery),
                }
            }

            async fn effects(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM effects").fetch_one(pool).await.unwrap()
            }

            #[tokio::test]
            async fn a_redelivery_is_absorbed_with_the_first_result() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("order:1:paid");
                assert_eq!(deliver(&inbox, &pool, &k, 1, 5).await.unwrap(), Delivery::Processed(105));
                for _ in 0..3 {
                    assert_eq!(
                        deliver(&inbox, &pool, &k, 1, 5).await.unwrap(),
                        Delivery::Duplicate { first_result: Some(105) }
                    );
                }
                assert_eq!(effects(&pool).await, 1);
                // Another consumer group processes the same message on its own.
                let other = Inbox::new("analytics").unwrap();
                assert!(deliver(&other, &pool, &k, 1, 5).await.unwrap().is_processed());
                let counters = inbox.counters();
                assert_eq!((counters.applied, counters.duplicates), (1, 3));
            }

            /// Keys and groups compare byte for byte: a trailing space makes another record
            /// (MySQL's `utf8mb4_bin` pads, so idem's columns there are binary).
            #[tokio::test]
            async fn keys_that_differ_by_a_trailing_space_are_two_records() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                for (k, amount) in [("k", 1), ("k ", 2), ("k  ", 3)] {
                    assert_eq!(
                        deliver(&inbox, &pool, &key(k), 9, amount).await.unwrap(),
                        Delivery::Processed(900 + amount),
                        "{k:?} is a record of its own"
                    );
                }
                for (k, amount) in [("k", 1), ("k ", 2), ("k  ", 3)] {
                    assert_eq!(
                        deliver(&inbox, &pool, &key(k), 9, amount).await.unwrap(),
                        Delivery::Duplicate { first_result: Some(900 + amount) },
                        "{k:?} replays its own first result"
                    );
                }
                let spaced = Inbox::new("billing ").unwrap();
                assert!(deliver(&spaced, &pool, &key("k"), 9, 1).await.unwrap().is_processed());
                assert_eq!(effects(&pool).await, 4);
                let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox").fetch_one(&pool).await.unwrap();
                assert_eq!(records, 4);
            }

            #[tokio::test]
            async fn the_same_key_with_other_content_is_a_conflict() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("order:2:paid");
                assert!(deliver(&inbox, &pool, &k, 2, 10).await.unwrap().is_processed());
                assert_eq!(deliver(&inbox, &pool, &k, 2, 99).await.unwrap(), Delivery::Conflict);
                assert_eq!(effects(&pool).await, 1);
                let amount: i64 = sqlx::query_scalar("SELECT amount FROM effects").fetch_one(&pool).await.unwrap();
                assert_eq!(amount, 10, "the first effect stays");
                assert_eq!(inbox.counters().conflicts, 1);
            }

            #[tokio::test]
            async fn a_failed_handler_leaves_the_message_unprocessed() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("order:3:paid");
                let failed = match inbox.receive::<_, i64>(&pool, &k, b"m").await.unwrap() {
                    Received::New(mut receipt) => {
                        sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (3, 'pay', 1)")
                            .execute(&mut **receipt.transaction())
                            .await
                            .unwrap();
                        receipt.finish(Err::<i64, _>("card declined")).await
                    }
                    Received::Done(d) => panic!("first delivery, got {d:?}"),
                };
                assert!(matches!(failed, Err(Error::Handler("card declined"))));
                assert_eq!(effects(&pool).await, 0, "record and effect rolled back together");
                let retry = inbox
                    .process(&pool, &k, b"m", async |tx: &mut sqlx::Transaction<'static, $db>| {
                        sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (3, 'pay', 1)")
                            .execute(&mut **tx)
                            .await?;
                        Ok::<_, sqlx::Error>(())
                    })
                    .await
                    .unwrap();
                assert_eq!(retry, Delivery::Processed(()));
                assert_eq!(effects(&pool).await, 1);
            }

            #[tokio::test]
            async fn large_payloads_are_fingerprinted_not_stored() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("upload:1");
                let payload = vec![b'a'; 8 << 20];
                let first = inbox.process(&pool, &k, &payload, async |_: &mut sqlx::Transaction<'static, $db>| {
                    Ok::<_, sqlx::Error>(1)
                }).await.unwrap();
                assert_eq!(first, Delivery::Processed(1));
                let record: i64 = sqlx::query_scalar(
                    if $positional {
                        "SELECT CAST(LENGTH(fingerprint) AS SIGNED) FROM idem_inbox"
                    } else {
                        "SELECT CAST(LENGTH(fingerprint) AS BIGINT) FROM idem_inbox"
                    },
                ).fetch_one(&pool).await.unwrap();
                assert_eq!(record, 64, "the record holds the SHA-256, not the 8 MiB");
                let again = inbox.receive::<_, i64>(&pool, &k, &payload).await.unwrap();
                assert!(matches!(again, Received::Done(Delivery::Duplicate { first_result: Some(1) })));
                let mut other = payload.clone();
                other[4 << 20] = b'b';
                let changed = inbox.receive::<_, i64>(&pool, &k, &other).await.unwrap();
                assert!(matches!(changed, Received::Done(Delivery::Conflict)));
            }

            #[tokio::test]
            async fn an_oversized_result_is_refused_and_nothing_is_lost() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap().max_attempts(2);
                let huge = "x".repeat(idem::MAX_RESULT_LEN);
                // Transactional: the record and the effect roll back; a redelivery applies.
                let k = key("order:8:paid");
                let refused = match inbox.receive::<_, String>(&pool, &k, b"m").await.unwrap() {
                    Received::New(mut receipt) => {
                        sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (8, 'pay', 1)")
                            .execute(&mut **receipt.transaction())
                            .await
                            .unwrap();
                        receipt.finish(Ok::<_, sqlx::Error>(huge.clone())).await
                    }
                    Received::Done(d) => panic!("first delivery, got {d:?}"),
                };
                assert!(matches!(refused, Err(Error::ResultTooLarge { .. })), "{refused:?}");
                assert_eq!(effects(&pool).await, 0);
                assert_eq!(deliver(&inbox, &pool, &k, 8, 1).await.unwrap(), Delivery::Processed(801));
                // Leased: the work happened, so the attempt is recorded as failed (retried,
                // then parked), never left hanging until its lease expires.
                let k = key("order:9:paid");
                for attempt in 1..=2 {
                    let Claimed::Work(lease) = inbox.claim::<_, String>(&pool, &k, b"m").await.unwrap() else {
                        panic!("attempt {attempt}: the message is claimable");
                    };
                    let done = lease.complete(&pool, Ok::<_, String>(huge.clone())).await;
                    assert!(matches!(done, Err(Error::ResultTooLarge { .. })), "{done:?}");
                }
                let (status, error): (String, Option<String>) =
                    sqlx::query_as("SELECT status, error FROM idem_inbox WHERE message_key = 'order:9:paid'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!(status, "DEAD");
                assert!(error.unwrap().contains("limit for stored results"));
            }

            #[tokio::test]
            async fn bad_keys_and_groups_are_refused() {
                assert!(MessageKey::new("").is_err());
                assert!(MessageKey::new("x".repeat(256)).is_err());
                assert!(MessageKey::business("order:1", "paid\n").is_err());
                assert!(Inbox::new("").is_err());
            }

            #[tokio::test]
            async fn many_redeliveries_to_concurrent_consumers_apply_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                // 1,000 messages, each delivered one to three times, shuffled, to 4 consumers.
                let mut deliveries: Vec<i64> = (0..1000).flat_map(|m| std::iter::repeat_n(m, 1 + (m as usize % 3))).collect();
                deliveries.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
                let chunks: Vec<Vec<i64>> = deliveries.chunks(deliveries.len().div_ceil(4)).map(<[i64]>::to_vec).collect();
                let mut consumers = Vec::new();
                for chunk in chunks {
                    let (inbox, pool) = (inbox.clone(), pool.clone());
                    consumers.push(tokio::spawn(async move {
                        let mut processed = 0;
                        for m in chunk {
                            let k = MessageKey::new(format!("msg-{m}")).unwrap();
                            let delivery = deliver(&inbox, &pool, &k, m, 1).await.unwrap();
                            assert!(delivery.should_ack(), "{delivery:?}");
                            processed += usize::from(delivery.is_processed());
                        }
                        processed
                    }));
                }
                let mut processed = 0;
                for consumer in consumers {
                    processed += consumer.await.unwrap();
                }
                assert_eq!(processed, 1000);
                assert_eq!(effects(&pool).await, 1000);
                let distinct: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT order_id) FROM effects").fetch_one(&pool).await.unwrap();
                assert_eq!(distinct, 1000);
                let c = inbox.counters();
                assert_eq!((c.applied, c.duplicates), (1000, deliveries.len() as u64 - 1000));
            }

            #[tokio::test]
            async fn a_replay_within_retention_is_absorbed_and_after_it_is_not() {
                let Some(pool) = setup().await else { return };
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = Inbox::new("billing").unwrap().clock(clock.clone());
                let k = key("order:4:paid");
                assert!(deliver(&inbox, &pool, &k, 4, 1).await.unwrap().is_processed());
                // A dead-letter replay an hour later: absorbed.
                clock.advance(HOUR);
                assert_eq!(inbox.purge(&pool, 24 * HOUR, 100).await.unwrap(), 0);
                assert!(matches!(deliver(&inbox, &pool, &k, 4, 1).await.unwrap(), Delivery::Duplicate { .. }));
                // Past the retention period the record is gone, and a replay applies again:
                // that is why retention must outlast every replay window.
                clock.advance(25 * HOUR);
                assert_eq!(inbox.purge(&pool, 24 * HOUR, 100).await.unwrap(), 1);
                assert!(deliver(&inbox, &pool, &k, 4, 1).await.unwrap().is_processed());
                assert_eq!(effects(&pool).await, 2);
            }

            #[tokio::test]
            async fn retention_deletes_in_bounded_batches_and_spares_live_leases() {
                let Some(pool) = setup().await else { return };
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = Inbox::new("billing").unwrap().clock(clock.clone()).lease(48 * HOUR);
                let mut insert = String::from(
                    "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, created_at, updated_at) VALUES ",
                );
                insert.push_str(
                    &(0..2500)
                        .map(|i| format!("('billing', 'k{i}', 'f', 'SUCCESS', 1, 1700000000000, 1700000000000)"))
                        .collect::<Vec<_>>()
                        .join(", "),
                );
                sqlx::query(&insert).execute(&pool).await.unwrap();
                let Claimed::Work(_lease) = inbox.claim::<_, ()>(&pool, &key("live"), b"x").await.unwrap() else {
                    panic!("first claim")
                };
                clock.advance(30 * HOUR);
                assert_eq!(inbox.purge(&pool, 24 * HOUR, 1000).await.unwrap(), 2500);
                assert_eq!(inbox.counters().purged, 2500);
                let left: Vec<String> = sqlx::query_scalar(if $positional {
                    // sqlx reads a `_bin` column as bytes.
                    "SELECT CAST(message_key AS CHAR) FROM idem_inbox"
                } else {
                    "SELECT message_key FROM idem_inbox"
                }).fetch_all(&pool).await.unwrap();
                assert_eq!(left, ["live"], "a PROCESSING record is never purged");
            }

            #[tokio::test]
            async fn the_sweeper_purges_periodically() {
                let Some(pool) = setup().await else { return };
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = Inbox::new("billing").unwrap().clock(clock.clone());
                for i in 0..30 {
                    assert!(deliver(&inbox, &pool, &key(&format!("m{i}")), i, 1).await.unwrap().is_processed());
                }
                let sweeper = inbox.spawn_sweeper(pool.clone(), 24 * HOUR, Duration::from_millis(20), 7).unwrap();
                clock.advance(25 * HOUR);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while inbox.counters().purged < 30 {
                    assert!(tokio::time::Instant::now() < deadline, "the sweeper did not purge");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                sweeper.abort();
                let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox").fetch_one(&pool).await.unwrap();
                assert_eq!(left, 0);
            }

            #[tokio::test]
            async fn leases_are_exclusive_expire_and_are_taken_over() {
                let Some(pool) = setup().await else { return };
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = Inbox::new("mailer").unwrap().clock(clock.clone()).lease(Duration::from_secs(30));
                let k = key("welcome:7");
                let Claimed::Work(first) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("first claim")
                };
                assert_eq!(first.attempt(), 1);
                // While the lease lives, a redelivery is told to come back later.
                assert!(matches!(
                    inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap(),
                    Claimed::Done(Delivery::InProgress { lease_until_millis: Some(_) })
                ));
                // The first worker hangs past its lease; a redelivery takes over.
                clock.advance(Duration::from_secs(31));
                let Claimed::Work(second) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("takeover")
                };
                assert_eq!(second.attempt(), 2);
                // The first worker wakes up: its outcome is refused.
                assert!(matches!(
                    first.complete(&pool, Ok::<_, String>("sent by 1".to_owned())).await,
                    Err(Error::LeaseLost { .. })
                ));
                assert_eq!(
                    second.complete(&pool, Ok::<_, String>("sent by 2".to_owned())).await.unwrap(),
                    Delivery::Processed("sent by 2".to_owned())
                );
                assert_eq!(
                    inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap().done(),
                    Some(Delivery::Duplicate { first_result: Some("sent by 2".to_owned()) })
                );
                let c = inbox.counters();
                assert_eq!((c.applied, c.takeovers, c.in_progress, c.duplicates), (1, 1, 1, 1));
            }

            #[tokio::test]
            async fn an_extended_lease_is_not_taken_over_and_a_lost_one_is_not_extended() {
                let Some(pool) = setup().await else { return };
                let clock = ManualClock::new(1_700_000_000_000);
                let inbox = Inbox::new("mailer").unwrap().clock(clock.clone()).lease(Duration::from_secs(30));
                let k = key("welcome:10");
                let Claimed::Work(first) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("first claim")
                };
                let claimed_until = first.until_millis();
                clock.advance(Duration::from_secs(20));
                assert!(first.extend(&pool, Duration::from_secs(60)).await.unwrap());
                assert_eq!(first.until_millis(), claimed_until - 30_000 + 20_000 + 60_000);
                // Past the first lease, within the extended one: still the first worker's.
                clock.advance(Duration::from_secs(20));
                match inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() {
                    Claimed::Done(Delivery::InProgress { lease_until_millis }) => {
                        assert_eq!(lease_until_millis, Some(first.until_millis()));
                    }
                    other => panic!("expected the extended lease to hold, got {other:?}"),
                }
                // Past the extended lease: taken over, and the first can no longer extend.
                clock.advance(Duration::from_secs(61));
                let Claimed::Work(second) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("takeover")
                };
                let lost_until = first.until_millis();
                assert!(!first.extend(&pool, Duration::from_secs(60)).await.unwrap());
                assert_eq!(first.until_millis(), lost_until, "a lost lease keeps its old end");
                assert!(matches!(
                    first.complete(&pool, Ok::<_, String>("late".to_owned())).await,
                    Err(Error::LeaseLost { .. })
                ));
                assert_eq!(
                    second.complete(&pool, Ok::<_, String>("sent by 2".to_owned())).await.unwrap(),
                    Delivery::Processed("sent by 2".to_owned())
                );
            }

            #[tokio::test]
            async fn work_kept_alive_outlives_its_lease_without_a_takeover() {
                let Some(pool) = setup().await else { return };
                // Real time: a 1 s lease, work that takes three of them.
                let inbox = Inbox::new("mailer").unwrap().lease(Duration::from_secs(1));
                let k = key("welcome:long");
                let Claimed::Work(lease) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("first claim")
                };
                let claimed_until = lease.until_millis();
                let runs = std::sync::atomic::AtomicU64::new(1);
                let retries = async {
                    // Redeliveries while the work runs, well past the first lease: each finds
                    // the lease alive.
                    for _ in 0..4 {
                        tokio::time::sleep(Duration::from_millis(600)).await;
                        match inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() {
                            Claimed::Done(Delivery::InProgress { .. }) => {}
                            Claimed::Work(_) => {
                                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                panic!("a redelivery took the live work over");
                            }
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                };
                let work = lease.keep_alive(&pool, tokio::time::sleep(Duration::from_secs(3)));
                let ((), ()) = tokio::join!(work, retries);
                assert!(lease.until_millis() > claimed_until + 1500, "the beats extended the lease");
                assert_eq!(
                    lease.complete(&pool, Ok::<_, String>("sent".to_owned())).await.unwrap(),
                    Delivery::Processed("sent".to_owned())
                );
                assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
                assert_eq!(inbox.counters().takeovers, 0);
                assert_eq!(
                    inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap().done(),
                    Some(Delivery::Duplicate { first_result: Some("sent".to_owned()) })
                );
            }

            #[tokio::test]
            async fn failures_are_retried_then_parked_as_dead() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("mailer").unwrap().max_attempts(3);
                let k = key("welcome:8");
                for attempt in 1..=3 {
                    let Claimed::Work(lease) = inbox.claim::<_, ()>(&pool, &k, b"hi").await.unwrap() else {
                        panic!("attempt {attempt}")
                    };
                    assert_eq!(lease.attempt(), attempt);
                    let failed = lease.complete(&pool, Err::<(), _>(format!("smtp down {attempt}"))).await;
                    assert!(matches!(failed, Err(Error::Handler(_))));
                }
                assert_eq!(
                    inbox.claim::<_, ()>(&pool, &k, b"hi").await.unwrap().done(),
                    Some(Delivery::Dead { attempts: 3, last_error: Some("smtp down 3".into()) })
                );
                assert_eq!(inbox.counters().dead, 1);
                let status: String = sqlx::query_scalar("SELECT status FROM idem_inbox").fetch_one(&pool).await.unwrap();
                assert_eq!(status, "DEAD");
            }

            #[tokio::test]
            async fn completing_a_lease_waits_for_the_writer_instead_of_giving_up() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("mailer").unwrap().lock_timeout(Duration::from_millis(100));
                let Claimed::Work(lease) = inbox.claim::<_, ()>(&pool, &key("welcome:9"), b"hi").await.unwrap() else {
                    panic!("first claim")
                };
                // Another delivery holds a transaction (on SQLite: the database's writer)
                // for longer than the lock timeout.
                let Received::New(busy) = inbox.receive::<_, ()>(&pool, &key("other"), b"x").await.unwrap() else {
                    panic!("first delivery")
                };
                let completion = {
                    let pool = pool.clone();
                    tokio::spawn(async move { lease.complete(&pool, Ok::<(), String>(())).await })
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                drop(busy);
                assert_eq!(completion.await.unwrap().unwrap(), Delivery::Processed(()));
            }

            #[tokio::test]
            async fn a_record_with_an_unknown_status_is_refused_and_left_alone() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("order:12:paid");
                assert!(deliver(&inbox, &pool, &k, 12, 5).await.unwrap().is_processed());
                // Another program writes a status idem does not know. SQLite's table keeps
                // its CHECK constraint, so the test turns it off on its connection; the
                // PostgreSQL table has none (the second migration dropped it).
                let mut conn = pool.acquire().await.unwrap();
                let sqlite = std::any::TypeId::of::<$db>() == std::any::TypeId::of::<sqlx::Sqlite>();
                if sqlite {
                    sqlx::raw_sql("PRAGMA ignore_check_constraints = ON").execute(&mut *conn).await.unwrap();
                }
                sqlx::query("UPDATE idem_inbox SET status = 'DONE'").execute(&mut *conn).await.unwrap();
                if sqlite {
                    sqlx::raw_sql("PRAGMA ignore_check_constraints = OFF").execute(&mut *conn).await.unwrap();
                }
                drop(conn);
                fn refused<E>(e: &Error<E>) -> bool {
                    matches!(e, Error::CorruptRecord { group, key, problem }
                        if group == "billing" && key == "order:12:paid" && problem.contains("\"DONE\""))
                }
                let delivered = deliver(&inbox, &pool, &k, 12, 5).await;
                assert!(delivered.as_ref().is_err_and(refused), "{delivered:?}");
                let claimed = inbox.claim::<_, ()>(&pool, &k, b"{\"order\":12,\"amount\":5}").await;
                assert!(claimed.as_ref().is_err_and(refused), "{claimed:?}");
                assert_eq!(effects(&pool).await, 1, "the handler did not run again");
                let status: String = sqlx::query_scalar("SELECT status FROM idem_inbox").fetch_one(&pool).await.unwrap();
                assert_eq!(status, "DONE", "the record is left for someone to look at");
            }

            /// idem's tables hold no NULL fingerprint or status (both columns are NOT NULL
            /// on every backend); a table made or altered by hand may. Such a record is
            /// refused, named, and left alone, never read as a conflict. The test drops the
            /// NOT NULL: SQLite cannot alter a column, so there the table's schema text is
            /// rewritten (as SQLite documents for removing a NOT NULL constraint).
            #[tokio::test]
            async fn a_record_with_no_fingerprint_or_status_is_refused_and_left_alone() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let k = key("order:13:paid");
                assert!(deliver(&inbox, &pool, &k, 13, 5).await.unwrap().is_processed());
                let mut conn = pool.acquire().await.unwrap();
                let id = std::any::TypeId::of::<$db>();
                let nullable = if id == std::any::TypeId::of::<sqlx::Sqlite>() {
                    "PRAGMA writable_schema = ON;
                     UPDATE sqlite_schema SET sql = replace(replace(sql,
                         'fingerprint TEXT NOT NULL', 'fingerprint TEXT'),
                         'status TEXT NOT NULL', 'status TEXT')
                     WHERE name = 'idem_inbox';
                     PRAGMA writable_schema = OFF;"
                } else if id == std::any::TypeId::of::<sqlx::Postgres>() {
                    "ALTER TABLE idem_inbox ALTER COLUMN fingerprint DROP NOT NULL, \
                     ALTER COLUMN status DROP NOT NULL"
                } else {
                    "ALTER TABLE idem_inbox MODIFY fingerprint VARCHAR(64) NULL, \
                     MODIFY status VARCHAR(16) NULL"
                };
                sqlx::raw_sql(nullable).execute(&mut *conn).await.unwrap();
                if id == std::any::TypeId::of::<sqlx::Sqlite>() {
                    // The pool's other connections read the new schema on their next statement.
                    let version: i64 = sqlx::query_scalar("PRAGMA schema_version").fetch_one(&mut *conn).await.unwrap();
                    sqlx::raw_sql(&format!("PRAGMA schema_version = {}", version + 1)).execute(&mut *conn).await.unwrap();
                }
                drop(conn);
                fn names<E>(e: &Error<E>, column: &str) -> bool {
                    matches!(e, Error::CorruptRecord { group, key, problem }
                        if group == "billing" && key == "order:13:paid" && problem.contains(column))
                }
                let fingerprint: String = sqlx::query_scalar("SELECT fingerprint FROM idem_inbox")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                for (column, update) in [
                    ("fingerprint", "UPDATE idem_inbox SET fingerprint = NULL WHERE fingerprint = $1"),
                    ("status", "UPDATE idem_inbox SET fingerprint = $1, status = NULL"),
                ] {
                    sqlx::query(common::placed($positional, update))
                    .bind(&fingerprint)
                    .execute(&pool)
                    .await
                    .unwrap();
                    let delivered = deliver(&inbox, &pool, &k, 13, 5).await;
                    assert!(delivered.as_ref().is_err_and(|e| names(e, column)), "{column}: {delivered:?}");
                    let claimed = inbox.claim::<_, ()>(&pool, &k, b"{\"order\":13,\"amount\":5}").await;
                    assert!(claimed.as_ref().is_err_and(|e| names(e, column)), "{column}: {claimed:?}");
                    assert_eq!(effects(&pool).await, 1, "the handler did not run again");
                    let nulls: i64 = sqlx::query_scalar(&format!(
                        "SELECT COUNT(*) FROM idem_inbox WHERE {column} IS NULL"
                    ))
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    assert_eq!(nulls, 1, "{column}: the record is left for someone to look at");
                }
            }

            /// A PROCESSING record without a lease (idem always writes one; another writer
            /// may not) is taken over, as an expired lease is: a lease that never ends
            /// would pin the message forever. The holder, if any, can no longer record.
            #[tokio::test]
            async fn a_processing_record_without_a_lease_is_taken_over() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("mailer").unwrap().lease(HOUR);
                let k = key("welcome:8");
                let Claimed::Work(first) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("first claim")
                };
                sqlx::query("UPDATE idem_inbox SET lease_until = NULL").execute(&pool).await.unwrap();
                let Claimed::Work(second) = inbox.claim::<_, String>(&pool, &k, b"hi").await.unwrap() else {
                    panic!("takeover")
                };
                assert_eq!(second.attempt(), 2);
                assert!(matches!(
                    first.complete(&pool, Ok::<_, String>("sent by 1".to_owned())).await,
                    Err(Error::LeaseLost { .. })
                ));
                assert_eq!(
                    second.complete(&pool, Ok::<_, String>("sent by 2".to_owned())).await.unwrap(),
                    Delivery::Processed("sent by 2".to_owned())
                );
                assert_eq!(inbox.counters().takeovers, 1);
                // The same in a delivery's own transaction.
                let k = key("order:14:paid");
                assert!(deliver(&inbox, &pool, &k, 14, 5).await.unwrap().is_processed());
                sqlx::query("UPDATE idem_inbox SET status = 'PROCESSING', lease_until = NULL WHERE attempts = 1")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert!(deliver(&inbox, &pool, &k, 14, 5).await.unwrap().is_processed());
                assert_eq!(effects(&pool).await, 2);
                assert_eq!(inbox.counters().takeovers, 2);
            }

            #[tokio::test]
            async fn a_concurrent_duplicate_gives_up_after_the_lock_timeout() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap().lock_timeout(Duration::from_millis(200));
                let k = key("order:9:paid");
                let Received::New(receipt) = inbox.receive::<_, ()>(&pool, &k, b"m").await.unwrap() else {
                    panic!("first delivery")
                };
                // The first delivery is still in its transaction: the second waits, then gives up.
                let second = inbox.receive::<_, ()>(&pool, &k, b"m").await.unwrap();
                assert!(matches!(second, Received::Done(Delivery::InProgress { .. })), "{second:?}");
                assert_eq!(receipt.finish(Ok::<(), ()>(())).await.unwrap(), Delivery::Processed(()));
                let third = inbox.receive::<_, ()>(&pool, &k, b"m").await.unwrap();
                assert!(matches!(third, Received::Done(Delivery::Duplicate { .. })), "{third:?}");
                assert_eq!(inbox.counters().in_progress, 1);
            }
        }
    };
}

inbox_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("inbox-{}", common::next_id()), 8).await)
);
inbox_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("inbox_{}", common::next_id()), 8).await
);
// Under REPEATABLE READ a duplicate that races the first delivery fails with a
// serialization failure instead of waiting; the inbox retries it before the handler runs.
inbox_tests!(
    postgres_repeatable_read,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres_with(
        &format!("inbox_rr_{}", common::next_id()),
        8,
        &[("default_transaction_isolation", "repeatable\\ read")]
    )
    .await
);
// MySQL under REPEATABLE READ (InnoDB's default): a duplicate's insert waits for the first
// delivery's uncommitted record, then fails on its key (read as "recorded already").
inbox_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("inbox_{}", common::next_id()), 8).await,
    positional = true
);
inbox_tests!(
    mysql_read_committed,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql_with(
        &format!("inbox_rc_{}", common::next_id()),
        8,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    )
    .await,
    positional = true
);

trait Done<T> {
    fn done(self) -> Option<Delivery<T>>;
}

impl<T> Done<T> for Claimed<T> {
    fn done(self) -> Option<Delivery<T>> {
        match self {
            Claimed::Done(d) => Some(d),
            Claimed::Work(_) => None,
        }
    }
}

/// MySQL's lock timeout is the session's, with no transaction-local setting: idem sets it for
/// its own statements and puts back the session's own value, not the global default.
#[tokio::test]
async fn mysql_the_sessions_own_lock_wait_timeout_is_put_back() {
    let Some(pool) = common::mysql_with(
        &format!("inbox_lwt_{}", common::next_id()),
        1,
        "SET SESSION innodb_lock_wait_timeout = 7",
    )
    .await
    else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    let inbox = Inbox::new("billing")
        .unwrap()
        .lock_timeout(Duration::from_millis(200));
    let k = key("order:1:paid");
    let Received::New(receipt) = inbox.receive::<_, ()>(&pool, &k, b"m").await.unwrap() else {
        panic!("first delivery")
    };
    assert_eq!(
        receipt.finish(Ok::<(), ()>(())).await.unwrap(),
        Delivery::Processed(())
    );
    let again = inbox.receive::<_, ()>(&pool, &k, b"m").await.unwrap();
    assert!(
        matches!(again, Received::Done(Delivery::Duplicate { .. })),
        "{again:?}"
    );
    let claimed = inbox
        .claim::<_, ()>(&pool, &key("order:2:paid"), b"m")
        .await
        .unwrap();
    assert!(matches!(claimed, Claimed::Work(_)), "{claimed:?}");
    let session: i64 =
        sqlx::query_scalar("SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(session, 7, "the session's own lock wait timeout is back");
}

/// PostgreSQL: the inbox's `lock_timeout` bounds idem's own statements; the handler's run
/// with the session's own setting (here 300ms, set by the pool's `after_connect`, as
/// pgbouncer's `connect_query` would set it), under `receive`, `process` and `batch` alike —
/// not the server's default.
#[tokio::test]
async fn postgres_the_handler_runs_with_the_sessions_own_lock_timeout() {
    let name = format!("inbox_lt_{}", common::next_id());
    let Some(made) = common::postgres(&name, 1).await else {
        return;
    };
    made.close().await;
    let schema = format!("idem_test_{name}");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let set = format!("SET search_path TO {schema}; SET lock_timeout = '300ms'");
            Box::pin(async move {
                sqlx::Executor::execute(conn, set.as_str()).await?;
                Ok(())
            })
        })
        .connect(&common::postgres_url().unwrap())
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    let inbox = Inbox::new("billing")
        .unwrap()
        .lock_timeout(Duration::from_millis(50));
    let show = async |tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
        sqlx::query_scalar::<_, String>("SHOW lock_timeout")
            .fetch_one(&mut **tx)
            .await
    };
    let Received::New(mut receipt) = inbox
        .receive::<_, String>(&pool, &key("order:1:paid"), b"m")
        .await
        .unwrap()
    else {
        panic!("first delivery")
    };
    let seen = show(receipt.transaction()).await.unwrap();
    assert_eq!(seen, "300ms", "receive");
    assert!(
        receipt
            .finish(Ok::<_, sqlx::Error>(seen))
            .await
            .unwrap()
            .is_processed()
    );
    let processed = inbox
        .process(&pool, &key("order:2:paid"), b"m", show)
        .await
        .unwrap();
    assert_eq!(
        processed,
        Delivery::Processed("300ms".to_owned()),
        "process"
    );
    let messages = [(key("order:3:paid"), b"m".to_vec())];
    let settled = inbox
        .batch(&pool, &messages, |tx, _| {
            Box::pin(async move {
                sqlx::query_scalar::<_, String>("SHOW lock_timeout")
                    .fetch_one(&mut **tx)
                    .await
            })
        })
        .await
        .unwrap();
    assert_eq!(
        settled[0].as_ref().unwrap(),
        &Delivery::Processed("300ms".to_owned()),
        "batch"
    );
}

/// A binary column holding bytes that are not UTF-8 (here the inbox's `result`, made a
/// `LONGBLOB` by hand) is a decode error naming the column, nothing changed, no panic.
#[tokio::test]
async fn mysql_non_utf8_bytes_are_a_decode_error_naming_the_column() {
    let Some(pool) = common::mysql(&format!("inbox_bytes_{}", common::next_id()), 2).await else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    let inbox = Inbox::new("billing").unwrap();
    let k = key("order:15:paid");
    let Received::New(receipt) = inbox.receive::<_, String>(&pool, &k, b"m").await.unwrap() else {
        panic!("first delivery")
    };
    let first = receipt.finish(Ok::<_, String>("ok".to_owned())).await;
    assert_eq!(first.unwrap(), Delivery::Processed("ok".to_owned()));
    sqlx::raw_sql(
        "ALTER TABLE idem_inbox MODIFY result LONGBLOB; UPDATE idem_inbox SET result = X'FF22'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let again = inbox.receive::<_, String>(&pool, &k, b"m").await;
    match &again {
        Err(Error::Database(sqlx::Error::ColumnDecode { index, .. })) => {
            assert_eq!(index, "result", "{again:?}")
        }
        other => panic!("expected a decode error naming `result`, got {other:?}"),
    }
    let message = again.unwrap_err().to_string();
    assert!(message.contains("result"), "{message}");
    let bytes: Vec<u8> = sqlx::query_scalar("SELECT result FROM idem_inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(bytes, [0xFF, 0x22], "the record is left as it was");
}
