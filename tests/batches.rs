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
//!   effect per message, every delivery settled;
//! - a model-based test: random batches with copies inside and across batches, other
//!   payloads under a key, handlers that fail (and messages that fail until parked),
//!   against a reference model of the inbox: every answer, every record and every effect
//!   (failures kept in `tests/batches.regressions`).

use crate::common;
use crate::harness::{Harness, config, harness};

use idem::inbox::{Delivery, Inbox, MessageKey, Settled, settles_with_ack};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::collections::HashMap;
use std::sync::OnceLock;

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
                            assert!(!payload.ends_with(b"panic"), "message {n} panics");
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

            /// Results that together pass what one statement may carry on MariaDB
            /// (`max_allowed_packet`, 16 MiB by default): stored in several statements,
            /// each replayed whole.
            #[tokio::test]
            async fn results_larger_together_than_one_statement_are_all_stored() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("large-results").unwrap();
                let messages: Vec<Message> = (1..=24).map(message).collect();
                let large = |n: i64| format!("{n}:{}", "x".repeat(900_000));
                let run = || {
                    inbox.batch(&pool, &messages, |_, (_, payload)| {
                        Box::pin(async move { Ok::<_, String>(large(number(payload))) })
                    })
                };
                let settled = run().await.unwrap();
                for (n, settled) in (1..).zip(&settled) {
                    assert!(
                        matches!(settled, Ok(Delivery::Processed(r)) if *r == large(n)),
                        "message {n}"
                    );
                }
                for (n, settled) in (1..).zip(&run().await.unwrap()) {
                    let Ok(Delivery::Duplicate { first_result: Some(r) }) = settled else {
                        panic!("message {n}: not a duplicate")
                    };
                    assert_eq!(*r, large(n), "message {n}");
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

            /// A handler that panics (not an `Err`) fails its own message: caught, counted,
            /// parked after the last attempt, and the rest of its batch commits.
            #[tokio::test]
            async fn a_panicking_handler_fails_its_message_alone_and_is_parked() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("panics").unwrap().max_attempts(2);
                let batch: Vec<Message> = (1..=5)
                    .map(|n| if n == 3 { (key(3), b"3panic".to_vec()) } else { message(n) })
                    .collect();
                for attempt in 1..=2i64 {
                    let settled = deliver(&pool, &inbox, &batch).await;
                    match (&settled[2], attempt) {
                        (Err(idem::Error::Panicked(message)), 1) => {
                            assert_eq!(message, "message 3 panics");
                        }
                        (Ok(Delivery::Dead { attempts: 2, last_error: Some(error) }), 2) => {
                            assert_eq!(error, "the handler panicked: message 3 panics");
                        }
                        (other, _) => panic!("attempt {attempt}: {other:?}"),
                    }
                    assert_eq!(effects(&pool).await, (4, 4), "attempt {attempt}");
                }
                let settled = deliver(&pool, &inbox, &batch).await;
                assert!(settled.iter().all(acked), "{settled:?}");
                assert_eq!(inbox.counters().dead, 1);

                // A single delivery's handler that panics: rolled back, answered with
                // the panic, and the consumer goes on.
                let single = inbox
                    .process(&pool, &key(20), b"20", async |tx: &mut sqlx::Transaction<'static, $db>| {
                        sqlx::query(common::placed(
                            $positional,
                            "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'batch', 1)",
                        ))
                        .bind(20i64)
                        .execute(&mut **tx)
                        .await
                        .map_err(|e| e.to_string())?;
                        if std::hint::black_box(true) {
                            panic!("a single delivery panics");
                        }
                        Ok::<i64, String>(200)
                    })
                    .await;
                assert!(matches!(&single, Err(idem::Error::Panicked(m)) if m == "a single delivery panics"), "{single:?}");
                assert_eq!(effects(&pool).await, (4, 4), "rolled back");
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

/// One delivery of the model: message `n`'s key, its payload (`other`: another payload under
/// the same key), and whether its handler fails (not part of the payload: the same message
/// may fail on one delivery and not on the next).
#[derive(Debug, Clone)]
struct Modelled {
    key: MessageKey,
    payload: Vec<u8>,
    n: i64,
    fails: bool,
}

