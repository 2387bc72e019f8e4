//! Batches of deliveries: many messages in one transaction and one commit, each still
//! applied once ([`Inbox::batch`]).
//!
//! A batch is one unit of work whose stage records every message at once:
//!
//! 1. the copies of a message inside the batch are folded in memory (the first delivery of a
//!    key leads, the later ones are answered from what became of it);
//! 2. one multi-row insert records every message that has no record, one read classifies
//!    those that had one (duplicates, conflicts, dead, in progress; a failed one is retried,
//!    key by key, as a single delivery would);
//! 3. the handlers of the messages to process run one after the other in the transaction;
//! 4. one multi-row update stores their results, and the batch commits once; only then is
//!    anything counted or answered.
//!
//! The handlers first run without savepoints, which cost round trips on every message. If
//! one fails, that attempt is rolled back whole and the batch runs again with a savepoint
//! around each handler: a handler that fails there rolls back its own effects alone, and its
//! record keeps the failed attempt (FAILED, or DEAD once the inbox's attempts are spent), so
//! a poison message is parked after its last attempt without holding back its batch.

use super::counters::Counter;
use super::record::{self, Ended, Found, Stored};
use super::stage::{reset_lock_timeout, set_lock_timeout};
use super::{Delivery, Inbox, MessageKey, fingerprint, not_yet};
use crate::backend::{Backend, Param, Record, insert_unless_taken, is_conflict, is_lock_timeout};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::work::observe::Labels;
use crate::work::retry::Backoff;
use crate::work::stored::{Codec, bounded, codec, replay};
use crate::work::unit::{Begun, Entered, Entry, GaveUp, Kept, Plan, begin};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Pool, Transaction};
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A message handed to [`Inbox::batch`]: its key and its payload. Implement it for your
/// broker's message type (keeping its ack handle), or use a `(MessageKey, Vec<u8>)` pair.
pub trait Incoming: Sync {
    /// The message key (see [`MessageKey`]).
    fn key(&self) -> &MessageKey;
    /// The payload, whose digest tells a redelivery from a different message under the same
    /// key.
    fn payload(&self) -> &[u8];
}

impl Incoming for (MessageKey, Vec<u8>) {
    fn key(&self) -> &MessageKey {
        &self.0
    }

    fn payload(&self) -> &[u8] {
        &self.1
    }
}

impl Incoming for (MessageKey, &[u8]) {
    fn key(&self) -> &MessageKey {
        &self.0
    }

    fn payload(&self) -> &[u8] {
        self.1
    }
}

/// The future of a batch's handler for one message: `Box::pin(async move { … })`.
pub type BatchFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// What became of one message of a batch: settle it with the broker on
/// [`settles_with_ack`].
///
/// - `Ok(delivery)`: as for a single delivery ([`Delivery::should_ack`]); a message whose
///   handler failed on its last allowed attempt is [`Delivery::Dead`] (ack: it is parked);
/// - `Err(Error::Handler(e))`: its handler failed and its attempt is recorded; nack it
///   (with a delay), a redelivery tries again;
/// - `Err(_)` otherwise: its result could not be stored ([`Error::ResultTooLarge`],
///   [`Error::Result`]; recorded as a failed attempt like a handler's error) or its record
///   is corrupt ([`Error::CorruptRecord`], left alone); nack it.
pub type Settled<T, E> = Result<Delivery<T>, Error<E>>;

/// Whether to ack a message of a batch: `true` for a delivery that needs no more
/// deliveries ([`Delivery::should_ack`]), `false` for an error (nack it).
pub fn settles_with_ack<T, E>(settled: &Settled<T, E>) -> bool {
    settled.as_ref().is_ok_and(Delivery::should_ack)
}

/// The mark of a record this batch inserted (see `idem_sql::inbox::BATCH_INSERT`): no
/// lease is ever negative.
const MARK: i64 = -1;

/// The first delivery of a key in a batch, which stands for all of them.
struct Lead {
    key: MessageKey,
    fingerprint: String,
    /// Its position among the messages.
    first: usize,
}

/// Whether a batch keeps its messages' order when one fails ([`Inbox::batch_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// A failed message does not hold back the others (the broker redelivers it alone).
    Free,
    /// A failed message with attempts left holds back the messages after it (a log read
    /// in order: a Kafka partition).
    Kept,
}

