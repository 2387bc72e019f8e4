//! Idempotent creation: a handler with `create = "STATE"` makes the row itself, under a
//! business key the client supplies (`out_trade_no`, `request_id`), as the machine's entry
//! into an initial state. One atomic `INSERT … ON CONFLICT (key) DO NOTHING`, never
//! check-then-insert; when the key exists, one read tells a duplicate (the same values:
//! the first result replayed) from a conflict (other values: the first row stays, this
//! call is refused).

use crate::backend::{Backend, Param, Record, is_duplicate};
use crate::error::{Error, RowProblem};
use crate::fault::{FaultPoint, reached};
use crate::machine::reference::MachineRef;
use crate::transition::params::{Params, key_params};
use crate::transition::set::SetColumns;
use crate::transition::set::Setting;
use crate::transition::stage::{CallKey, Moved, checked_key, checked_key_text};
use crate::value::column::{ColumnProblem, ColumnValue};
use crate::value::key::{Key, KeyError};
use crate::work::observe::Labels;
use crate::work::statement::Storing;
use crate::work::stored::Fallible;
use crate::work::stored::{Codec, replay};
use crate::work::unit::{Entered, Entry, Kept, Plan};
use std::convert::Infallible;

/// What a creation did. `S` is the machine's state enum.
///
/// | variant | meaning | what the caller usually does |
/// |---|---|---|
/// | [`Created`](Creation::Created) | this call inserted the row, ran the body, and committed | 201 |
/// | [`Duplicate`](Creation::Duplicate) | a row has the key, with this call's values: the same request again | replay the first result (200) |
/// | [`Conflict`](Creation::Conflict) | a row has the key, with other values: another request under the same key | refuse it (422); the first row stays |
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a creation tells a retry from a conflict; match on it"]
pub enum Creation<T, S> {
    /// This call created the row; the body's result, committed with it.
    Created(T),
    /// The row exists with the values this call would have written: a retry of the
    /// creation.
    Duplicate {
        /// The row's state now (the workflow may have moved on since).
        current: S,
        /// The first creation's result, replayed; `None` when it stored none (a `null`
        /// result, or a row made outside idem).
        first_result: Option<T>,
    },
    /// The key is taken by a row with other values: the first stays, nothing was
    /// written by this call.
    Conflict {
        /// The row's state now.
        current: S,
    },
}

impl<T, S> Creation<T, S> {
    /// `true` only if this call created the row.
    pub fn is_created(&self) -> bool {
        matches!(self, Creation::Created(_))
    }

    /// `true` for [`Created`](Creation::Created) and [`Duplicate`](Creation::Duplicate):
    /// the row this call asked for exists.
    pub fn is_done(&self) -> bool {
        matches!(self, Creation::Created(_) | Creation::Duplicate { .. })
    }

    /// The creation's result: this call's, or the replayed first one.
    pub fn result(&self) -> Option<&T> {
        match self {
            Creation::Created(result) => Some(result),
            Creation::Duplicate { first_result, .. } => first_result.as_ref(),
            Creation::Conflict { .. } => None,
        }
    }

    /// The variant's name, for logs and metrics: `created`, `duplicate`, `conflict`.
    pub fn name(&self) -> &'static str {
        match self {
            Creation::Created(_) => "created",
            Creation::Duplicate { .. } => "duplicate",
            Creation::Conflict { .. } => "conflict",
        }
    }
}

/// What a creation handler (`create = "…"`) returns: `Result<Creation<T, M>, Error<E>>`
/// for a body returning `Result<T, E>`.
pub type Created<R, M> = Result<Creation<<R as Fallible>::Ok, M>, Error<<R as Fallible>::Err>>;

/// `params`, then the values of the columns the handler sets.
fn with_values<'a>(mut params: Params<'a>, values: &'a [ColumnValue]) -> Params<'a> {
    for value in values {
        params.push(Param::Column(value));
    }
    params
}

/// How many times a key that vanished between the INSERT and the read is tried again.
const VANISHED_ATTEMPTS: usize = 3;

