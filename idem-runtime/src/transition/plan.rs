//! The plan of a transition handler: one stage, the transition, whose reply is an
//! [`Outcome`]; and [`run`], that plan without the macro.

use crate::backend::Backend;
use crate::error::Error;
use crate::machine::definition::Machine;
use crate::machine::reference::machine;
use crate::transition::declared::Transition;
use crate::transition::outcome::Outcome;
use crate::transition::stage::{CallKey, Moved, TransitionStage};
use crate::work::fast::CacheKey;
use crate::work::observe::Labels;
use crate::work::stored::{Codec, codec};
use crate::work::unit::{Begun, Entered, Entry, Kept, Plan, begin};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Pool, Transaction};
use std::convert::Infallible;

/// Runs `body` as the transition `transition` of the row `key`, at most once.
///
/// This is `#[idempotent]` without the macro: the same statements, the same outcomes.
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), idem::Error<sqlx::Error>> {
/// const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
/// let outcome: idem::Outcome<(), Order> = idem::run(&pool, PAY, idem::Key::Int(7).into(), None,
///     async |tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
///         sqlx::query("INSERT INTO payments (order_id) VALUES (7)").execute(&mut **tx).await?;
///         Ok::<_, sqlx::Error>(())
///     }).await?;
/// # let _ = outcome; Ok(()) }
/// ```
///
/// The future of a call through an async closure is not `Send` on rustc 1.95 (the
/// compiler cannot prove the closure general enough); to spawn calls, use `#[idempotent]`,
/// whose handlers are `Send`.
pub async fn run<M, DB, T, E, F>(
    pool: &Pool<DB>,
    transition: Transition,
    key: CallKey,
    expected_version: Option<i64>,
    body: F,
) -> Result<Outcome<T, M>, Error<E>>
where
    M: Machine,
    DB: Backend,
    T: Serialize + DeserializeOwned,
    F: AsyncFnOnce(&mut Transaction<'static, DB>) -> Result<T, E>,
{
    let plan = TransitionPlan::new(
        TransitionStage::new(machine::<M>(), transition, key, expected_version),
        codec::<Result<T, E>>(),
    );
    match begin(pool, &plan).await {
        Begun::Run(mut work) => {
            let held = work.held();
            let result = held.run_unwound(body(work.transaction())).await;
            work.finish_unwound(&plan, result).await
        }
        Begun::Done(done) => done.map_err(Error::widen),
    }
}

/// The plan of a transition handler: one stage, the transition; replies with an
/// [`Outcome`].
pub struct TransitionPlan<T, M> {
    stage: TransitionStage<M>,
    codec: Codec<T>,
}

impl<T, M> TransitionPlan<T, M> {
    /// The plan of one transition stage, whose result is stored with `codec`.
    pub fn new(stage: TransitionStage<M>, codec: Codec<T>) -> Self {
        TransitionPlan { stage, codec }
    }
}

impl<DB: Backend, T, M> Plan<DB> for TransitionPlan<T, M> {
    type Value = T;
    type Reply = Outcome<T, M>;
    type Kept = Moved;

    fn check(&self) -> Result<(), Error<Infallible>> {
        self.stage.check()
    }

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        entry: Entry,
    ) -> Result<Entered<Outcome<T, M>, Moved>, Error<Infallible>> {
        Ok(match self.stage.enter::<DB>(tx, entry).await? {
            Ok(moved) => Entered::Run(moved),
            Err(not_moved) => Entered::Done {
                reply: not_moved.into_outcome(self.codec)?,
                commit: false,
            },
        })
    }

    fn encode(&self, value: &T) -> Result<String, Error<Infallible>> {
        (self.codec.encode)(value).map_err(Error::Result)
    }

    fn applied(&self, value: T) -> Outcome<T, M> {
        Outcome::Applied(value)
    }

    fn labels(&self) -> Labels<'_> {
        self.stage.labels()
    }

    fn outcome_name(reply: &Outcome<T, M>) -> &'static str {
        reply.kind().as_str()
    }

    fn cache_key(&self) -> Option<CacheKey> {
        self.stage.cache_key()
    }

    fn cached_reply(&self, value: &str) -> Option<Outcome<T, M>> {
        // `null` is what the database does not store: it replays as no result.
        let first_result = match value {
            "null" => None,
            json => Some((self.codec.decode)(json).ok()?),
        };
        Some(Outcome::AlreadyDone {
            current: self.stage.target(),
            first_result,
        })
    }

    fn cache_value(&self, reply: &Outcome<T, M>) -> Option<String> {
        match reply {
            Outcome::Applied(result) => (self.codec.encode)(result).ok(),
            Outcome::AlreadyDone { first_result, .. } => match first_result {
                Some(result) => (self.codec.encode)(result).ok(),
                None => Some("null".to_owned()),
            },
            _ => None,
        }
    }

    fn cache_applied(&self, json: &str) -> Option<String> {
        Some(json.to_owned())
    }
}

impl<DB: Backend, T, M: Send> crate::work::statement::Storing<DB> for TransitionPlan<T, M> {
    const APPLIED: &'static str = "applied";

    async fn enter_storing(
        &self,
        conn: &mut DB::Connection,
        result: Option<&str>,
        entry: Entry,
    ) -> Result<Option<Outcome<T, M>>, Error<Infallible>> {
        Ok(
            match self.stage.enter_storing::<DB>(conn, result, entry).await? {
                Ok(moved) => {
                    if let (Some(json), false) = (result, moved.stored) {
                        moved.store::<DB>(conn, json).await?;
                    }
                    None
                }
                Err(not_moved) => Some(not_moved.into_outcome(self.codec)?),
            },
        )
    }
}
