//! The outbox on SQLite, PostgreSQL and MariaDB: a message staged in a handler's body
//! commits with its effect and with nothing else (a body error, a refusal, a caller's
//! rollback stage nothing; a duplicate call stages nothing), its id is derived from the
//! effect (a body that runs again stages the same ids), and the relay publishes every
//! message, per ordering key in order, with several relays at once, backing off, parking a
//! message that used its attempts and holding back its key until it is requeued or
//! discarded; PostgreSQL's and MariaDB's commit-order gap skips nothing.

use crate::common;

use idem::inbox::{Delivery, Inbox, MessageKey, Received};
use idem::outbox::{
    self, EffectKey, Message, OutboxError, Outgoing, PublishError, Published, Publisher, Relay,
};
use idem::{Error, Outcome, StateMachine};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID")]
    Paid,
    #[state(name = "CANCELLED")]
    Cancelled,
}

/// A publisher that records what it was given, and fails every message of the ordering
/// keys it is told to.
#[derive(Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<Vec<Outgoing>>>,
    failing: Arc<Mutex<HashSet<String>>>,
}

impl Recorder {
    fn seen(&self) -> Vec<Outgoing> {
        self.seen.lock().unwrap().clone()
    }

    fn fail(&self, ordering_key: &str, fail: bool) {
        let mut failing = self.failing.lock().unwrap();
        if fail {
            failing.insert(ordering_key.to_owned());
        } else {
            failing.remove(ordering_key);
        }
    }

    /// The payloads seen, per ordering key, in the order they were published.
    fn per_key(&self) -> HashMap<String, Vec<String>> {
        let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
        for message in self.seen() {
            per_key
                .entry(message.ordering_key().to_owned())
                .or_default()
                .push(String::from_utf8(message.payload().to_vec()).unwrap());
        }
        per_key
    }
}

impl Publisher for Recorder {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        if self
            .failing
            .lock()
            .unwrap()
            .contains(message.ordering_key())
        {
            return Err("the broker refused it".into());
        }
        // Yield, so that the batch's publishes and other relays interleave.
        tokio::task::yield_now().await;
        self.seen.lock().unwrap().push(message.clone());
        Ok(Published::Acked)
    }
}

/// A publisher that fails the ordering key `nul` with an error holding a NUL, panics on
/// the ordering key `boom`, and acknowledges every other message (counted per id).
#[derive(Clone, Default)]
pub struct Quirky {
    acked: Arc<Mutex<HashMap<String, usize>>>,
}

impl Quirky {
    fn acked(&self, id: &str) -> usize {
        self.acked.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

impl Publisher for Quirky {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        tokio::task::yield_now().await;
        match message.ordering_key() {
            "nul" => Err("the broker said: bad\0byte \u{1b}[31m".into()),
            "boom" => panic!("the publisher cannot take this message"),
            _ => {
                *self
                    .acked
                    .lock()
                    .unwrap()
                    .entry(message.id().to_owned())
                    .or_default() += 1;
                Ok(Published::Acked)
            }
        }
    }
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The error inside a staging error: what the outbox said.
fn outbox_error(e: &sqlx::Error) -> Option<&OutboxError> {
    match e {
        sqlx::Error::Encode(inner) => inner.downcast_ref::<OutboxError>(),
        _ => None,
    }
}

/// Runs relays until a batch finds nothing to do.
async fn drain<DB: idem::Backend, P: Publisher>(relay: &Relay<DB, P>) -> usize {
    let mut published = 0;
    loop {
        let relayed = relay.run_once().await.unwrap();
        published += relayed.published;
        if relayed.claimed == 0 {
            return published;
        }
    }
}

macro_rules! outbox_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr, $begin:path, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use sqlx::Transaction;

            /// Pays the order and stages `messages` messages (payloads `"{order}:{i}"`); fails
            /// after staging when told to.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                messages: u32,
                fail: bool,
            ) -> Result<Vec<String>, sqlx::Error> {
                let mut ids = Vec::new();
                for i in 0..messages {
                    let message = Message::bytes("orders.paid", format!("{order_id}:{i}"));
                    ids.push(outbox::stage(tx, message).await?.to_string());
                }
                let effect = EffectKey::current().expect("a handler's body has an effect");
                assert_eq!(
                    ids.first().cloned(),
                    (messages > 0).then(|| effect.message_id(0))
                );
                if fail {
                    return Err(sqlx::Error::Protocol(format!("declined after {ids:?}")));
                }
                Ok(ids)
            }

            /// Cancels the order; its answer is the idempotency key it would give a payment
            /// provider's refund, derived from its effect. Fails when told to.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
            async fn cancel(
                _tx: &mut Transaction<'_, $db>,
                order_id: i64,
                fail: bool,
            ) -> Result<String, sqlx::Error> {
                let refund = EffectKey::current().expect("a handler's body has an effect").derive("refund");
                if fail {
                    return Err(sqlx::Error::Protocol(refund));
                }
                Ok(refund)
            }

            /// Creates the order (`create`) and stages one message; fails after staging when
            /// told to.
            #[idem::idempotent(machine = Order, key = "order_id", create = "CREATED")]
            async fn open(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                fail: bool,
            ) -> Result<String, sqlx::Error> {
                let id = outbox::stage(tx, Message::json("orders.opened", &order_id)).await?;
                if fail {
                    return Err(sqlx::Error::Protocol("refused after staging".into()));
                }
                Ok(id.to_string())
            }

            /// A consumer that pays the order (inbox + transition) and stages a message.
            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload",
                               machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn consume_payment(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
                fail: bool,
            ) -> Result<(), sqlx::Error> {
                outbox::stage(tx, Message::json("orders.paid", &order_id)).await?;
                if fail {
                    return Err(sqlx::Error::Protocol("refused after staging".into()));
                }
                Ok(())
            }

            /// A route behind the HTTP layer that stages a message, and answers 500 (not
            /// stored, so rolled back) when the body says `fail`.
            async fn route(mut tx: idem::http::Tx<$db>, body: String) -> idem::http::Committed<axum::http::StatusCode> {
                outbox::stage(&mut tx, Message::bytes("orders.requested", body.clone())).await.unwrap();
                tx.commit(if body == "fail" {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::CREATED
                })
            }

