//! Batches of deliveries (`Inbox::batch`): many messages in one transaction and one commit,
//! each still applied once, on SQLite, PostgreSQL and MariaDB.
//!
//! - a thousand messages published one to three times and shuffled, through batches of 1,
//!   10 and 100: exactly a thousand effects, every delivery acked;
//! - copies of a message inside one batch: one applies, the others are its duplicates (or,
//!   with another payload, conflicts);
//! - a failing handler rolls back its own message alone, its attempt is recorded, and a
//!   message that fails every time is parked as dead after its last attempt without
//!   holding back the rest of its batch;
//! - eight consumers delivering overlapping batches at once, on real connections: one
//!   effect per message, every delivery settled.

use crate::common;

use idem::inbox::{Delivery, Inbox, MessageKey, Settled, settles_with_ack};
use rand::SeedableRng;
use rand::seq::SliceRandom;

/// A message of the tests: message number `n` as key and payload (`fail` in the payload
/// makes its handler fail; anything after `#` changes the payload but not the key).
type Message = (MessageKey, Vec<u8>);

fn message(n: i64) -> Message {
    (key(n), n.to_string().into_bytes())
}

fn key(n: i64) -> MessageKey {
    MessageKey::business(format!("m:{n}"), "paid").unwrap()
}

/// The message number in a payload (`7`, `7#other`, `7fail`).
fn number(payload: &[u8]) -> i64 {
    let text = std::str::from_utf8(payload).unwrap();
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap()
}

/// The delivery of a message that did not fail.
fn ok(settled: &Settled<i64, String>) -> &Delivery<i64> {
    settled.as_ref().expect("a delivery, not an error")
}

/// Whether a delivery ended the message for good (ack) or must come again (nack).
fn acked(settled: &Settled<i64, String>) -> bool {
    settles_with_ack(settled)
}

