//! The transition engine: one conditional UPDATE, the body, the stored result, one commit.

use crate::backend::{Backend, Dialect, Param, Record, WriterGuard, begin_write, is_conflict};
use crate::classification::MissRate;
use crate::classify::{Classified, Observed, classify};
use crate::error::{Error, RowProblem};
use crate::fault::{FaultPoint, reached};
use crate::glue::{Codec, MachineRef, codec, machine};
use crate::key::{Key, KeyError};
use crate::machine::Machine;
use crate::outcome::Outcome;
use crate::retry::Backoff;
use crate::stored::bounded;
use crate::transition::Transition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Pool, Transaction};

/// How many times a lost race is re-examined before idem gives up with
/// [`RowProblem::Unstable`]. One is enough on a database that keeps its promises.
const LOST_RACE_ATTEMPTS: usize = 3;

/// Runs `body` as the transition `transition` of the row `key`, at most once.
///
/// This is `#[idempotent]` without the macro: the same statements, the same outcomes.
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), idem::Error<sqlx::Error>> {
/// const PAY: idem::Transition = idem::Transition::new::<Order>("CREATED", "PAID");
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
    let (machine, codec) = (machine::<M>(), codec::<Result<T, E>>());
    match begin(machine, codec, pool, transition, key, expected_version).await {
        Begun::Apply(mut applying) => {
            let result = body(applying.transaction()).await;
            applying.finish(codec, result).await
        }
        Begun::Done(done) => done,
    }
}

/// The first half of a call: the transition attempted, and either the row moved (the body
/// must run now, in [`Applying::transaction`]) or the call is over.
#[doc(hidden)]
pub enum Begun<DB: Backend, T, E, M> {
    /// The conditional UPDATE moved the row; run the body, then [`Applying::finish`].
    Apply(Applying<DB>),
    /// Nothing to apply: a duplicate, an illegal state, … or an error. Already rolled back.
    Done(Result<Outcome<T, M>, Error<E>>),
}

/// A transition that moved its row, in an open transaction, waiting for the body's result.
/// Dropping it rolls everything back.
#[doc(hidden)]
pub struct Applying<DB: Backend> {
    tx: Transaction<'static, DB>,
    // Released after COMMIT or ROLLBACK, when `Applying` is dropped.
    _writer: Option<WriterGuard>,
    moved: Moved,
}

/// Begins a call: validates the key, opens the transaction and attempts the transition.
#[doc(hidden)]
pub async fn begin<M, DB: Backend, T, E>(
    machine: MachineRef<M>,
    codec: Codec<T>,
    pool: &Pool<DB>,
    transition: Transition,
    key: CallKey,
    expected_version: Option<i64>,
) -> Begun<DB, T, E, M> {
    match try_begin(machine, codec, pool, transition, key, expected_version).await {
        Ok(Ok(applying)) => Begun::Apply(applying),
        Ok(Err(outcome)) => Begun::Done(Ok(outcome)),
        Err(e) => Begun::Done(Err(e)),
    }
}