/// The batch's messages, copies folded: the leads in key order (the order their records
/// are inserted in, so that two batches sharing keys lock them in the same order), and for
/// each message its lead and its fingerprint.
struct Folded {
    leads: Vec<Lead>,
    /// For each message: its lead's position in `leads`, and its own fingerprint.
    messages: Vec<(usize, String)>,
    /// The leads as the batch's statements take them: `[{"k": key, "f": fingerprint}, …]`.
    json: String,
}

impl Folded {
    /// Whether the batch's records carry its mark ([`MARK`]): a batch of one key records it
    /// with the single delivery's insert, which tells by itself whether it made the record,
    /// so its record needs no mark, and a result of `null` no statement.
    fn marks(&self) -> bool {
        self.leads.len() > 1
    }

    /// The leads' positions in the order of their first delivery.
    fn in_message_order(&self) -> Vec<usize> {
        let mut runs: Vec<usize> = (0..self.leads.len()).collect();
        runs.sort_by_key(|&n| self.leads[n].first);
        runs
    }

    fn of<M: Incoming>(messages: &[M]) -> Folded {
        let mut firsts: HashMap<&str, usize> = HashMap::with_capacity(messages.len());
        for (i, message) in messages.iter().enumerate() {
            firsts.entry(message.key().as_str()).or_insert(i);
        }
        let mut order: Vec<usize> = firsts.into_values().collect();
        order.sort_by(|&a, &b| messages[a].key().as_str().cmp(messages[b].key().as_str()));
        let fingerprints: Vec<String> = messages.iter().map(|m| fingerprint(m.payload())).collect();
        let leads: Vec<Lead> = order
            .iter()
            .map(|&i| Lead {
                key: messages[i].key().clone(),
                fingerprint: fingerprints[i].clone(),
                first: i,
            })
            .collect();
        let position: HashMap<&str, usize> = leads
            .iter()
            .enumerate()
            .map(|(n, lead)| (lead.key.as_str(), n))
            .collect();
        let folded_messages = messages
            .iter()
            .zip(fingerprints)
            .map(|(m, f)| (position[m.key().as_str()], f))
            .collect();
        let rows: Vec<KeyFingerprint<'_>> = leads
            .iter()
            .map(|lead| KeyFingerprint {
                k: lead.key.as_str(),
                f: &lead.fingerprint,
            })
            .collect();
        let json = serde_json::to_string(&rows).expect("strings serialize");
        Folded {
            leads,
            messages: folded_messages,
            json,
        }
    }
}

#[derive(Serialize)]
struct KeyFingerprint<'a> {
    k: &'a str,
    f: &'a str,
}

#[derive(Serialize)]
struct KeyResult<'a> {
    k: &'a str,
    r: Option<&'a str>,
}

/// How many bytes of results one statement carries at most: a quarter of MariaDB's default
/// `max_allowed_packet` (16 MiB), which bounds a statement with its parameters, whatever
/// the batch's size.
const RESULTS_PER_STATEMENT: usize = 4 << 20;

/// The results as [`BatchKept::store`] takes them: JSON arrays `[{"k": key, "r": result},
/// …]`, one a line (compact JSON holds no line break), each at most
/// [`RESULTS_PER_STATEMENT`] bytes unless a single result is longer.
fn chunked(results: &[KeyResult<'_>]) -> serde_json::Result<String> {
    let mut out = String::from("[");
    let mut chunk = 0;
    for result in results {
        let row = serde_json::to_string(result)?;
        if chunk > 0 && chunk + row.len() + 1 > RESULTS_PER_STATEMENT {
            out.push_str("]\n[");
            chunk = 0;
        } else if chunk > 0 {
            out.push(',');
        }
        chunk += row.len() + 1;
        out.push_str(&row);
    }
    out.push(']');
    Ok(out)
}

/// What the batch's stage found for a lead.
#[derive(Debug, Clone)]
pub(crate) enum Finding {
    /// Recorded for this attempt (`attempts` made, this one included): run its handler.
    Run { attempts: i64, takeover: bool },
    /// Recorded before and nothing to do: what became of it.
    Ended(Ended),
    /// Another delivery is working on it (or its record vanished meanwhile): nack.
    Busy,
}

impl Finding {
    /// Whether a lead found so is settled for good without running: not another
    /// delivery's (busy, in progress) and not corrupt.
    fn settles(&self) -> bool {
        match self {
            Finding::Run { .. } | Finding::Busy => false,
            Finding::Ended(ended) => !matches!(ended, Ended::InProgress { .. } | Ended::Corrupt(_)),
        }
    }
}

/// What the batch's stage found: for each lead, what to do, and the record it read (for the
/// copies whose payload differs from their lead's).
#[derive(Debug, Clone)]
pub(crate) struct Entries {
    found: Vec<Finding>,
    records: Vec<Option<(Stored, i64)>>,
}

/// The plan of one attempt at a batch: one stage (the records), then the handlers.
struct BatchPlan<'b> {
    inbox: &'b Inbox,
    folded: &'b Folded,
}