            async fn setup(orders: i64) -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                for order_id in 1..=orders {
                    sqlx::query(common::placed(
                        $positional,
                        "INSERT INTO orders (order_id, status) VALUES ($1, 'CREATED')",
                    ))
                    .bind(order_id)
                    .execute(&pool)
                    .await
                    .unwrap();
                }
                sqlx::query("UPDATE orders SET status = 'CANCELLED' WHERE order_id = 2")
                    .execute(&pool)
                    .await
                    .unwrap();
                Some(pool)
            }

            async fn staged(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn a_message_commits_with_its_effect_and_a_duplicate_stages_nothing() {
                let Some(pool) = setup(3).await else { return };
                let first = match pay(&pool, 1, 2, false).await.unwrap() {
                    Outcome::Applied(ids) => ids,
                    other => panic!("{other:?}"),
                };
                assert_eq!(first.len(), 2);
                assert_ne!(first[0], first[1]);
                assert!(first.iter().all(|id| id.len() == 64));
                // The duplicate's body does not run: nothing more is staged.
                assert!(matches!(
                    pay(&pool, 1, 2, false).await.unwrap(),
                    Outcome::AlreadyDone { .. }
                ));
                assert_eq!(staged(&pool).await, 2);
                let recorder = Recorder::default();
                let relay = Relay::new(pool.clone(), recorder.clone());
                assert_eq!(drain(&relay).await, 2);
                let seen = recorder.seen();
                let ids: Vec<&str> = seen.iter().map(|m| m.id()).collect();
                assert_eq!(ids, [first[0].as_str(), first[1].as_str()]);
                assert_eq!(seen[0].ordering_key(), "orders/1");
                assert_eq!(seen[0].destination(), "orders.paid");
                assert_eq!(seen[0].attempt(), 1);
                assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 0);
                // Published rows stay for the retention, then go.
                assert_eq!(
                    outbox::purge(&pool, Duration::from_secs(3600), 10)
                        .await
                        .unwrap(),
                    0
                );
                common::past_this_millisecond().await;
                assert_eq!(outbox::purge(&pool, Duration::ZERO, 1).await.unwrap(), 2);
                assert_eq!(staged(&pool).await, 0);
            }

            #[tokio::test]
            async fn a_body_error_a_refusal_or_a_callers_rollback_stage_nothing() {
                let Some(pool) = setup(3).await else { return };
                let failed = match pay(&pool, 1, 2, true).await {
                    Err(Error::Handler(e)) => e.to_string(),
                    other => panic!("{other:?}"),
                };
                assert_eq!(
                    staged(&pool).await,
                    0,
                    "a body error rolls its messages back"
                );
                // Order 2 is CANCELLED: the body does not run.
                assert!(matches!(
                    pay(&pool, 2, 2, false).await.unwrap(),
                    Outcome::IllegalState { .. }
                ));
                assert_eq!(staged(&pool).await, 0);
                let mut tx = $begin(&pool).await;
                assert!(pay(&mut tx, 3, 2, false).await.unwrap().is_applied());
                tx.rollback().await.unwrap();
                assert_eq!(
                    staged(&pool).await,
                    0,
                    "the caller's rollback takes its messages"
                );
                // The body that runs again stages the very ids it staged the first time.
                let ids = match pay(&pool, 1, 2, false).await.unwrap() {
                    Outcome::Applied(ids) => ids,
                    other => panic!("{other:?}"),
                };
                assert!(failed.contains(&format!("{ids:?}")), "{failed} vs {ids:?}");
                assert_eq!(staged(&pool).await, 2);
            }

            #[tokio::test]
            async fn an_inbox_handler_stages_under_its_message_and_a_redelivery_stages_nothing() {
                let Some(pool) = setup(1).await else { return };
                let inbox = Inbox::new("coupons").unwrap();
                let key = MessageKey::new("order:1:paid").unwrap();
                for _ in 0..2 {
                    let delivery = inbox
                        .process(
                            &pool,
                            &key,
                            b"paid",
                            async |tx: &mut Transaction<'static, $db>| {
                                outbox::stage(tx, Message::json("coupon.granted", &1)).await?;
                                Ok::<_, sqlx::Error>(())
                            },
                        )
                        .await
                        .unwrap();
                    assert!(delivery.should_ack());
                }
                // The receipt form stages through the receipt.
                let other = MessageKey::new("order:1:shipped").unwrap();
                let Received::New(mut receipt) =
                    inbox.receive::<_, ()>(&pool, &other, b"s").await.unwrap()
                else {
                    panic!("a first delivery");
                };
                let id = receipt
                    .stage(Message::json("coupon.granted", &2))
                    .await
                    .unwrap();
                assert_eq!(
                    receipt.finish(Ok::<(), ()>(())).await.unwrap(),
                    Delivery::Processed(())
                );
                assert_eq!(staged(&pool).await, 2);
                let recorder = Recorder::default();
                drain(&Relay::new(pool.clone(), recorder.clone())).await;
                let seen = recorder.seen();
                assert_eq!(seen.len(), 2);
                assert_eq!(seen[0].ordering_key(), "coupons/order:1:paid");
                assert_eq!(seen[1].id(), id.as_str());
            }

            /// Input the database would refuse raw (a NUL in an ordering key aborts the
            /// transaction on PostgreSQL; a 17 MiB header outgrows MariaDB's packet) is an
            /// `OutboxError` naming it, before any statement: the transaction goes on.
            #[tokio::test]
            async fn bad_input_is_refused_at_stage_and_the_transaction_goes_on() {
                let Some(pool) = setup(0).await else { return };
                let mut tx = $begin(&pool).await;
                let huge = "v".repeat(17 * 1024 * 1024);
                for (message, says) in [
                    (Message::json("a", &1).id("nul").ordering_key("k\0"), "control character"),
                    (Message::json("a", &1).id("big").header("x-big", huge.as_str()), "over the limit"),
                    (Message::json("a", &1).id("ctl").header("x", "a\0b"), "control character"),
                ] {
                    let refused = outbox::stage(&mut tx, message).await.unwrap_err();
                    match outbox_error(&refused) {
                        Some(OutboxError::InvalidMessage(problem)) => assert!(problem.contains(says), "{problem}"),
                        other => panic!("{other:?}: {refused}"),
                    }
                }
                outbox::stage(&mut tx, Message::json("a", &1).id("fine")).await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!(staged(&pool).await, 1);
            }

            #[tokio::test]
            async fn outside_a_handler_a_message_needs_an_id_and_an_id_is_staged_once() {
                let Some(pool) = setup(0).await else { return };
                let mut tx = $begin(&pool).await;
                let refused = outbox::stage(&mut tx, Message::json("a", &1))
                    .await
                    .unwrap_err();
                assert_eq!(
                    outbox_error(&refused),
                    Some(&OutboxError::NoEffect),
                    "{refused}"
                );
                let invalid =
                    outbox::stage(&mut tx, Message::json("a", &1).id("x").header("a b", "c"))
                        .await
                        .unwrap_err();
                assert!(matches!(
                    outbox_error(&invalid),
                    Some(OutboxError::InvalidMessage(_))
                ));
                for _ in 0..2 {
                    let id = outbox::stage(&mut tx, Message::json("a", &1).id("import-7"))
                        .await
                        .unwrap();
                    assert_eq!(id.as_str(), "import-7");
                }
                tx.commit().await.unwrap();
                assert_eq!(staged(&pool).await, 1);
            }

            #[tokio::test]
            async fn a_failing_message_backs_off_dies_and_holds_its_key_until_requeued() {
                let Some(pool) = setup(0).await else { return };
                let mut tx = $begin(&pool).await;
                for (key, i) in [("a", 0), ("a", 1), ("b", 0)] {
                    let message = Message::bytes("m", format!("{key}{i}"))
                        .ordering_key(key)
                        .id(format!("{key}{i}"));
                    outbox::stage(&mut tx, message).await.unwrap();
                }
                tx.commit().await.unwrap();
                let recorder = Recorder::default();
                recorder.fail("a", true);
                let relay = Relay::new(pool.clone(), recorder.clone())
                    .max_attempts(2)
                    .backoff(Duration::ZERO, Duration::ZERO);
                let first = relay.run_once().await.unwrap();
                assert_eq!(
                    (first.claimed, first.published, first.failed, first.dead),
                    (2, 1, 1, 0)
                );
                let second = relay.run_once().await.unwrap();
                assert_eq!((second.claimed, second.failed, second.dead), (1, 1, 1));
                assert_eq!(
                    relay.run_once().await.unwrap().claimed,
                    0,
                    "a dead head holds its key"
                );
                let dead = outbox::dead(&pool, 10).await.unwrap();
                assert_eq!(dead.len(), 1);
                assert_eq!((dead[0].id.as_str(), dead[0].attempts), ("a0", 2));
                assert_eq!(dead[0].last_error.as_deref(), Some("the broker refused it"));
                let backlog = outbox::backlog(&pool).await.unwrap();
                assert_eq!((backlog.pending, backlog.dead), (2, 1));
                assert!(backlog.oldest.is_some());
                recorder.fail("a", false);
                assert!(outbox::requeue(&pool, "a0").await.unwrap());
                assert!(
                    !outbox::requeue(&pool, "a0").await.unwrap(),
                    "only a dead message is requeued"
                );
                assert_eq!(drain(&relay).await, 2);
                assert_eq!(recorder.per_key()["a"], ["a0", "a1"]);
                // A discarded dead message lets its key go on without it.
                let mut tx = $begin(&pool).await;
                for i in 0..2 {
                    outbox::stage(
                        &mut tx,
                        Message::bytes("m", format!("c{i}"))
                            .ordering_key("c")
                            .id(format!("c{i}")),
                    )
                    .await
                    .unwrap();
                }
                tx.commit().await.unwrap();
                recorder.fail("c", true);
                let relay = relay.max_attempts(1);
                assert_eq!(relay.run_once().await.unwrap().dead, 1);
                recorder.fail("c", false);
                assert!(outbox::discard(&pool, "c0").await.unwrap());
                assert_eq!(drain(&relay).await, 1);
                assert_eq!(recorder.per_key()["c"], ["c1"]);
            }

            /// What a dead head holds back is held out of the claims' way (`Backlog::held`):
            /// the key's pending messages when it dies, and what is staged behind it
            /// afterwards; a requeue releases them, in order. Messages held behind no dead
            /// message (what a staging racing a requeue leaves) are released by a running
            /// relay, and the key goes on.
            #[tokio::test]
            async fn a_dead_head_holds_its_key_out_of_the_claims_way_until_requeued() {
                let Some(pool) = setup(0).await else { return };
                let stage = async |keys: &[(&str, u32)]| {
                    let mut tx = $begin(&pool).await;
                    for (key, i) in keys {
                        let message = Message::bytes("m", format!("{key}{i}"))
                            .ordering_key(*key)
                            .id(format!("{key}{i}"));
                        outbox::stage(&mut tx, message).await.unwrap();
                    }
                    tx.commit().await.unwrap();
                };
                stage(&[("p", 0), ("p", 1), ("p", 2), ("b", 0)]).await;
                let recorder = Recorder::default();
                recorder.fail("p", true);
                let relay = Relay::new(pool.clone(), recorder.clone())
                    .max_attempts(1)
                    .backoff(Duration::ZERO, Duration::ZERO);
                let first = relay.run_once().await.unwrap();
                assert_eq!((first.published, first.dead), (1, 1));
                let backlog = outbox::backlog(&pool).await.unwrap();
                assert_eq!((backlog.pending, backlog.dead, backlog.held), (3, 1, 2));
                // Staged behind the dead head: held (by the staging, on MariaDB by the next
                // claim); another key is not.
                stage(&[("p", 3), ("b", 1)]).await;
                assert_eq!(drain(&relay).await, 1);
                let backlog = outbox::backlog(&pool).await.unwrap();
                assert_eq!((backlog.pending, backlog.dead, backlog.held), (4, 1, 3));
                // Unheld behind the dead head: what a staging that read the head before it
                // died leaves (made here by hand). A running relay holds it.
                sqlx::query("UPDATE idem_outbox SET dead_at = NULL WHERE id = 'p3'")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(outbox::backlog(&pool).await.unwrap().held, 2);
                let running = Relay::new(pool.clone(), recorder.clone()).spawn().unwrap();
                until("p3 held again", async || outbox::backlog(&pool).await.unwrap().held == 3).await;
                running.stop().await;
                assert!(!outbox::requeue(&pool, "p1").await.unwrap(), "a held message is not dead");
                recorder.fail("p", false);
                assert!(outbox::requeue(&pool, "p0").await.unwrap());
                assert_eq!(outbox::backlog(&pool).await.unwrap().held, 0);
                assert_eq!(drain(&relay).await, 4);
                assert_eq!(recorder.per_key()["p"], ["p0", "p1", "p2", "p3"]);
                assert_eq!(recorder.per_key()["b"], ["b0", "b1"]);

                // Held behind no dead message: the state a staging leaves when it read its
                // key's head dead while a requeue released the key (made here by hand).
                stage(&[("s", 0), ("s", 1)]).await;
                sqlx::query("UPDATE idem_outbox SET dead_at = 0 WHERE published_at IS NULL")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert_eq!(outbox::backlog(&pool).await.unwrap().held, 2);
                assert_eq!(relay.run_once().await.unwrap().claimed, 0, "held, not due");
                let running = Relay::new(pool.clone(), recorder.clone())
                    .poll_interval(Duration::from_millis(20))
                    .spawn()
                    .unwrap();
                until("the stranded key released and published", async || {
                    outbox::backlog(&pool).await.unwrap().pending == 0
                })
                .await;
                running.stop().await;
                assert_eq!(recorder.per_key()["s"], ["s0", "s1"]);

                // A `dead_at` idem never writes (by hand, another writer): dead, listed and
                // requeued as dead, never kept out of every list.
                stage(&[("x", 0)]).await;
                sqlx::query("UPDATE idem_outbox SET dead_at = -1 WHERE id = 'x0'")
                    .execute(&pool)
                    .await
                    .unwrap();
                let dead: Vec<String> = outbox::dead(&pool, 10).await.unwrap().into_iter().map(|d| d.id).collect();
                assert_eq!(dead, ["x0"]);
                assert_eq!(outbox::backlog(&pool).await.unwrap().dead, 1);
                assert!(outbox::requeue(&pool, "x0").await.unwrap());
                assert_eq!(drain(&relay).await, 1);
                assert_eq!(recorder.per_key()["x"], ["x0"]);
            }

            /// The backlog told per destination: which one a dead message blocks, and
            /// where the oldest waits; the parts add up to the whole.
            #[tokio::test]
            async fn the_backlog_is_told_per_destination() {
                let Some(pool) = setup(0).await else { return };
                let stage = async |messages: &[(&str, &str, &str)]| {
                    let mut tx = $begin(&pool).await;
                    for (destination, key, id) in messages {
                        let message = Message::bytes(*destination, *id).ordering_key(*key).id(*id);
                        outbox::stage(&mut tx, message).await.unwrap();
                    }
                    tx.commit().await.unwrap();
                };
                stage(&[("orders", "p", "p0"), ("orders", "p", "p1"), ("orders", "q", "q0"), ("mail", "m", "m0")]).await;
                assert!(
                    outbox::backlog_by_destination(&pool).await.unwrap().iter().all(|d| d.backlog.pending > 0),
                );
                let recorder = Recorder::default();
                recorder.fail("p", true);
                let relay = Relay::new(pool.clone(), recorder.clone())
                    .max_attempts(1)
                    .backoff(Duration::ZERO, Duration::ZERO);
                // `p0` dies and holds `p1`; `q0` and `m0` are published; then `n0` waits.
                while relay.run_once().await.unwrap().claimed > 0 {}
                stage(&[("mail", "n", "n0")]).await;
                let by = outbox::backlog_by_destination(&pool).await.unwrap();
                let counts: Vec<(&str, u64, u64, u64)> = by
                    .iter()
                    .map(|d| (d.destination.as_str(), d.backlog.pending, d.backlog.dead, d.backlog.held))
                    .collect();
                assert_eq!(counts, [("mail", 1, 0, 0), ("orders", 2, 1, 1)]);
                assert!(by.iter().all(|d| d.backlog.oldest.is_some()));
                let whole = outbox::backlog(&pool).await.unwrap();
                assert_eq!(
                    (whole.pending, whole.dead, whole.held),
                    (3, 1, 1),
                );
                // Read after the parts, by the database's clock: no younger than the oldest part.
                assert!(whole.oldest >= by.iter().filter_map(|d| d.backlog.oldest).max());
                // Published, a destination leaves the list.
                recorder.fail("p", false);
                assert!(outbox::requeue(&pool, "p0").await.unwrap());
                assert_eq!(drain(&relay).await, 3);
                assert!(outbox::backlog_by_destination(&pool).await.unwrap().is_empty());
            }

            #[tokio::test]
            async fn a_creation_stages_with_its_row_and_a_duplicate_or_an_error_stages_nothing() {
                let Some(pool) = setup(0).await else { return };
                assert!(matches!(open(&pool, 5, true).await, Err(Error::Handler(_))));
                assert_eq!(staged(&pool).await, 0);
                let id = match open(&pool, 5, false).await.unwrap() {
                    idem::Creation::Created(id) => id,
                    other => panic!("{other:?}"),
                };
                assert!(matches!(open(&pool, 5, false).await.unwrap(), idem::Creation::Duplicate { .. }));
                assert_eq!(staged(&pool).await, 1);
                let recorder = Recorder::default();
                drain(&Relay::new(pool.clone(), recorder.clone())).await;
                assert_eq!(recorder.seen()[0].id(), id);
                assert_eq!(recorder.seen()[0].ordering_key(), "orders/5");
            }

            #[tokio::test]
            async fn an_inbox_transition_stages_only_when_it_applies() {
                let Some(pool) = setup(3).await else { return };
                let inbox = Inbox::new("payments").unwrap();
                let key = |order: i64| MessageKey::new(format!("order:{order}:paid")).unwrap();
                // Refused (order 2 is CANCELLED), failed: nothing staged.
                let refused = consume_payment(&pool, &inbox, &key(2), b"p", 2, false).await.unwrap();
                assert!(matches!(refused, Delivery::Refused(_)), "{refused:?}");
                assert!(matches!(consume_payment(&pool, &inbox, &key(1), b"p", 1, true).await, Err(Error::Handler(_))));
                assert_eq!(staged(&pool).await, 0);
                assert_eq!(consume_payment(&pool, &inbox, &key(1), b"p", 1, false).await.unwrap(), Delivery::Processed(()));
                // A redelivery, and another message for the same transition: nothing more.
                assert!(consume_payment(&pool, &inbox, &key(1), b"p", 1, false).await.unwrap().should_ack());
                let other = MessageKey::new("order:1:paid-again").unwrap();
                assert!(matches!(
                    consume_payment(&pool, &inbox, &other, b"p", 1, false).await.unwrap(),
                    Delivery::Duplicate { .. }
                ));
                assert_eq!(staged(&pool).await, 1);
                let recorder = Recorder::default();
                drain(&Relay::new(pool.clone(), recorder.clone())).await;
                assert_eq!(recorder.seen()[0].ordering_key(), "orders/1");
            }

            #[tokio::test]
            async fn a_route_stages_with_its_response_and_a_replay_or_a_5xx_stages_nothing() {
                let Some(pool) = setup(0).await else { return };
                let keys = idem::http::IdempotencyLayer::new(pool.clone(), Inbox::new("api").unwrap()).unscoped();
                let app = axum::Router::new().route("/orders", axum::routing::post(route).layer(keys));
                let addr = crate::http_client::serve(app).await;
                let failed = crate::http_client::post(addr, "/orders", "k-fail", "fail").await;
                assert_eq!(failed.status, 500);
                assert_eq!(staged(&pool).await, 0, "a response not stored rolls its message back");
                assert_eq!(crate::http_client::post(addr, "/orders", "k-1", "one").await.status, 201);
                let replay = crate::http_client::post(addr, "/orders", "k-1", "one").await;
                assert!(replay.replayed());
                assert_eq!(staged(&pool).await, 1, "a replay stages nothing");
                let recorder = Recorder::default();
                drain(&Relay::new(pool.clone(), recorder.clone())).await;
                let seen = recorder.seen();
                assert_eq!(seen[0].payload(), b"one");
                assert!(seen[0].ordering_key().starts_with("api/"), "{}", seen[0].ordering_key());
            }

            /// An outside API gets the same idempotency key from a body that runs again, from
            /// a redelivered message, and from a leased claim taken over.
            #[tokio::test]
            async fn an_outside_call_gets_one_key_across_retries_redeliveries_and_takeovers() {
                let Some(pool) = setup(3).await else { return };
                let first = match cancel(&pool, 1, true).await {
                    Err(Error::Handler(sqlx::Error::Protocol(key))) => key,
                    other => panic!("{other:?}"),
                };
                assert_eq!(cancel(&pool, 1, false).await.unwrap(), Outcome::Applied(first.clone()));
                assert_eq!(first.len(), 64);
                let other = match cancel(&pool, 3, false).await.unwrap() {
                    Outcome::Applied(key) => key,
                    outcome => panic!("{outcome:?}"),
                };
                assert_ne!(first, other, "another order's refund has another key");
                // A redelivered message, whose first delivery failed.
                let inbox = Inbox::new("payments").unwrap();
                let key = MessageKey::new("order:1:refund").unwrap();
                let mut seen = Vec::new();
                let failed = inbox
                    .process(&pool, &key, b"r", async |_: &mut Transaction<'static, $db>| {
                        seen.push(EffectKey::current().unwrap().derive("refund"));
                        Err::<(), _>("declined")
                    })
                    .await;
                assert!(matches!(failed, Err(Error::Handler("declined"))));
                let Received::New(receipt) = inbox.receive::<_, ()>(&pool, &key, b"r").await.unwrap() else {
                    panic!("not processed yet");
                };
                seen.push(receipt.effect_key().derive("refund"));
                assert_eq!(receipt.finish(Ok::<(), ()>(())).await.unwrap(), Delivery::Processed(()));
                assert_eq!(seen[0], seen[1]);
                // A leased claim taken over after its lease ran out.
                let clock = idem::inbox::ManualClock::new(1_700_000_000_000);
                let leased = Inbox::new("payments").unwrap().clock(clock.clone()).lease(Duration::from_secs(30));
                let key = MessageKey::new("order:3:refund").unwrap();
                let idem::inbox::Claimed::Work(first) = leased.claim::<_, ()>(&pool, &key, b"r").await.unwrap() else {
                    panic!("a first claim");
                };
                clock.advance(Duration::from_secs(31));
                let idem::inbox::Claimed::Work(second) = leased.claim::<_, ()>(&pool, &key, b"r").await.unwrap() else {
                    panic!("a takeover");
                };
                assert_eq!(second.attempt(), 2);
                assert_eq!(first.effect_key().derive("refund"), second.effect_key().derive("refund"));
                assert_ne!(first.effect_key(), EffectKey::of(&["payments", "order:3:refund"]));
            }

            /// A row whose stored headers are not idem's is never published as it stands:
            /// each attempt fails with what is wrong, and it ends dead, listed, its key held.
            #[tokio::test]
            async fn a_message_with_unreadable_headers_fails_loudly_and_is_kept() {
                let Some(pool) = setup(0).await else { return };
                let mut tx = $begin(&pool).await;
                outbox::stage(&mut tx, Message::json("m", &1).id("garbled").ordering_key("g")).await.unwrap();
                tx.commit().await.unwrap();
                sqlx::query("UPDATE idem_outbox SET headers = 'not json'").execute(&pool).await.unwrap();
                let recorder = Recorder::default();
                let relay = Relay::new(pool.clone(), recorder.clone()).max_attempts(1);
                let relayed = relay.run_once().await.unwrap();
                assert_eq!((relayed.claimed, relayed.published, relayed.dead), (1, 0, 1));
                assert!(recorder.seen().is_empty());
                let dead = outbox::dead(&pool, 10).await.unwrap();
                assert!(dead[0].last_error.as_deref().unwrap().contains("stored headers are not idem's"), "{dead:?}");
                assert_eq!(staged(&pool).await, 1, "the row is kept");
            }

            /// A failure whose error text holds a NUL (PostgreSQL's `text` refuses it) is
            /// recorded, and the batch's acknowledged message stays marked: never published
            /// again.
            #[tokio::test]
            async fn an_error_holding_a_nul_is_recorded_and_the_rest_stays_published() {
                let Some(pool) = setup(0).await else { return };
                let mut tx = $begin(&pool).await;
                outbox::stage(&mut tx, Message::json("m", &1).id("good").ordering_key("ok")).await.unwrap();
                outbox::stage(&mut tx, Message::json("m", &2).id("odd").ordering_key("nul")).await.unwrap();
                tx.commit().await.unwrap();
                let quirky = Quirky::default();
                let relay = Relay::new(pool.clone(), quirky.clone())
                    .max_attempts(2)
                    .backoff(Duration::from_millis(1), Duration::from_millis(1));
                for round in 0..3 {
                    let relayed = relay.run_once().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if round == 0 {
                        assert_eq!((relayed.claimed, relayed.published, relayed.failed), (2, 1, 1));
                    }
                }
                assert_eq!(quirky.acked("good"), 1, "an acknowledged message is never sent again");
                let dead = outbox::dead(&pool, 10).await.unwrap();
                assert_eq!(dead.len(), 1, "{dead:?}");
                assert_eq!(dead[0].attempts, 2);
                let error = dead[0].last_error.as_deref().unwrap();
                assert_eq!(error, "the broker said: bad\u{fffd}byte \u{fffd}[31m");
            }

            /// A publisher that panics fails that message's attempt; the spawned relay goes
            /// on publishing the others, and later ones.
            #[tokio::test]
            async fn a_publisher_that_panics_fails_its_message_and_the_relay_goes_on() {
                let Some(pool) = setup(0).await else { return };
                let stage = async |id: &str, key: &str| {
                    let mut tx = $begin(&pool).await;
                    outbox::stage(&mut tx, Message::json("m", &1).id(id).ordering_key(key)).await.unwrap();
                    tx.commit().await.unwrap();
                };
                stage("first", "a").await;
                stage("poison", "boom").await;
                let quirky = Quirky::default();
                let relay = Relay::new(pool.clone(), quirky.clone())
                    .max_attempts(1)
                    .poll_interval(Duration::from_millis(10))
                    .spawn()
                    .unwrap();
                until("the first published", async || quirky.acked("first") == 1).await;
                until("the poison dead", async || outbox::dead(&pool, 10).await.unwrap().len() == 1).await;
                stage("later", "c").await;
                until("a later message published", async || quirky.acked("later") == 1).await;
                let dead = outbox::dead(&pool, 10).await.unwrap();
                assert!(dead[0].last_error.as_deref().unwrap().contains("the publisher panicked: the publisher cannot take this message"), "{dead:?}");
                relay.stop().await;
            }

            /// The guide's `relay.spawn()?;`: the handle dropped, the relay runs on, batch
            /// after batch.
            #[tokio::test]
            async fn a_relay_whose_handle_is_dropped_runs_on() {
                let Some(pool) = setup(0).await else { return };
                let quirky = Quirky::default();
                drop(
                    Relay::new(pool.clone(), quirky.clone())
                        .poll_interval(Duration::from_millis(10))
                        .spawn()
                        .unwrap(),
                );
                for round in 0..3 {
                    let id = format!("m-{round}");
                    let mut tx = $begin(&pool).await;
                    outbox::stage(&mut tx, Message::json("m", &round).id(id.clone())).await.unwrap();
                    tx.commit().await.unwrap();
                    until(&format!("round {round} published"), async || quirky.acked(&id) == 1).await;
                }
            }

            /// Several relays at once: every message published, per key in order.
            #[tokio::test]
            async fn relays_at_once_publish_every_message_in_order_per_key() {
                let Some(pool) = setup(0).await else { return };
                const KEYS: usize = 10;
                const PER_KEY: usize = 20;
                let writers: Vec<_> = (0..KEYS)
                    .map(|k| {
                        let pool = pool.clone();
                        tokio::spawn(async move {
                            for i in 0..PER_KEY {
                                let mut tx = $begin(&pool).await;
                                let id = format!("k{k}-{i:02}");
                                let message = Message::bytes("m", id.clone())
                                    .ordering_key(format!("k{k}"))
                                    .id(id);
                                outbox::stage(&mut tx, message).await.unwrap();
                                tx.commit().await.unwrap();
                            }
                        })
                    })
                    .collect();
                let recorder = Recorder::default();
                let relays: Vec<_> = (0..3)
                    .map(|_| {
                        let relay = Relay::new(pool.clone(), recorder.clone()).batch_size(4);
                        tokio::spawn(async move {
                            let mut idle = 0;
                            while idle < 20 {
                                let relayed = relay.run_once().await.unwrap();
                                if relayed.claimed == 0 {
                                    idle += 1;
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                } else {
                                    idle = 0;
                                }
                            }
                        })
                    })
                    .collect();
                for writer in writers {
                    writer.await.unwrap();
                }
                for relay in relays {
                    relay.await.unwrap();
                }
                drain(&Relay::new(pool.clone(), recorder.clone())).await;
                let per_key = recorder.per_key();
                assert_eq!(per_key.len(), KEYS);
                for (key, seen) in per_key {
                    let expected: Vec<String> =
                        (0..PER_KEY).map(|i| format!("{key}-{i:02}")).collect();
                    assert_eq!(seen, expected, "key {key} out of order or repeated");
                }
                assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 0);
            }
        }
    };
}