impl idem::inbox::Incoming for Modelled {
    fn key(&self) -> &MessageKey {
        &self.key
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

const MAX_ATTEMPTS: i64 = 3;

/// A record as the model keeps it.
#[derive(Debug, Clone, PartialEq)]
enum Record {
    Success { other: bool, result: i64 },
    Failed { other: bool, attempts: i64 },
    Dead { other: bool, attempts: i64 },
}

/// What the model expects of one delivery.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Processed(i64),
    Duplicate(i64),
    Conflict,
    /// The handler failed; the attempt is recorded.
    Failed,
    Dead(i64),
    InProgress,
}

fn observed(settled: &Settled<i64, String>) -> Expected {
    match settled {
        Ok(Delivery::Processed(v)) => Expected::Processed(*v),
        Ok(Delivery::Duplicate { first_result }) => Expected::Duplicate(first_result.unwrap()),
        Ok(Delivery::Conflict) => Expected::Conflict,
        Ok(Delivery::Dead { attempts, .. }) => Expected::Dead(*attempts),
        Ok(Delivery::InProgress { .. }) => Expected::InProgress,
        Err(idem::Error::Handler(_)) => Expected::Failed,
        other => panic!("unexpected: {other:?}"),
    }
}

/// The reference model: a batch's answers, and the records after it.
fn model(records: &mut HashMap<i64, Record>, batch: &[Modelled]) -> Vec<Expected> {
    let before = records.clone();
    // For each key, its lead's fingerprint and what it left.
    let mut leads: HashMap<i64, (bool, Expected)> = HashMap::new();
    let mut answers = Vec::with_capacity(batch.len());
    for m in batch {
        let other = m.payload.ends_with(b"#other");
        if let Some((lead_other, left)) = leads.get(&m.n) {
            let same = *lead_other == other;
            let answer = match (left, same) {
                (Expected::Processed(v), true) => Expected::Duplicate(*v),
                (Expected::Failed | Expected::InProgress, true) => Expected::InProgress,
                (Expected::Dead(a), true) => Expected::Dead(*a),
                (lead, true) => lead.clone(),
                // Another payload than its lead's: judged by the record before the batch,
                // or a conflict with what its lead wrote.
                (_, false) => match before.get(&m.n) {
                    None => Expected::Conflict,
                    Some(record) => judged(record, other).unwrap_or(Expected::InProgress),
                },
            };
            answers.push(answer);
            continue;
        }
        let answer = match records.get(&m.n).cloned() {
            Some(record) => match judged(&record, other) {
                Some(ended) => ended,
                None => {
                    let Record::Failed { attempts, .. } = record else {
                        unreachable!()
                    };
                    run(records, m, other, attempts + 1)
                }
            },
            None => run(records, m, other, 1),
        };
        leads.insert(m.n, (other, answer.clone()));
        answers.push(answer);
    }
    answers
}

/// What a delivery of payload `other` finds in `record`; `None`: it retries a failed one.
fn judged(record: &Record, other: bool) -> Option<Expected> {
    match *record {
        Record::Success { other: o, .. }
        | Record::Failed { other: o, .. }
        | Record::Dead { other: o, .. }
            if o != other =>
        {
            Some(Expected::Conflict)
        }
        Record::Success { result, .. } => Some(Expected::Duplicate(result)),
        Record::Dead { attempts, .. } => Some(Expected::Dead(attempts)),
        Record::Failed { .. } => None,
    }
}

/// Runs `m`'s handler as attempt `attempts`.
fn run(records: &mut HashMap<i64, Record>, m: &Modelled, other: bool, attempts: i64) -> Expected {
    if m.fails {
        if attempts >= MAX_ATTEMPTS {
            records.insert(m.n, Record::Dead { other, attempts });
            Expected::Dead(attempts)
        } else {
            records.insert(m.n, Record::Failed { other, attempts });
            Expected::Failed
        }
    } else {
        let result = m.n * 10 + i64::from(other);
        records.insert(m.n, Record::Success { other, result });
        Expected::Processed(result)
    }
}

fn modelled() -> impl Strategy<Value = Modelled> {
    (
        1i64..=6,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(n, other, fails)| Modelled {
            key: key(n),
            payload: if other {
                format!("{n}#other")
            } else {
                n.to_string()
            }
            .into_bytes(),
            n,
            fails,
        })
}

fn batches() -> impl Strategy<Value = Vec<Vec<Modelled>>> {
    prop::collection::vec(prop::collection::vec(modelled(), 1..8), 1..8)
}

use proptest::prelude::*;

macro_rules! model_runner {
    ($name:ident, $pool:ty, $positional:expr) => {
        /// Runs `batches` on a fresh group, checking every answer, then every record and
        /// effect, against the model.
        async fn $name(pool: &$pool, batches: &[Vec<Modelled>]) -> Result<(), TestCaseError> {
            let group = format!("model-{}", common::next_id());
            let inbox = Inbox::new(group.clone()).unwrap().max_attempts(MAX_ATTEMPTS as u32);
            let mut records = HashMap::new();
            for batch in batches {
                let expected = model(&mut records, batch);
                let kind = group.clone();
                let settled = inbox
                    .batch(pool, batch, move |tx, m| {
                        let kind = kind.clone();
                        Box::pin(async move {
                            sqlx::query(common::placed(
                                $positional,
                                "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, 1)",
                            ))
                            .bind(m.n)
                            .bind(kind)
                            .execute(&mut **tx)
                            .await
                            .map_err(|e| e.to_string())?;
                            if m.fails {
                                return Err(format!("message {} fails", m.n));
                            }
                            Ok(m.n * 10 + i64::from(m.payload.ends_with(b"#other")))
                        })
                    })
                    .await
                    .unwrap();
                let got: Vec<Expected> = settled.iter().map(observed).collect();
                prop_assert_eq!(got, expected, "batch {:?}", batch);
            }
            for n in 1..=6i64 {
                let effects: i64 = sqlx::query_scalar(common::placed(
                    $positional,
                    "SELECT COUNT(*) FROM effects WHERE kind = $1 AND order_id = $2",
                ))
                .bind(&group)
                .bind(n)
                .fetch_one(pool)
                .await
                .unwrap();
                let success = matches!(records.get(&n), Some(Record::Success { .. }));
                prop_assert_eq!(effects, i64::from(success), "message {}'s effects", n);
                let record: Option<(String, i64)> = sqlx::query_as(common::placed(
                    $positional,
                    "SELECT status, attempts FROM idem_inbox WHERE consumer_group = $1 AND message_key = $2",
                ))
                .bind(&group)
                .bind(key(n).as_str())
                .fetch_optional(pool)
                .await
                .unwrap();
                let expected = records.get(&n).map(|r| match *r {
                    Record::Success { .. } => ("SUCCESS".to_owned(), None),
                    Record::Failed { attempts, .. } => ("FAILED".to_owned(), Some(attempts)),
                    Record::Dead { attempts, .. } => ("DEAD".to_owned(), Some(attempts)),
                });
                match (record, expected) {
                    (None, None) => {}
                    (Some((status, attempts)), Some((want, want_attempts))) => {
                        prop_assert_eq!(&status, &want, "message {}", n);
                        if let Some(want_attempts) = want_attempts {
                            prop_assert_eq!(attempts, want_attempts, "message {}", n);
                        }
                    }
                    (got, want) => prop_assert!(false, "message {}: {:?} against {:?}", n, got, want),
                }
            }
            Ok(())
        }
    };
}

model_runner!(run_sqlite, sqlx::SqlitePool, false);
model_runner!(run_postgres, sqlx::PgPool, false);
model_runner!(run_mysql, sqlx::MySqlPool, true);

fn sqlite() -> &'static Harness<sqlx::SqlitePool> {
    static HARNESS: OnceLock<Harness<sqlx::SqlitePool>> = OnceLock::new();
    HARNESS.get_or_init(|| {
        harness(async || {
            let pool =
                common::sqlite_file(&format!("batches-model-{}", common::next_id()), 4).await;
            idem::migrate(&pool).await.unwrap();
            pool
        })
    })
}