async fn try_begin<M, DB: Backend, T, E>(
    machine: MachineRef<M>,
    codec: Codec<T>,
    pool: &Pool<DB>,
    transition: Transition,
    key: CallKey,
    expected_version: Option<i64>,
) -> Result<Result<Applying<DB>, Outcome<T, M>>, Error<E>> {
    let key = key.0.map_err(Error::InvalidKey)?;
    let mut backoff = Backoff::default();
    loop {
        let attempt = async {
            let (mut tx, writer) = begin_write(pool).await?;
            let step = attempt_in::<M, DB, T, E>(
                &mut tx,
                machine,
                codec,
                transition,
                key.clone(),
                expected_version,
            )
            .await?;
            Ok::<_, Error<E>>((tx, writer, step))
        };
        match attempt.await {
            Ok((tx, writer, Step::Moved(moved))) => {
                return Ok(Ok(Applying {
                    tx,
                    _writer: writer,
                    moved,
                }));
            }
            Ok((tx, _writer, Step::Done(outcome))) => {
                tx.rollback().await?;
                return Ok(Err(outcome));
            }
            // Lost a conflict before the body ran: the transaction is gone (dropped, so
            // rolled back), nothing was applied, and a fresh one may win.
            Err(Error::Database(e)) if is_conflict(&e) => {
                if !backoff.wait().await {
                    return Err(Error::Contention {
                        attempts: backoff.attempts(),
                        last: e,
                    });
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// What the transition did in a transaction someone else owns.
#[doc(hidden)]
pub enum Step<T, M> {
    /// The row moved: run the body, then [`Moved::store`] its result.
    Moved(Moved),
    /// Nothing moved; the outcome. The caller decides what to do with its transaction.
    Done(Outcome<T, M>),
}

/// A transition that moved its row, waiting for the body's result to be stored.
#[doc(hidden)]
pub struct Moved {
    transition: Transition,
    dialect: Dialect,
    key: Key,
    key_text: String,
}

/// Attempts `transition` in `tx` (a transaction the caller owns and ends: the inbox's,
/// when a handler is both a consumer and a transition).
#[doc(hidden)]
pub async fn transition_in<M, DB: Backend, T, E>(
    tx: &mut Transaction<'static, DB>,
    machine: MachineRef<M>,
    codec: Codec<T>,
    transition: Transition,
    key: CallKey,
    expected_version: Option<i64>,
) -> Result<Step<T, M>, Error<E>> {
    let key = key.0.map_err(Error::InvalidKey)?;
    attempt_in::<M, DB, T, E>(tx, machine, codec, transition, key, expected_version).await
}

async fn attempt_in<M, DB: Backend, T, E>(
    conn: &mut DB::Connection,
    machine: MachineRef<M>,
    codec: Codec<T>,
    transition: Transition,
    key: Key,
    expected_version: Option<i64>,
) -> Result<Step<T, M>, Error<E>> {
    let moved = Moved {
        transition,
        dialect: DB::dialect(conn),
        key_text: key.to_text(),
        key,
    };
    let call = moved.call(expected_version);
    let misses = MissRate::of(&transition);
    let mut observed = attempt::<DB>(conn, &call, misses.inline()).await?;
    misses.record(observed.is_some());
    let mut asked_again = 0;
    loop {
        let Some(row) = observed else {
            reached(FaultPoint::Transitioned);
            return Ok(Step::Moved(moved));
        };
        let classified = classify(&transition, row, expected_version);
        if classified != Classified::LostRace {
            return outcome(machine, codec, &call, classified).map(Step::Done);
        }
        if asked_again == LOST_RACE_ATTEMPTS {
            return Err(corrupt(&call, RowProblem::Unstable));
        }
        // A concurrent transaction moved the row after this statement's snapshot: try
        // again with a fresh statement (and snapshot, under READ COMMITTED).
        asked_again += 1;
        observed = attempt::<DB>(conn, &call, misses.inline()).await?;
    }
}

impl Moved {
    fn call(&self, expected_version: Option<i64>) -> Call<'_> {
        Call {
            transition: &self.transition,
            dialect: self.dialect,
            key: &self.key,
            key_text: &self.key_text,
            expected_version,
        }
    }

    /// Stores the body's result with the transition (skipped if it serializes to `null`).
    pub async fn store<DB: Backend, T, E>(
        &self,
        tx: &mut Transaction<'static, DB>,
        codec: Codec<T>,
        result: &T,
    ) -> Result<(), Error<E>> {
        let json = bounded((codec.encode)(result).map_err(Error::Result)?)?;
        // A result that serializes to `null` (`()`, `None`) replays without storage.
        if json != "null" {
            store_result::<DB>(tx, &self.call(None), &json).await?;
        }
        Ok(())
    }
}

impl<DB: Backend> Applying<DB> {
    /// The transaction the body runs in.
    pub fn transaction(&mut self) -> &mut Transaction<'static, DB> {
        &mut self.tx
    }

    /// Ends the call with the body's result: stores it and commits, or rolls back on error.
    pub async fn finish<T, E, M>(
        mut self,
        codec: Codec<T>,
        result: Result<T, E>,
    ) -> Result<Outcome<T, M>, Error<E>> {
        let result = match result {
            Ok(result) => result,
            Err(e) => {
                // The connection may be gone; the handler's error is the one to report,
                // and an unfinished transaction is rolled back by the server anyway.
                let _ = self.tx.rollback().await;
                return Err(Error::Handler(e));
            }
        };
        reached(FaultPoint::BodyDone);
        self.moved.store(&mut self.tx, codec, &result).await?;
        self.tx.commit().await?;
        reached(FaultPoint::Committed);
        Ok(Outcome::Applied(result))
    }
}

/// The key of a call, validated (or refused) before any statement runs.
#[derive(Debug)]
pub struct CallKey(Result<Key, KeyError>);

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

struct Call<'a> {
    transition: &'a Transition,
    dialect: Dialect,
    key: &'a Key,
    key_text: &'a str,
    expected_version: Option<i64>,
}

impl Call<'_> {
    fn key_param(&self) -> Param<'_> {
        match self.key {
            Key::Int(n) => Param::Int(*n),
            Key::Text(s) => Param::Text(s),
        }
    }
}