outbox_tests!(
    sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("outbox-{}", common::next_id()), 4).await),
    begin_sqlite,
    positional = false
);
outbox_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("outbox_{}", common::next_id()), 6).await,
    begin_postgres,
    positional = false
);
outbox_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("outbox_{}", common::next_id()), 6).await,
    begin_mysql,
    positional = true
);

/// MariaDB: a relay reads its candidates in autocommit, then locks each. A candidate that
/// another relay failed in between (its next attempt minutes away) is passed over by the
/// lock, not published at once: the lock sees the latest commit and checks it is due.
#[tokio::test]
async fn mysql_a_candidate_failed_meanwhile_is_not_claimed_before_its_backoff() {
    let Some(pool) = common::mysql(&format!("outbox_due_{}", common::next_id()), 4).await else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox::stage(&mut tx, Message::json("m", &1).id("m").ordering_key("k"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Relay B's candidates: the message is due.
    let sql = idem::Dialect::MySql.outbox();
    let candidates: Vec<i64> = sqlx::query_scalar(common::placed(
        true,
        Box::leak(sql.claim.clone().into_boxed_str()),
    ))
    .bind(10i64)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(candidates.len(), 1);
    // Relay A claims it meanwhile and fails it: due again in ten minutes.
    let recorder = Recorder::default();
    recorder.fail("k", true);
    let relay = Relay::new(pool.clone(), recorder)
        .backoff(Duration::from_secs(600), Duration::from_secs(600));
    assert_eq!(relay.run_once().await.unwrap().failed, 1);
    // Relay B locks its candidate now: passed over.
    let mut tx = pool.begin().await.unwrap();
    let locked = sqlx::query(common::placed(
        true,
        Box::leak(sql.lock(1).into_boxed_str()),
    ))
    .bind(candidates[0])
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert!(locked.is_empty(), "a message in its backoff was claimed");
    tx.rollback().await.unwrap();
}

/// A batch over what one statement may carry is refused when the relay is built.
#[tokio::test]
async fn a_batch_size_over_the_bound_is_refused() {
    let pool = common::sqlite_memory().await;
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(Relay::new(pool.clone(), Recorder::default()).batch_size(outbox::MAX_BATCH_SIZE + 1))
    }));
    let Err(panic) = built else {
        panic!("a batch_size over the bound was taken")
    };
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("batch_size(10001) is over 10000"),
        "{message}"
    );
    drop(Relay::new(pool, Recorder::default()).batch_size(outbox::MAX_BATCH_SIZE));
}

