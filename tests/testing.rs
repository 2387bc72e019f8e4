//! `idem::testing` on real databases: the helpers pass idempotent handlers, and fail —
//! with the answers in the message — on handlers that are not.

use crate::common;
use crate::order;

use idem::Outcome;
use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::testing::{Shuffles, assert_applied_once, assert_shuffled};
use order::Order;

/// An event of the order stream, as a broker delivers it (with duplicates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Event {
    Pay(i64),
    Ship(i64),
}

macro_rules! testing_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        testing_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(tx: &mut sqlx::Transaction<'_, $db>, order_id: i64, amount: i64) -> Result<i64, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"))
                    .bind(order_id)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id * 1000 + amount)
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
            async fn ship(tx: &mut sqlx::Transaction<'_, $db>, order_id: i64) -> Result<(), sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'ship', 0)"))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload")]
            async fn record(
                tx: &mut sqlx::Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
            ) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES (0, 'message', $1)"))
                    .bind(payload.len() as i64)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("{} bytes", payload.len()))
            }

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED'), (3, 'CREATED')")
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

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_duplicates_of_a_transition_apply_once() {
                let Some(pool) = setup().await else { return };
                let first = assert_applied_once(32, || {
                    let pool = pool.clone();
                    async move { pay(&pool, 1, 50).await }
                })
                .await;
                assert_eq!((first.result, first.replays), (1050, 31));
                assert_eq!(effects(&pool, "pay").await, 1);
                // A result that is not stored (`()`) replays as nothing, and passes too.
                let shipped = assert_applied_once(8, || {
                    let pool = pool.clone();
                    async move { ship(&pool, 1).await }
                })
                .await;
                assert_eq!(shipped.replays, 7);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_redeliveries_of_a_message_apply_once() {
                let Some(pool) = setup().await else { return };
                let inbox = Inbox::new("billing").unwrap();
                let key = MessageKey::new("payment:9").unwrap();
                let first = assert_applied_once(32, || {
                    let (pool, inbox, key) = (pool.clone(), inbox.clone(), key.clone());
                    async move { record(&pool, &inbox, &key, b"{\"amount\":9}").await }
                })
                .await;
                assert_eq!(first.result, "12 bytes");
                assert_eq!(effects(&pool, "message").await, 1);
            }

            /// A handler written without idem: every copy applies, and the helper says so.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            #[should_panic(expected = "8 of 8 calls applied, where exactly one must")]
            async fn a_handler_that_is_not_idempotent_fails() {
                let Some(pool) = setup().await else {
                    panic!("8 of 8 calls applied, where exactly one must (no server: skipped)")
                };
                assert_applied_once(8, || {
                    let pool = pool.clone();
                    async move {
                        let mut tx = pool.begin().await?;
                        sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_id = 2")
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok::<_, sqlx::Error>(Outcome::<i64, Order>::Applied(2))
                    }
                })
                .await;
            }

            #[tokio::test]
            async fn shuffled_streams_with_duplicates_apply_each_event_once() {
                if setup().await.is_none() {
                    return;
                }
                let mut events = Vec::new();
                for order in 1..=3 {
                    // Each event twice: the broker redelivers.
                    events.extend([Event::Pay(order), Event::Pay(order), Event::Ship(order), Event::Ship(order)]);
                }
                let pools = assert_shuffled(
                    &events,
                    Shuffles { orders: 8, seed: 7 },
                    || async { setup().await.unwrap() },
                    |pool, event| async move {
                        match event {
                            Event::Pay(order) => pay(&pool, order, 10).await.map(|o| o.map(|_| ())),
                            Event::Ship(order) => ship(&pool, order).await,
                        }
                    },
                    |event| *event,
                )
                .await;
                assert_eq!(pools.len(), 8);
                for pool in &pools {
                    assert_eq!((effects(pool, "pay").await, effects(pool, "ship").await), (3, 3));
                }
            }

            /// A ship for an order nobody pays stays "not yet" for ever: the helper stops.
            #[tokio::test]
            #[should_panic(expected = "nothing can proceed")]
            async fn a_delivery_that_can_never_proceed_fails() {
                if setup().await.is_none() {
                    panic!("nothing can proceed (no server: skipped)");
                }
                assert_shuffled(
                    &[Event::Ship(1), Event::Pay(2)],
                    Shuffles { orders: 1, seed: 0 },
                    || async { setup().await.unwrap() },
                    |pool, event| async move {
                        match event {
                            Event::Pay(order) => pay(&pool, order, 10).await.map(|o| o.map(|_| ())),
                            Event::Ship(order) => ship(&pool, order).await,
                        }
                    },
                    |event| *event,
                )
                .await;
            }
        }
    };
}

testing_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("testing-{}", common::next_id()), 8).await)
);
testing_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("testing_{}", common::next_id()), 8).await
);
testing_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("testing_{}", common::next_id()), 8).await,
    positional = true
);

/// A replay of another result than the first is caught.
#[tokio::test]
#[should_panic(expected = "a duplicate was not answered with the first result 1")]
async fn a_replay_of_another_result_fails() {
    let calls = std::sync::atomic::AtomicUsize::new(0);
    assert_applied_once(2, || {
        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            Ok::<_, ()>(if first {
                Delivery::<i64>::Processed(1)
            } else {
                Delivery::Duplicate {
                    first_result: Some(2),
                }
            })
        }
    })
    .await;
}

/// A stream whose duplicate applies again is caught, with the failing order's seed.
#[tokio::test]
#[should_panic(expected = "2 deliveries applied, where exactly one must; key Pay(1)")]
async fn a_second_application_in_a_stream_fails() {
    assert_shuffled(
        &[Event::Pay(1), Event::Pay(1)],
        Shuffles { orders: 1, seed: 3 },
        || async {},
        |(), _| async { Ok::<_, ()>(Outcome::<(), Order>::Applied(())) },
        |event| *event,
    )
    .await;
}
