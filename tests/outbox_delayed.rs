//! Delayed messages (`Message::deliver_after`, `Message::deliver_at`) and their
//! cancellation (`outbox::cancel`), on a SQLite file, PostgreSQL and MariaDB:
//!
//! - a delayed message is not published before its time and is published after it; the
//!   delay is counted from the staging statement's now, by the database's clock;
//! - until it is due it holds back nothing: a message staged after it under its ordering
//!   key goes first;
//! - a time already past is due at once;
//! - cancelled in a later transaction, it is never published; a cancel of a published
//!   message, of a cancelled one or of an unknown id says `false`, and a cancel rolled back
//!   cancels nothing;
//! - a delay over 100 years is refused at staging, saying so;
//! - an idle spawned relay wakes when a delayed message comes due, not a poll interval
//!   (an hour here) later, notified or not.

use crate::common;
use idem::outbox::{
    self, Message, OutboxError, Outgoing, PublishError, Published, Publisher, Relay,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// A publisher that acknowledges everything and keeps the ids it published, in order.
#[derive(Clone, Default)]
struct Ids(Arc<Mutex<Vec<String>>>);

impl Ids {
    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl Publisher for Ids {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        self.0.lock().unwrap().push(message.id().to_owned());
        Ok(Published::Acked)
    }
}

/// Runs the relay until a batch finds nothing to do.
async fn drain<DB: idem::Backend>(relay: &Relay<DB, Ids>) {
    while relay.run_once().await.unwrap().claimed > 0 {}
}

const DELAY: Duration = Duration::from_secs(3);

async fn delayed<DB: idem::Backend>(pool: sqlx::Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let messages = [
        Message::json("orders", &1)
            .id("delayed")
            .ordering_key("k")
            .deliver_after(DELAY),
        // Staged after it under its key: it goes first.
        Message::json("orders", &2).id("behind").ordering_key("k"),
        Message::json("orders", &3)
            .id("past")
            .ordering_key("p")
            .deliver_at(SystemTime::UNIX_EPOCH + Duration::from_secs(1)),
        Message::json("orders", &4)
            .id("cancelled")
            .ordering_key("c")
            .deliver_after(Duration::from_secs(3600)),
    ];
    for message in messages {
        outbox::stage(&mut tx, message).await.unwrap();
    }
    tx.commit().await.unwrap();
    let staged = Instant::now();
    // The delay is the database's: its due time is its staging statement's now plus it.
    let (due_in,): (i64,) = sqlx::query_as(
        "SELECT next_attempt_at - created_at FROM idem_outbox WHERE id = 'cancelled'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(due_in, 3_600_000);

    let ids = Ids::default();
    let relay = Relay::new(pool.clone(), ids.clone());
    drain(&relay).await;
    assert!(staged.elapsed() < DELAY, "the test ran too slowly to tell");
    assert_eq!(
        ids.seen(),
        ["behind", "past"],
        "the delayed message went early, or held its key back"
    );

    // A cancel rolled back cancels nothing; a cancel committed is for good.
    let mut tx = pool.begin().await.unwrap();
    assert!(outbox::cancel(&mut tx, "cancelled").await.unwrap());
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(outbox::cancel(&mut tx, "cancelled").await.unwrap());
    assert!(
        !outbox::cancel(&mut tx, "cancelled").await.unwrap(),
        "cancelled twice"
    );
    assert!(
        !outbox::cancel(&mut tx, "behind").await.unwrap(),
        "published already"
    );
    assert!(!outbox::cancel(&mut tx, "never-staged").await.unwrap());
    tx.commit().await.unwrap();

    // Its time comes.
    tokio::time::sleep(DELAY.saturating_sub(staged.elapsed()) + Duration::from_millis(200)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids.seen().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the delayed message was not published: {:?}",
            ids.seen()
        );
        drain(&relay).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ids.seen(), ["behind", "past", "delayed"]);
    let left: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        left, 0,
        "the cancelled message is gone, the others published"
    );

    // A delay no database integer takes is refused at staging.
    let mut tx = pool.begin().await.unwrap();
    let centuries = Message::json("orders", &5)
        .id("centuries")
        .deliver_after(Duration::from_secs(200 * 366 * 24 * 3600));
    let refused = outbox::stage(&mut tx, centuries).await.unwrap_err();
    let sqlx::Error::Encode(inner) = &refused else {
        panic!("{refused:?}");
    };
    let Some(OutboxError::InvalidMessage(problem)) = inner.downcast_ref::<OutboxError>() else {
        panic!("{refused:?}");
    };
    assert!(problem.contains("100 years"), "{problem}");
}

/// A spawned relay polling once an hour publishes a message delayed by `DUE` when it comes
/// due (woken by nothing else: staged before the relay starts, the notification is gone).
async fn woken_when_due<DB: idem::Backend>(pool: sqlx::Pool<DB>) {
    const DUE: Duration = Duration::from_millis(1500);
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let message = Message::json("orders", &1)
        .id("due-soon")
        .deliver_after(DUE);
    outbox::stage(&mut tx, message).await.unwrap();
    tx.commit().await.unwrap();
    let staged = Instant::now();
    let ids = Ids::default();
    let relay = Relay::new(pool.clone(), ids.clone())
        .poll_interval(Duration::from_secs(3600))
        .spawn()
        .unwrap();
    let deadline = staged + Duration::from_secs(30);
    while ids.seen().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = staged.elapsed();
    relay.stop().await;
    assert_eq!(
        ids.seen(),
        ["due-soon"],
        "the relay slept its poll interval past the message's time"
    );
    // The database's clock and this process's tick at the same rate: not before its time.
    assert!(
        took >= DUE - Duration::from_millis(50),
        "published early: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_wakes_when_due_sqlite() {
    woken_when_due(common::sqlite_file(&format!("outbox-due-{}", common::next_id()), 2).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_wakes_when_due_postgres() {
    let Some(pool) = common::postgres("outbox_due", 4).await else {
        return;
    };
    woken_when_due(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_wakes_when_due_mysql() {
    let Some(pool) = common::mysql("outbox_due", 4).await else {
        return;
    };
    woken_when_due(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_sqlite() {
    delayed(common::sqlite_file(&format!("outbox-delayed-{}", common::next_id()), 2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_postgres() {
    let Some(pool) = common::postgres("outbox_delayed", 4).await else {
        return;
    };
    delayed(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_mysql() {
    let Some(pool) = common::mysql("outbox_delayed", 4).await else {
        return;
    };
    delayed(pool).await;
}