async fn begin_sqlite(pool: &sqlx::SqlitePool) -> sqlx::Transaction<'static, sqlx::Sqlite> {
    pool.begin_with("BEGIN IMMEDIATE").await.unwrap()
}

async fn begin_postgres(pool: &sqlx::PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    pool.begin().await.unwrap()
}

async fn begin_mysql(pool: &sqlx::MySqlPool) -> sqlx::Transaction<'static, sqlx::MySql> {
    pool.begin().await.unwrap()
}

/// A sequence hands out `seq` at INSERT (PostgreSQL's identity, InnoDB's AUTO_INCREMENT), and
/// a transaction that began first may commit last: its message has the lower `seq`, and is
/// still published after it commits (no high-water mark passed over it).
async fn a_lower_seq_committed_last_is_still_published<DB: idem::Backend>(pool: sqlx::Pool<DB>) {
    idem::migrate(&pool).await.unwrap();
    let mut long = pool.begin().await.unwrap();
    let early = Message::json("m", &"early").id("early").ordering_key("a");
    outbox::stage(&mut long, early).await.unwrap();
    let mut short = pool.begin().await.unwrap();
    let late = Message::json("m", &"late").id("late").ordering_key("b");
    outbox::stage(&mut short, late).await.unwrap();
    short.commit().await.unwrap();
    let recorder = Recorder::default();
    let relay = Relay::new(pool.clone(), recorder.clone());
    assert_eq!(drain(&relay).await, 1);
    long.commit().await.unwrap();
    assert_eq!(drain(&relay).await, 1);
    let seen = recorder.seen();
    let ids: Vec<&str> = seen.iter().map(|m| m.id()).collect();
    assert_eq!(ids, ["late", "early"]);
    assert!(
        seen[1].seq() < seen[0].seq(),
        "the early message has the lower seq"
    );
}

