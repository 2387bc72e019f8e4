//! The requests of this process in flight, by record key: a repeat of a key whose first
//! request is still running here is answered at once (409) or waits for it, bounded,
//! instead of queueing for the database. An optimisation only: the record's unique key in
//! the database is what makes a second execution impossible, across processes too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

type Turn = Arc<tokio::sync::Mutex<()>>;

/// The keys in flight in one layer.
#[derive(Default)]
pub(crate) struct InFlight(Mutex<HashMap<String, Turn>>);

/// A request's hold on its key; released when dropped.
pub(crate) struct Flight {
    flights: Arc<InFlight>,
    key: String,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// It waited for another request of this process holding the key.
    waited: bool,
}

impl InFlight {
    /// Takes `key`, waiting at most `wait` for a request of this process that holds it.
    /// `None` if it is still held after that.
    pub(crate) async fn enter(self: &Arc<Self>, key: &str, wait: Duration) -> Option<Flight> {
        let turn = {
            let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            map.entry(key.to_owned()).or_default().clone()
        };
        // Forgets the key if nobody else uses it once this call ends, however it ends: with
        // the key held (a `Flight` keeps it), refused, or cancelled while waiting (the
        // request dropped by its client), which must leave no entry behind.
        let waiting = Waiting {
            flights: self,
            key,
            turn: Some(turn),
        };
        let turn = || waiting.turn.clone().unwrap_or_default();
        let (held, waited) = match turn().try_lock_owned() {
            Ok(held) => (Some(held), false),
            Err(_) if wait.is_zero() => (None, false),
            Err(_) => (
                tokio::time::timeout(wait, turn().lock_owned()).await.ok(),
                true,
            ),
        };
        let flight = held.map(|held| Flight {
            flights: self.clone(),
            key: key.to_owned(),
            turn: Some(held),
            waited,
        });
        drop(waiting);
        flight
    }

    fn forget_if_unused(&self, key: &str) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .get(key)
            .is_some_and(|turn| Arc::strong_count(turn) == 1)
        {
            map.remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A call of [`InFlight::enter`] under way (see there).
struct Waiting<'a> {
    flights: &'a InFlight,
    key: &'a str,
    turn: Option<Turn>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        drop(self.turn.take());
        self.flights.forget_if_unused(self.key);
    }
}

impl Flight {
    /// Whether it waited for another request of this process that held the key (which,
    /// most likely, recorded it meanwhile).
    pub(crate) fn waited(&self) -> bool {
        self.waited
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        // The guard holds a clone of the turn: release it before counting.
        drop(self.turn.take());
        self.flights.forget_if_unused(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_key_is_refused_or_waited_for_and_forgotten_after() {
        let flights = Arc::new(InFlight::default());
        let first = flights.enter("k", Duration::ZERO).await.unwrap();
        assert!(!first.waited());
        assert!(flights.enter("k", Duration::ZERO).await.is_none());
        assert!(
            flights
                .enter("k", Duration::from_millis(20))
                .await
                .is_none()
        );
        let other = flights.enter("other", Duration::ZERO).await;
        assert!(other.is_some(), "another key is not held");
        drop(other);
        let waiter = {
            let flights = flights.clone();
            tokio::spawn(async move {
                flights
                    .enter("k", Duration::from_secs(5))
                    .await
                    .is_some_and(|flight| flight.waited())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(
            waiter.await.unwrap(),
            "the waiter gets the key once it is released, having waited"
        );
        assert_eq!(flights.len(), 0, "released keys are forgotten");
    }

    #[tokio::test]
    async fn a_waiter_cancelled_mid_wait_leaves_no_entry() {
        let flights = Arc::new(InFlight::default());
        let first = flights.enter("k", Duration::ZERO).await.unwrap();
        let waiter = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.enter("k", Duration::from_secs(5)).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The first ends while the waiter still waits (so the entry stays for it), and the
        // waiter is cancelled before it runs again, as a request whose client went away.
        drop(first);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(flights.len(), 0, "a cancelled waiter's key is forgotten");
    }
}
