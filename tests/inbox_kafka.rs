//! The inbox's Kafka consumer on a real broker (`IDEM_TEST_KAFKA_URL`): offsets committed
//! only after the database's commit, copies absorbed, a poison message parked while its
//! partition moves on, a message without a key parked under its position, a rebalance
//! between two members losing and doubling nothing, and a configuration with auto-commit
//! refused.

use crate::brokers::{
    KAFKA_PARTITIONS, kafka_member, kafka_offsets, kafka_produce, kafka_url, unique,
    with_kafka_topic,
};
use crate::common;

use idem::inbox::kafka::{KafkaConsumer, KafkaConsumerError, KafkaHandlerError, KeyFrom};
use idem::inbox::{Delivery, Inbox};
use rdkafka::ClientConfig;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// `messages` messages `m-{i}` (payload `{i}`), message `i` sent `1 + i % copies` times
/// in a row, keyed over `keys` Kafka keys: the records [`kafka_produce`] sends.
fn copies(messages: i64, copies: i64, keys: i64) -> Vec<(String, Option<String>, String)> {
    (0..messages)
        .flat_map(|i| {
            let record = (
                format!("k{}", i % keys),
                Some(format!("m-{i}")),
                format!("{i}"),
            );
            std::iter::repeat_n(record, (1 + i % copies) as usize)
        })
        .collect()
}

/// Each partition's committed offset for `group`, and its end.
async fn offsets(url: &str, group: &str, topic: &str) -> Vec<(i64, i64)> {
    kafka_offsets(url, group, topic, KAFKA_PARTITIONS).await
}