/// The plan of a creation handler (generated code only).
pub struct CreationPlan<T, M> {
    machine: MachineRef<M>,
    codec: Codec<T>,
    state: &'static str,
    key: Result<Key, KeyError>,
    key_text: String,
    set: Option<Setting>,
}

impl<T, M> CreationPlan<T, M> {
    /// Creates the row `key` of `machine` in `state` (an initial state, checked at compile
    /// time).
    pub fn new(machine: MachineRef<M>, codec: Codec<T>, state: usize, key: CallKey) -> Self {
        let key = key.into_inner();
        let key_text = key.as_ref().map(Key::to_text).unwrap_or_default();
        CreationPlan {
            state: machine
                .definition
                .states
                .get(state)
                .copied()
                .unwrap_or_default(),
            machine,
            codec,
            key,
            key_text,
            set: None,
        }
    }

    /// The plan that also writes `columns` (one value per bound column, in order).
    pub fn set(
        mut self,
        columns: &'static SetColumns,
        values: Vec<Result<ColumnValue, ColumnProblem>>,
    ) -> Self {
        self.set = Some(Setting::new(columns, values));
        self
    }

    fn corrupt(&self, problem: RowProblem) -> Error<Infallible> {
        let definition = self.machine.definition;
        Error::CorruptRow {
            machine: definition.name,
            table: definition.table,
            key: self.key_text.clone(),
            problem,
        }
    }
}

/// What a creation's statements did.
enum Insertion<T, M> {
    /// The row is inserted (with its result, if the statement stored one).
    Inserted(Moved),
    /// The key was taken: the reply.
    Taken(Creation<T, M>),
}

impl<T, M> CreationPlan<T, M> {
    /// Inserts the row, or answers for the row that has the key. With `storing` (the
    /// result, known already) on PostgreSQL, one statement inserts the row and stores it.
    async fn create<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        storing: Option<&str>,
    ) -> Result<Insertion<T, M>, Error<Infallible>> {
        let definition = self.machine.definition;
        let key = checked_key(&self.key, definition)?;
        let dialect = DB::dialect(conn)?;
        let storing = storing.filter(|_| dialect.writes_in_cte());
        let (create, classify, create_storing, values): (&str, &str, &str, &[ColumnValue]) =
            match &self.set {
                Some(setting) => {
                    let sql = setting.columns.statements(dialect, definition);
                    let values = setting.check()?;
                    (
                        &sql.create,
                        &sql.classify_created,
                        &sql.create_storing,
                        values,
                    )
                }
                None => {
                    let sql = definition.sql.of(dialect);
                    (sql.create, sql.classify_created, sql.create_storing, &[])
                }
            };
        // The parameters of the classifying read, which PostgreSQL's storing statement
        // shares: the key, the empty `from`, the state, the machine, the key as text.
        let read = || {
            let mut read = Params::default();
            key_params(key, &mut read);
            for param in [
                Param::Text(""),
                Param::State(self.state),
                Param::Text(definition.id),
                Param::Text(&self.key_text),
            ] {
                read.push(param);
            }
            read
        };
        for _ in 0..VANISHED_ATTEMPTS {
            let mut moved =
                Moved::new(definition, ("", self.state), dialect, self.key_text.clone());
            let row = match storing {
                Some(json) => {
                    let mut params = read();
                    params.push(Param::Text(json));
                    let row = DB::fetch(conn, create_storing, &with_values(params, values))
                        .await?
                        .unwrap_or_default();
                    if row.int("applied_version").is_some() {
                        reached(FaultPoint::Transitioned);
                        moved.stored = true;
                        return Ok(Insertion::Inserted(moved));
                    }
                    row
                }
                None => {
                    let mut insert = Params::default();
                    key_params(key, &mut insert);
                    insert.push(Param::State(self.state));
                    // MySQL has no `ON CONFLICT (key) DO NOTHING`: a taken key fails with the
                    // duplicate-key error (only that statement), and so does a row another
                    // unique index of the table refuses, told apart by the read below.
                    let refused =
                        match DB::execute(conn, create, &with_values(insert, values)).await {
                            Ok(1) => {
                                reached(FaultPoint::Transitioned);
                                return Ok(Insertion::Inserted(moved));
                            }
                            Ok(_) => None,
                            Err(e) if dialect.refuses_taken_keys() && is_duplicate(&e) => Some(e),
                            Err(e) => return Err(e.into()),
                        };
                    // The key is taken: by this very creation before, or by another.
                    let row = DB::fetch(conn, classify, &with_values(read(), values))
                        .await?
                        .unwrap_or_default();
                    match refused {
                        Some(refused) if row.int("found").is_none_or(|n| n == 0) => {
                            return Err(refused.into());
                        }
                        _ => row,
                    }
                }
            };
            if let Some(reply) = self.answer(row)? {
                return Ok(Insertion::Taken(reply));
            }
            // Deleted between the INSERT and the read (or, on PostgreSQL, committed after
            // the storing statement's snapshot): insert again.
        }
        Err(self.corrupt(RowProblem::Unstable))
    }

    /// The reply for the row that has the key: a duplicate or a conflict; `None` if the
    /// read found no row.
    fn answer(&self, mut row: Record) -> Result<Option<Creation<T, M>>, Error<Infallible>> {
        if row.int("found").is_none_or(|n| n == 0) {
            return Ok(None);
        }
        let definition = self.machine.definition;
        let Some(state) = row.take_text("current_state") else {
            return Err(self.corrupt(RowProblem::NullState));
        };
        let Some(current) = definition.state_index(&state) else {
            return Err(self.corrupt(RowProblem::UnknownState(state)));
        };
        let current = (self.machine.from_index)(current);
        Ok(Some(if row.int("same_content") == Some(1) {
            Creation::Duplicate {
                current,
                first_result: replay(self.codec, row.take_text("first_result"))?,
            }
        } else {
            Creation::Conflict { current }
        }))
    }
}