/// One key, two relays, a lower `seq` committed last: while relay A publishes the message
/// committed first, relay B claims nothing of that key, not even the message with the lower
/// `seq` that committed meanwhile; it goes once A is done. Per key, one message at a time,
/// in the order they became claimable (the order of the commits). PostgreSQL keeps it with
/// an advisory lock per key, MariaDB with a lock row per key's bucket.
async fn a_key_goes_one_message_at_a_time_when_a_lower_seq_commits_late<DB: idem::Backend>(
    pool: sqlx::Pool<DB>,
) {
    idem::migrate(&pool).await.unwrap();
    let mut long = pool.begin().await.unwrap();
    outbox::stage(
        &mut long,
        Message::json("m", &1).id("first-staged").ordering_key("k"),
    )
    .await
    .unwrap();
    let mut short = pool.begin().await.unwrap();
    outbox::stage(
        &mut short,
        Message::json("m", &2)
            .id("first-committed")
            .ordering_key("k"),
    )
    .await
    .unwrap();
    short.commit().await.unwrap();
    let (hanging, mut publishing, release) = Hanging::new(4);
    let hanging = Relay::new(pool.clone(), hanging);
    let a = tokio::spawn(async move { hanging.run_once().await.unwrap() });
    publishing.recv().await.unwrap();
    long.commit().await.unwrap();
    let recorder = Recorder::default();
    let b = Relay::new(pool.clone(), recorder.clone());
    let meanwhile = b.run_once().await.unwrap();
    assert_eq!(
        meanwhile.claimed, 0,
        "a second message of the key went while one was in flight"
    );
    release.add_permits(1);
    assert_eq!(a.await.unwrap().published, 1);
    assert_eq!(b.run_once().await.unwrap().published, 1);
    let ids: Vec<String> = recorder.seen().iter().map(|m| m.id().to_owned()).collect();
    assert_eq!(ids, ["first-staged"]);
}

