//! Concurrency and ordering tests for your own handlers (feature `testing`).
//!
//! Idempotent code without a concurrency test is untested. These helpers run a handler of
//! yours on your real pool the way production will: many copies of one call at once
//! ([`assert_applied_once`]), and the same deliveries in many shuffled orders
//! ([`assert_shuffled`]), and assert what idem promises — every key applied exactly once,
//! every duplicate answered with the first result. They panic, like `assert!`, with every
//! answer in the message. The guide's page,
//! [`idem::guide::testing`](https://docs.rs/idem/latest/idem/guide/testing/index.html), has a complete test.
//!
//! ```no_run
//! # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
//! # #[machine(table = "orders", key = "order_id")]
//! # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
//! # #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
//! # async fn pay(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, order_id: i64, amount: i64)
//! #     -> Result<i64, sqlx::Error> { Ok(amount) }
//! # async fn demo(pool: sqlx::SqlitePool) {
//! // 32 copies of one payment callback at once: one applies, 31 get its result.
//! let first = idem::testing::assert_applied_once(32, || {
//!     let pool = pool.clone();
//!     async move { pay(&pool, 7, 1000).await }
//! })
//! .await;
//! assert_eq!(first.result, 1000);
//! # }
//! ```

use crate::inbox::Delivery;
use crate::transition::outcome::Outcome;
use serde::Serialize;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// How often an answer that means "come back later" is asked again, and how long apart.
const RETRIES: usize = 200;
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// A handler's answer, as the checks read it: [`Outcome`] (a transition),
/// [`Creation`](crate::Creation) (a creation) or [`Delivery`] (an inbox handler, with or
/// without a transition).
pub trait Answer: Debug {
    /// The handler's result type.
    type Result: PartialEq + Debug + Serialize;

    /// The result, when this call applied (ran the body and committed).
    fn applied(&self) -> Option<&Self::Result>;

    /// [`applied`](Answer::applied), owned.
    fn into_applied(self) -> Option<Self::Result>
    where
        Self: Sized;

    /// The replayed first result, when this call was a duplicate (`Some(None)`: nothing
    /// was stored to replay).
    fn replayed(&self) -> Option<Option<&Self::Result>>;

    /// Whether the answer means "not now, deliver again later": another delivery of the
    /// same message is in progress, or a transition came before the one it depends on.
    fn later(&self) -> bool;
}

impl<T: PartialEq + Debug + Serialize, S: Debug> Answer for Outcome<T, S> {
    type Result = T;

    fn applied(&self) -> Option<&T> {
        match self {
            Outcome::Applied(result) => Some(result),
            _ => None,
        }
    }

    fn into_applied(self) -> Option<T> {
        match self {
            Outcome::Applied(result) => Some(result),
            _ => None,
        }
    }

    fn replayed(&self) -> Option<Option<&T>> {
        match self {
            Outcome::AlreadyDone { first_result, .. } => Some(first_result.as_ref()),
            _ => None,
        }
    }

    fn later(&self) -> bool {
        matches!(self, Outcome::NotYet { .. })
    }
}

impl<T: PartialEq + Debug + Serialize, S: Debug> Answer for crate::Creation<T, S> {
    type Result = T;

    fn applied(&self) -> Option<&T> {
        match self {
            crate::Creation::Created(result) => Some(result),
            _ => None,
        }
    }

    fn into_applied(self) -> Option<T> {
        match self {
            crate::Creation::Created(result) => Some(result),
            _ => None,
        }
    }

    fn replayed(&self) -> Option<Option<&T>> {
        match self {
            crate::Creation::Duplicate { first_result, .. } => Some(first_result.as_ref()),
            _ => None,
        }
    }

    fn later(&self) -> bool {
        false
    }
}

impl<T: PartialEq + Debug + Serialize, R: Postponed + Debug> Answer for Delivery<T, R> {
    type Result = T;

    fn applied(&self) -> Option<&T> {
        match self {
            Delivery::Processed(result) => Some(result),
            _ => None,
        }
    }

    fn into_applied(self) -> Option<T> {
        match self {
            Delivery::Processed(result) => Some(result),
            _ => None,
        }
    }

    fn replayed(&self) -> Option<Option<&T>> {
        match self {
            Delivery::Duplicate { first_result } => Some(first_result.as_ref()),
            _ => None,
        }
    }

    fn later(&self) -> bool {
        match self {
            Delivery::InProgress { .. } => true,
            Delivery::Refused(refusal) => refusal.postponed(),
            _ => false,
        }
    }
}