async fn ledger(name: &str) -> sqlx::SqlitePool {
    let pool = common::sqlite_file(&format!("{name}-{}", common::next_id()), 4).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE kafka_effects (id TEXT NOT NULL, payload TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// One round of `consumer`, recording each applied message in `kafka_effects` (after
/// `pause`); payloads that start with `poison` fail.
async fn round(
    consumer: &KafkaConsumer,
    pool: &sqlx::SqlitePool,
    pause: Duration,
) -> idem::inbox::kafka::KafkaRound<(), String> {
    consumer
        .next(pool, |tx, record| {
            Box::pin(async move {
                tokio::time::sleep(pause).await;
                use rdkafka::Message as _;
                let payload =
                    String::from_utf8_lossy(record.message().payload().unwrap_or_default())
                        .into_owned();
                if payload.starts_with("poison") {
                    return Err(format!("refused {payload}"));
                }
                sqlx::query("INSERT INTO kafka_effects (id, payload) VALUES (?, ?)")
                    .bind(record.key().as_str())
                    .bind(payload)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            })
        })
        .await
        .unwrap()
}

async fn effects(pool: &sqlx::SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM kafka_effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every message sent twice or three times: each applied once, the copies absorbed, and in
/// the end every partition's committed offset is its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_copies_are_absorbed_and_offsets_follow_the_database() {
    with_kafka_topic("inbox", |url, name| async move {
        let records = copies(60, 3, 10);
        kafka_produce(&url, &name, &records).await;
        let pool = ledger("inbox-kafka").await;
        let group = unique("group");
        let consumer = KafkaConsumer::new(
            kafka_member(&url, &group),
            &[&name],
            Inbox::new("kafka-copies").unwrap(),
        )
        .unwrap()
        .batch(50, Duration::from_millis(200));
        let (mut processed, mut duplicates) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while processed + duplicates < records.len() && Instant::now() < deadline {
            let round = round(&consumer, &pool, Duration::ZERO).await;
            for (_, settled) in round.settled {
                match settled {
                    Ok(Delivery::Processed(())) => processed += 1,
                    Ok(Delivery::Duplicate { .. }) => duplicates += 1,
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!((processed, duplicates), (60, records.len() - 60));
        assert_eq!(effects(&pool).await, (60, 60));
        for (committed, end) in offsets(&url, &group, &name).await {
            assert_eq!(
                committed, end,
                "a partition's offset was not committed to its end"
            );
        }
    })
    .await;
}

/// A message whose handler always fails is read again until its attempts are spent, then
/// parked; the messages after it in its partition are applied, and the partition's offset
/// goes past it. A message with no id is parked under its position, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_poison_message_and_one_without_a_key_are_parked_and_the_partition_moves_on() {
    with_kafka_topic("inbox-poison", |url, name| async move {
        // One key: one partition, in this order.
        let records = vec![
            ("one".to_owned(), Some("a".to_owned()), "a".to_owned()),
            ("one".to_owned(), Some("p".to_owned()), "poison".to_owned()),
            ("one".to_owned(), None, "unkeyed".to_owned()),
            ("one".to_owned(), Some("b".to_owned()), "b".to_owned()),
        ];
        kafka_produce(&url, &name, &records).await;
        let pool = ledger("inbox-kafka-poison").await;
        let group = unique("group");
        let consumer = KafkaConsumer::new(
            kafka_member(&url, &group),
            &[&name],
            Inbox::new("kafka-poison").unwrap().max_attempts(3),
        )
        .unwrap()
        .batch(10, Duration::from_millis(200));
        let mut dead: HashMap<String, String> = HashMap::new();
        let mut failures = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while dead.len() < 2 && Instant::now() < deadline {
            for (position, settled) in round(&consumer, &pool, Duration::ZERO).await.settled {
                match settled {
                    Ok(Delivery::Dead { last_error, .. }) => {
                        dead.insert(position.to_string(), last_error.unwrap_or_default());
                    }
                    Err(idem::Error::Handler(KafkaHandlerError::Handler(_)))
                    | Err(idem::Error::Handler(KafkaHandlerError::NoKey(_))) => failures += 1,
                    _ => {}
                }
            }
        }
        assert_eq!(dead.len(), 2, "{dead:?}");
        let errors: Vec<&String> = dead.values().collect();
        assert!(
            errors.iter().any(|e| e.contains("refused poison")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.contains("idem-message-id")),
            "{errors:?}"
        );
        assert!(
            dead.keys().any(|p| p.starts_with(&format!("{name}/"))),
            "parked under its position: {dead:?}"
        );
        // Two attempts of each failed before the third parked it.
        assert!(failures >= 4, "{failures} failed attempts");
        assert_eq!(effects(&pool).await, (2, 2), "a and b, once each");
        let offsets = offsets(&url, &group, &name).await;
        assert!(
            offsets.iter().all(|(committed, end)| committed == end),
            "{offsets:?}"
        );
    })
    .await;
}

/// A round whose database fails (here: its pool is closed) is an `Err`, and its messages,
/// polled but neither applied nor committed, are read again by the next round: none is
/// passed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_failed_round_reads_its_messages_again() {
    with_kafka_topic("inbox-failed-round", |url, name| async move {
        let records: Vec<_> = (0..20)
            .map(|i| {
                (
                    format!("k{}", i % 4),
                    Some(format!("m-{i}")),
                    format!("{i}"),
                )
            })
            .collect();
        kafka_produce(&url, &name, &records).await;
        let pool = ledger("inbox-kafka-failed-round").await;
        let closed =
            common::sqlite_file(&format!("inbox-kafka-closed-{}", common::next_id()), 1).await;
        closed.close().await;
        let consumer = KafkaConsumer::new(
            kafka_member(&url, &unique("group")),
            &[&name],
            Inbox::new("kafka-failed-round").unwrap(),
        )
        .unwrap()
        .batch(50, Duration::from_millis(500));
        let failed = consumer
            .next(&closed, |_, _| Box::pin(async { Ok::<(), String>(()) }))
            .await;
        assert!(
            matches!(failed, Err(idem::inbox::kafka::KafkaRoundError::Inbox(_))),
            "{failed:?}"
        );
        let applied = tokio::time::timeout(Duration::from_secs(30), async {
            let mut applied = 0;
            while applied < 20 {
                let round = round(&consumer, &pool, Duration::ZERO).await;
                applied += round
                    .settled
                    .iter()
                    .filter(|(_, s)| matches!(s, Ok(Delivery::Processed(()))))
                    .count();
            }
            applied
        })
        .await
        .expect("the failed round's messages were passed over");
        assert_eq!(applied, 20);
        assert_eq!(effects(&pool).await, (20, 20));
    })
    .await;
}

/// A second member joins while the first is consuming: the partitions are split between
/// them (a rebalance), each resumes where the other's commits left off, and every message
/// is applied once; messages really were read twice somewhere, or not, but never applied
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_rebalance_between_two_members_applies_each_message_once() {
    with_kafka_topic("inbox-rebalance", |url, name| async move {
        const MESSAGES: usize = 300;
        let records = copies(MESSAGES as i64, 2, 30);
        kafka_produce(&url, &name, &records).await;
        let pool = ledger("inbox-kafka-rebalance").await;
        let group = unique("group");
        let member = |pool: sqlx::SqlitePool, url: String, name: String, group: String| {
            tokio::spawn(async move {
                let consumer = KafkaConsumer::new(
                    kafka_member(&url, &group),
                    &[&name],
                    Inbox::new("kafka-rebalance").unwrap(),
                )
                .unwrap()
                .batch(20, Duration::from_millis(100));
                let mut read = 0;
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    // A handler of 5 ms: the first member is still at work when the
                    // second joins.
                    let next = tokio::time::timeout(
                        Duration::from_secs(3),
                        round(&consumer, &pool, Duration::from_millis(5)),
                    );
                    match next.await {
                        Ok(round) => read += round.settled.len(),
                        // Nothing came for 3 s: done.
                        Err(_) => break,
                    }
                }
                read
            })
        };
        let first = member(pool.clone(), url.clone(), name.clone(), group.clone());
        // The second joins once the first has applied some.
        let deadline = Instant::now() + Duration::from_secs(30);
        while effects(&pool).await.0 < 50 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let second = member(pool.clone(), url.clone(), name.clone(), group.clone());
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(effects(&pool).await, (MESSAGES as i64, MESSAGES as i64));
        assert!(
            first > 0 && second > 0,
            "both members read: {first} and {second} (the second got partitions)"
        );
        let read = first + second;
        assert!(read >= records.len(), "{read} read of {}", records.len());
        for (committed, end) in offsets(&url, &group, &name).await {
            assert_eq!(committed, end);
        }
    })
    .await;
}

/// Auto-commit would commit offsets before the database commits what they cover: refused,
/// saying so; a consumer without a group is refused too.
#[test]
fn kafka_consumer_refuses_auto_commit_and_a_missing_group() {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", "127.0.0.1:9")
        .set("group.id", "g")
        .set("enable.auto.commit", "true");
    let refused = KafkaConsumer::new(config, &["t"], Inbox::new("g").unwrap()).unwrap_err();
    assert!(matches!(refused, KafkaConsumerError::AutoCommit));
    assert!(refused.to_string().contains("enable.auto.commit=true"));
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", "127.0.0.1:9");
    let refused = KafkaConsumer::new(config, &["t"], Inbox::new("g").unwrap()).unwrap_err();
    assert!(matches!(refused, KafkaConsumerError::NoGroup));
    let _ = KeyFrom::Position;
}

/// The PostgreSQL schema `idem_test_{name}` of the member processes' tests, with idem's
/// tables, the effects and the members' reads: a pool on it, and the URL a member process
/// connects with. `None` without PostgreSQL.
async fn members_database(name: &str) -> Option<(sqlx::PgPool, String)> {
    let pool = common::postgres(name, 4).await?;
    let url = common::postgres_url().unwrap();
    let join = if url.contains('?') { '&' } else { '?' };
    let database = format!("{url}{join}options=-c%20search_path%3Didem_test_{name}");
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE kafka_effects (id TEXT NOT NULL, payload TEXT NOT NULL);
         CREATE TABLE kafka_reads (applied BIGINT NOT NULL, absorbed BIGINT NOT NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();
    Some((pool, database))
}

/// A member process ([`kafka_member_child`]) of `group` on `topic`, writing to `database`,
/// with `env` besides.
fn spawn_member(
    database: &str,
    group: &str,
    topic: &str,
    env: &[(&'static str, String)],
) -> crate::child::ChildProcess {
    let mut all = vec![
        ("IDEM_KAFKA_MEMBER_DB", database.to_owned()),
        ("IDEM_KAFKA_MEMBER_GROUP", group.to_owned()),
        ("IDEM_KAFKA_MEMBER_TOPIC", topic.to_owned()),
    ];
    all.extend(env.iter().cloned());
    crate::child::ChildProcess::spawn(
        "inbox_kafka::kafka_member_child",
        &all,
        &["IDEM_CRASH_NTH", "IDEM_PAUSE_NTH", "IDEM_PAUSE_RELEASE"],
    )
}

/// The member of [`kafka_members_killed_and_joining_apply_each_message_once`] and
/// [`kafka_a_member_frozen_past_its_session_commits_nothing_it_lost`], as a child process:
/// consumes until the parent kills it, recording after each round how many of its
/// deliveries were applied and how many absorbed. Killed after its `IDEM_CRASH_NTH`-th
/// database commit, before that round's offsets are committed, if asked; or paused there
/// after its `IDEM_PAUSE_NTH`-th until the file `IDEM_PAUSE_RELEASE` exists, reporting what
/// the round it paused in committed and lost (`round committed=… lost=…`).
#[test]
#[ignore = "the child process of the Kafka members test, which runs it"]
fn kafka_member_child() {
    let Ok(url) = std::env::var("IDEM_KAFKA_MEMBER_DB") else {
        eprintln!("kafka_member_child runs only as the child of the Kafka members test");
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    if let Ok(nth) = std::env::var("IDEM_CRASH_NTH") {
        crate::child::stop_at_nth(idem::fault::FaultPoint::Committed, nth.parse().unwrap());
    }
    let release = std::env::var("IDEM_PAUSE_RELEASE")
        .ok()
        .map(std::path::PathBuf::from);
    if let Some(release) = &release {
        let nth = var("IDEM_PAUSE_NTH").parse().unwrap();
        crate::child::pause_at_nth(idem::fault::FaultPoint::Committed, nth, release.clone());
    }
    let mut paused_round_reported = false;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap();
        let consumer = KafkaConsumer::new(
            kafka_member(&kafka_url().unwrap(), &var("IDEM_KAFKA_MEMBER_GROUP")),
            &[&var("IDEM_KAFKA_MEMBER_TOPIC")],
            Inbox::new("kafka-members").unwrap(),
        )
        .unwrap()
        .batch(50, Duration::from_millis(100));
        crate::child::report("ready");
        loop {
            let next = consumer.next(&pool, |tx, record| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO kafka_effects (id, payload) VALUES ($1, '')")
                        .bind(record.key().as_str())
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            });
            let round = next.await.unwrap();
            // Rounds run one after another: the first to end after the release is the one
            // that paused (reported once its reads are recorded).
            let paused_round = (!paused_round_reported
                && release.as_ref().is_some_and(|r| r.exists()))
            .then(|| {
                format!(
                    "round committed={} lost={}",
                    round.committed.len(),
                    round.lost.len()
                )
            });
            let applied = round
                .settled
                .iter()
                .filter(|(_, s)| matches!(s, Ok(Delivery::Processed(()))))
                .count() as i64;
            let absorbed = round
                .settled
                .iter()
                .filter(|(_, s)| matches!(s, Ok(Delivery::Duplicate { .. })))
                .count() as i64;
            sqlx::query("INSERT INTO kafka_reads (applied, absorbed) VALUES ($1, $2)")
                .bind(applied)
                .bind(absorbed)
                .execute(&pool)
                .await
                .unwrap();
            if let Some(step) = paused_round {
                paused_round_reported = true;
                crate::child::report(&step);
            }
        }
    });
}

/// 1,000 messages, each sent one to three times, on six partitions, consumed by a group of
/// three member processes; one is SIGKILLed after a batch's database commit and before its
/// offsets' commit, and a fourth joins later: two rebalances at least. Every message is
/// applied exactly once, every partition's offset ends committed at its end, and the killed
/// member's last batch was really read again (its messages answered as duplicates by the
/// members that took its partitions over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_members_killed_and_joining_apply_each_message_once() {
    let name = format!("kafka_members_{}", common::next_id());
    let Some((pool, database)) = members_database(&name).await else {
        return;
    };
    with_kafka_topic("inbox-members", |kafka, topic| async move {
            const MESSAGES: i64 = 1000;
            let records = copies(MESSAGES, 3, 50);
            kafka_produce(&kafka, &topic, &records).await;
            let group = unique("members");
            let spawn = |crash: Option<u64>| {
                let env: Vec<_> = crash.map(|nth| ("IDEM_CRASH_NTH", nth.to_string())).into_iter().collect();
                spawn_member(&database, &group, &topic, &env)
            };
            let mut doomed = spawn(Some(4));
            doomed.step("ready").await;
            let mut members = vec![spawn(None), spawn(None)];
            for member in &mut members {
                member.step("ready").await;
            }
            let step = tokio::time::timeout(Duration::from_secs(60), doomed.step("crash-point"))
                .await
                .expect("the doomed member reached its fourth commit");
            assert_eq!(step, "crash-point committed");
            doomed.kill();
            // A fourth member joins later.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut late = spawn(None);
            late.step("ready").await;
            members.push(late);
            // Done once every message is applied and every offset committed to its end
            // (the killed member's partitions wait for its session to time out first).
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let (applied,): (i64,) =
                    sqlx::query_as("SELECT COUNT(DISTINCT id) FROM kafka_effects")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                let offsets = offsets(&kafka, &group, &topic).await;
                if applied == MESSAGES && offsets.iter().all(|(c, e)| c == e) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "after 120 s: {applied} applied, offsets {offsets:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            for mut member in members {
                member.kill();
            }
            let (rows, distinct): (i64, i64) =
                sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM kafka_effects")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!((rows, distinct), (MESSAGES, MESSAGES), "each message applied once");
            let (applied, absorbed): (i64, i64) = sqlx::query_as(
                "SELECT COALESCE(SUM(applied), 0)::BIGINT, COALESCE(SUM(absorbed), 0)::BIGINT FROM kafka_reads",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            // The killed member applied messages whose offsets it never committed: the
            // surviving members read them again, as duplicates.
            assert!(
                applied < MESSAGES,
                "the survivors applied {applied}: none of the killed member's batch was read again"
            );
            assert!(
                applied + absorbed >= records.len() as i64,
                "{applied} applied and {absorbed} absorbed of {} records",
                records.len()
            );
            for (committed, end) in offsets(&kafka, &group, &topic).await {
                assert_eq!(committed, end, "a partition's offset was not committed to its end");
            }
    })
    .await;
}

/// A member frozen (SIGSTOP, its heartbeats with it) after a batch's database commit and
/// before its offsets' commit, for longer than its session: the group hands its partitions
/// to the other member, which reads that batch again (absorbed) and the rest, and commits
/// every partition to its end. Thawed, the frozen member finishes its round without
/// committing anything (Kafka fences its stale generation, or it saw the revocation): the
/// committed offsets stay at their ends, not set back, and nothing is applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_member_frozen_past_its_session_commits_nothing_it_lost() {
    let name = format!("kafka_frozen_{}", common::next_id());
    let Some((pool, database)) = members_database(&name).await else {
        return;
    };
    let release = common::scratch_file(&format!("{name}.release"));
    let _ = std::fs::remove_file(&release);
    with_kafka_topic("inbox-frozen", |kafka, topic| async move {
        const MESSAGES: i64 = 300;
        let records = copies(MESSAGES, 2, 30);
        kafka_produce(&kafka, &topic, &records).await;
        let group = unique("frozen");
        let spawn = |pause: Option<u64>| {
            let mut env = Vec::new();
            if let Some(nth) = pause {
                env.push(("IDEM_PAUSE_NTH", nth.to_string()));
                env.push(("IDEM_PAUSE_RELEASE", release.display().to_string()));
            }
            spawn_member(&database, &group, &topic, &env)
        };
        // Alone in the group, the first member owns every partition; it pauses after its
        // second batch's commit, and is frozen there.
        let mut frozen = spawn(Some(2));
        frozen.step("ready").await;
        let step = tokio::time::timeout(Duration::from_secs(60), frozen.step("pause-point"))
            .await
            .expect("the member reached its second commit");
        assert_eq!(step, "pause-point committed");
        frozen.freeze();
        let mut other = spawn(None);
        other.step("ready").await;
        // The other member gets the partitions once the frozen one's session (6 s) is over,
        // and takes every partition to its end.
        let all_committed = || offsets(&kafka, &group, &topic);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (applied,): (i64,) = sqlx::query_as("SELECT COUNT(DISTINCT id) FROM kafka_effects")
                .fetch_one(&pool)
                .await
                .unwrap();
            let offsets = all_committed().await;
            if applied == MESSAGES && offsets.iter().all(|(c, e)| c == e) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after 90 s with a member frozen: {applied} applied, offsets {offsets:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Thawed, the frozen member ends its round: nothing committed, its partitions lost.
        std::fs::write(&release, b"").unwrap();
        frozen.thaw();
        frozen.step("released").await;
        let step = frozen.step("round").await;
        let committed: usize = step
            .split_whitespace()
            .find_map(|part| part.strip_prefix("committed="))
            .unwrap()
            .parse()
            .unwrap();
        let lost: usize = step
            .split_whitespace()
            .find_map(|part| part.strip_prefix("lost="))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            committed, 0,
            "the thawed member committed partitions it lost: {step}"
        );
        assert!(lost > 0, "the thawed member's round lost nothing: {step}");
        // Give a stray commit the time to land, then look: every offset still at its end.
        tokio::time::sleep(Duration::from_secs(2)).await;
        for (committed, end) in all_committed().await {
            assert_eq!(
                committed, end,
                "an offset was set back by the thawed member"
            );
        }
        frozen.kill();
        other.kill();
        let (rows, distinct): (i64, i64) =
            sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id) FROM kafka_effects")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            (rows, distinct),
            (MESSAGES, MESSAGES),
            "each message applied once"
        );
        let (absorbed,): (i64,) =
            sqlx::query_as("SELECT COALESCE(SUM(absorbed), 0)::BIGINT FROM kafka_reads")
                .fetch_one(&pool)
                .await
                .unwrap();
        // Every copy, and the frozen member's batch read again by the other.
        assert!(
            absorbed > records.len() as i64 - MESSAGES,
            "{absorbed} absorbed: the frozen member's batch was not read again"
        );
    })
    .await;
}