/// What the batch keeps until its commit: the statement storing its results, and how many
/// records it must reach.
pub(crate) struct BatchKept {
    group: String,
    entries: Entries,
    stored: AtomicU64,
}

impl Kept for BatchKept {
    /// Stores every processed message's result (`json`: lines of `[{"k": key, "r": result},
    /// …]`, see [`chunked`]) in one statement a line, which together must reach each of
    /// their records.
    async fn store<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        json: &str,
    ) -> Result<(), sqlx::Error> {
        let expected = self.stored.load(Ordering::Acquire);
        if expected == 0 {
            return Ok(());
        }
        let store = &DB::dialect(conn)?.inbox().batch_store;
        let mut reached = 0;
        for chunk in json.split('\n') {
            let params = [Param::Text(&self.group), Param::Text(chunk)];
            reached += DB::execute(conn, store, &params).await?;
        }
        if reached != expected {
            // Never commit a record still carrying the batch's mark.
            return Err(sqlx::Error::Protocol(format!(
                "idem: a batch's results reached {reached} of its {expected} records"
            )));
        }
        Ok(())
    }
}

impl<DB: Backend> Plan<DB> for BatchPlan<'_> {
    /// The results, as [`BatchKept::store`] takes them.
    type Value = String;
    /// `Some` when no message is left to process (the stage's findings), `None` once the
    /// handlers' results committed.
    type Reply = Option<Entries>;
    type Kept = BatchKept;

    fn patience(&self) -> Option<(Duration, GaveUp<Self, Self::Reply>)> {
        let gave_up: GaveUp<Self, Self::Reply> = |plan| Ok(Some(plan.busy()));
        self.inbox.lock_timeout.map(|patience| (patience, gave_up))
    }

    async fn enter(
        &self,
        conn: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Self::Reply, BatchKept>, Error<Infallible>> {
        let dialect = DB::dialect(conn)?;
        let set = set_lock_timeout::<DB>(conn, dialect, self.inbox.lock_timeout).await?;
        let entries = self.record::<DB>(conn).await;
        let proceeding =
            matches!(&entries, Ok(e) if e.found.iter().any(|f| matches!(f, Finding::Run { .. })));
        reset_lock_timeout::<DB>(conn, dialect, set, proceeding, entries.is_err()).await?;
        let entries = entries?;
        if !proceeding {
            return Ok(Entered::Done {
                reply: Some(entries),
                commit: false,
            });
        }
        reached(FaultPoint::Recorded);
        Ok(Entered::Run(BatchKept {
            group: self.inbox.group.clone(),
            entries,
            stored: AtomicU64::new(0),
        }))
    }

    fn encode(&self, value: &String) -> Result<String, Error<Infallible>> {
        Ok(value.clone())
    }

    /// Each result was bounded on its own; the batch's are not, together.
    fn encode_bounded(&self, value: &String) -> Result<String, Error<Infallible>> {
        Ok(value.clone())
    }

    fn applied(&self, _: String) -> Self::Reply {
        None
    }

    fn labels(&self) -> Labels<'_> {
        Labels {
            group: Some(&self.inbox.group),
            ..Labels::default()
        }
    }

    fn outcome_name(_: &Self::Reply) -> &'static str {
        "batch"
    }
}

