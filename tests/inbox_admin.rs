//! The inbox as the people on call see it, on real databases: every group's records by
//! status, the stuck, failed and parked records listed without their results, a stuck
//! lease released (the next delivery takes it over at once, a late worker's result is
//! fenced off), a parked record revived (its next delivery runs the handler again), and a
//! purge's dry run.

use crate::common;

use idem::inbox::{Claimed, Delivery, Inbox, MessageKey, RecordStatus};
use std::time::Duration;

fn key(k: &str) -> MessageKey {
    MessageKey::new(k).unwrap()
}

/// Claims `k` in `inbox` and returns its lease.
async fn claim<DB: idem::Backend>(
    pool: &sqlx::Pool<DB>,
    inbox: &Inbox,
    k: &str,
) -> idem::inbox::Lease {
    match inbox
        .claim::<DB, String>(pool, &key(k), k.as_bytes())
        .await
        .unwrap()
    {
        Claimed::Work(lease) => lease,
        Claimed::Done(done) => panic!("{k} was not claimed: {done:?}"),
    }
}

async fn operated<DB: idem::Backend>(pool: sqlx::Pool<DB>) {
    idem::migrate(&pool).await.unwrap();
    // `billing`: one done, one failed, one parked, one stuck (a lease that ran out), one
    // held under a long lease. `shipping`: one done.
    let billing = Inbox::new("billing").unwrap().max_attempts(2);
    let short = billing.clone().lease(Duration::from_millis(50));
    let long = billing.clone().lease(Duration::from_secs(3600));
    let done = claim(&pool, &billing, "done").await;
    let paid = done
        .complete(&pool, Ok::<_, String>("paid".to_owned()))
        .await;
    assert!(matches!(paid, Ok(Delivery::Processed(_))));
    let failed = claim(&pool, &billing, "failed").await;
    let _ = failed
        .complete(&pool, Err::<String, _>("card declined"))
        .await;
    for _ in 0..2 {
        let parked = claim(&pool, &billing, "parked").await;
        let _ = parked
            .complete(&pool, Err::<String, _>("no such account"))
            .await;
    }
    let _stuck = claim(&pool, &short, "stuck").await;
    let held = claim(&pool, &long, "held").await;
    let shipping = Inbox::new("shipping").unwrap();
    let shipped = claim(&pool, &shipping, "shipped").await;
    let sent = shipped
        .complete(&pool, Ok::<_, String>("sent".to_owned()))
        .await;
    assert!(matches!(sent, Ok(Delivery::Processed(_))));
    tokio::time::sleep(Duration::from_millis(120)).await;

    let groups = idem::inbox::groups(&pool).await.unwrap();
    let counts: Vec<(&str, [u64; 5])> = groups
        .iter()
        .map(|g| {
            (
                g.group.as_str(),
                [g.processing, g.stuck, g.succeeded, g.failed, g.dead],
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("billing", [2, 1, 1, 1, 1]), ("shipping", [0, 0, 1, 0, 0])]
    );
    assert!(groups.iter().all(|g| g.last_at_millis.is_some()));

    // The last hour's signals; nothing was touched in the last 60 ms (it slept 120).
    let activity = idem::inbox::activity(&pool, Duration::from_secs(3600))
        .await
        .unwrap();
    let shown: Vec<(&str, [u64; 7])> = activity
        .iter()
        .map(|a| {
            (
                a.group.as_str(),
                [
                    a.touched,
                    a.first_delivered,
                    a.succeeded,
                    a.succeeded_after_retry,
                    a.retried,
                    a.failed,
                    a.dead,
                ],
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("billing", [5, 5, 1, 0, 1, 1, 1]),
            ("shipping", [1, 1, 1, 0, 0, 0, 0])
        ]
    );
    assert_eq!(activity[0].retry_success_rate(), Some(0.0));
    assert_eq!(activity[1].retry_success_rate(), None);
    assert!(
        idem::inbox::activity(&pool, Duration::from_millis(60))
            .await
            .unwrap()
            .is_empty()
    );

    let listed = |status, group: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            idem::inbox::records(&pool, group, status, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.group, r.key, r.status, r.attempts, r.error))
                .collect::<Vec<_>>()
        }
    };
    let s = |v: &str| v.to_owned();
    assert_eq!(
        listed(RecordStatus::Stuck, None).await,
        [(s("billing"), s("stuck"), s("PROCESSING"), 1, None)]
    );
    assert_eq!(
        listed(RecordStatus::Processing, Some("billing"))
            .await
            .len(),
        2
    );
    assert_eq!(
        listed(RecordStatus::Failed, Some("billing")).await,
        [(
            s("billing"),
            s("failed"),
            s("FAILED"),
            1,
            Some(s("card declined"))
        )]
    );
    assert_eq!(
        listed(RecordStatus::Dead, None).await,
        [(
            s("billing"),
            s("parked"),
            s("DEAD"),
            2,
            Some(s("no such account"))
        )]
    );
    assert!(
        listed(RecordStatus::Dead, Some("shipping"))
            .await
            .is_empty()
    );
    let stuck = idem::inbox::records(&pool, None, RecordStatus::Stuck, 10)
        .await
        .unwrap();
    assert!(stuck[0].lease_until_millis.unwrap() <= stuck[0].updated_at_millis + 50);
    assert!(stuck[0].created_at_millis > 0);

    // Released: the record under the long lease is taken over by the next delivery at
    // once, and the worker that held it can no longer record a result.
    assert!(matches!(
        long.claim::<DB, String>(&pool, &key("held"), b"held")
            .await
            .unwrap(),
        Claimed::Done(Delivery::InProgress { .. })
    ));
    assert!(long.release(&pool, &key("held"), "alice").await.unwrap());
    let released = idem::inbox::records(&pool, Some("billing"), RecordStatus::Stuck, 10)
        .await
        .unwrap();
    let released = released.iter().find(|r| r.key == "held").unwrap();
    assert_eq!(released.error.as_deref(), Some("lease released by alice"));
    let record = long.record(&pool, &key("held")).await.unwrap().unwrap();
    assert_eq!(
        (
            record.status.as_str(),
            record.attempts,
            record.error.as_deref()
        ),
        ("PROCESSING", 1, Some("lease released by alice"))
    );
    assert_eq!(long.record(&pool, &key("nothing")).await.unwrap(), None);
    let again = claim(&pool, &long, "held").await;
    assert_eq!(again.attempt(), 2);
    assert!(matches!(
        held.complete(&pool, Ok::<_, String>("late".to_owned()))
            .await,
        Err(idem::Error::LeaseLost { .. })
    ));
    let on_time = again
        .complete(&pool, Ok::<_, String>("on time".to_owned()))
        .await;
    assert!(matches!(on_time, Ok(Delivery::Processed(_))));
    // Only a PROCESSING record is released.
    assert!(!long.release(&pool, &key("held"), "alice").await.unwrap());
    assert!(!long.release(&pool, &key("nothing"), "alice").await.unwrap());

    // Revived: the parked record's next delivery runs again, with every attempt allowed.
    assert!(matches!(
        billing
            .claim::<DB, String>(&pool, &key("parked"), b"parked")
            .await
            .unwrap(),
        Claimed::Done(Delivery::Dead { attempts: 2, .. })
    ));
    assert!(!billing.revive(&pool, &key("failed"), "bob").await.unwrap());
    assert!(billing.revive(&pool, &key("parked"), "bob").await.unwrap());
    assert_eq!(
        listed(RecordStatus::Failed, Some("billing")).await,
        [
            (
                s("billing"),
                s("failed"),
                s("FAILED"),
                1,
                Some(s("card declined"))
            ),
            (
                s("billing"),
                s("parked"),
                s("FAILED"),
                0,
                Some(s("revived by bob"))
            ),
        ]
    );
    let revived = claim(&pool, &billing, "parked").await;
    assert_eq!(revived.attempt(), 1);
    let _ = revived
        .complete(&pool, Err::<String, _>("still no account"))
        .await;
    assert_eq!(
        listed(RecordStatus::Dead, None).await.len(),
        0,
        "one attempt of two"
    );

    // The held record done on its second attempt: a retry that succeeded.
    let billing_now = idem::inbox::activity(&pool, Duration::from_secs(3600))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (
            billing_now.succeeded,
            billing_now.succeeded_after_retry,
            billing_now.retried,
            billing_now.failed,
            billing_now.dead
        ),
        (2, 1, 1, 2, 0)
    );
    assert_eq!(billing_now.retry_success_rate(), Some(1.0));

    // A purge's dry run counts what the purge deletes.
    let zero = Duration::ZERO;
    common::past_this_millisecond().await;
    let purgeable = billing.purgeable(&pool, zero).await.unwrap();
    assert_eq!(
        purgeable, 4,
        "done, failed, held (now done) and parked (failed again)"
    );
    assert_eq!(
        billing
            .purgeable(&pool, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(billing.purge(&pool, zero, 100).await.unwrap(), purgeable);
}

#[tokio::test]
async fn sqlite_inbox_is_operated() {
    operated(common::sqlite_file(&format!("inbox_admin_{}", common::next_id()), 2).await).await;
}

#[tokio::test]
async fn postgres_inbox_is_operated() {
    let Some(pool) = common::postgres(&format!("inbox_admin_{}", common::next_id()), 4).await
    else {
        return;
    };
    operated(pool).await;
}

#[tokio::test]
async fn mysql_inbox_is_operated() {
    let Some(pool) = common::mysql(&format!("inbox_admin_{}", common::next_id()), 4).await else {
        return;
    };
    operated(pool).await;
}

/// The charts' series: each record in the bucket of its last touch, with its status now.
async fn charted<DB: idem::Backend>(pool: sqlx::Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(&pool).await.unwrap();
    // `billing`: done, failed once of two attempts, parked after two, one held by a
    // delivery (`busy`), and two more done (`old`, `later`). `shipping`: one done.
    let billing = Inbox::new("billing").unwrap().max_attempts(2);
    for k in ["done", "old", "later"] {
        let lease = claim(&pool, &billing, k).await;
        let _ = lease.complete(&pool, Ok::<_, String>(k.to_owned())).await;
    }
    let failed = claim(&pool, &billing, "failed").await;
    let _ = failed.complete(&pool, Err::<String, _>("declined")).await;
    for _ in 0..2 {
        let parked = claim(&pool, &billing, "parked").await;
        let _ = parked.complete(&pool, Err::<String, _>("no account")).await;
    }
    let _busy = claim(&pool, &billing, "busy").await;
    let shipping = Inbox::new("shipping").unwrap();
    let shipped = claim(&pool, &shipping, "shipped").await;
    let _ = shipped
        .complete(&pool, Ok::<_, String>(String::new()))
        .await;
    // Moved into the middle of their buckets, away from any edge: `done` 22.5 minutes back
    // (the bucket 25–20 minutes ago, index 7 of 12), `failed` 57.5 (index 0), `old` 90 (out
    // of the hour), `later` 10 minutes ahead (not yet: left out).
    for (k, minutes) in [
        ("done", -22.5),
        ("failed", -57.5),
        ("old", -90.0),
        ("later", 10.0),
    ] {
        let shift = (minutes * 60_000.0) as i64;
        common::exec(
            &pool,
            &format!(
                "UPDATE idem_inbox SET updated_at = updated_at + ({shift}) \
                 WHERE consumer_group = 'billing' AND message_key = '{k}'"
            ),
        )
        .await;
    }
    let five = Duration::from_secs(300);
    let series = idem::inbox::activity_series(&pool, five, 12).await.unwrap();
    let at = |processing, succeeded, failed, dead| idem::inbox::ActivityBucket {
        processing,
        succeeded,
        failed,
        dead,
    };
    let mut billing_buckets = vec![at(0, 0, 0, 0); 12];
    billing_buckets[0] = at(0, 0, 1, 0);
    billing_buckets[7] = at(0, 1, 0, 0);
    billing_buckets[11] = at(1, 0, 0, 1);
    let mut shipping_buckets = vec![at(0, 0, 0, 0); 12];
    shipping_buckets[11] = at(0, 1, 0, 0);
    assert_eq!(
        series,
        [
            idem::inbox::GroupSeries {
                group: "billing".into(),
                bucket: five,
                buckets: billing_buckets,
            },
            idem::inbox::GroupSeries {
                group: "shipping".into(),
                bucket: five,
                buckets: shipping_buckets,
            },
        ]
    );
    // Two hours in 24 buckets take `old` in too (90 minutes back: index 5 of 24).
    let wide = idem::inbox::activity_series(&pool, five, 24).await.unwrap();
    assert_eq!(wide[0].buckets.len(), 24);
    assert_eq!(wide[0].buckets[5], at(0, 1, 0, 0));
    assert_eq!(
        wide[0].buckets.iter().map(|b| b.total()).sum::<u64>(),
        5,
        "all of billing's but `later`"
    );
    // Out-of-range arguments are clamped, not refused.
    let one = idem::inbox::activity_series(&pool, Duration::ZERO, 0)
        .await
        .unwrap();
    assert!(
        one.iter()
            .all(|s| s.buckets.len() == 1 && s.bucket == Duration::from_millis(1))
    );
    let widest = idem::inbox::activity_series(&pool, Duration::MAX, u32::MAX)
        .await
        .unwrap();
    assert_eq!(widest[0].buckets.len(), idem::inbox::MAX_BUCKETS as usize);
    assert_eq!(
        widest[0].buckets.last().unwrap().total(),
        5,
        "all of billing's but `later`, in the bucket ending now"
    );
}

#[tokio::test]
async fn sqlite_activity_is_charted() {
    charted(common::sqlite_file(&format!("inbox_chart_{}", common::next_id()), 2).await).await;
}

#[tokio::test]
async fn postgres_activity_is_charted() {
    let Some(pool) = common::postgres(&format!("inbox_chart_{}", common::next_id()), 4).await
    else {
        return;
    };
    charted(pool).await;
}

#[tokio::test]
async fn mysql_activity_is_charted() {
    let Some(pool) = common::mysql(&format!("inbox_chart_{}", common::next_id()), 4).await else {
        return;
    };
    charted(pool).await;
}
