//! Reconciliation on real databases: effects made through idem (an inbox's handler, a
//! machine's transition), then one of each way a duplicate or a loss shows after the fact
//! planted by hand — a raw duplicate insert, an effect written around idem, a deleted
//! effect — and the report names exactly the planted keys, and nothing else (not a failed
//! delivery, not another group's record, not a cancelled order).

use crate::common;
use crate::order::Order;

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::reconcile::{Effects, Found, KeyEffects, ReconcileError, Records, reconcile};
use sqlx::{Pool, Transaction};

const PAYMENTS: &str =
    "CREATE TABLE payments (message_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)";

use common::exec;

fn keys(found: &Found<KeyEffects>) -> Vec<(&str, u64)> {
    found
        .first
        .iter()
        .map(|k| (k.key.as_str(), k.effects))
        .collect()
}

async fn reconciled<DB: idem::Backend>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(&pool).await.unwrap();
    exec(&pool, PAYMENTS).await;

    // The consumer group `payments`: five messages handled, each inserting its payment in
    // the delivery's transaction; a sixth fails (its payment rolled back with it). The
    // group `refunds` records `k9` with no payment: another group's, not read.
    let inbox = Inbox::new("payments").unwrap();
    for (i, k) in ["k1", "k2", "k3", "k4", "k5", "k6"].into_iter().enumerate() {
        let delivery = inbox
            .process(&pool, &MessageKey::new(k).unwrap(), k.as_bytes(), {
                async move |tx: &mut Transaction<'static, DB>| {
                    let sql = format!("INSERT INTO payments VALUES ('{k}', {})", 10 * (i + 1));
                    sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
                    if k == "k6" {
                        return Err(sqlx::Error::Protocol("card declined".into()));
                    }
                    Ok::<_, sqlx::Error>(k.to_owned())
                }
            })
            .await;
        if k == "k6" {
            assert!(delivery.is_err(), "{delivery:?}");
        } else {
            assert!(
                matches!(delivery, Ok(Delivery::Processed(_))),
                "{delivery:?}"
            );
        }
    }
    let refunds = Inbox::new("refunds").unwrap();
    let _ = refunds
        .process(&pool, &MessageKey::new("k9").unwrap(), b"k9", {
            async |_: &mut Transaction<'static, DB>| Ok::<_, sqlx::Error>(())
        })
        .await
        .unwrap();

    let payments = Effects::table("payments", "message_key");
    let group = Records::inbox("payments");
    let clean = reconcile(&pool, &group, &payments, 10).await.unwrap();
    assert!(clean.is_clean(), "{clean}");
    assert_eq!((clean.effects, clean.records), (5, 5));

    // Planted: a raw duplicate of k2, a payment written around idem, k4's payment deleted.
    exec(&pool, "INSERT INTO payments VALUES ('k2', 20)").await;
    exec(&pool, "INSERT INTO payments VALUES ('rogue', 99)").await;
    exec(&pool, "DELETE FROM payments WHERE message_key = 'k4'").await;
    let found = reconcile(&pool, &group, &payments, 10).await.unwrap();
    assert!(!found.is_clean());
    assert_eq!((found.effects, found.records), (6, 5));
    assert_eq!(keys(&found.duplicates), [("k2", 2)]);
    assert_eq!(keys(&found.effects_without_record), [("rogue", 1)]);
    assert_eq!(found.records_without_effect.first, ["k4"]);
    assert_eq!(
        found.to_string(),
        "6 effect(s) read against 5 done record(s)\n\
         keys with more than one effect: 1: k2 (2)\n\
         effects without a record: 1: rogue (1)\n\
         records without an effect: 1: k4\n"
    );

    // The same through a query of the effects; and counted without listing.
    let query = Effects::query(
        "SELECT message_key AS ref, amount FROM payments WHERE amount > 0",
        "ref",
    );
    assert_eq!(reconcile(&pool, &group, &query, 10).await.unwrap(), found);
    let counted = reconcile(&pool, &group, &payments, 0).await.unwrap();
    assert_eq!(
        (
            counted.duplicates.count,
            counted.effects_without_record.count,
            counted.records_without_effect.count
        ),
        (1, 1, 1)
    );
    assert!(counted.duplicates.first.is_empty());

    // A machine: orders 1–4 paid through idem (each inserting its effect), 4 then shipped,
    // 5 cancelled. Planted: a second charge of 2, a charge of the cancelled 5 (no
    // transition to PAID led there), 3's charge deleted.
    const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
    for id in 1..=5 {
        exec(
            &pool,
            &format!("INSERT INTO orders (order_id, status, version) VALUES ({id}, 'CREATED', 0)"),
        )
        .await;
    }
    for id in 1..=4_i64 {
        let paid: idem::Outcome<(), Order> = idem::run(
            &pool,
            PAY,
            idem::Key::Int(id).into(),
            None,
            async move |tx: &mut Transaction<'static, DB>| {
                let sql = format!("INSERT INTO effects VALUES ({id}, 'charge', 100)");
                sqlx::Executor::execute(&mut **tx, sql.as_str()).await?;
                Ok::<_, sqlx::Error>(())
            },
        )
        .await
        .unwrap();
        assert!(matches!(paid, idem::Outcome::Applied { .. }), "{paid:?}");
    }
    exec(
        &pool,
        "UPDATE orders SET status = 'SHIPPED' WHERE order_id = 4",
    )
    .await;
    exec(
        &pool,
        "UPDATE orders SET status = 'CANCELLED' WHERE order_id = 5",
    )
    .await;
    let paid = Records::transitions::<Order>("PAID").unwrap();
    let charges = Effects::table("effects", "order_id");
    let clean = reconcile(&pool, &paid, &charges, 10).await.unwrap();
    assert!(clean.is_clean(), "{clean}");
    assert_eq!((clean.effects, clean.records), (4, 4));
    exec(&pool, "INSERT INTO effects VALUES (2, 'charge', 100)").await;
    exec(&pool, "INSERT INTO effects VALUES (5, 'charge', 100)").await;
    exec(&pool, "DELETE FROM effects WHERE order_id = 3").await;
    let found = reconcile(&pool, &paid, &charges, 10).await.unwrap();
    assert_eq!(keys(&found.duplicates), [("2", 2)]);
    assert_eq!(keys(&found.effects_without_record), [("5", 1)]);
    assert_eq!(found.records_without_effect.first, ["3"]);
    // The same rows named as a tool names them.
    let rows = Records::rows("orders", "order_id", "status", ["PAID", "SHIPPED"]);
    assert_eq!(reconcile(&pool, &rows, &charges, 10).await.unwrap(), found);

    // Bad names and missing tables fail before reading anything.
    let refused = |e: ReconcileError| e.to_string();
    let bad = reconcile(&pool, &group, &Effects::table("pay;ments", "k"), 1).await;
    assert!(
        matches!(bad, Err(ReconcileError::InvalidName { .. })),
        "{bad:?}"
    );
    let missing = reconcile(&pool, &group, &Effects::table("nowhere", "k"), 1).await;
    assert_eq!(
        missing.map_err(refused).unwrap_err(),
        "the table `nowhere` does not exist"
    );
    let column = reconcile(&pool, &group, &Effects::table("payments", "ref"), 1).await;
    assert_eq!(
        column.map_err(refused).unwrap_err(),
        "the table `payments` has no column `ref`"
    );
    assert_eq!(
        Records::transitions::<Order>("REFUNDED")
            .map_err(refused)
            .unwrap_err(),
        "the machine Order has no state `REFUNDED` (its states: CREATED, PAID, SHIPPED, CANCELLED)"
    );
}

#[tokio::test]
async fn sqlite_reconciles() {
    reconciled(common::sqlite_file(&format!("reconcile_{}", common::next_id()), 2).await).await;
}

#[tokio::test]
async fn postgres_reconciles() {
    let Some(pool) = common::postgres(&format!("reconcile_{}", common::next_id()), 2).await else {
        return;
    };
    reconciled(pool).await;
}

#[tokio::test]
async fn mysql_reconciles() {
    let Some(pool) = common::mysql(&format!("reconcile_{}", common::next_id()), 2).await else {
        return;
    };
    reconciled(pool).await;
}
