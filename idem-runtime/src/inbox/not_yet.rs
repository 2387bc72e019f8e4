//! A batch handler's answer for a message that came early ([`not_yet`]).

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    /// Whether the handler running in this scope marked its error with [`not_yet`].
    static MARKED: Cell<bool>;
}

/// Marks the error a batch's handler is about to return as **not yet**: the message came
/// early (a "ship" that overtook its "pay", a transition's
/// [`Outcome::NotYet`](crate::Outcome::NotYet)) and must be tried again later, without
/// counting an attempt. Returns `error` unchanged: `return Err(not_yet(error))`.
///
/// In a handler of [`Inbox::batch`](super::Inbox::batch) or of
/// [`KafkaConsumer::next`](super::kafka::KafkaConsumer::next), a marked error:
///
/// - rolls back that message's effects alone, as any failure does;
/// - leaves its record FAILED with **no attempt counted** and the error's text as its
///   `last_error` ("waiting for the payment", for whoever looks), so waiting for another
///   message never parks it, however many times it comes early;
/// - answers `Err(Error::Handler(error))`: nack it (with a delay), a redelivery tries it
///   again;
/// - on a Kafka partition, holds back the partition's messages after it, as a failure does,
///   until it applies (read again after the consumer's
///   [`retry_delay`](super::kafka::KafkaConsumer::retry_delay)).
///
/// Mark only what another message will unblock: a message that can never apply (an
/// illegal state, a bad payload) should fail and be parked after its attempts.
///
/// The mark is the handler's own: call `not_yet` in the handler's future (not in a task it
/// spawns). Outside a batch's handler it does nothing; a single delivery whose handler is
/// also a transition says "not yet" by itself
/// ([`Delivery::Refused`](super::Delivery::Refused)).
///
/// ```
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::inbox::{BatchFuture, Delivery, Inbox, MessageKey, not_yet};
///
/// idem::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
///     .execute(&pool)
///     .await?;
/// sqlx::query("INSERT INTO orders VALUES (7, 'CREATED')").execute(&pool).await?;
/// let inbox = Inbox::new("shipping")?.max_attempts(3);
/// let message = [(MessageKey::business("order:7", "ship")?, b"7".to_vec())];
/// fn ship<'t>(
///     tx: &'t mut sqlx::Transaction<'static, sqlx::Sqlite>,
///     _: &'t (MessageKey, Vec<u8>),
/// ) -> BatchFuture<'t, (), String> {
///     Box::pin(async move {
///         let shipped = sqlx::query("UPDATE orders SET status = 'SHIPPED' WHERE id = 7 AND status = 'PAID'")
///             .execute(&mut **tx)
///             .await
///             .map_err(|e| e.to_string())?;
///         if shipped.rows_affected() == 0 {
///             return Err(not_yet("order 7 is not paid yet".to_owned()));
///         }
///         Ok(())
///     })
/// }
/// // Five deliveries before the payment: none of them is an attempt, nothing is parked.
/// for _ in 0..5 {
///     let settled = inbox.batch(&pool, &message, ship).await?;
///     assert!(matches!(&settled[0], Err(idem::Error::Handler(e)) if e.contains("not paid")));
/// }
/// sqlx::query("UPDATE orders SET status = 'PAID' WHERE id = 7").execute(&pool).await?;
/// let settled = inbox.batch(&pool, &message, ship).await?;
/// assert!(matches!(settled[0], Ok(Delivery::Processed(()))));
/// # Ok(()) }
/// ```
pub fn not_yet<E>(error: E) -> E {
    // Outside a batch's handler there is no scope: nothing to mark.
    let _ = MARKED.try_with(|marked| marked.set(true));
    error
}

/// Runs a batch handler's future, and tells whether it marked its error ([`not_yet`]).
pub(crate) async fn watched<F: Future>(handler: F) -> (F::Output, bool) {
    MARKED
        .scope(Cell::new(false), async move {
            let output = handler.await;
            (output, MARKED.with(Cell::get))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_mark_is_the_watched_future_s_own() {
        assert_eq!(
            not_yet(7),
            7,
            "outside a handler: unchanged, nothing marked"
        );
        let (output, marked) = watched(async { Err::<(), _>(not_yet("early")) }).await;
        assert_eq!((output, marked), (Err("early"), true));
        let (output, marked) = watched(async { Err::<(), _>("failed") }).await;
        assert_eq!((output, marked), (Err("failed"), false));
        // Each handler starts unmarked.
        let (_, marked) = watched(async { Ok::<(), ()>(()) }).await;
        assert!(!marked);
    }
}
