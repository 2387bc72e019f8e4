//! The inbox partitioned by day (`idem::inbox::partitions`), on PostgreSQL and MariaDB: an
//! existing inbox turned into the partitioned table with its records; every form of idem on
//! it (PostgreSQL); a day past the window dropped with its records (its failures kept); and
//! deliveries racing the maintenance that moves records between partitions, each applied
//! once.

use crate::common;
use crate::pg_forms::{consume, effects, every_form, prepare};

use idem::inbox::partitions::{self, Maintained};
use idem::inbox::{Claimed, Delivery, Inbox, MessageKey};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinSet;

/// A first delivery of `key` claims it and fails: its record FAILED, one attempt made.
async fn fails_once<DB: idem::Backend>(pool: &sqlx::Pool<DB>, inbox: &Inbox, key: &MessageKey) {
    let Claimed::Work(lease) = inbox.claim::<_, i64>(pool, key, b"m").await.unwrap() else {
        panic!("a first delivery works")
    };
    assert!(lease.complete(pool, Err::<i64, _>("down")).await.is_err());
}

async fn setup(name: &str) -> Option<PgPool> {
    let pool = common::postgres(&format!("{name}_{}", common::next_id()), 8).await?;
    prepare(&pool, 4).await;
    Some(pool)
}

/// The database's day (UTC), in days since 1970-01-01.
async fn today(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT CAST(CAST(now() AT TIME ZONE 'UTC' AS date) - DATE '1970-01-01' AS BIGINT)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Noon (UTC) of `day`.
fn noon(day: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs((day * 86_400 + 43_200) as u64)
}

fn dated(order: i64, day: i64) -> MessageKey {
    MessageKey::business(format!("order:{order}"), "paid")
        .unwrap()
        .dated(noon(day))
        .unwrap()
}

/// The partition holding `key`'s record in `group`.
async fn partition_of(pool: &PgPool, group: &str, key: &MessageKey) -> Option<String> {
    sqlx::query_scalar(
        "SELECT CAST(CAST(tableoid AS regclass) AS TEXT) FROM idem_inbox \
         WHERE consumer_group = $1 AND message_key = $2",
    )
    .bind(group)
    .bind(key.as_str())
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn is_partitioned(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = CAST('idem_inbox' AS regclass)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_existing_inbox_is_partitioned_with_its_records() {
    let Some(pool) = setup("partition_existing").await else {
        return;
    };
    let inbox = Inbox::new("billing").unwrap();
    let day = today(&pool).await;
    let undated = MessageKey::business("order:1", "paid").unwrap();
    let dated_key = dated(2, day);
    assert_eq!(dated_key.as_str().len(), "~d2026-12-05/order:2:paid".len());
    assert!(
        consume(&pool, &inbox, &undated, b"m", 1)
            .await
            .unwrap()
            .is_processed()
    );
    assert!(
        consume(&pool, &inbox, &dated_key, b"m", 2)
            .await
            .unwrap()
            .is_processed()
    );
    assert!(!is_partitioned(&pool).await);

    partitions::partition(&pool).await.unwrap();
    partitions::partition(&pool).await.unwrap();
    assert!(is_partitioned(&pool).await, "partitioned, once");
    // The records moved with the table: both messages are duplicates.
    let duplicate = |r: i64| Delivery::Duplicate {
        first_result: Some(r),
    };
    assert_eq!(
        consume(&pool, &inbox, &undated, b"m", 1).await.unwrap(),
        duplicate(10)
    );
    assert_eq!(
        consume(&pool, &inbox, &dated_key, b"m", 2).await.unwrap(),
        duplicate(20)
    );
    assert_eq!(
        partition_of(&pool, "billing", &dated_key).await.as_deref(),
        Some("idem_inbox_dated_rest")
    );

    let maintained = partitions::maintain(&pool, 2, 2).await.unwrap();
    assert_eq!(maintained.created.len(), 5, "{maintained:?}");
    assert!(maintained.dropped.is_empty());
    assert_eq!(
        partitions::maintain(&pool, 2, 2).await.unwrap(),
        Maintained::default()
    );
    // The dated record now lives in its day, the undated one below the dated keys.
    let day_name = format!(
        "idem_inbox_d{}",
        &dated_key.as_str()[2..12].replace('-', "")
    );
    assert!(maintained.created.contains(&day_name), "{maintained:?}");
    assert_eq!(
        partition_of(&pool, "billing", &dated_key).await,
        Some(day_name)
    );
    assert_eq!(
        partition_of(&pool, "billing", &undated).await.as_deref(),
        Some("idem_inbox_undated_low")
    );
    assert_eq!(
        consume(&pool, &inbox, &dated_key, b"m", 2).await.unwrap(),
        duplicate(20)
    );
    assert_eq!(
        consume(&pool, &inbox, &dated_key, b"other", 2)
            .await
            .unwrap(),
        Delivery::Conflict
    );
    assert_eq!(effects(&pool, "consume").await, vec![(1, 1), (2, 1)]);
    // migrate, run again at the next start-up, leaves the partitioned table as it is.
    idem::migrate(&pool).await.unwrap();
    assert!(is_partitioned(&pool).await);
}

#[tokio::test]
async fn every_form_works_on_a_partitioned_inbox() {
    let Some(pool) = setup("partition_forms").await else {
        return;
    };
    partitions::partition(&pool).await.unwrap();
    partitions::maintain(&pool, 3, 2).await.unwrap();
    // Undated keys: every form, HTTP included.
    every_form(&pool, &pool).await;

    // Dated keys: a batch, the leased mode and the purge, in the day's partition.
    let inbox = Inbox::new("dated").unwrap();
    let day = today(&pool).await;
    let messages: Vec<(MessageKey, Vec<u8>)> = [10, 11, 10]
        .into_iter()
        .map(|n| (dated(n, day), b"m".to_vec()))
        .collect();
    let settled = inbox
        .batch(&pool, &messages, |tx, (key, _)| {
            Box::pin(async move {
                let order: i64 = key.as_str()[19..21].parse().unwrap();
                sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'batch', 0)")
                    .bind(order)
                    .execute(&mut **tx)
                    .await?;
                Ok::<_, sqlx::Error>(order)
            })
        })
        .await
        .unwrap();
    assert_eq!(settled[0].as_ref().unwrap(), &Delivery::Processed(10));
    assert_eq!(settled[1].as_ref().unwrap(), &Delivery::Processed(11));
    assert_eq!(
        settled[2].as_ref().unwrap(),
        &Delivery::Duplicate {
            first_result: Some(10)
        }
    );
    let again = inbox
        .batch(&pool, &messages[..1], |_, _| {
            Box::pin(async { Ok::<i64, sqlx::Error>(0) })
        })
        .await
        .unwrap();
    assert_eq!(
        again[0].as_ref().unwrap(),
        &Delivery::Duplicate {
            first_result: Some(10)
        }
    );
    assert_eq!(effects(&pool, "batch").await, vec![(10, 1), (11, 1)]);

    let leased = dated(12, day + 1);
    let Claimed::Work(lease) = inbox.claim::<_, i64>(&pool, &leased, b"m").await.unwrap() else {
        panic!("a first delivery works")
    };
    assert_eq!(
        lease.complete(&pool, Ok::<_, String>(120)).await.unwrap(),
        Delivery::Processed(120)
    );
    assert!(
        partition_of(&pool, "dated", &leased)
            .await
            .unwrap()
            .starts_with("idem_inbox_d")
    );
    // Purge names rows by partition and ctid: it deletes exactly the group's three records.
    let other_group = Inbox::new("kept").unwrap();
    assert!(
        consume(&pool, &other_group, &dated(13, day), b"m", 13)
            .await
            .unwrap()
            .is_processed()
    );
    common::past_this_millisecond().await;
    assert_eq!(inbox.purge(&pool, Duration::ZERO, 1).await.unwrap(), 3);
    assert!(partition_of(&pool, "kept", &dated(13, day)).await.is_some());
}

#[tokio::test]
async fn a_day_past_the_window_is_dropped_with_its_records_and_its_failures_kept() {
    let Some(pool) = setup("partition_drop").await else {
        return;
    };
    assert!(!partitions::status(&pool).await.unwrap().is_partitioned());
    partitions::partition(&pool).await.unwrap();
    let before = partitions::status(&pool).await.unwrap();
    assert!(
        before.is_partitioned() && before.days.is_empty(),
        "{before:?}"
    );
    let would = before.would_maintain(3, 1);
    let first = partitions::maintain(&pool, 3, 1).await.unwrap();
    assert_eq!(first.created.len(), 5, "{first:?}");
    assert_eq!(would, first, "the dry run says what the maintenance does");
    let day = today(&pool).await;
    let status = partitions::status(&pool).await.unwrap();
    assert_eq!(status.days.len(), 5, "{status:?}");
    assert_eq!(status.days[3], status.today);
    assert_eq!(status.today.len(), "YYYY-MM-DD".len());
    let inbox = Inbox::new("old").unwrap().max_attempts(3);
    let old = dated(1, day - 2);
    assert!(
        consume(&pool, &inbox, &old, b"m", 1)
            .await
            .unwrap()
            .is_processed()
    );
    let failing = dated(2, day - 2);
    fails_once(&pool, &inbox, &failing).await;
    let recent = dated(3, day);
    assert!(
        consume(&pool, &inbox, &recent, b"m", 3)
            .await
            .unwrap()
            .is_processed()
    );

    // Keep one day: the days three and two days ago go, with their records.
    let would = partitions::status(&pool)
        .await
        .unwrap()
        .would_maintain(1, 1);
    let dropped = partitions::maintain(&pool, 1, 1).await.unwrap();
    assert_eq!(would, dropped, "the dry run says what the maintenance does");
    assert_eq!(dropped.dropped.len(), 2, "{dropped:?}");
    assert!(dropped.created.is_empty(), "{dropped:?}");
    assert_eq!(partition_of(&pool, "old", &old).await, None);
    assert_eq!(partition_of(&pool, "old", &failing).await, None);
    let kept: Vec<(String, String)> =
        sqlx::query_as("SELECT message_key, status FROM idem_inbox_failures ORDER BY message_key")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        kept,
        vec![(failing.as_str().to_owned(), "FAILED".to_owned())]
    );
    assert!(
        partition_of(&pool, "old", &recent).await.is_some(),
        "today's stays"
    );

    // A redelivery older than the window is processed again, as after a purge, and lands
    // in the past partition, which the next maintenance empties.
    assert!(
        consume(&pool, &inbox, &old, b"m", 1)
            .await
            .unwrap()
            .is_processed()
    );
    assert_eq!(
        partition_of(&pool, "old", &old).await.as_deref(),
        Some("idem_inbox_dated_past")
    );
    let emptied = partitions::maintain(&pool, 1, 2).await.unwrap();
    assert_eq!(emptied.created.len(), 1, "{emptied:?}");
    assert_eq!(partition_of(&pool, "old", &old).await, None);
    assert!(partition_of(&pool, "old", &recent).await.is_some());
}

/// A record of a day being dropped turns DEAD while the maintenance runs (its last attempt
/// fails in a transaction that commits while the maintenance waits): it is copied DEAD, as
/// it is at the drop, not as an earlier look saw it, nor lost with its partition.
#[tokio::test]
async fn a_record_turning_dead_during_the_maintenance_is_kept_dead() {
    let Some(pool) = setup("partition_dead").await else {
        return;
    };
    partitions::partition(&pool).await.unwrap();
    partitions::maintain(&pool, 3, 1).await.unwrap();
    let day = today(&pool).await;
    let inbox = Inbox::new("old").unwrap().max_attempts(2);
    let failing = dated(2, day - 2);
    fails_once(&pool, &inbox, &failing).await;
    // Its last attempt's failure, recorded in a transaction still open.
    let mut last = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE idem_inbox SET status = 'DEAD', attempts = 2, error = 'down again' \
         WHERE consumer_group = 'old' AND message_key = $1",
    )
    .bind(failing.as_str())
    .execute(&mut *last)
    .await
    .unwrap();
    let maintenance = tokio::spawn({
        let pool = pool.clone();
        async move { partitions::maintain(&pool, 1, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    last.commit().await.unwrap();
    let dropped = maintenance.await.unwrap().unwrap();
    assert_eq!(dropped.dropped.len(), 2, "{dropped:?}");
    let kept: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT message_key, status, attempts FROM idem_inbox_failures ORDER BY message_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        vec![(failing.as_str().to_owned(), "DEAD".to_owned(), 2)]
    );
}

/// Sixteen tasks deliver 256 dated messages four times each (their days from today to four
/// days ahead: some land in the future partition first) while the maintenance widens the
/// window day by day, each time moving the future partition's records into their new
/// days: every message applied once, every other delivery its duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_racing_the_maintenance_apply_once() {
    let Some(pool) = setup("partition_race").await else {
        return;
    };
    partitions::partition(&pool).await.unwrap();
    partitions::maintain(&pool, 1, 0).await.unwrap();
    let day = today(&pool).await;
    let inbox = Inbox::new("race").unwrap();
    // Four rounds of every message, so that a message's later copies come after the
    // maintenance moved its record.
    let calls: Vec<i64> = (0..4).flat_map(|_| 1..=256).collect();
    let calls = Arc::new(std::sync::Mutex::new(calls));
    let mut tasks = JoinSet::new();
    for _ in 0..16 {
        let (pool, inbox, calls) = (pool.clone(), inbox.clone(), calls.clone());
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let Some(n) = calls.lock().unwrap().pop() else {
                    return outcomes;
                };
                let key = dated(n, day + n % 5);
                let delivery = consume(&pool, &inbox, &key, b"m", n).await.unwrap();
                outcomes.push((n, delivery));
            }
        });
    }
    // Once deliveries are under way (some of them into the future partition), the window
    // widens a day at a time, each maintenance moving the future partition's records.
    while inbox.counters().applied < 16 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut moved = 0;
    for ahead in 1..=4 {
        moved += sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM idem_inbox_dated_future")
            .fetch_one(&pool)
            .await
            .unwrap();
        let maintained = partitions::maintain(&pool, 1, ahead).await.unwrap();
        assert_eq!(maintained.created.len(), 1, "{maintained:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(moved > 0, "records were moved out of the future partition");
    let mut processed: HashMap<i64, usize> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (n, delivery) in done.unwrap() {
            match delivery {
                Delivery::Processed(r) => {
                    assert_eq!(r, n * 10);
                    *processed.entry(n).or_default() += 1;
                }
                Delivery::Duplicate { first_result } => assert_eq!(first_result, Some(n * 10)),
                other => panic!("message {n}: {other:?}"),
            }
        }
    }
    assert_eq!(processed.len(), 256);
    assert!(processed.values().all(|&p| p == 1), "{processed:?}");
    let effects = effects(&pool, "consume").await;
    assert_eq!(effects.len(), 256);
    assert!(effects.iter().all(|(_, n)| *n == 1));
    // Every record kept, each in its day now: none left in the future partition.
    let records: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox WHERE consumer_group = 'race'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(records, 256);
    let future: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox_dated_future")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(future, 0);
}