/// What a [`Delivery::Refused`] carries, as [`Answer::later`] reads it: a plain message
/// handler refuses nothing; a transition's [`NotYet`](crate::Refusal::NotYet) is "later".
pub trait Postponed {
    /// Whether the refusal means "deliver again later".
    fn postponed(&self) -> bool;
}

impl Postponed for std::convert::Infallible {
    fn postponed(&self) -> bool {
        match *self {}
    }
}

impl<S> Postponed for crate::Refusal<S> {
    fn postponed(&self) -> bool {
        matches!(self, crate::Refusal::NotYet { .. })
    }
}

/// What [`assert_applied_once`] saw.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedOnce<T> {
    /// The result of the one call that applied.
    pub result: T,
    /// How many calls were duplicates answered with it.
    pub replays: usize,
    /// How many answers meant "later" and were asked again (an inbox's `InProgress`).
    pub retried: usize,
}

/// Runs `copies` calls of `call` at once (each in its own task, all released together)
/// and asserts that exactly one applied and every other is a duplicate replaying its
/// result (or nothing, when the result serializes to `null`). An answer that means "later"
/// ([`Answer::later`]) is asked again, as a broker would redeliver it, up to 200 times
/// 10 ms apart. Panics, listing every answer, on anything else: a second application, an
/// error, a refusal, a replay of another result.
///
/// `call` builds each call; clone what it needs into it (a pool is an `Arc`). Call this
/// from a multi-threaded runtime (`#[tokio::test(flavor = "multi_thread")]`) for real
/// parallelism, on a pool with several connections.
pub async fn assert_applied_once<F, Fut, A, E>(copies: usize, call: F) -> AppliedOnce<A::Result>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<A, E>> + Send + 'static,
    A: Answer + Send + 'static,
    E: Debug + Send + 'static,
{
    assert!(copies > 0, "assert_applied_once needs at least one copy");
    let mut answers: Vec<Option<Result<A, E>>> = (0..copies).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..copies).collect();
    let mut retried = 0;
    for round in 0..=RETRIES {
        if round > 0 {
            tokio::time::sleep(RETRY_PAUSE).await;
            retried += pending.len();
        }
        // Every call of a round waits for the others to be ready, then all go at once.
        let start = Arc::new(tokio::sync::Barrier::new(pending.len()));
        let tasks: Vec<_> = pending
            .iter()
            .map(|&i| {
                let (start, call) = (start.clone(), call());
                (
                    i,
                    tokio::spawn(async move {
                        start.wait().await;
                        call.await
                    }),
                )
            })
            .collect();
        let mut again = Vec::new();
        for (i, task) in tasks {
            let answer = task.await.expect("a call panicked");
            if matches!(&answer, Ok(a) if a.later()) && round < RETRIES {
                again.push(i);
            } else {
                answers[i] = Some(answer);
            }
        }
        pending = again;
        if pending.is_empty() {
            break;
        }
    }
    let answers: Vec<Result<A, E>> = answers.into_iter().flatten().collect();
    let listed = || format!("{answers:#?}");
    let answered: Vec<&A> = answers
        .iter()
        .map(|a| {
            a.as_ref()
                .unwrap_or_else(|e| panic!("a call failed: {e:?}; every answer: {}", listed()))
        })
        .collect();
    let applied = answered.iter().filter(|a| a.applied().is_some()).count();
    if applied != 1 {
        panic!(
            "{applied} of {copies} calls applied, where exactly one must; every answer: {}",
            listed()
        );
    }
    let result = answered
        .iter()
        .find_map(|a| a.applied())
        .expect("one applied");
    check_replays(result, answered.iter().copied(), &listed);
    let result = answers
        .into_iter()
        .flatten()
        .find_map(Answer::into_applied)
        .expect("one applied");
    AppliedOnce {
        result,
        replays: copies - 1,
        retried,
    }
}

/// Every answer but the applied one replays `result` (or nothing, if idem stores nothing
/// for it).
fn check_replays<'a, A: Answer + 'a>(
    result: &A::Result,
    answers: impl Iterator<Item = &'a A>,
    listed: &dyn Fn() -> String,
) {
    let stored = !matches!(serde_json::to_value(result), Ok(serde_json::Value::Null));
    for answer in answers {
        if answer.applied().is_some() {
            continue;
        }
        match answer.replayed() {
            Some(Some(replayed)) if replayed == result => {}
            Some(None) if !stored => {}
            _ => panic!(
                "a duplicate was not answered with the first result {result:?}: {answer:?}; every answer: {}",
                listed()
            ),
        }
    }
}

