//! Taking a batch from a stream of deliveries: at most so many, waiting at most so long.

use futures_util::{Stream, StreamExt};
use std::time::Duration;

/// The next batch of `deliveries`: what arrives within `wait` of the call, at most `max` of
/// them (at least 1), returned as soon as `max` are taken. Under load a batch is full and
/// returns at once; under light load it returns after `wait` with what came, possibly
/// nothing, so no delivery waits longer than `wait` for its batch to begin. `None` once
/// the stream ended with nothing taken.
///
/// For a push consumer (RabbitMQ with a prefetch of at least `max`, a NATS subscription):
/// a pull consumer's fetch already returns a batch (JetStream:
/// `consumer.fetch().max_messages(max).expires(wait)`). Let it return: dropped half way,
/// the deliveries it took are dropped unsettled, and the broker redelivers them only after
/// its own timeout.
///
/// ```
/// # async fn demo() {
/// use futures_util::stream;
/// use std::time::Duration;
///
/// let mut deliveries = stream::iter(1..=250);
/// let wait = Duration::from_millis(50);
/// assert_eq!(idem::inbox::gather(&mut deliveries, 100, wait).await.unwrap().len(), 100);
/// assert_eq!(idem::inbox::gather(&mut deliveries, 100, wait).await.unwrap().len(), 100);
/// assert_eq!(idem::inbox::gather(&mut deliveries, 100, wait).await.unwrap().len(), 50);
/// assert!(idem::inbox::gather(&mut deliveries, 100, wait).await.is_none());
/// # }
/// ```
pub async fn gather<S: Stream + Unpin>(
    deliveries: &mut S,
    max: usize,
    wait: Duration,
) -> Option<Vec<S::Item>> {
    let max = max.max(1);
    let deadline = tokio::time::Instant::now() + wait;
    let mut batch = Vec::with_capacity(max.min(1024));
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, deliveries.next()).await {
            Ok(Some(delivery)) => batch.push(delivery),
            Ok(None) if batch.is_empty() => return None,
            Ok(None) | Err(_) => break,
        }
    }
    Some(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    #[tokio::test(start_paused = true)]
    async fn a_batch_ends_full_or_after_the_wait() {
        // Three deliveries at once, then one 100 ms later, then the stream ends.
        let later = stream::once(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            4
        });
        let mut deliveries = Box::pin(stream::iter(1..=3).chain(later));
        let wait = Duration::from_millis(50);
        let started = tokio::time::Instant::now();
        assert_eq!(gather(&mut deliveries, 2, wait).await, Some(vec![1, 2]));
        assert_eq!(started.elapsed(), Duration::ZERO, "full: at once");
        assert_eq!(gather(&mut deliveries, 2, wait).await, Some(vec![3]));
        assert_eq!(started.elapsed(), wait, "not full: after the wait");
        assert_eq!(gather(&mut deliveries, 2, wait).await, Some(vec![4]));
        assert_eq!(gather(&mut deliveries, 2, wait).await, None);
        assert_eq!(gather(&mut deliveries, 0, wait).await, None);
    }
}