impl BatchPlan<'_> {
    /// Every lead in progress: the batch could not take the writer's turn, or waited past
    /// the lock timeout.
    fn busy(&self) -> Entries {
        let n = self.folded.leads.len();
        Entries {
            found: vec![Finding::Busy; n],
            records: vec![None; n],
        }
    }

    /// The stage: records every lead without a record in one statement, classifies the rest
    /// with one read, and retries a failed one key by key.
    async fn record<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
    ) -> Result<Entries, Error<Infallible>> {
        let inbox = self.inbox;
        let sql = DB::dialect(conn)?.inbox();
        let leads = &self.folded.leads;
        let params = [
            Param::Text(&inbox.group),
            Param::Text(&self.folded.json),
            inbox.at(),
        ];
        let inserted = match leads.as_slice() {
            // One key: the single delivery's insert, no JSON to plan, no mark to clear.
            [lead] if !self.folded.marks() => {
                let dialect = DB::dialect(conn)?;
                let one = [
                    Param::Text(&inbox.group),
                    Param::Text(lead.key.as_str()),
                    Param::Text(&lead.fingerprint),
                    Param::Text(record::SUCCESS),
                    Param::Null,
                    inbox.at(),
                ];
                insert_unless_taken::<DB>(conn, dialect, &sql.insert, &one).await?
            }
            _ => DB::execute(conn, &sql.batch_insert, &params).await?,
        };
        let fresh = Finding::Run {
            attempts: 1,
            takeover: false,
        };
        let mut entries = Entries {
            found: vec![fresh; leads.len()],
            records: vec![None; leads.len()],
        };
        if inserted == leads.len() as u64 {
            return Ok(entries);
        }
        let rows = DB::fetch_all(conn, &sql.batch_select, &params).await?;
        let mut by_key: HashMap<String, Record> = HashMap::with_capacity(rows.len());
        for mut row in rows {
            if let Some(key) = row.take_text("message_key") {
                by_key.insert(key, row);
            }
        }
        for (n, lead) in leads.iter().enumerate() {
            let Some(mut row) = by_key.remove(lead.key.as_str()) else {
                // Not inserted, and no record: purged between the two statements. Left to
                // a redelivery rather than guessed at.
                entries.found[n] = Finding::Busy;
                continue;
            };
            if row.int("lease_until") == Some(MARK) {
                continue;
            }
            let (stored, now) = inbox.stored(&mut row, &lead.key)?;
            entries.found[n] = match record::classify(stored.clone(), &lead.fingerprint, now) {
                Found::Ended(ended) => Finding::Ended(ended),
                // Failed before, or its lease expired: read again, locked, and retried as a
                // single delivery would (rare: the plain read above settles the rest).
                Found::Retry { .. } => {
                    match inbox
                        .found_if_any::<DB>(conn, &lead.key, &lead.fingerprint)
                        .await?
                    {
                        Some(Found::Retry { attempts, takeover }) => {
                            if inbox.retry::<DB>(conn, &lead.key, attempts).await? {
                                Finding::Run {
                                    attempts: attempts + 1,
                                    takeover,
                                }
                            } else {
                                Finding::Busy
                            }
                        }
                        Some(Found::Ended(ended)) => Finding::Ended(ended),
                        None => Finding::Busy,
                    }
                }
            };
            entries.records[n] = Some((stored, now));
        }
        Ok(entries)
    }
}

/// What a lead's handler did in this attempt.
enum Ran<T, E> {
    /// Not run: the stage ended it.
    No,
    /// Its value, and its result as stored (`"null"`: nothing stored).
    Done(T, String),
    /// It failed (its effects rolled back to its savepoint), on attempt `attempts`; `dead`
    /// when that was the last allowed.
    Failed {
        error: Error<E>,
        text: String,
        attempts: i64,
        dead: bool,
    },
    /// It came early ([`not_yet`](super::not_yet)): its effects rolled back, its attempt
    /// not counted.
    NotYet(Error<E>),
}