fn postgres() -> Option<&'static Harness<sqlx::PgPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::PgPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::postgres_url()?;
            Some(harness(async || {
                let pool = common::postgres("batches_model", 2).await.unwrap();
                idem::migrate(&pool).await.unwrap();
                pool
            }))
        })
        .as_ref()
}

fn mysql() -> Option<&'static Harness<sqlx::MySqlPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::MySqlPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::mysql_url()?;
            Some(harness(async || {
                let pool = common::mysql("batches_model", 2).await.unwrap();
                idem::migrate(&pool).await.unwrap();
                pool
            }))
        })
        .as_ref()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sqlite_batches_agree_with_the_model(batches in batches()) {
        let h = sqlite();
        h.runtime.block_on(run_sqlite(&h.pool, &batches))?;
    }

    #[test]
    fn postgres_batches_agree_with_the_model(batches in batches()) {
        if let Some(h) = postgres() {
            h.runtime.block_on(run_postgres(&h.pool, &batches))?;
        }
    }

    #[test]
    fn mysql_batches_agree_with_the_model(batches in batches()) {
        if let Some(h) = mysql() {
            h.runtime.block_on(run_mysql(&h.pool, &batches))?;
        }
    }
}

/// The handlers run in the order of the messages, not of their keys (here the reverse), a
/// message delivered twice at its first delivery: what a log read in order (a Kafka
/// partition) relies on.
#[tokio::test]
async fn a_batch_runs_its_handlers_in_the_order_of_its_messages() {
    let pool = common::sqlite_file(&format!("batch-order-{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    let inbox = Inbox::new("batch-order").unwrap();
    let messages: Vec<Message> = [30, 20, 30, 10, 25].into_iter().map(message).collect();
    let calls = std::sync::Mutex::new(Vec::new());
    let settled = inbox
        .batch(&pool, &messages, |_, (_, payload)| {
            calls.lock().unwrap().push(number(payload));
            Box::pin(async move { Ok::<i64, String>(number(payload)) })
        })
        .await
        .unwrap();
    assert!(settled.iter().all(acked));
    assert_eq!(*calls.lock().unwrap(), [30, 20, 10, 25]);
}