impl<DB: Backend, T, M> Storing<DB> for CreationPlan<T, M> {
    const APPLIED: &'static str = "created";

    async fn enter_storing(
        &self,
        conn: &mut DB::Connection,
        result: Option<&str>,
        _: Entry,
    ) -> Result<Option<Creation<T, M>>, Error<Infallible>> {
        let moved = match self.create::<DB>(conn, result).await? {
            Insertion::Inserted(moved) => moved,
            Insertion::Taken(reply) => return Ok(Some(reply)),
        };
        if let (Some(json), false) = (result, moved.stored) {
            moved.store::<DB>(conn, json).await?;
        }
        Ok(None)
    }
}

impl<DB: Backend, T, M> Plan<DB> for CreationPlan<T, M> {
    type Value = T;
    type Reply = Creation<T, M>;
    type Kept = Moved;

    fn check(&self) -> Result<(), Error<Infallible>> {
        checked_key(&self.key, self.machine.definition)?;
        checked_key_text(&self.key_text)?;
        if let Some(set) = &self.set {
            set.check()?;
        }
        Ok(())
    }

    async fn enter(
        &self,
        conn: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Creation<T, M>, Moved>, Error<Infallible>> {
        Ok(match self.create::<DB>(conn, None).await? {
            Insertion::Inserted(moved) => Entered::Run(moved),
            Insertion::Taken(reply) => Entered::Done {
                reply,
                commit: false,
            },
        })
    }

    fn encode(&self, value: &T) -> Result<String, Error<Infallible>> {
        (self.codec.encode)(value).map_err(Error::Result)
    }

    fn applied(&self, value: T) -> Creation<T, M> {
        Creation::Created(value)
    }

    fn labels(&self) -> Labels<'_> {
        Labels {
            machine: Some(self.machine.definition.id),
            transition: Some(("", self.state)),
            group: None,
            key: self.key.is_ok().then_some(self.key_text.as_str()),
        }
    }

    fn outcome_name(reply: &Creation<T, M>) -> &'static str {
        reply.name()
    }
}
