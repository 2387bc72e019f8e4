//! Bounded, jittered backoff for transactions that lost a conflict, and [`retry`] for
//! the conflicts a call cannot retry alone.
//!
//! Under REPEATABLE READ or SERIALIZABLE, a transition whose row a concurrent transaction
//! changed fails with a serialization failure (SQLSTATE 40001) or a deadlock (40P01; on
//! MySQL, 1213); a SQLite writer can find the database busy. Idem retries the whole transaction, but only
//! up to the conditional UPDATE: the body has not run yet, so a retry cannot duplicate an
//! effect.

use crate::error::Error;
use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Attempts in all, the first included.
pub(crate) const MAX_ATTEMPTS: u32 = 8;
const BASE: Duration = Duration::from_millis(5);
const CAP: Duration = Duration::from_millis(250);

/// Waits between attempts: full jitter over an exponential ceiling (5 ms, 10 ms, … 250 ms).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    attempts: u32,
}

impl Backoff {
    /// Counts a failed attempt and waits before the next; `false` when no attempt is left.
    pub(crate) async fn wait(&mut self) -> bool {
        self.attempts += 1;
        if self.attempts >= MAX_ATTEMPTS {
            return false;
        }
        tokio::time::sleep(self.delay()).await;
        true
    }

    /// Attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    fn delay(&self) -> Duration {
        let ceiling = BASE.saturating_mul(1 << self.attempts.min(16)).min(CAP);
        ceiling.mul_f64(jitter())
    }
}

/// Calls an idempotent handler again while it loses conflicts that idem could not retry
/// alone ([`Error::is_conflict`]: a serialization failure at COMMIT or in the body's
/// statements, typical under SERIALIZABLE), with the same bounded, jittered backoff idem
/// uses before the body (8 attempts in all, 5 ms doubling to 250 ms). Each failed attempt
/// was rolled back whole, so no effect can be duplicated. When every attempt lost, it gives
/// up with [`Error::Contention`] if the last conflict was in idem's own statements (COMMIT),
/// or with the last attempt's error as it is (a conflict in the body); every other outcome
/// and error is returned at once.
///
/// Conflicts before the body are already retried inside each call; this is for the rest.
/// Only the database work is repeated: keep calls to the outside world out of handler
/// bodies (see the leased inbox). For handler errors of your own type, see
/// [`retry_when`].
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "order_id", state = "status")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
/// async fn pay(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, order_id: i64) -> Result<(), sqlx::Error> {
///     // Reads that a concurrent payment may invalidate, under SERIALIZABLE.
///     sqlx::query("INSERT INTO ledger (order_id, balance) \
///                  SELECT $1, COALESCE(MAX(balance), 0) + 1 FROM ledger")
///         .bind(order_id).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idem::Error<sqlx::Error>> {
/// let outcome = idem::retry(|| pay(&pool, 7)).await?;
/// # let _ = outcome; Ok(()) }
/// ```
pub async fn retry<T, E, F, Fut>(call: F) -> Result<T, Error<E>>
where
    E: 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error<E>>>,
{
    retry_when(Error::is_conflict, call).await
}

/// [`retry`] with your own test of what a conflict is: for handler error types idem cannot
/// see into, such as a `thiserror` enum wrapping `sqlx::Error`
/// (`|e| idem::is_conflict_source(e)`, which walks the error's `source()` chain).
pub async fn retry_when<T, E, P, F, Fut>(mut is_conflict: P, mut call: F) -> Result<T, Error<E>>
where
    P: FnMut(&Error<E>) -> bool,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error<E>>>,
{
    let mut backoff = Backoff::default();
    loop {
        match call().await {
            Err(e) if is_conflict(&e) => {
                if !backoff.wait().await {
                    return Err(match e {
                        Error::Database(last) => Error::Contention {
                            attempts: backoff.attempts(),
                            last,
                        },
                        other => other,
                    });
                }
            }
            other => return other,
        }
    }
}

/// A number in [0, 1) from a per-thread xorshift; no cryptographic quality needed, only
/// that concurrent losers do not retry in lockstep.
fn jitter() -> f64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

fn seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let here = &nanos as *const u64 as u64;
    (nanos ^ here.rotate_left(32)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_are_capped_and_jittered() {
        for attempts in 0..MAX_ATTEMPTS {
            let delay = Backoff { attempts }.delay();
            assert!(delay <= CAP, "{delay:?}");
            assert!(delay <= BASE * (1 << attempts), "{delay:?}");
        }
        let samples: Vec<f64> = (0..100).map(|_| jitter()).collect();
        assert!(samples.iter().all(|j| (0.0..1.0).contains(j)));
        assert!(samples.windows(2).any(|w| w[0] != w[1]));
    }

    #[tokio::test]
    async fn gives_up_after_the_last_attempt() {
        let mut backoff = Backoff::default();
        let mut waits = 0;
        while backoff.wait().await {
            waits += 1;
        }
        assert_eq!(waits, MAX_ATTEMPTS - 1);
        assert_eq!(backoff.attempts(), MAX_ATTEMPTS);
    }
}
