//! Retention: one batch of a purge is a unit of work of its own (the writer's turn and the
//! inbox's lock timeout, the conflict retry, a span), so live deliveries interleave with a
//! long purge.

use super::Inbox;
use super::counters::Counter;
use crate::backend::{Backend, Param};
use crate::error::Error;
use crate::work::observe::Labels;
use crate::work::unit::{Entered, Entry, GaveUp, Plan, no_body};
use std::convert::Infallible;
use std::time::Duration;

/// Deletes at most `batch` finished records of the inbox's group last touched more than
/// `retention` milliseconds ago, by the database's clock (or the inbox's test clock).
pub(crate) struct PurgePlan<'a> {
    pub(crate) inbox: &'a Inbox,
    pub(crate) retention: i64,
    pub(crate) batch: i64,
}

/// How many records a batch deleted; `None` when it gave up waiting for the writer's turn
/// (the inbox's lock timeout), to be tried again.
pub(crate) type Purged = Option<u64>;

impl<DB: Backend> Plan<DB> for PurgePlan<'_> {
    // No body: a batch ends in its stage.
    type Value = Infallible;
    type Reply = Purged;
    type Kept = ();

    fn patience(&self) -> Option<(Duration, GaveUp<Self, Purged>)> {
        let gave_up: GaveUp<Self, Purged> = |_| Ok(None);
        self.inbox.lock_timeout.map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Purged>, Error<Infallible>> {
        let statement = DB::dialect(tx)?.inbox_purge();
        let params = [
            Param::Text(&self.inbox.group),
            self.inbox.at(),
            Param::Int(self.batch),
            Param::Int(self.retention),
        ];
        let deleted = DB::execute(tx, statement, &params).await?;
        Ok(Entered::Done {
            reply: Some(deleted),
            commit: true,
        })
    }

    no_body!(Purged);

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            ..Labels::default()
        }
    }

    fn outcome_name(reply: &Purged) -> &'static str {
        match reply {
            Some(_) => "purged",
            None => "busy",
        }
    }

    fn settled(&self, reply: &Purged) {
        if let Some(deleted) = reply {
            self.inbox.counters.add(Counter::Purged, *deleted);
        }
    }
}
