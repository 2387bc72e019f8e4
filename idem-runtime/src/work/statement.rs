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
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::work::fast::{CacheKey, Fast};
use crate::work::observe::Labels;
use crate::work::source::Origin;
use crate::work::stored::bounded;
use crate::work::unit::{Entered, Entry, Plan, no_body, stages_only_at};
use core::future::Future;
use std::convert::Infallible;
use tracing::Instrument;

/// A plan the one-statement form runs: a transition or a creation whose stage moves (or
/// creates) the row and stores a result already known with it.
pub trait Storing<DB: Backend>: Plan<DB> {
    /// The name of the reply when the row moved, for the span and the counters.
    const APPLIED: &'static str;

    /// Moves (or creates) the row and stores `result` (JSON; `None`: nothing to store)
    /// with it, on PostgreSQL in the same statement; `None` when it did, else the reply.
    fn enter_storing<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        result: Option<&'a str>,
        entry: Entry,
    ) -> impl Future<Output = Result<Option<Self::Reply>, Error<Infallible>>> + Send + 'a;
}

/// Runs a handler in the one-statement form (generated code only): checks the call, runs
/// `body`, then moves (or creates) the row and stores the body's result in one unit of work.
pub async fn statement<'c, DB, P, E, F>(
    origin: Origin<'c, DB>,
    plan: P,
    body: F,
) -> Result<P::Reply, Error<E>>
where
    DB: Backend,
    P: Storing<DB>,
    F: Future<Output = Result<P::Value, E>>,
{
    plan.check().map_err(Error::widen)?;
    // A duplicate answered from the cache before the body runs (its body would only
    // decide a result nobody stores).
    if let Origin::Pool(pool) = &origin
        && let Some(reply) = answered_from_cache(pool, &plan).await
    {
        return Ok(reply);
    }
    let value = body.await.map_err(Error::Handler)?;
    let json = plan
        .encode(&value)
        .and_then(bounded)
        .map_err(Error::widen)?;
    // A result that serializes to `null` (`()`, `None`) replays without storage.
    let stored = (json != "null").then_some(json);
    let once = StatementPlan {
        plan: &plan,
        result: stored.as_deref(),
    };
    match stages_only_at(origin, &once).await {
        Ok(None) => {
            reached(FaultPoint::Committed);
            Ok(plan.applied(value))
        }
        Ok(Some(reply)) => Ok(reply),
        Err(e) => Err(e.widen()),
    }
}

/// The cache's answer to `plan`'s call from `pool`, if it has one (a span of its own, as
/// every unit of work has).
async fn answered_from_cache<DB: Backend, P: Plan<DB>>(
    pool: &sqlx::Pool<DB>,
    plan: &P,
) -> Option<P::Reply> {
    let fast = Fast::of(pool, plan);
    if !fast.is_on() {
        return None;
    }
    let labels = plan.labels();
    let span = labels.span();
    let reply = fast.answer(plan, &span).instrument(span.clone()).await?;
    plan.settled(&reply);
    labels.ended::<Infallible>(&span, Ok(P::outcome_name(&reply)));
    Some(reply)
}

/// What the name of a one-statement handler's pool means inside its body: nothing. The
/// body runs before any statement, outside any transaction, so it has no database to use
/// (take a transaction parameter instead, `&mut Transaction<'_, DB>`, for a body that
/// writes).
#[derive(Debug, Clone, Copy)]
pub struct NoDatabaseInTheBody;

/// A plan whose body already ran: its stage moves the row and stores `result`.
struct StatementPlan<'p, P> {
    plan: &'p P,
    /// The result to store, JSON; `None` for one that serializes to `null`.
    result: Option<&'p str>,
}

impl<DB: Backend, P: Storing<DB>> Plan<DB> for StatementPlan<'_, P> {
    type Value = Infallible;
    /// `None`: the row moved and its result is stored.
    type Reply = Option<P::Reply>;
    type Kept = ();

    fn autocommit(&self, dialect: Dialect) -> bool {
        // PostgreSQL stores the result in the statement that moves the row; SQLite needs a
        // second statement for it, so a transaction, unless there is nothing to store.
        dialect.writes_in_cte() || self.result.is_none()
    }

    async fn enter(
        &self,
        conn: &mut DB::Connection,
        entry: Entry,
    ) -> Result<Entered<Option<P::Reply>>, Error<Infallible>> {
        let reply = self.plan.enter_storing(conn, self.result, entry).await?;
        Ok(Entered::Done {
            commit: reply.is_none(),
            reply,
        })
    }

    no_body!(Option<P::Reply>);

    fn labels(&self) -> Labels<'_> {
        self.plan.labels()
    }

    fn outcome_name(reply: &Option<P::Reply>) -> &'static str {
        match reply {
            None => P::APPLIED,
            Some(reply) => P::outcome_name(reply),
        }
    }

    fn cache_key(&self) -> Option<CacheKey> {
        self.plan.cache_key()
    }

    /// Asked by [`statement`] before the body, not again.
    fn cache_reads(&self) -> bool {
        false
    }

    fn cache_value(&self, reply: &Option<P::Reply>) -> Option<String> {
        match reply {
            None => self.plan.cache_applied(self.result.unwrap_or("null")),
            Some(reply) => self.plan.cache_value(reply),
        }
    }
}
