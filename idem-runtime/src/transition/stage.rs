//! The transition stage of a unit of work: one conditional UPDATE of one row; when it
//! matches nothing, what the row says (a duplicate, a refusal, an event older than the row);
//! and the row that moved, waiting for the body's result to be stored with it.

use crate::backend::{Backend, Dialect, Param, Record};
use crate::error::{Error, RowProblem};
use crate::fault::{FaultPoint, reached};
use crate::machine::definition::Definition;
use crate::machine::reference::MachineRef;
use crate::transition::classification::MissRate;
use crate::transition::classify::{Classified, Guard, Observed, classify};
use crate::transition::declared::Transition;
use crate::transition::outcome::{Outcome, Refusal};
use crate::transition::params::Call;
use crate::transition::set::{SetColumns, Setting};
use crate::value::column::{ColumnProblem, ColumnValue};
use crate::value::key::{Key, KeyError};
use crate::work::observe::Labels;
use crate::work::stored::{Codec, replay};
use crate::work::unit::Entry;
use crate::work::unit::Kept;
use std::convert::Infallible;

/// How many times a lost race is re-examined before idem gives up with
/// [`RowProblem::Unstable`]. One is enough on a database that keeps its promises.
const LOST_RACE_ATTEMPTS: usize = 3;

/// The transition stage of a unit of work: the conditional UPDATE of one row.
pub struct TransitionStage<M> {
    machine: MachineRef<M>,
    transition: Transition,
    key: Result<Key, KeyError>,
    key_text: String,
    expected_version: Option<i64>,
    /// An event's version (`watermark = "…"`), or the text of one that is none.
    watermark: Option<Result<i64, String>>,
    /// Where an event's first result is stored: the key's text and its version (`None`:
    /// under the key's text).
    event_key: Option<String>,
    set: Option<Setting>,
}

/// The call's key, if it is one for `definition`'s key columns.
pub(crate) fn checked_key<'k>(
    key: &'k Result<Key, KeyError>,
    definition: &Definition,
) -> Result<&'k Key, Error<Infallible>> {
    let key = key.as_ref().map_err(|e| Error::InvalidKey(e.clone()))?;
    let columns = definition.key_columns.len();
    let parts = key.parts().len();
    if parts != columns {
        return Err(Error::InvalidKey(KeyError::WrongArity { columns, parts }));
    }
    Ok(key)
}

/// `text`, the key as the results table stores it, if it fits there: checked before any
/// statement, on every backend alike, never left to the column (MySQL outside strict mode
/// truncates, and two keys would share one first result).
pub(crate) fn checked_key_text(text: &str) -> Result<(), Error<Infallible>> {
    if text.len() > crate::value::key::MAX_KEY_TEXT_LEN {
        return Err(Error::InvalidKey(KeyError::TextTooLong { len: text.len() }));
    }
    Ok(())
}

/// Why the transition stage did not move its row.
pub(crate) enum NotMoved<M> {
    /// A duplicate; the stored first result, if any (JSON).
    AlreadyDone {
        current: M,
        first_result: Option<String>,
    },
    /// Not yet, illegal, not found or stale.
    Refused(Refusal<M>),
    /// An event older than the row.
    Superseded {
        current: M,
        version: i64,
        event: i64,
    },
}

impl<M> NotMoved<M> {
    /// The outcome of a transition handler that did not move its row, the first result
    /// decoded.
    pub(crate) fn into_outcome<T>(
        self,
        codec: Codec<T>,
    ) -> Result<Outcome<T, M>, Error<Infallible>> {
        Ok(match self {
            NotMoved::AlreadyDone {
                current,
                first_result,
            } => Outcome::AlreadyDone {
                current,
                first_result: replay(codec, first_result)?,
            },
            NotMoved::Refused(refusal) => refusal.into_outcome(),
            NotMoved::Superseded {
                current,
                version,
                event,
            } => Outcome::Superseded {
                current,
                version,
                event,
            },
        })
    }
}