#[tokio::test]
async fn partitions_are_refused_on_sqlite_with_a_reason() {
    let pool = common::sqlite_memory().await;
    idem::migrate(&pool).await.unwrap();
    let refused = partitions::partition(&pool).await.unwrap_err().to_string();
    assert!(refused.contains("on SQLite purge the inbox"), "{refused}");
    assert!(partitions::maintain(&pool, 3, 1).await.is_err());
    assert!(partitions::status(&pool).await.is_err());
}

/// The same on MariaDB, where the table is partitioned in place and its ranges are
/// contiguous (a message older than the window lands in the oldest day kept).
mod mysql {
    use super::*;
    use sqlx::{MySql, MySqlPool, Transaction};

    #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
    async fn consume(
        tx: &mut Transaction<'_, MySql>,
        inbox: &Inbox,
        key: &MessageKey,
        payload: &[u8],
        order_id: i64,
    ) -> Result<i64, sqlx::Error> {
        let _ = payload;
        sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (?, 'consume', 0)")
            .bind(order_id)
            .execute(&mut **tx)
            .await?;
        Ok(order_id * 10)
    }

    async fn setup(name: &str) -> Option<MySqlPool> {
        let pool = common::mysql(&format!("{name}_{}", common::next_id()), 8).await?;
        idem::migrate(&pool).await.unwrap();
        Some(pool)
    }