#[tokio::test]
async fn postgres_a_key_goes_one_message_at_a_time_when_a_lower_seq_commits_late() {
    let name = format!("outbox_one_{}", common::next_id());
    if let Some(pool) = common::postgres(&name, 6).await {
        a_key_goes_one_message_at_a_time_when_a_lower_seq_commits_late(pool).await;
    }
}

/// Two outboxes in two schemas of one PostgreSQL database (advisory locks are the
/// database's): while a relay of the first publishes a message of key `k`, a relay of the
/// second publishes its own message of key `k`.
#[tokio::test]
async fn postgres_outboxes_in_two_schemas_do_not_hold_back_each_others_keys() {
    let first = common::postgres(&format!("outbox_schema_a_{}", common::next_id()), 4).await;
    let second = common::postgres(&format!("outbox_schema_b_{}", common::next_id()), 4).await;
    let (Some(first), Some(second)) = (first, second) else {
        return;
    };
    for pool in [&first, &second] {
        idem::migrate(pool).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        outbox::stage(&mut tx, Message::json("m", &1).id("m").ordering_key("k"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let (hanging, mut publishing, release) = Hanging::new(4);
    let hanging = Relay::new(first.clone(), hanging);
    let a = tokio::spawn(async move { hanging.run_once().await.unwrap() });
    publishing.recv().await.unwrap();
    let recorder = Recorder::default();
    let b = Relay::new(second.clone(), recorder.clone());
    assert_eq!(
        b.run_once().await.unwrap().published,
        1,
        "a relay of another schema held the key back"
    );
    release.add_permits(1);
    assert_eq!(a.await.unwrap().published, 1);
}

#[tokio::test]
async fn mysql_a_key_goes_one_message_at_a_time_when_a_lower_seq_commits_late() {
    let name = format!("outbox_one_{}", common::next_id());
    if let Some(pool) = common::mysql(&name, 6).await {
        a_key_goes_one_message_at_a_time_when_a_lower_seq_commits_late(pool).await;
    }
}

#[tokio::test]
async fn postgres_a_lower_seq_committed_last_is_still_published() {
    let name = format!("outbox_gap_{}", common::next_id());
    if let Some(pool) = common::postgres(&name, 4).await {
        a_lower_seq_committed_last_is_still_published(pool).await;
    }
}

#[tokio::test]
async fn mysql_a_lower_seq_committed_last_is_still_published() {
    let name = format!("outbox_gap_{}", common::next_id());
    if let Some(pool) = common::mysql(&name, 4).await {
        a_lower_seq_committed_last_is_still_published(pool).await;
    }
}

/// Under SERIALIZABLE on PostgreSQL, relays claiming and marking while writers stage: no
/// writer's transaction fails for it (a relay's reads and writes touch only rows committed
/// before it claimed them), and every key's messages arrive in order.
#[tokio::test]
async fn postgres_serializable_stagers_and_relays_do_not_fail_each_other() {
    let name = format!("outbox_ser_{}", common::next_id());
    let settings = [("default_transaction_isolation", "serializable")];
    let Some(pool) = common::postgres_with(&name, 8, &settings).await else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    let writers: Vec<_> = (0..4)
        .map(|k| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let mut tx = pool.begin().await.unwrap();
                    let id = format!("k{k}-{i:02}");
                    let message = Message::bytes("m", id.clone())
                        .ordering_key(format!("k{k}"))
                        .id(id);
                    outbox::stage(&mut tx, message).await.unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    let recorder = Recorder::default();
    let relays: Vec<_> = (0..2)
        .map(|_| {
            Relay::new(pool.clone(), recorder.clone())
                .batch_size(3)
                .poll_interval(Duration::from_millis(5))
                .spawn()
                .unwrap()
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while outbox::backlog(&pool).await.unwrap().pending > 0 && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for relay in relays {
        relay.stop().await;
    }
    assert_eq!(outbox::backlog(&pool).await.unwrap().pending, 0);
    for (key, seen) in recorder.per_key() {
        let mut expected: Vec<String> = (0..50).map(|i| format!("{key}-{i:02}")).collect();
        expected.dedup();
        let mut deduped = seen.clone();
        deduped.dedup();
        assert_eq!(deduped, expected, "key {key} out of order");
    }
}

/// A relay whose publish hangs holds its claim; meanwhile handlers stage new messages
/// without waiting for it (InnoDB's gap locks would make them wait under a range claim).
#[tokio::test]
async fn mysql_staging_does_not_wait_for_a_relay_that_holds_its_batch() {
    let Some(pool) = common::mysql(&format!("outbox_nowait_{}", common::next_id()), 4).await else {
        return;
    };
    staging_does_not_wait(pool).await;
}

/// The same under SERIALIZABLE, where InnoDB turns every plain read of a transaction into a
/// locking one.
#[tokio::test]
async fn mysql_serializable_staging_does_not_wait_for_a_relay_that_holds_its_batch() {
    let name = format!("outbox_nowait_ser_{}", common::next_id());
    let serializable = "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE";
    let Some(pool) = common::mysql_with(&name, 4, serializable).await else {
        return;
    };
    staging_does_not_wait(pool).await;
}

async fn staging_does_not_wait(pool: sqlx::MySqlPool) {
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for key in ["a", "b"] {
        let message = Message::json("m", &1)
            .id(format!("held-{key}"))
            .ordering_key(key);
        outbox::stage(&mut tx, message).await.unwrap();
    }
    tx.commit().await.unwrap();
    let (hanging, mut publishing, release) = Hanging::new(2);
    let relay = Relay::new(pool.clone(), hanging);
    let relaying = tokio::spawn(async move { relay.run_once().await.unwrap() });
    publishing.recv().await.unwrap();
    publishing.recv().await.unwrap();
    let staging = async {
        for i in 0..5 {
            let mut tx = pool.begin().await.unwrap();
            outbox::stage(
                &mut tx,
                Message::json("m", &i)
                    .id(format!("new-{i}"))
                    .ordering_key(format!("k{i}")),
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), staging)
        .await
        .expect("staging waited for the relay's claim");
    release.add_permits(2);
    assert_eq!(relaying.await.unwrap().published, 2);
}

/// Tells when it is publishing, then waits to be released.
struct Hanging {
    entered: tokio::sync::mpsc::Sender<()>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Hanging {
    /// A publisher that tells each publish on the receiver (room for `publishes`) and waits
    /// for a permit of the semaphore.
    fn new(
        publishes: usize,
    ) -> (
        Hanging,
        tokio::sync::mpsc::Receiver<()>,
        Arc<tokio::sync::Semaphore>,
    ) {
        let (entered, publishing) = tokio::sync::mpsc::channel(publishes);
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let hanging = Hanging {
            entered,
            release: release.clone(),
        };
        (hanging, publishing, release)
    }
}

impl Publisher for Hanging {
    async fn publish(&self, _: &Outgoing) -> Result<Published, PublishError> {
        let _ = self.entered.send(()).await;
        self.release.acquire().await.unwrap().forget();
        Ok(Published::Acked)
    }
}

/// A spawned relay on PostgreSQL is woken by the commit's notification, long before its
/// poll interval.
#[tokio::test]
async fn postgres_a_spawned_relay_is_woken_by_the_commit() {
    let Some(pool) = common::postgres(&format!("outbox_notify_{}", common::next_id()), 4).await
    else {
        return;
    };
    idem::migrate(&pool).await.unwrap();
    let recorder = Recorder::default();
    let relay = Relay::new(pool.clone(), recorder.clone())
        .poll_interval(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    // Its first batch (nothing) and its LISTEN.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tx = pool.begin().await.unwrap();
    outbox::stage(&mut tx, Message::json("m", &1).id("woken"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let woken = async {
        while recorder.seen().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), woken)
        .await
        .expect("the relay was not woken by the notification");
    relay.stop().await;
    // Without notifications it waits for its poll interval: an hour.
    let deaf = Relay::new(pool.clone(), recorder.clone())
        .poll_interval(Duration::from_secs(3600))
        .notifications(false)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tx = pool.begin().await.unwrap();
    outbox::stage(&mut tx, Message::json("m", &2).id("unheard"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        recorder.seen().len(),
        1,
        "a relay that does not listen was woken"
    );
    deaf.stop().await;
}