impl<M> TransitionStage<M> {
    /// The stage of transition `transition` of machine `machine` on the row `key`.
    pub fn new(
        machine: MachineRef<M>,
        transition: Transition,
        key: CallKey,
        expected_version: Option<i64>,
    ) -> Self {
        let key = key.0;
        let key_text = key.as_ref().map(Key::to_text).unwrap_or_default();
        TransitionStage {
            machine,
            transition,
            key,
            event_key: None,
            key_text,
            expected_version,
            watermark: None,
            set: None,
        }
    }

    /// The stage of an event of a stream: the row must be below the event's version
    /// `watermark`, and takes it (instead of an expected version and an increment). Its
    /// first result is stored under the key and the version, separated by U+001F (which
    /// no key contains).
    pub fn watermark(mut self, watermark: Result<i64, String>) -> Self {
        if let Ok(event) = &watermark {
            self.event_key = Some(format!("{}\u{1f}{event}", self.key_text));
        }
        self.watermark = Some(watermark);
        self
    }

    /// The key the first result is stored under.
    fn result_key(&self) -> &str {
        self.event_key.as_deref().unwrap_or(&self.key_text)
    }

    fn guard(&self) -> Guard {
        match (&self.watermark, self.expected_version) {
            (Some(Ok(event)), _) => Guard::Watermark(*event),
            (_, Some(expected)) => Guard::Expected(expected),
            _ => Guard::Any,
        }
    }

    /// The stage that also sets `columns` in the UPDATE, to `values` (one per bound
    /// column, in order).
    pub fn set(
        mut self,
        columns: &'static SetColumns,
        values: Vec<Result<ColumnValue, ColumnProblem>>,
    ) -> Self {
        self.set = Some(Setting::new(columns, values));
        self
    }

    pub(crate) fn check(&self) -> Result<(), Error<Infallible>> {
        checked_key(&self.key, self.transition.definition)?;
        if let Some(Err(value)) = &self.watermark {
            return Err(Error::InvalidWatermark {
                value: value.clone(),
            });
        }
        checked_key_text(self.result_key())?;
        if let Some(set) = &self.set {
            set.check()?;
        }
        Ok(())
    }

    /// The transition's target state: what a duplicate answered from the cache reports as
    /// its current state.
    pub(crate) fn target(&self) -> M {
        (self.machine.from_index)(self.transition.to)
    }

    /// The key of the first result in the fast path: the machine, the states and the key.
    /// `None` for an event of a stream (`watermark`): once a later event moved the row,
    /// the database calls a redelivery of an earlier one `Superseded`, which the cache
    /// cannot know.
    pub(crate) fn cache_key(&self) -> Option<crate::work::fast::CacheKey> {
        if self.watermark.is_some() || self.key.is_err() {
            return None;
        }
        let t = &self.transition;
        Some(crate::work::fast::CacheKey::new(
            "transition",
            &[t.definition.id, t.from_name(), t.to_name(), &self.key_text],
        ))
    }

