//! The one-statement form: a handler without a transaction parameter.
//!
//! Its body cannot touch the database, so it runs first, before any statement: it decides
//! the result (or refuses the call with an error, and nothing is written). Then one unit of
//! work moves the row and stores that result together — on PostgreSQL in a single
//! autocommit statement (the transition's UPDATE with the result's INSERT as a second
//! data-modifying CTE, which also classifies a miss), on SQLite in autocommit when there is
//! nothing to store and otherwise in one `BEGIN IMMEDIATE` transaction (UPDATE, INSERT).
//! Inside a caller's transaction it is a savepoint, as for every handler.

use crate::backend::{Backend, Dialect};
use crate::engine::TransitionPlan;
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::observe::Labels;
use crate::outcome::Outcome;
use crate::stored::bounded;
use crate::work::{Entered, Origin, Plan, stages_only_at};
use core::future::Future;
use std::convert::Infallible;

/// Runs a handler in the one-statement form (generated code only): checks the call, runs
/// `body`, then moves the row and stores the body's result in one unit of work.
pub async fn statement<'c, DB, T, M, E, F>(
    origin: Origin<'c, DB>,
    plan: TransitionPlan<T, M>,
    body: F,
) -> Result<Outcome<T, M>, Error<E>>
where
    DB: Backend,
    M: Send,
    F: Future<Output = Result<T, E>>,
{
    <TransitionPlan<T, M> as Plan<DB>>::check(&plan).map_err(Error::widen)?;
    let value = body.await.map_err(Error::Handler)?;
    let json = <TransitionPlan<T, M> as Plan<DB>>::encode(&plan, &value)
        .and_then(bounded)
        .map_err(Error::widen)?;
    // A result that serializes to `null` (`()`, `None`) replays without storage.
    let stored = (json != "null").then_some(json);
    let plan = StatementPlan {
        plan: &plan,
        result: stored.as_deref(),
    };
    match stages_only_at(origin, &plan).await {
        Ok(Moved::Yes) => {
            reached(FaultPoint::Committed);
            Ok(Outcome::Applied(value))
        }
        Ok(Moved::No(outcome)) => Ok(outcome),
        Err(e) => Err(e.widen()),
    }
}

/// What the one statement did: moved the row (the caller has the result), or not.
enum Moved<T, M> {
    Yes,
    No(Outcome<T, M>),
}

/// A transition plan whose body already ran: its stage moves the row and stores `result`.
struct StatementPlan<'p, T, M> {
    plan: &'p TransitionPlan<T, M>,
    /// The result to store, JSON; `None` for one that serializes to `null`.
    result: Option<&'p str>,
}

impl<DB: Backend, T, M: Send> Plan<DB> for StatementPlan<'_, T, M> {
    type Value = Infallible;
    type Reply = Moved<T, M>;

    fn check(&self) -> Result<(), Error<Infallible>> {
        Ok(())
    }

    fn autocommit(&self, dialect: Dialect) -> bool {
        // PostgreSQL stores the result in the statement that moves the row; SQLite needs a
        // second statement for it, so a transaction, unless there is nothing to store.
        dialect == Dialect::Postgres || self.result.is_none()
    }

    async fn enter(
        &self,
        conn: &mut DB::Connection,
    ) -> Result<Entered<Moved<T, M>>, Error<Infallible>> {
        let stage = self.plan.stage();
        Ok(match stage.enter_storing::<DB>(conn, self.result).await? {
            Ok(moved) => {
                if let (Some(json), false) = (self.result, moved.stored) {
                    moved.store::<DB>(conn, json).await?;
                }
                Entered::Done {
                    reply: Moved::Yes,
                    commit: true,
                }
            }
            Err(not_moved) => Entered::Done {
                reply: Moved::No(not_moved.into_outcome(self.plan.codec())?),
                commit: false,
            },
        })
    }

    fn encode(&self, value: &Infallible) -> Result<String, Error<Infallible>> {
        match *value {}
    }

    fn applied(&self, value: Infallible) -> Moved<T, M> {
        match value {}
    }

    fn labels(&self) -> Labels<'_> {
        self.plan.stage().labels()
    }

    fn outcome_name(reply: &Moved<T, M>) -> &'static str {
        match reply {
            Moved::Yes => crate::outcome::OutcomeKind::Applied.as_str(),
            Moved::No(outcome) => outcome.kind().as_str(),
        }
    }
}