    async fn today(pool: &MySqlPool) -> i64 {
        sqlx::query_scalar("SELECT CAST(DATEDIFF(UTC_DATE(), '1970-01-01') AS SIGNED)")
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// The partition holding `key`'s record in `group`, if any.
    async fn partition_of(pool: &MySqlPool, group: &str, key: &MessageKey) -> Option<String> {
        let partitions: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(partition_name AS CHAR) FROM information_schema.PARTITIONS \
             WHERE table_schema = DATABASE() AND table_name = 'idem_inbox' \
             ORDER BY partition_ordinal_position",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        for name in partitions {
            let found: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM idem_inbox PARTITION ({name}) \
                 WHERE consumer_group = ? AND message_key = ?"
            ))
            .bind(group)
            .bind(key.as_str())
            .fetch_one(pool)
            .await
            .unwrap();
            if found > 0 {
                return Some(name);
            }
        }
        None
    }

    async fn consumed(pool: &MySqlPool) -> Vec<(i64, i64)> {
        sqlx::query_as(
            "SELECT order_id, COUNT(*) FROM effects WHERE kind = 'consume' \
             GROUP BY order_id ORDER BY order_id",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn an_existing_inbox_is_partitioned_and_its_days_kept() {
        let Some(pool) = setup("partition_my").await else {
            return;
        };
        let inbox = Inbox::new("billing").unwrap().max_attempts(3);
        let day = today(&pool).await;
        let undated = MessageKey::business("order:1", "paid").unwrap();
        assert!(
            consume(&pool, &inbox, &undated, b"m", 1)
                .await
                .unwrap()
                .is_processed()
        );
        assert!(
            consume(&pool, &inbox, &dated(2, day), b"m", 2)
                .await
                .unwrap()
                .is_processed()
        );

        partitions::partition(&pool).await.unwrap();
        partitions::partition(&pool).await.unwrap();
        let duplicate = |r: i64| Delivery::Duplicate {
            first_result: Some(r),
        };
        assert_eq!(
            consume(&pool, &inbox, &undated, b"m", 1).await.unwrap(),
            duplicate(10)
        );
        assert_eq!(
            consume(&pool, &inbox, &dated(2, day), b"m", 2)
                .await
                .unwrap(),
            duplicate(20)
        );
        assert_eq!(
            partition_of(&pool, "billing", &dated(2, day))
                .await
                .as_deref(),
            Some("idem_inbox_dated_future")
        );

        let would = partitions::status(&pool)
            .await
            .unwrap()
            .would_maintain(2, 1);
        let made = partitions::maintain(&pool, 2, 1).await.unwrap();
        assert_eq!(made.created.len(), 4, "{made:?}");
        assert_eq!(would, made, "the dry run says what the maintenance does");
        let status = partitions::status(&pool).await.unwrap();
        assert_eq!(status.days.len(), 4, "{status:?}");
        assert!(status.others.contains(&"idem_inbox_undated_low".to_owned()));
        assert_eq!(
            partitions::maintain(&pool, 2, 1).await.unwrap(),
            Maintained::default()
        );
        let today_partition = partition_of(&pool, "billing", &dated(2, day))
            .await
            .unwrap();
        assert!(made.created.contains(&today_partition), "{made:?}");
        assert_eq!(
            partition_of(&pool, "billing", &undated).await.as_deref(),
            Some("idem_inbox_undated_low")
        );

        // Two days ago: a success and a failure, then that day dropped.
        let old = dated(3, day - 2);
        assert!(
            consume(&pool, &inbox, &old, b"m", 3)
                .await
                .unwrap()
                .is_processed()
        );
        let failing = dated(4, day - 2);
        fails_once(&pool, &inbox, &failing).await;
        let dropped = partitions::maintain(&pool, 1, 1).await.unwrap();
        assert_eq!(dropped.dropped.len(), 1, "{dropped:?}");
        assert_eq!(partition_of(&pool, "billing", &old).await, None);
        let kept: Vec<(String, String)> =
            sqlx::query_as("SELECT CAST(message_key AS CHAR), status FROM idem_inbox_failures")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            kept,
            vec![(failing.as_str().to_owned(), "FAILED".to_owned())]
        );
        // Older than the window: processed again, in the oldest day kept.
        assert!(
            consume(&pool, &inbox, &old, b"m", 3)
                .await
                .unwrap()
                .is_processed()
        );
        assert!(
            partition_of(&pool, "billing", &old)
                .await
                .unwrap()
                .starts_with("idem_inbox_d")
        );
        assert_eq!(consumed(&pool).await, vec![(1, 1), (2, 1), (3, 2)]);
        // A batch of dated messages, and its redelivery.
        let batch: Vec<(MessageKey, Vec<u8>)> = [5, 6, 5]
            .into_iter()
            .map(|n| (dated(n, day), b"m".to_vec()))
            .collect();
        for round in 0..2 {
            let settled = inbox
                .batch(&pool, &batch, |_, (key, _)| {
                    Box::pin(async move { Ok::<_, String>(key.as_str().len() as i64) })
                })
                .await
                .unwrap();
            let kinds: Vec<&str> = settled.iter().map(|s| s.as_ref().unwrap().kind()).collect();
            match round {
                0 => assert_eq!(kinds, ["processed", "processed", "duplicate"]),
                _ => assert_eq!(kinds, ["duplicate", "duplicate", "duplicate"]),
            }
        }
    }

    /// A record of the day being dropped turns DEAD in a transaction that commits while
    /// the maintenance waits for the table: it is copied DEAD (the day's records are swapped
    /// out of the inbox, then copied), not kept as the FAILED an earlier copy saw.
    #[tokio::test]
    async fn a_record_turning_dead_during_the_maintenance_is_kept_dead() {
        let Some(pool) = setup("partition_my_dead").await else {
            return;
        };
        partitions::partition(&pool).await.unwrap();
        partitions::maintain(&pool, 3, 1).await.unwrap();
        let day = today(&pool).await;
        let inbox = Inbox::new("old").unwrap().max_attempts(2);
        let failing = dated(2, day - 2);
        fails_once(&pool, &inbox, &failing).await;
        // A delivery's transaction already writing the inbox (another key): the
        // maintenance's DDL waits for it, and meanwhile its last attempt fails.
        let mut last = pool.begin().await.unwrap();
        sqlx::query("UPDATE idem_inbox SET attempts = attempts WHERE consumer_group = 'other'")
            .execute(&mut *last)
            .await
            .unwrap();
        let maintenance = tokio::spawn({
            let pool = pool.clone();
            async move { partitions::maintain(&pool, 1, 1).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query(
            "UPDATE idem_inbox SET status = 'DEAD', attempts = 2, error = 'down again' \
             WHERE consumer_group = 'old' AND message_key = ?",
        )
        .bind(failing.as_str())
        .execute(&mut *last)
        .await
        .unwrap();
        last.commit().await.unwrap();
        let dropped = maintenance.await.unwrap().unwrap();
        assert_eq!(dropped.dropped.len(), 2, "{dropped:?}");
        let kept: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT CAST(message_key AS CHAR), status, attempts FROM idem_inbox_failures",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(
            kept,
            vec![(failing.as_str().to_owned(), "DEAD".to_owned(), 2)]
        );
    }

    /// A maintenance that stopped after swapping a day out (its records in
    /// `idem_inbox_dropping` alone) and before copying its failures: the next one copies
    /// them before anything else.
    #[tokio::test]
    async fn a_day_swapped_out_by_a_stopped_maintenance_keeps_its_failures() {
        let Some(pool) = setup("partition_my_left").await else {
            return;
        };
        partitions::partition(&pool).await.unwrap();
        partitions::maintain(&pool, 1, 1).await.unwrap();
        let day = today(&pool).await;
        let dead = dated(7, day - 3);
        for statement in [
            "CREATE TABLE idem_inbox_dropping LIKE idem_inbox",
            "ALTER TABLE idem_inbox_dropping REMOVE PARTITIONING",
        ] {
            sqlx::query(statement).execute(&pool).await.unwrap();
        }
        sqlx::query(
            "INSERT INTO idem_inbox_dropping (consumer_group, message_key, fingerprint, status, \
             attempts, error, created_at, updated_at) VALUES ('old', ?, 'f', 'DEAD', 5, 'down', 1, 2)",
        )
        .bind(dead.as_str())
        .execute(&pool)
        .await
        .unwrap();
        partitions::maintain(&pool, 1, 1).await.unwrap();
        let kept: Vec<(String, String)> =
            sqlx::query_as("SELECT CAST(message_key AS CHAR), status FROM idem_inbox_failures")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(kept, vec![(dead.as_str().to_owned(), "DEAD".to_owned())]);
        let left: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE table_schema = DATABASE() AND table_name = 'idem_inbox_dropping'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0);
    }

    /// Sixteen tasks deliver 128 dated messages four times each, in rounds, while the
    /// maintenance splits the partition of days not made yet, day by day: each applied
    /// once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliveries_racing_the_maintenance_apply_once() {
        let Some(pool) = setup("partition_my_race").await else {
            return;
        };
        partitions::partition(&pool).await.unwrap();
        partitions::maintain(&pool, 1, 0).await.unwrap();
        let day = today(&pool).await;
        let inbox = Inbox::new("race").unwrap();
        let calls: Vec<i64> = (0..4).flat_map(|_| 1..=128).collect();
        let calls = Arc::new(std::sync::Mutex::new(calls));
        let mut tasks = JoinSet::new();
        for _ in 0..16 {
            let (pool, inbox, calls) = (pool.clone(), inbox.clone(), calls.clone());
            tasks.spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let Some(n) = calls.lock().unwrap().pop() else {
                        return outcomes;
                    };
                    let key = dated(n, day + n % 5);
                    let delivery = consume(&pool, &inbox, &key, b"m", n).await.unwrap();
                    outcomes.push((n, delivery));
                }
            });
        }
        while inbox.counters().applied < 16 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for ahead in 1..=4 {
            let maintained = partitions::maintain(&pool, 1, ahead).await.unwrap();
            assert_eq!(maintained.created.len(), 1, "{maintained:?}");
        }
        let mut processed: HashMap<i64, usize> = HashMap::new();
        while let Some(done) = tasks.join_next().await {
            for (n, delivery) in done.unwrap() {
                match delivery {
                    Delivery::Processed(_) => *processed.entry(n).or_default() += 1,
                    Delivery::Duplicate { first_result } => assert_eq!(first_result, Some(n * 10)),
                    other => panic!("message {n}: {other:?}"),
                }
            }
        }
        assert_eq!(processed.len(), 128);
        assert!(processed.values().all(|&p| p == 1), "{processed:?}");
        let effects = consumed(&pool).await;
        assert_eq!(effects.len(), 128);
        assert!(effects.iter().all(|(_, n)| *n == 1));
    }
}