    /// The machine, the transition and the key, for the call's span and counters.
    pub(crate) fn labels(&self) -> Labels<'_> {
        let t = &self.transition;
        Labels {
            machine: Some(t.definition.id),
            transition: Some((t.from_name(), t.to_name())),
            group: None,
            key: self.key.is_ok().then_some(self.key_text.as_str()),
        }
    }

    /// Attempts the transition in `conn`, at `entry`: the row moved, or why not.
    pub(crate) async fn enter<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        entry: Entry,
    ) -> Result<Result<Moved, NotMoved<M>>, Error<Infallible>> {
        self.enter_storing::<DB>(conn, None, entry).await
    }

    /// [`enter`](Self::enter), with the first result already known (`storing`, JSON, not
    /// `null`): on PostgreSQL the statement that moves the row stores it too
    /// ([`Moved::stored`]); elsewhere it is left to [`Moved::store`].
    pub(crate) async fn enter_storing<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        storing: Option<&str>,
        entry: Entry,
    ) -> Result<Result<Moved, NotMoved<M>>, Error<Infallible>> {
        let key = self
            .key
            .as_ref()
            .map_err(|e| Error::InvalidKey(e.clone()))?;
        let transition = self.transition;
        let dialect = DB::dialect(conn)?;
        let set = match &self.set {
            None => None,
            Some(setting) => Some((
                setting.columns.statements(dialect, transition.definition),
                setting.check()?,
            )),
        };
        let storing = storing.filter(|_| dialect.writes_in_cte());
        let call = Call {
            transition: &transition,
            dialect,
            key,
            key_text: &self.key_text,
            result_key: self.result_key(),
            guard: self.guard(),
            set,
            storing,
        };
        let misses = MissRate::of(&transition);
        // A read that is the transaction's first needs no lock to see what the UPDATE saw
        // (see `Statements::classify_unlocked`); any later one does.
        let unlocked = entry == Entry::Fresh;
        let mut observed = attempt::<DB>(conn, &call, misses.inline(), unlocked).await?;
        misses.record(observed.is_some());
        let mut asked_again = 0;
        loop {
            let Some(row) = observed else {
                reached(FaultPoint::Transitioned);
                let mut moved = Moved::new(
                    transition.definition,
                    (transition.from_name(), transition.to_name()),
                    call.dialect,
                    self.result_key().to_owned(),
                );
                moved.stored = storing.is_some();
                return Ok(Ok(moved));
            };
            let classified = classify(&transition, row, call.guard);
            if classified != Classified::LostRace {
                return not_moved(self.machine, &call, classified).map(Err);
            }
            if asked_again == LOST_RACE_ATTEMPTS {
                return Err(corrupt(&call, RowProblem::Unstable));
            }
            // A concurrent transaction moved the row after this statement's snapshot: try
            // again with a fresh statement (and snapshot, under READ COMMITTED).
            asked_again += 1;
            observed = attempt::<DB>(conn, &call, misses.inline(), false).await?;
        }
    }
}

/// A transition that moved its row, waiting for the body's result to be stored.
pub struct Moved {
    definition: &'static Definition,
    /// The states the first result is stored under: the transition's (a creation's
    /// `from` is the empty string).
    from: &'static str,
    to: &'static str,
    dialect: Dialect,
    key_text: String,
    /// The statement that moved the row stored the first result too.
    pub(crate) stored: bool,
}

impl Moved {
    /// A row moved (or created) by `from → to`, its result to be stored under `key_text`.
    pub(crate) fn new(
        definition: &'static Definition,
        (from, to): (&'static str, &'static str),
        dialect: Dialect,
        key_text: String,
    ) -> Self {
        Moved {
            definition,
            from,
            to,
            dialect,
            key_text,
            stored: false,
        }
    }
}

impl Kept for Moved {
    /// Stores the body's result (JSON, not `null`) as the transition's first result.
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        let sql = self.definition.sql.of(self.dialect).store_result;
        let params = [
            Param::Text(self.definition.id),
            Param::Text(&self.key_text),
            Param::Text(self.from),
            Param::Text(self.to),
            Param::Text(json),
        ];
        DB::execute(conn, sql, &params).await.map(drop)
    }
}

/// The key of a call, validated (or refused) before any statement runs.
#[derive(Debug)]
pub struct CallKey(Result<Key, KeyError>);

impl CallKey {
    pub(crate) fn into_inner(self) -> Result<Key, KeyError> {
        self.0
    }
}

impl From<Key> for CallKey {
    fn from(key: Key) -> Self {
        CallKey(Ok(key))
    }
}

impl From<Result<Key, KeyError>> for CallKey {
    fn from(key: Result<Key, KeyError>) -> Self {
        CallKey(key)
    }
}

