//! `#[idempotent]` on message handlers: the inbox alone, and the inbox combined with a
//! state transition, on SQLite and PostgreSQL.

use crate::common;

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::{Refusal, StateMachine};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

macro_rules! consumer_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        consumer_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// A consumer: the effect happens once per message key.
            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn record_payment(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"))
                    .bind(order_id)
                    .bind(payload.len() as i64)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("recorded {order_id}"))
            }

            /// A consumer that is also a transition: the message is recorded only if the
            /// order moved (or had moved).
            #[idem::idempotent(
                                inbox = "inbox", message = "key", payload = "payload",
                                machine = Order, key = "order_id", from = "PAID", to = "SHIPPED"
                            )]
            async fn ship(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: MessageKey,
                payload: Vec<u8>,
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                let _ = payload;
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'ship', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id * 10)
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(
                    "INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'PAID')",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            async fn effects(pool: &$pool, kind: &str) -> i64 {
                sqlx::query_scalar(common::placed($positional, "SELECT COUNT(*) FROM effects WHERE kind = $1"))
                    .bind(kind)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn a_consumer_applies_each_message_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("payments").unwrap();
                let key = MessageKey::business("order:1", "paid").unwrap();
                let first = record_payment(&pool, &inbox, &key, b"{\"amount\":5}", 1)
                    .await
                    .unwrap();
                assert_eq!(first, Delivery::Processed("recorded 1".to_owned()));
                let again = record_payment(&pool, &inbox, &key, b"{\"amount\":5}", 1)
                    .await
                    .unwrap();
                assert_eq!(
                    again,
                    Delivery::Duplicate {
                        first_result: Some("recorded 1".to_owned())
                    }
                );
                let other = record_payment(&pool, &inbox, &key, b"{\"amount\":6}", 1)
                    .await
                    .unwrap();
                assert_eq!(other, Delivery::Conflict);
                assert_eq!(effects(&pool, "pay").await, 1);
            }

            #[tokio::test]
            async fn a_consumer_transition_records_only_what_moved() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("shipping").unwrap();
                // Order 1 is not paid yet: the ship message came early. It is refused, not
                // recorded and not acked...
                let early = MessageKey::business("order:1", "ship").unwrap();
                let refused = ship(&pool, &inbox, early.clone(), b"s1".to_vec(), 1)
                    .await
                    .unwrap();
                assert_eq!(
                    refused,
                    Delivery::Refused(Refusal::NotYet {
                        current: Order::Created,
                        from: Order::Paid,
                        to: Order::Shipped
                    })
                );
                assert!(!refused.should_ack(), "a message that came early must be redelivered");
                assert_eq!(records(&pool).await, 0);
                // ...so once the payment arrives, its redelivery applies.
                sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_id = 1")
                    .execute(&pool)
                    .await
                    .unwrap();
                let applied = ship(&pool, &inbox, early.clone(), b"s1".to_vec(), 1)
                    .await
                    .unwrap();
                assert_eq!(applied, Delivery::Processed(10));
                assert!(applied.should_ack());
                // A redelivery now replays the first result.
                assert_eq!(
                    ship(&pool, &inbox, early, b"s1".to_vec(), 1).await.unwrap(),
                    Delivery::Duplicate {
                        first_result: Some(10)
                    }
                );
                // Another message for an order already shipped is a duplicate of the
                // transition: recorded with its first result, replayed now and later.
                let second = MessageKey::business("order:1", "ship-again").unwrap();
                for _ in 0..2 {
                    assert_eq!(
                        ship(&pool, &inbox, second.clone(), b"s2".to_vec(), 1)
                            .await
                            .unwrap(),
                        Delivery::Duplicate {
                            first_result: Some(10)
                        }
                    );
                }
                assert_eq!(effects(&pool, "ship").await, 1);
                let counters = inbox.counters();
                assert_eq!(
                    (counters.applied, counters.duplicates, counters.refused, counters.illegal),
                    (1, 3, 1, 0),
                    "{counters:?}"
                );
            }

            #[tokio::test]
            async fn an_illegal_message_is_refused_loudly_and_never_acked() {
                let Some(pool) = setup().await else { return };
                sqlx::query("UPDATE orders SET status = 'CANCELLED' WHERE order_id = 1")
                    .execute(&pool)
                    .await
                    .unwrap();
                let inbox = Inbox::new("shipping").unwrap();
                let key = MessageKey::business("order:1", "ship").unwrap();
                for _ in 0..2 {
                    let delivery = ship(&pool, &inbox, key.clone(), b"s".to_vec(), 1)
                        .await
                        .unwrap();
                    let Delivery::Refused(refusal) = &delivery else {
                        panic!("expected a refusal, got {delivery:?}");
                    };
                    assert!(refusal.is_illegal(), "{refusal:?}");
                    assert!(!delivery.should_ack(), "an illegal message must not be acked away");
                }
                let missing = MessageKey::business("order:9", "ship").unwrap();
                assert_eq!(
                    ship(&pool, &inbox, missing, b"s".to_vec(), 9).await.unwrap(),
                    Delivery::Refused(Refusal::NotFound)
                );
                assert_eq!(records(&pool).await, 0);
                assert_eq!(effects(&pool, "ship").await, 0);
                let counters = inbox.counters();
                assert_eq!(
                    (counters.applied, counters.refused, counters.illegal),
                    (0, 3, 2),
                    "{counters:?}"
                );
            }

            #[tokio::test]
            async fn concurrent_redeliveries_of_a_consumer_transition_apply_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("shipping").unwrap();
                let key = MessageKey::business("order:2", "ship").unwrap();
                let mut tasks = Vec::new();
                for _ in 0..8 {
                    let (pool, inbox, key) = (pool.clone(), inbox.clone(), key.clone());
                    tasks.push(tokio::spawn(async move {
                        ship(&pool, &inbox, key, b"s".to_vec(), 2).await.unwrap()
                    }));
                }
                let mut processed = 0;
                for task in tasks {
                    match task.await.unwrap() {
                        Delivery::Processed(20) => processed += 1,
                        Delivery::Duplicate {
                            first_result: Some(20),
                        } => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
                assert_eq!(processed, 1);
                assert_eq!(effects(&pool, "ship").await, 1);
            }

            /// Different messages that carry the same transition (a producer that minted a
            /// new id per retry, a replay): they pass the inbox, then race on the row. Under
            /// REPEATABLE READ every loser's UPDATE fails with a serialization failure
            /// before its body; the unit of work retries it, and it finds the winner's
            /// result: one effect, the rest duplicates, no error.
            #[tokio::test]
            async fn messages_racing_on_one_transition_apply_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("shipping").unwrap();
                let mut tasks = Vec::new();
                for n in 0..8 {
                    let (pool, inbox) = (pool.clone(), inbox.clone());
                    let key = MessageKey::business("order:2", format!("ship-{n}")).unwrap();
                    tasks.push(tokio::spawn(async move {
                        ship(&pool, &inbox, key, b"s".to_vec(), 2).await
                    }));
                }
                let mut processed = 0;
                for task in tasks {
                    match task.await.unwrap() {
                        Ok(Delivery::Processed(20)) => processed += 1,
                        Ok(Delivery::Duplicate {
                            first_result: Some(20),
                        }) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
                assert_eq!(processed, 1);
                assert_eq!(effects(&pool, "ship").await, 1);
                assert_eq!(records(&pool).await, 8, "every message is recorded");
            }

            async fn records(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_inbox")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
        }
    };
}

consumer_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("consumers-{}", common::next_id()), 8).await)
);
consumer_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("consumers_{}", common::next_id()), 8).await
);
// Under REPEATABLE READ the losers of a race fail with serialization failures instead of
// waiting: the combined form retries them before the body, like the other forms.
consumer_tests!(
    postgres_repeatable_read,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres_with(
        &format!("consumers_rr_{}", common::next_id()),
        8,
        &[("default_transaction_isolation", "repeatable\\ read")]
    )
    .await
);
consumer_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("consumers_{}", common::next_id()), 8).await,
    positional = true
);