/// How many shuffled orders [`assert_shuffled`] runs, and from which seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shuffles {
    /// How many orders (each on a fresh context from `setup`).
    pub orders: usize,
    /// The seed of the first order; order `n` uses `seed + n`, so a failure names the seed
    /// that reproduces it.
    pub seed: u64,
}

impl Default for Shuffles {
    /// 20 orders from seed 0.
    fn default() -> Self {
        Shuffles {
            orders: 20,
            seed: 0,
        }
    }
}

/// Delivers `events` — a stream with its duplicates, as an at-least-once broker hands them
/// over — in [`Shuffles::orders`] shuffled orders, each to a fresh context (`setup`: a pool
/// on a fresh database, say), one at a time through `deliver`, and asserts, per
/// idempotency key (`key` of each event), exactly one application and every other delivery
/// answered with the first result. A delivery whose answer means "later" (an event that
/// overtook the one it depends on: [`Outcome::NotYet`], [`Delivery::InProgress`], a
/// refusal `NotYet`) goes to the back of the queue and is delivered again, as a broker
/// redelivers a nacked message; one that can never proceed fails the test. Panics, naming
/// the seed of the failing order and the order itself, on a second application, a replay
/// of another result, an error or a refusal.
///
/// Returns each order's context, to check the effects (one payment per order, …).
pub async fn assert_shuffled<Ev, K, C, S, SFut, D, DFut, A, E>(
    events: &[Ev],
    shuffles: Shuffles,
    mut setup: S,
    deliver: D,
    key: impl Fn(&Ev) -> K,
) -> Vec<C>
where
    Ev: Clone + Debug,
    K: Eq + Hash + Debug,
    C: Clone,
    S: FnMut() -> SFut,
    SFut: Future<Output = C>,
    D: Fn(C, Ev) -> DFut,
    DFut: Future<Output = Result<A, E>>,
    A: Answer,
    E: Debug,
{
    let mut contexts = Vec::with_capacity(shuffles.orders);
    for n in 0..shuffles.orders {
        let seed = shuffles.seed.wrapping_add(n as u64);
        let order = shuffled(events.len(), seed);
        let shown = || {
            let sequence: Vec<&Ev> = order.iter().map(|&i| &events[i]).collect();
            format!("order {n} (seed {seed}): {sequence:#?}")
        };
        let context = setup().await;
        let mut queue: std::collections::VecDeque<usize> = order.iter().copied().collect();
        let mut answers: std::collections::HashMap<K, Vec<A>> = std::collections::HashMap::new();
        let mut postponed_in_a_row = 0;
        while let Some(i) = queue.pop_front() {
            let event = &events[i];
            let answer = deliver(context.clone(), event.clone())
                .await
                .unwrap_or_else(|e| panic!("delivering {event:?} failed: {e:?}; in {}", shown()));
            if answer.later() {
                postponed_in_a_row += 1;
                if postponed_in_a_row > queue.len() + 1 {
                    panic!(
                        "{event:?} and the rest of the queue stay \"later\" ({answer:?}): nothing can proceed; in {}",
                        shown()
                    );
                }
                queue.push_back(i);
                continue;
            }
            postponed_in_a_row = 0;
            if answer.applied().is_none() && answer.replayed().is_none() {
                panic!(
                    "{event:?} was answered {answer:?}, neither applied nor a duplicate; in {}",
                    shown()
                );
            }
            answers.entry(key(event)).or_default().push(answer);
        }
        for (k, answered) in &answers {
            let listed = || format!("key {k:?}: {answered:#?}; in {}", shown());
            let applied: Vec<&A::Result> = answered.iter().filter_map(A::applied).collect();
            let [result] = applied.as_slice() else {
                panic!(
                    "{} deliveries applied, where exactly one must; {}",
                    applied.len(),
                    listed()
                );
            };
            check_replays(*result, answered.iter(), &listed);
        }
        contexts.push(context);
    }
    contexts
}

/// The indices `0..len` in the order of `seed` (Fisher–Yates over SplitMix64): the same
/// order for the same seed on every machine.
fn shuffled(len: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffles_are_permutations_fixed_by_their_seed() {
        let a = shuffled(50, 7);
        assert_eq!(a, shuffled(50, 7));
        assert_ne!(a, shuffled(50, 8));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(shuffled(0, 1), Vec::<usize>::new());
    }
}