impl Inbox {
    /// Delivers a batch of messages in one transaction and one commit, each message still
    /// applied once: for each message to process, `handler` runs in the batch's
    /// transaction; the answers come back in the order of `messages`, one per message, once
    /// the batch committed. Ack each message on [`settles_with_ack`], and only then.
    ///
    /// - The handlers run one after another in the order of `messages` (a message delivered
    ///   twice at its first delivery).
    /// - A message delivered twice in the batch is processed once; its other delivery is its
    ///   duplicate (or, with another payload, a conflict), as across batches.
    /// - Every message is recorded in one statement and every result stored in one more (one
    ///   per 4 MiB of results, so that no statement outgrows what MariaDB accepts), so a
    ///   batch costs a few round trips and one commit instead of several round trips and a
    ///   commit per message.
    /// - A message another delivery is working on, or whose record vanished between the
    ///   batch's statements (purged), is [`Delivery::InProgress`] (nack): its redelivery
    ///   finds out what became of it.
    /// - A handler that fails rolls back its own message alone: the batch runs again with a
    ///   savepoint around each handler (the handlers of the other messages run again too,
    ///   their first effects rolled back with the first attempt, so a handler's effects
    ///   must all be in this transaction, as for [`receive`](Self::receive)). The failed
    ///   message's record keeps the attempt, with the error's text: its answer is
    ///   `Err(Error::Handler(e))` (nack), and once the inbox's
    ///   [`max_attempts`](Self::max_attempts) are spent it is parked as
    ///   [`Delivery::Dead`] (ack) without holding back the rest of its batch. A handler
    ///   that panics fails the same way: the panic is caught, its message's attempt
    ///   recorded (the error's text says it panicked, and with what), its answer
    ///   `Err(Error::Panicked(message))`, and the rest of the batch commits.
    /// - A handler whose error is marked [`not_yet`] (the message came
    ///   early: it waits for another) fails the same way, but spends no attempt: its record
    ///   stays FAILED with the error's text and is never parked for it; nack it with a
    ///   delay.
    /// - A conflict lost at the commit (a serialization failure, a Galera certification
    ///   failure) runs the whole batch again, with bounded backoff. Any other failure of
    ///   the batch as a whole (a cut connection, a commit that failed) is the `Err` of this
    ///   call: nothing of the batch is acked, and a redelivery of its messages is applied
    ///   or absorbed as usual.
    /// - With a [`lock_timeout`](Self::lock_timeout), a batch that waits past it for a
    ///   message another delivery holds (or, on SQLite, for the writer's turn) ends with
    ///   every message [`Delivery::InProgress`] (nack with a delay), nothing committed.
    ///
    /// The handler is a closure returning a boxed future, which is `Send` (so the call can
    /// be spawned): `|tx, message| Box::pin(async move { … })`. It gets the message itself,
    /// so it may borrow from it; what else it uses it owns (clone a pool or a client into
    /// it).
    ///
    /// ```
    /// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem::inbox::{Inbox, MessageKey, settles_with_ack};
    ///
    /// idem::migrate(&pool).await?;
    /// sqlx::query("CREATE TABLE payments (order_id INTEGER NOT NULL)").execute(&pool).await?;
    /// let inbox = Inbox::new("billing")?;
    /// // What a broker's fetch returned: a message twice, as brokers do.
    /// let messages: Vec<(MessageKey, Vec<u8>)> = [41, 42, 41]
    ///     .into_iter()
    ///     .map(|order| (MessageKey::business(format!("order:{order}"), "paid").unwrap(), order.to_string().into_bytes()))
    ///     .collect();
    ///
    /// let settled = inbox
    ///     .batch(&pool, &messages, |tx, (_, payload)| {
    ///         Box::pin(async move {
    ///             let order: i64 = std::str::from_utf8(payload).unwrap().parse().unwrap();
    ///             sqlx::query("INSERT INTO payments (order_id) VALUES (?)")
    ///                 .bind(order)
    ///                 .execute(&mut **tx)
    ///                 .await?;
    ///             Ok::<_, sqlx::Error>(order)
    ///         })
    ///     })
    ///     .await?;
    /// assert!(settled.iter().all(settles_with_ack)); // ack every message now
    /// let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments").fetch_one(&pool).await?;
    /// assert_eq!(paid, 2);
    /// # Ok(()) }
    /// ```
    pub async fn batch<DB, M, T, E, F>(
        &self,
        pool: &Pool<DB>,
        messages: &[M],
        handler: F,
    ) -> Result<Vec<Settled<T, E>>, Error<Infallible>>
    where
        DB: Backend,
        M: Incoming,
        T: Serialize + DeserializeOwned + Send,
        E: fmt::Display + Send,
        F: for<'t> FnMut(&'t mut Transaction<'static, DB>, &'t M) -> BatchFuture<'t, T, E> + Send,
    {
        self.batch_in(pool, messages, handler, Order::Free).await
    }

    /// [`batch`](Self::batch), and with [`Order::Kept`], stopped at the first message that
    /// fails and still has attempts left: it and the messages before it are settled (the
    /// answers are a prefix of `messages`), the messages after it are not run, not
    /// recorded, not answered, so that they are delivered again after it, in their order.
    pub(crate) async fn batch_in<DB, M, T, E, F>(
        &self,
        pool: &Pool<DB>,
        messages: &[M],
        mut handler: F,
        order: Order,
    ) -> Result<Vec<Settled<T, E>>, Error<Infallible>>
    where
        DB: Backend,
        M: Incoming,
        T: Serialize + DeserializeOwned + Send,
        E: fmt::Display + Send,
        F: for<'t> FnMut(&'t mut Transaction<'static, DB>, &'t M) -> BatchFuture<'t, T, E> + Send,
    {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut folded = Folded::of(messages);
        let codec = codec::<Result<T, E>>();
        let mut savepoints = false;
        let mut backoff = Backoff::default();
        loop {
            let plan = BatchPlan {
                inbox: self,
                folded: &folded,
            };
            let mut work = match begin(pool, &plan).await {
                Begun::Run(work) => work,
                Begun::Done(Ok(Some(entries))) => {
                    return Ok(self.settle(&folded, &entries, Vec::new(), codec));
                }
                Begun::Done(Ok(None)) => {
                    return Err(Error::CorruptRecord {
                        group: self.group.clone(),
                        key: String::new(),
                        problem: "a batch ended before its handlers without its findings".into(),
                    });
                }
                Begun::Done(Err(Error::Database(e))) if is_lock_timeout(&e) => {
                    return Ok(self.settle(&folded, &plan.busy(), Vec::new(), codec));
                }
                Begun::Done(Err(e)) => return Err(e),
            };
            let entries = work.kept().entries.clone();
            // The handlers run in the order of the messages (a lead at its first delivery);
            // `ran` is kept in the leads' order, the records'.
            let mut ran: Vec<Option<Ran<T, E>>> = (0..folded.leads.len()).map(|_| None).collect();
            let mut failed = false;
            let mut cut = None;
            let runs = folded.in_message_order();
            for (step, &n) in runs.iter().enumerate() {
                let (lead, found) = (&folded.leads[n], &entries.found[n]);
                // Whether a message that needs another delivery here holds back the
                // messages after it (kept order, and messages after it to hold back).
                let holds_back = order == Order::Kept && step + 1 < runs.len();
                let Finding::Run { attempts, .. } = *found else {
                    if holds_back && !found.settles() {
                        // Another delivery holds it (a rebalance's overlap), or its record
                        // is corrupt: the messages after it wait for it.
                        cut = Some(lead.first + 1);
                        break;
                    }
                    ran[n] = Some(Ran::No);
                    continue;
                };
                if savepoints {
                    DB::execute_script(&mut **work.transaction(), idem_sql::inbox::BATCH_SAVEPOINT)
                        .await?;
                }
                let labels = Labels {
                    group: Some(&self.group),
                    key: Some(lead.key.as_str()),
                    ..Labels::default()
                };
                let held = work.held_as(&labels);
                let message = &messages[lead.first];
                // A handler that panics fails its own message, as one that returns an
                // error does: caught here, it is rolled back to its savepoint, counted and,
                // after the last attempt, parked.
                let result = held
                    .run_unwound(not_yet::watched(handler(work.transaction(), message)))
                    .await;
                let early = matches!(result, Ok((Err(_), true)));
                // A failure holds back the messages after it while it has attempts left;
                // a message that came early always has.
                let halts = holds_back && (early || attempts < self.max_attempts);
                let stored = match result.map(|(result, _)| result) {
                    Ok(Ok(value)) => (codec.encode)(&value)
                        .map_err(Error::Result)
                        .and_then(bounded)
                        .map(|json| (value, json)),
                    Ok(Err(e)) => Err(Error::Handler(e)),
                    Err(panicked) => {
                        tracing::error!(
                            key = lead.key.as_str(),
                            panic = panicked.message(),
                            "idem: a batch's handler panicked; its message failed this attempt"
                        );
                        Err(Error::Panicked(panicked.message().to_owned()))
                    }
                };
                match stored {
                    Ok((value, json)) => {
                        if savepoints {
                            DB::execute_script(
                                &mut **work.transaction(),
                                idem_sql::inbox::BATCH_RELEASE_SAVEPOINT,
                            )
                            .await?;
                        }
                        ran[n] = Some(Ran::Done(value, json));
                    }
                    Err(_) if halts => {
                        // This attempt goes, whole; the next covers the messages up to
                        // this one, each handler in a savepoint.
                        cut = Some(lead.first + 1);
                        break;
                    }
                    Err(_) if !savepoints => {
                        failed = true;
                        break;
                    }
                    Err(error) => {
                        DB::execute_script(
                            &mut **work.transaction(),
                            idem_sql::inbox::BATCH_ROLLBACK_TO_SAVEPOINT,
                        )
                        .await?;
                        let text = match &error {
                            Error::Handler(e) => e.to_string(),
                            Error::Panicked(message) => format!("the handler panicked: {message}"),
                            other => other.to_string(),
                        };
                        if early {
                            self.record_not_yet::<DB>(&mut **work.transaction(), &lead.key, &text)
                                .await?;
                            ran[n] = Some(Ran::NotYet(error));
                            continue;
                        }
                        let dead = attempts >= self.max_attempts;
                        self.record_failure::<DB>(
                            &mut **work.transaction(),
                            &lead.key,
                            &text,
                            dead,
                        )
                        .await?;
                        ran[n] = Some(Ran::Failed {
                            error,
                            text,
                            attempts,
                            dead,
                        });
                    }
                }
            }
            if let Some(cut) = cut {
                drop(work);
                folded = Folded::of(&messages[..cut]);
                savepoints = true;
                continue;
            }
            let ran: Vec<Ran<T, E>> = ran.into_iter().map(|r| r.unwrap_or(Ran::No)).collect();
            if failed {
                // A handler failed without a savepoint to roll back to: this attempt goes,
                // whole, and the next runs each handler in a savepoint.
                drop(work);
                savepoints = true;
                continue;
            }
            let results: Vec<KeyResult<'_>> = folded
                .leads
                .iter()
                .zip(&ran)
                .filter_map(|(lead, ran)| match ran {
                    Ran::Done(_, json) => Some(KeyResult {
                        k: lead.key.as_str(),
                        r: (json != "null").then_some(json.as_str()),
                    }),
                    _ => None,
                })
                // A record without the mark needs a statement only for a result.
                .filter(|result| folded.marks() || result.r.is_some())
                .collect();
            work.kept()
                .stored
                .store(results.len() as u64, Ordering::Release);
            let json = chunked(&results).map_err(Error::Result)?;
            match work.finish(&plan, Ok::<_, Infallible>(json)).await {
                Ok(_) => return Ok(self.settle(&folded, &entries, ran, codec)),
                Err(Error::Database(e)) if is_conflict(&e) => {
                    if !backoff.wait().await {
                        let attempts = backoff.attempts();
                        return Err(Error::Contention { attempts, last: e });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Records that a message of a batch came early ([`not_yet`](super::not_yet)), its
    /// handler's effects just rolled back: FAILED, this attempt not counted.
    async fn record_not_yet<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        why: &str,
    ) -> Result<(), Error<Infallible>> {
        let params = [
            Param::Text(&self.group),
            Param::Text(key.as_str()),
            Param::Text(why),
            self.at(),
        ];
        let not_yet = &DB::dialect(conn)?.inbox().batch_not_yet;
        DB::execute(conn, not_yet, &params).await?;
        Ok(())
    }

    /// Records a failed attempt of a message of a batch, whose handler's effects were just
    /// rolled back: FAILED, or DEAD when it was the last allowed.
    async fn record_failure<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &MessageKey,
        error: &str,
        dead: bool,
    ) -> Result<(), Error<Infallible>> {
        let status = if dead { record::DEAD } else { record::FAILED };
        let params = [
            Param::Text(&self.group),
            Param::Text(key.as_str()),
            Param::Text(status),
            Param::Text(error),
            self.at(),
        ];
        let fail = &DB::dialect(conn)?.inbox().batch_fail;
        DB::execute(conn, fail, &params).await?;
        Ok(())
    }

    /// The answers of a batch that ended (committed, or with nothing to commit), one per
    /// message in order, counted.
    fn settle<T, E>(
        &self,
        folded: &Folded,
        entries: &Entries,
        ran: Vec<Ran<T, E>>,
        codec: Codec<T>,
    ) -> Vec<Settled<T, E>> {
        // What each lead left, for its copies: its fingerprint's fate.
        let mut left: Vec<Left> = Vec::with_capacity(folded.leads.len());
        let mut answers: Vec<Option<Settled<T, E>>> =
            (0..folded.messages.len()).map(|_| None).collect();
        let mut ran = ran.into_iter();
        for (n, lead) in folded.leads.iter().enumerate() {
            let (answer, leaves) = match (&entries.found[n], ran.next().unwrap_or(Ran::No)) {
                (Finding::Run { takeover, .. }, Ran::Done(value, json)) => {
                    self.counters.add(Counter::Applied, 1);
                    if *takeover {
                        self.counters.add(Counter::Takeovers, 1);
                    }
                    let stored = (json != "null").then_some(json);
                    (Ok(Delivery::Processed(value)), Left::Done(stored))
                }
                (
                    Finding::Run { .. },
                    Ran::Failed {
                        error,
                        text,
                        attempts,
                        dead,
                    },
                ) => {
                    if dead {
                        self.counters.add(Counter::Dead, 1);
                        crate::work::observe::inbox_event(&self.group, "dead", 1);
                        let last_error = Some(text);
                        let dead = Delivery::Dead {
                            attempts,
                            last_error: last_error.clone(),
                        };
                        (Ok(dead), Left::Dead(attempts, last_error))
                    } else {
                        (Err(error), Left::Failed)
                    }
                }
                (Finding::Run { .. }, Ran::NotYet(error)) => {
                    self.counters.add(Counter::Refused, 1);
                    (Err(error), Left::Failed)
                }
                // Not run: a batch that ended before its handlers.
                (Finding::Run { .. }, Ran::No) | (Finding::Busy, _) => {
                    (Ok(self.in_progress(None)), Left::Busy)
                }
                (Finding::Ended(ended), _) => (
                    self.ended(codec, &lead.key, ended.clone()),
                    Left::Ended(ended.clone()),
                ),
            };
            answers[lead.first] = Some(answer);
            left.push(leaves);
        }
        for (i, (n, fingerprint)) in folded.messages.iter().enumerate() {
            if answers[i].is_some() {
                continue;
            }
            let lead = &folded.leads[*n];
            let same = *fingerprint == lead.fingerprint;
            let copy: Settled<T, E> = match &left[*n] {
                Left::Busy | Left::Failed if same => Ok(self.in_progress(None)),
                Left::Done(stored) if same => replay(codec, stored.clone())
                    .map(|first_result| Delivery::Duplicate { first_result }),
                Left::Dead(attempts, last_error) if same => Ok(Delivery::Dead {
                    attempts: *attempts,
                    last_error: last_error.clone(),
                }),
                Left::Ended(ended) if same => self.ended(codec, &lead.key, ended.clone()),
                // Another payload than its lead's: judged by the record as the batch found
                // it, if it found one; else by its lead's, which this batch wrote.
                Left::Ended(_) => match &entries.records[*n] {
                    Some((stored, now)) => {
                        match record::classify(stored.clone(), fingerprint, *now) {
                            Found::Ended(ended) => self.ended(codec, &lead.key, ended),
                            Found::Retry { .. } => Ok(self.in_progress(None)),
                        }
                    }
                    None => Ok(self.in_progress(None)),
                },
                Left::Busy => Ok(self.in_progress(None)),
                Left::Done(_) | Left::Failed | Left::Dead(..) => Ok(Delivery::Conflict),
            };
            answers[i] = Some(copy);
        }
        answers
            .into_iter()
            .map(|answer| {
                let answer = answer.expect("every message answered");
                if let Ok(delivery) = &answer {
                    self.count(delivery, false);
                }
                answer
            })
            .collect()
    }
}

/// What a lead left for the copies of its message in the batch.
enum Left {
    /// Processed, with its result as stored.
    Done(Option<String>),
    /// Failed; tried again on a redelivery.
    Failed,
    /// Parked after its last attempt.
    Dead(i64, Option<String>),
    /// Ended before this batch.
    Ended(Ended),
    /// In progress elsewhere.
    Busy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_stored_in_statements_of_bounded_size() {
        let big = "x".repeat(RESULTS_PER_STATEMENT / 3);
        let huge = "y".repeat(RESULTS_PER_STATEMENT + 10);
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let results: Vec<KeyResult<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| KeyResult {
                k,
                r: match i {
                    4 => Some(&huge),
                    7 => None,
                    i if i % 2 == 0 => Some(&big),
                    _ => Some("1"),
                },
            })
            .collect();
        let json = chunked(&results).unwrap();
        let lines: Vec<&str> = json.split('\n').collect();
        assert_eq!(lines.len(), 3, "the huge result in a statement of its own");
        let mut stored = Vec::new();
        for line in lines {
            let rows: Vec<serde_json::Value> = serde_json::from_str(line).unwrap();
            assert!(
                line.len() <= RESULTS_PER_STATEMENT + 1 || rows.len() == 1,
                "a statement of {} bytes and {} results",
                line.len(),
                rows.len()
            );
            stored.extend(rows);
        }
        let stored_keys: Vec<&str> = stored.iter().map(|r| r["k"].as_str().unwrap()).collect();
        assert_eq!(stored_keys, keys);
        assert_eq!(stored[4]["r"].as_str(), Some(huge.as_str()));
        assert!(stored[7]["r"].is_null());
        let one = [KeyResult {
            k: "k",
            r: Some("7"),
        }];
        assert_eq!(chunked(&one).unwrap(), r#"[{"k":"k","r":"7"}]"#);
    }
}