macro_rules! batch_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        batch_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                Some(pool)
            }

            /// Delivers `messages` as one batch: the handler writes the message's effect
            /// and returns ten times its number, or fails when its payload says so.
            async fn deliver(
                pool: &$pool,
                inbox: &Inbox,
                messages: &[Message],
            ) -> Vec<Settled<i64, String>> {
                inbox
                    .batch(pool, messages, |tx, (_, payload)| {
                        Box::pin(async move {
                            let n = number(payload);
                            sqlx::query(common::placed(
                                $positional,
                                "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'batch', 1)",
                            ))
                            .bind(n)
                            .execute(&mut **tx)
                            .await
                            .map_err(|e| e.to_string())?;
                            if payload.ends_with(b"fail") {
                                return Err(format!("message {n} fails"));
                            }
                            Ok(n * 10)
                        })
                    })
                    .await
                    .unwrap()
            }

            /// The effects written, and how many messages they are of.
            async fn effects(pool: &$pool) -> (i64, i64) {
                sqlx::query_as(
                    "SELECT COUNT(*), COUNT(DISTINCT order_id) FROM effects WHERE kind = 'batch'",
                )
                .fetch_one(pool)
                .await
                .unwrap()
            }

            #[tokio::test]
            async fn a_thousand_messages_published_up_to_three_times_apply_once_in_any_batch_size() {
                let Some(pool) = setup().await else { return };
                for (round, size) in [1usize, 10, 100].into_iter().enumerate() {
                    let inbox = Inbox::new(format!("thousand-{size}")).unwrap();
                    sqlx::query("DELETE FROM effects").execute(&pool).await.unwrap();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(round as u64);
                    let mut published: Vec<Message> = Vec::new();
                    for n in 1..=1000 {
                        let copies = 1 + (n % 3) as usize;
                        published.extend(std::iter::repeat_n(message(n), copies));
                    }
                    published.shuffle(&mut rng);
                    let mut processed = std::collections::HashMap::new();
                    for chunk in published.chunks(size) {
                        let settled = deliver(&pool, &inbox, chunk).await;
                        assert_eq!(settled.len(), chunk.len());
                        for ((key, payload), settled) in chunk.iter().zip(&settled) {
                            assert!(acked(settled), "{key}: {settled:?}");
                            let n = number(payload);
                            match settled {
                                Ok(Delivery::Processed(v)) => {
                                    assert_eq!(*v, n * 10);
                                    *processed.entry(n).or_insert(0) += 1;
                                }
                                Ok(Delivery::Duplicate { first_result }) => {
                                    assert_eq!(*first_result, Some(n * 10), "{key}")
                                }
                                other => panic!("{key}: {other:?}"),
                            }
                        }
                    }
                    assert_eq!(processed.len(), 1000, "batches of {size}: every message processed");
                    assert!(processed.values().all(|&p| p == 1), "batches of {size}: each once");
                    assert_eq!(effects(&pool).await, (1000, 1000), "batches of {size}");
                    let counters = inbox.counters();
                    assert_eq!(counters.applied, 1000);
                    assert_eq!(counters.duplicates as usize, published.len() - 1000);
                }
            }

            #[tokio::test]
            async fn copies_inside_a_batch_are_its_duplicates_or_conflicts() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("copies").unwrap();
                let other = (key(1), b"1#other".to_vec());
                let settled = deliver(&pool, &inbox, &[message(1), message(2), message(1), other.clone()]).await;
                assert_eq!(ok(&settled[0]), &Delivery::Processed(10));
                assert_eq!(ok(&settled[1]), &Delivery::Processed(20));
                assert_eq!(ok(&settled[2]), &Delivery::Duplicate { first_result: Some(10) });
                assert_eq!(ok(&settled[3]), &Delivery::Conflict);
                assert_eq!(effects(&pool).await, (2, 2));

                // The next batch: a message processed before, another payload under its
                // key first (a conflict with the record), then the right one, and a new one.
                let settled = deliver(&pool, &inbox, &[other, message(1), message(3)]).await;
                assert_eq!(ok(&settled[0]), &Delivery::Conflict);
                assert_eq!(ok(&settled[1]), &Delivery::Duplicate { first_result: Some(10) });
                assert_eq!(ok(&settled[2]), &Delivery::Processed(30));
                assert_eq!(effects(&pool).await, (3, 3));
                assert!(deliver(&pool, &inbox, &[]).await.is_empty());
            }

            #[tokio::test]
            async fn a_failing_handler_fails_its_message_alone_and_poison_is_parked() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("poison").unwrap().max_attempts(3);
                let poison = (key(5), b"5fail".to_vec());
                let batch: Vec<Message> = (1..=10)
                    .map(|n| if n == 5 { poison.clone() } else { message(n) })
                    .chain([poison.clone()])
                    .collect();
                for attempt in 1..=3i64 {
                    let settled = deliver(&pool, &inbox, &batch).await;
                    for (i, settled) in settled.iter().enumerate() {
                        let n = i as i64 + 1;
                        match (n, attempt) {
                            (5, 3) => assert_eq!(ok(settled), &(Delivery::Dead {
                                    attempts: 3,
                                    last_error: Some("message 5 fails".into())
                                })
                            ),
                            (5, _) => assert!(
                                matches!(settled, Err(idem::Error::Handler(e)) if e == "message 5 fails"),
                                "attempt {attempt}: {settled:?}"
                            ),
                            // The poison's copy: nacked with it, parked with it.
                            (11, 3) => assert!(matches!(settled, Ok(Delivery::Dead { attempts: 3, .. }))),
                            (11, _) => assert!(matches!(settled, Ok(Delivery::InProgress { .. }))),
                            (_, 1) => assert_eq!(ok(settled), &(Delivery::Processed(n * 10))),
                            (_, _) => assert_eq!(ok(settled), &(Delivery::Duplicate { first_result: Some(n * 10) })
                            ),
                        }
                    }
                    // The poison's effect was rolled back each time: the nine others only.
                    assert_eq!(effects(&pool).await, (9, 9), "attempt {attempt}");
                }
                // Parked: acked from now on, never run again.
                let settled = deliver(&pool, &inbox, &[poison, message(11)]).await;
                assert!(matches!(settled[0], Ok(Delivery::Dead { attempts: 3, .. })));
                assert_eq!(ok(&settled[1]), &Delivery::Processed(110));
                assert_eq!(effects(&pool).await, (10, 10));
                let counters = inbox.counters();
                assert_eq!(counters.applied, 10);
                assert_eq!(counters.dead, 1);

                // A message that fails once is processed by its redelivery.
                let settled = deliver(&pool, &inbox, &[(key(12), b"12fail".to_vec()), message(13)]).await;
                assert!(matches!(settled[0], Err(idem::Error::Handler(_))));
                assert_eq!(ok(&settled[1]), &Delivery::Processed(130));
                let settled = deliver(&pool, &inbox, &[message(12)]).await;
                // Another payload than the failed attempt's: a conflict, like any delivery.
                assert_eq!(ok(&settled[0]), &Delivery::Conflict);
                let settled = deliver(&pool, &inbox, &[(key(12), b"12fail".to_vec())]).await;
                assert!(matches!(settled[0], Err(idem::Error::Handler(_))));
            }

            #[tokio::test]
            async fn a_failed_message_is_processed_by_its_redelivery() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("flaky").unwrap();
                let fails = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
                let messages: Vec<Message> = (1..=5).map(message).collect();
                for round in 0..2 {
                    let settled = inbox
                        .batch(&pool, &messages, |tx, (_, payload)| {
                            let fails = fails.clone();
                            Box::pin(async move {
                                let n = number(payload);
                                sqlx::query(common::placed(
                                    $positional,
                                    "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'batch', 1)",
                                ))
                                .bind(n)
                                .execute(&mut **tx)
                                .await
                                .map_err(|e| e.to_string())?;
                                if n == 3 && fails.load(std::sync::atomic::Ordering::SeqCst) {
                                    return Err("down".to_owned());
                                }
                                Ok::<_, String>(n * 10)
                            })
                        })
                        .await
                        .unwrap();
                    if round == 0 {
                        assert!(matches!(settled[2], Err(idem::Error::Handler(_))));
                        assert_eq!(effects(&pool).await, (4, 4));
                        fails.store(false, std::sync::atomic::Ordering::SeqCst);
                    } else {
                        assert_eq!(ok(&settled[2]), &Delivery::Processed(30));
                        assert!(settled.iter().all(acked));
                        assert_eq!(effects(&pool).await, (5, 5));
                    }
                }
            }

            /// Eight consumers deliver overlapping batches at once (every message in three
            /// of them), each redelivering what it was told to nack: one effect per message.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn eight_consumers_with_overlapping_batches_apply_each_message_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("racing").unwrap();
                let mut tasks = Vec::new();
                for consumer in 0..8u64 {
                    let (pool, inbox) = (pool.clone(), inbox.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(consumer);
                        // 300 messages, each in the share of three consumers.
                        let mut mine: Vec<Message> = (1..=300)
                            .filter(|n| (0..3).any(|k| (n + k) % 8 == consumer as i64))
                            .map(message)
                            .collect();
                        mine.shuffle(&mut rng);
                        let mut processed = 0;
                        while !mine.is_empty() {
                            let take = mine.len().min(25);
                            let chunk: Vec<Message> = mine.drain(..take).collect();
                            let settled = deliver(&pool, &inbox, &chunk).await;
                            for (m, settled) in chunk.into_iter().zip(settled) {
                                if matches!(settled, Ok(Delivery::Processed(_))) {
                                    processed += 1;
                                }
                                if !acked(&settled) {
                                    mine.push(m);
                                }
                            }
                        }
                        processed
                    }));
                }
                let mut processed = 0;
                for task in tasks {
                    processed += task.await.unwrap();
                }
                assert_eq!(processed, 300, "each message processed by one consumer");
                assert_eq!(effects(&pool).await, (300, 300));
            }
        }
    };
}

batch_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("batches-{}", common::next_id()), 4).await)
);
batch_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("batches_{}", common::next_id()), 8).await
);
batch_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("batches_{}", common::next_id()), 8).await,
    positional = true
);