/// Attempts the conditional UPDATE. `None`: applied. `Some`: not applied, and what the
/// row looks like — from the same statement (PostgreSQL, `inline`) or from a second one.
async fn attempt<DB: Backend>(
    conn: &mut DB::Connection,
    call: &Call<'_>,
    inline: bool,
) -> Result<Option<Observed>, sqlx::Error> {
    let t = call.transition;
    let sql = call.dialect.statements(t.definition);
    let (key, from, to) = (
        call.key_param(),
        Param::Text(t.from_name()),
        Param::Text(t.to_name()),
    );
    let (machine, key_text) = (Param::Text(t.definition.name), Param::Text(call.key_text));
    if inline && call.dialect == Dialect::Postgres {
        let columns = match call.expected_version {
            None => {
                let params = [key, from, to, machine, key_text];
                DB::fetch(conn, sql.transition, &params).await?
            }
            Some(v) => {
                let params = [key, from, to, machine, key_text, Param::Int(v)];
                DB::fetch(conn, sql.transition_guarded, &params).await?
            }
        };
        let record = columns.unwrap_or_default();
        return Ok(record
            .int("applied_version")
            .is_none()
            .then(|| observed(record)));
    }
    let updated = match call.expected_version {
        None => DB::execute(conn, sql.update, &[key, from, to]).await?,
        Some(v) => {
            let params = [key, from, to, Param::Int(v)];
            DB::execute(conn, sql.update_guarded, &params).await?
        }
    };
    if updated > 0 {
        return Ok(None);
    }
    let params = [key, from, to, machine, key_text];
    let columns = DB::fetch(conn, sql.classify, &params).await?;
    Ok(Some(observed(columns.unwrap_or_default())))
}

async fn store_result<DB: Backend>(
    conn: &mut DB::Connection,
    call: &Call<'_>,
    json: &str,
) -> Result<(), sqlx::Error> {
    let t = call.transition;
    let sql = call.dialect.statements(t.definition).store_result;
    let params = [
        Param::Text(t.definition.name),
        Param::Text(call.key_text),
        Param::Text(t.from_name()),
        Param::Text(t.to_name()),
        Param::Text(json),
    ];
    DB::execute(conn, sql, &params).await.map(drop)
}

fn observed(mut record: Record) -> Observed {
    Observed {
        found: record.int("found").is_some_and(|n| n != 0),
        state: record.take_text("current_state"),
        version: record.int("current_version"),
        first_result: record.take_text("first_result"),
    }
}

fn outcome<T, M, E>(
    machine: MachineRef<M>,
    codec: Codec<T>,
    call: &Call<'_>,
    classified: Classified,
) -> Result<Outcome<T, M>, Error<E>> {
    let state = machine.from_index;
    let t = call.transition;
    Ok(match classified {
        Classified::AlreadyDone {
            current,
            first_result,
        } => Outcome::AlreadyDone {
            current: state(current),
            first_result: replay(codec, first_result)?,
        },
        Classified::IllegalState { current } => Outcome::IllegalState {
            current: state(current),
            from: state(t.from),
            to: state(t.to),
        },
        Classified::NotFound => Outcome::NotFound,
        Classified::StaleVersion { expected, actual } => Outcome::StaleVersion { expected, actual },
        Classified::Corrupt(problem) => return Err(corrupt(call, problem)),
        Classified::LostRace => return Err(corrupt(call, RowProblem::Unstable)),
    })
}

/// The first result, decoded. Nothing stored means the result serialized to `null`, so a
/// type that accepts `null` (`()`, `Option`) replays that; any other type gets `None`.
fn replay<T, E>(codec: Codec<T>, stored: Option<String>) -> Result<Option<T>, Error<E>> {
    match stored {
        Some(json) => (codec.decode)(&json).map(Some).map_err(Error::Result),
        None => Ok((codec.decode)("null").ok()),
    }
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