/// Attempts the conditional UPDATE. `None`: applied. `Some`: not applied, and what the
/// row looks like — from the same statement (PostgreSQL, `inline`) or from a second one.
async fn attempt<DB: Backend>(
    conn: &mut DB::Connection,
    call: &Call<'_>,
    inline: bool,
    unlocked: bool,
) -> Result<Option<Observed>, sqlx::Error> {
    let t = call.transition;
    let sql = t.definition.sql.of(call.dialect);
    let updates = call.updates();
    let (from, to) = (Param::State(t.from_name()), Param::State(t.to_name()));
    let (machine, key_text) = (Param::Text(t.definition.id), Param::Text(call.result_key));
    if let Some(json) = call.storing {
        // PostgreSQL only (see `enter_storing`): the result rides in the statement.
        let params = call.update_params(&[from, to, machine, key_text, Param::Text(json)]);
        return classified::<DB>(conn, updates.storing(call.guard), &params).await;
    }
    if inline && call.dialect.writes_in_cte() {
        let params = call.update_params(&[from, to, machine, key_text]);
        return classified::<DB>(conn, updates.transition(call.guard), &params).await;
    }
    let params = call.update_params(&[from, to]);
    let updated = DB::execute(conn, updates.update(call.guard), &params).await?;
    if updated > 0 {
        return Ok(None);
    }
    let params = call.params(&[from, to, machine, key_text]);
    let classify = if unlocked {
        sql.classify_unlocked
    } else {
        sql.classify
    };
    let columns = DB::fetch(conn, classify, &params).await?;
    Ok(Some(observed(columns.unwrap_or_default())))
}

/// Runs one of PostgreSQL's statements that attempt the transition and classify a miss:
/// `None` if it moved the row, else what the row looks like.
async fn classified<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Option<Observed>, sqlx::Error> {
    let record = DB::fetch(conn, sql, params).await?.unwrap_or_default();
    Ok(record
        .int("applied_version")
        .is_none()
        .then(|| observed(record)))
}

fn observed(mut record: Record) -> Observed {
    Observed {
        found: record.int("found").is_some_and(|n| n != 0),
        state: record.take_text("current_state"),
        version: record.int("current_version"),
        first_result: record.take_text("first_result"),
    }
}

fn not_moved<M>(
    machine: MachineRef<M>,
    call: &Call<'_>,
    classified: Classified,
) -> Result<NotMoved<M>, Error<Infallible>> {
    let state = machine.from_index;
    let t = call.transition;
    Ok(match classified {
        Classified::AlreadyDone {
            current,
            first_result,
        } => NotMoved::AlreadyDone {
            current: state(current),
            first_result,
        },
        Classified::NotYet { current } => NotMoved::Refused(Refusal::NotYet {
            current: state(current),
            from: state(t.from),
            to: state(t.to),
        }),
        Classified::IllegalState { current } => NotMoved::Refused(Refusal::IllegalState {
            current: state(current),
            from: state(t.from),
            to: state(t.to),
        }),
        Classified::NotFound => NotMoved::Refused(Refusal::NotFound),
        Classified::StaleVersion { expected, actual } => {
            NotMoved::Refused(Refusal::StaleVersion { expected, actual })
        }
        Classified::Superseded { current, version } => NotMoved::Superseded {
            current: state(current),
            version,
            event: match call.guard {
                Guard::Watermark(event) => event,
                _ => version,
            },
        },
        Classified::Corrupt(problem) => return Err(corrupt(call, problem)),
        Classified::LostRace => return Err(corrupt(call, RowProblem::Unstable)),
    })
}

fn corrupt<E>(call: &Call<'_>, problem: RowProblem) -> Error<E> {
    let definition = call.transition.definition;
    Error::CorruptRow {
        machine: definition.name,
        table: definition.table,
        key: call.key_text.to_owned(),
        problem,
    }
}
