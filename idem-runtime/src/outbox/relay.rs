//! The relay: claims staged messages, publishes them, and marks each one published once the
//! broker acknowledged it.

#[cfg(feature = "metrics")]
use super::Backlog;
use crate::backend::{Backend, Dialect, Param, Record};
use crate::error::Error;
use crate::fault::{FaultPoint, reached};
use crate::work::observe::Labels;
use crate::work::unit::{Begun, Entered, Entry, Kept, Plan, begin, no_body, stages_only};
use crate::work::unwind::unwound;
use idem_sql::outbox::Claim;
use sqlx::Pool;
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tracing::Instrument;
use tracing::field::Empty;

/// The largest [`Relay::batch_size`]: 10,000 messages.
pub const MAX_BATCH_SIZE: u32 = 10_000;

/// What a publisher's error is: anything that says what went wrong.
pub type PublishError = Box<dyn std::error::Error + Send + Sync>;

/// How the broker answered a message it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Acknowledged (a NATS PubAck, a RabbitMQ confirm).
    Acked,
    /// Acknowledged as a duplicate of a message the broker already has under this id
    /// (JetStream's dedup window): delivered before, so published.
    Duplicate,
}

/// Publishes one message to a broker and waits for its acknowledgement. idem ships NATS
/// JetStream's (feature `nats`) and RabbitMQ's (feature `rabbitmq`); implement it for
/// anything else (Kafka, a webhook).
///
/// Return `Ok` only once the broker holds the message: the relay then marks it published
/// and never sends it again. An error (or no answer within the relay's
/// [`publish_timeout`](Relay::publish_timeout)) is an attempt that failed: the message is
/// tried again later. The same message may be published more than once (a relay that dies
/// after the acknowledgement and before its mark): pass [`Outgoing::id`] on as the broker's
/// or the consumer's deduplication id.
///
/// ```
/// use idem::outbox::{Outgoing, PublishError, Published, Publisher};
///
/// /// Prints each message (a webhook would POST it, with the id as its Idempotency-Key).
/// struct Print;
///
/// impl Publisher for Print {
///     async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
///         println!("{} -> {}: {:?}", message.id(), message.destination(), message.payload());
///         Ok(Published::Acked)
///     }
/// }
/// ```
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `message`, and answers once the broker acknowledged it.
    fn publish(
        &self,
        message: &Outgoing,
    ) -> impl Future<Output = Result<Published, PublishError>> + Send;
}

/// A message a relay publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    seq: i64,
    id: String,
    ordering_key: String,
    destination: String,
    routing_key: String,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
    attempt: u32,
}

impl Outgoing {
    /// The message's id (deterministic: see [`EffectKey`](super::EffectKey)); publishers
    /// pass it on as the broker's message id (`Nats-Msg-Id`, AMQP `message_id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its ordering key.
    pub fn ordering_key(&self) -> &str {
        &self.ordering_key
    }

    /// The subject, or the exchange.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The routing key (empty for a subject).
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The headers it was staged with, in order.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Which attempt this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Its place in the outbox: later messages of its ordering key have higher ones.
    pub fn seq(&self) -> i64 {
        self.seq
    }
}

/// What one [`Relay::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relayed {
    /// Messages claimed (at most the batch size).
    pub claimed: usize,
    /// Published and marked.
    pub published: usize,
    /// Failed this attempt: to be tried again after a backoff, or dead (counted in
    /// [`dead`](Self::dead) too).
    pub failed: usize,
    /// Of the failed, those that failed their last allowed attempt: dead, holding back
    /// their ordering key.
    pub dead: usize,
}

/// Delivers the outbox: claims a batch of due messages, publishes them, and marks each one
/// published only after the broker acknowledged it. Several relays may run at once, in one
/// process or many.
///
/// - **Claim.** A batch holds the *head* of each ordering key: a message is claimed only
///   when no earlier message of its key is unpublished, so per key messages are published
///   in order, one at a time, whichever relay claims them. On PostgreSQL and MySQL the
///   claim is `SELECT … FOR UPDATE SKIP LOCKED` in a transaction the relay holds while it
///   publishes and marks (another relay passes over the locked heads); on SQLite, whose
///   one writer a relay must not hold while it waits for a broker, the claim is a lease
///   ([`claim_for`](Self::claim_for)) committed before publishing, the marks a second
///   transaction.
/// - **Publish.** The batch's messages (one per key) are published concurrently, each
///   within [`publish_timeout`](Self::publish_timeout).
/// - **Failures** back off exponentially with jitter, from
///   [`backoff`](Self::backoff)'s first delay up to its cap; after
///   [`max_attempts`](Self::max_attempts) a message is dead. A dead message **holds back
///   the rest of its ordering key** (publishing them would break the order promised), and
///   loudly: it is counted, listed by [`dead`](super::dead) and in
///   [`backlog`](super::backlog), until [`requeue`](super::requeue) sends it again or
///   [`discard`](super::discard) deletes it and lets its key go on.
#[derive(Debug)]
pub struct Relay<DB: Backend, P> {
    pool: Pool<DB>,
    publisher: Arc<P>,
    batch: u32,
    max_attempts: u32,
    backoff: (Duration, Duration),
    publish_timeout: Duration,
    claim_for: Duration,
    poll: Duration,
    retention: Option<Duration>,
    notifications: bool,
}

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// A relay of the outbox in `pool`'s database to `publisher`: batches of 100, 10
    /// attempts backing off from 1 s to 5 minutes, 10 s to publish, polling every second
    /// (PostgreSQL wakes it at once), published messages kept 7 days.
    pub fn new(pool: Pool<DB>, publisher: P) -> Self {
        Relay {
            pool,
            publisher: Arc::new(publisher),
            batch: 100,
            max_attempts: 10,
            backoff: (Duration::from_secs(1), Duration::from_secs(300)),
            publish_timeout: Duration::from_secs(10),
            claim_for: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            retention: Some(Duration::from_secs(7 * 24 * 3600)),
            notifications: true,
        }
    }

    /// At most `messages` per batch (at least 1, at most [`MAX_BATCH_SIZE`]).
    ///
    /// # Panics
    ///
    /// Above [`MAX_BATCH_SIZE`]: a batch's claim and marks are single statements with a
    /// parameter per message, which PostgreSQL bounds at 65,535 parameters and MySQL by
    /// `max_allowed_packet`; such a relay would publish its batch and never mark it.
    pub fn batch_size(mut self, messages: u32) -> Self {
        assert!(
            messages <= MAX_BATCH_SIZE,
            "idem: an outbox relay's batch_size({messages}) is over {MAX_BATCH_SIZE}: its statements would outgrow what the database takes; claim smaller batches (more relays, or a shorter poll interval, move more)"
        );
        self.batch = messages.max(1);
        self
    }

    /// A message is dead after `attempts` failed attempts (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The delay after a first failure, doubled after each next one up to `max`, each
    /// drawn at random between half of it and all of it (jitter), so that relays that
    /// failed together do not retry together.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = (first, max.max(first));
        self
    }

    /// How long a publish may wait for its acknowledgement before it counts as failed.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// On SQLite, how long a claimed batch stays this relay's before another relay may
    /// claim it again (after a crash): at least the publish timeout.
    pub fn claim_for(mut self, lease: Duration) -> Self {
        self.claim_for = lease;
        self
    }

    /// How often a spawned relay looks for messages when it was not woken (PostgreSQL
    /// notifies it when a message commits; a delayed message, or a failed one's next
    /// attempt, wakes it when it comes due).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// Whether a spawned relay on PostgreSQL `LISTEN`s for the notification a message's
    /// commit sends (the default), or only polls: off behind a pooler that cannot hold a
    /// listening session (pgbouncer in transaction pooling), and so whatever this says
    /// while idem's statements are [unnamed](crate::PostgresStatements::Unnamed) — give
    /// such a relay a pool on the server itself to have it listen. Elsewhere it always
    /// polls.
    pub fn notifications(mut self, listen: bool) -> Self {
        self.notifications = listen;
        self
    }

    /// How long a spawned relay keeps published messages before it deletes them (in
    /// bounded batches, oldest first); `None` keeps them (delete them with
    /// [`purge`](super::purge)).
    pub fn retention(mut self, keep: Option<Duration>) -> Self {
        self.retention = keep;
        self
    }

    /// Claims one batch, publishes it and marks what was acknowledged: what it did.
    /// Nothing to do is `claimed: 0`. An `Err` is the database's (each transaction is a
    /// unit of work: a lost conflict is retried, then [`Error::Contention`]); a broker's
    /// errors are failed attempts, counted in [`Relayed::failed`].
    pub async fn run_once(&self) -> Result<Relayed, Error<Infallible>> {
        let span = tracing::info_span!(
            "idem.outbox.relay",
            db.system.name = Empty,
            messaging.batch.message_count = Empty,
            idem.published = Empty,
            idem.failed = Empty,
            idem.dead = Empty,
        );
        if let Ok(dialect) = DB::pool_dialect(&self.pool) {
            span.record("db.system.name", dialect.system_name());
        }
        let relayed = self.relay().instrument(span.clone()).await?;
        if relayed.claimed > 0 {
            span.record("messaging.batch.message_count", relayed.claimed);
            span.record("idem.published", relayed.published);
            span.record("idem.failed", relayed.failed);
            span.record("idem.dead", relayed.dead);
        }
        Ok(relayed)
    }

    async fn relay(&self) -> Result<Relayed, Error<Infallible>> {
        let dialect = DB::pool_dialect(&self.pool)?;
        let batch = i64::from(self.batch);
        if dialect.outbox().claim_kind == Claim::Leased {
            let lease = millis(self.claim_for.max(self.publish_timeout));
            let claimed = stages_only(&self.pool, &LeasedClaim { batch, lease }).await?;
            if claimed.is_empty() {
                return Ok(Relayed::default());
            }
            let at = Instant::now();
            let results = self.publish_all(&claimed).await;
            let marks = Marks {
                relay: self,
                dialect,
                batch: &claimed,
                results: &results,
                at,
            };
            return stages_only(&self.pool, &marks).await;
        }
        let candidates = match dialect.outbox().claim_kind {
            Claim::Candidates => {
                let seqs = self.candidates(batch).await?;
                if seqs.is_empty() {
                    return Ok(Relayed::default());
                }
                seqs
            }
            Claim::Locked | Claim::Leased => Vec::new(),
        };
        let plan = LockedClaim { batch, candidates };
        match begin(&self.pool, &plan).await {
            Begun::Done(done) => done,
            Begun::Run(mut work) => {
                let claimed = Arc::clone(&work.kept().0);
                let at = Instant::now();
                let results = self.publish_all(&claimed).await;
                let marks = Marks {
                    relay: self,
                    dialect,
                    batch: &claimed,
                    results: &results,
                    at,
                };
                let marked = marks.mark::<DB>(work.transaction()).await;
                let done = work.finish(&plan, marked).await;
                if done.is_ok() {
                    marks.observe();
                }
                done.map_err(|e| match e {
                    // The marks' error: the database's.
                    Error::Handler(e) => Error::Database(e),
                    other => other.map_handler(|_| unreachable!("handled above")),
                })
            }
        }
    }

    /// MySQL's candidates: the due heads, read on a connection in autocommit, before the
    /// claiming transaction begins. Inside a transaction InnoDB makes a plain read locking
    /// under SERIALIZABLE (and its gap locks would make every staging INSERT wait until
    /// the batch is published); a read in autocommit never locks. The claim then locks each
    /// candidate by its primary key, if it is still pending.
    ///
    /// The same read names the dead messages with unheld messages of their key behind them
    /// (MySQL's staging does not hold): they are held first.
    async fn candidates(&self, batch: i64) -> Result<Vec<i64>, Error<Infallible>> {
        let mut conn = self.pool.acquire().await?;
        let sql = DB::dialect(&conn)?.outbox();
        let rows = DB::fetch_all(&mut conn, &sql.claim, &[Param::Int(batch)]).await?;
        drop(conn);
        let mut seqs = Vec::with_capacity(rows.len());
        for mut row in rows {
            let Some(seq) = row.int("seq") else { continue };
            match row.take_text("dead_key") {
                None => seqs.push(seq),
                Some(key) => {
                    if let Err(e) = super::hold_behind(&self.pool, &key, seq).await {
                        // Holding only spares the claims a walk: the claim goes on.
                        tracing::warn!(error = %e, "idem: holding outbox messages staged behind a dead message failed");
                    }
                }
            }
        }
        Ok(seqs)
    }

    /// Publishes every claimed message at once (one per ordering key), each within the
    /// publish timeout.
    async fn publish_all(&self, batch: &[Claimed]) -> Vec<Result<Published, String>> {
        let publishing = batch.iter().map(|claimed| async move {
            if let Some(problem) = &claimed.problem {
                return Err(problem.clone());
            }
            // A publisher that panics (on a row it cannot take) fails this attempt: it never
            // ends the relay, nor takes the batch's other messages with it.
            let publish = unwound(self.publisher.publish(&claimed.outgoing));
            match tokio::time::timeout(self.publish_timeout, publish).await {
                Ok(Ok(Ok(published))) => {
                    reached(FaultPoint::Acked);
                    Ok(published)
                }
                Ok(Ok(Err(e))) => Err(e.to_string()),
                Ok(Err(panicked)) => Err(format!("the publisher panicked: {}", panicked.message())),
                Err(_) => Err(format!(
                    "no acknowledgement within {:?}",
                    self.publish_timeout
                )),
            }
        });
        // Polled as each is woken, not all at every wake-up.
        let results = futures_util::future::join_all(publishing).await;
        reached(FaultPoint::Published);
        results
    }

    /// The backoff after failed attempt `attempt` (from 1) of message `seq`.
    fn delay(&self, attempt: u32, seq: i64) -> Duration {
        let (first, max) = self.backoff;
        let doubled = first.saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        let full = doubled.min(max);
        // Between half and all of it: a fresh hasher's keys are random per process.
        let unit = (RandomState::new().hash_one((seq, attempt, Instant::now())) >> 11) as f64
            / (1u64 << 53) as f64;
        full.mul_f64(0.5 + 0.5 * unit)
    }

    /// Runs the relay until `stop` completes: batch after batch while there is work, then
    /// waiting for a notification (PostgreSQL, with the feature `postgres`), the poll
    /// interval, or the time the next delayed message (or failed message's next attempt)
    /// comes due by the database's clock, whichever comes first; once a minute, busy or
    /// not, purging published messages past the retention, holding what staging left
    /// unheld behind a dead message, and releasing what is held behind none. Database
    /// errors are logged and waited out, never the end of it.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let mut stop = pin!(stop);
        let mut wake = Wake::listen(&self.pool, self.notifications).await;
        let mut last_purge: Option<Instant> = None;
        loop {
            let began = Instant::now();
            let more = match self.run_once().await {
                Ok(relayed) => relayed.claimed > 0 && relayed.claimed >= self.batch as usize,
                Err(e) => {
                    tracing::warn!(error = %e, "idem: the outbox relay's batch failed; retrying after the poll interval");
                    false
                }
            };
            // Once a minute, whether or not the relay is busy.
            self.housekeeping(&mut last_purge).await;
            if more {
                // Another relay's stop is no reason to hold this one back: look at `stop`
                // between batches too.
                if poll_fn(|cx| Poll::Ready(stop.as_mut().poll(cx).is_ready())).await {
                    return;
                }
                continue;
            }
            let pause = self.pause(began.elapsed()).await;
            let waited = first_of(stop.as_mut(), wake.wait(pause)).await;
            if waited.is_left() {
                return;
            }
        }
    }

    /// How long an idle relay waits, its last claim begun `since` ago: the poll interval, or
    /// less when a message comes due before it ends (then a millisecond past its time, so
    /// that the claim's now has reached it), or none for one that came due after that
    /// claim read its now.
    async fn pause(&self, since: Duration) -> Duration {
        match super::next_due(&self.pool, since).await {
            Ok(Some(due)) => self.poll.min(due + Duration::from_millis(1)),
            Ok(None) => self.poll,
            Err(e) => {
                tracing::warn!(error = %e, "idem: the outbox relay could not read when the next message is due; it polls");
                self.poll
            }
        }
    }

    /// Once a minute at most: the backlog's gauges (feature `metrics`), a purge past the
    /// retention, holding what was staged unheld behind a dead message, and releasing what
    /// is held behind none.
    async fn housekeeping(&self, last: &mut Option<Instant>) {
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *last = Some(Instant::now());
        #[cfg(feature = "metrics")]
        if let Ok(backlog) = super::backlog(&self.pool).await {
            observe_backlog(&backlog);
        }
        if let Some(retention) = self.retention
            && let Err(e) = super::purge(&self.pool, retention, 1000).await
        {
            tracing::warn!(error = %e, "idem: purging published outbox messages failed");
        }
        match super::hold_behind_dead(&self.pool, 100).await {
            Ok(0) => {}
            Ok(held) => tracing::info!(
                held,
                "idem: held outbox messages staged behind a dead message out of the claims' way"
            ),
            Err(e) => tracing::warn!(error = %e, "idem: holding outbox messages failed"),
        }
        match super::release_stranded(&self.pool, 100).await {
            Ok(0) => {}
            Ok(released) => tracing::info!(
                released,
                "idem: released outbox messages held behind no dead message (staged while their key's dead message was requeued or discarded)"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "idem: releasing held outbox messages failed")
            }
        }
    }

    /// Spawns [`run`](Self::run) on the current Tokio runtime; stop it with
    /// [`RelayHandle::stop`]. Dropping the handle does not stop it: the relay then runs
    /// until the runtime shuts down (`relay.spawn()?;` starts one for the life of the
    /// process). `Err` outside a runtime.
    pub fn spawn(self) -> Result<RelayHandle, tokio::runtime::TryCurrentError>
    where
        DB: 'static,
    {
        let runtime = tokio::runtime::Handle::try_current()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(self.run(async move {
            if stopped.await.is_err() {
                // The handle was dropped, not told to stop: run on.
                std::future::pending::<()>().await;
            }
        }));
        Ok(RelayHandle { stop, task })
    }
}

/// A spawned relay: [`stop`](Self::stop) stops it. Dropped, it lets the relay run on
/// until the runtime shuts down.
#[derive(Debug)]
pub struct RelayHandle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl RelayHandle {
    /// Stops the relay after the batch it is on, and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A claimed message, with what the relay needs to mark it.
struct Claimed {
    outgoing: Outgoing,
    created_at: i64,
    /// The database's time at the claim.
    claimed_at: i64,
    /// Why it cannot be published as stored (its headers unreadable): a failed attempt.
    problem: Option<String>,
}

/// The claimed rows, by `seq` (RETURNING and UNION ALL give no order).
fn decode(rows: Vec<Record>) -> Result<Vec<Claimed>, sqlx::Error> {
    let mut claimed = rows
        .into_iter()
        .map(|mut row| {
            let missing = |column: &str| {
                sqlx::Error::Protocol(format!("idem: an outbox claim returned no `{column}`"))
            };
            let seq = row.int("seq").ok_or_else(|| missing("seq"))?;
            let headers = row.take_text("headers").unwrap_or_default();
            let (headers, problem) = match serde_json::from_str(&headers) {
                Ok(headers) => (headers, None),
                Err(e) => (
                    Vec::new(),
                    Some(format!("its stored headers are not idem's: {e}")),
                ),
            };
            let attempts = row.int("attempts").unwrap_or(0);
            Ok(Claimed {
                outgoing: Outgoing {
                    seq,
                    id: row.take_text("id").ok_or_else(|| missing("id"))?,
                    ordering_key: row.take_text("ordering_key").unwrap_or_default(),
                    destination: row.take_text("destination").unwrap_or_default(),
                    routing_key: row.take_text("routing_key").unwrap_or_default(),
                    payload: row.take_bytes("payload").unwrap_or_default(),
                    headers,
                    attempt: u32::try_from(attempts.saturating_add(1)).unwrap_or(u32::MAX),
                },
                created_at: row.int("created_at").unwrap_or(0),
                claimed_at: row.int("now").unwrap_or(0),
                problem,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    claimed.sort_by_key(|c| c.outgoing.seq);
    Ok(claimed)
}

/// A claim that stays locked while its batch is published and marked, in the unit of
/// work's transaction (PostgreSQL: one locking statement; MySQL: the candidates, then each
/// locked by its key).
struct LockedClaim {
    batch: i64,
    /// MySQL: the candidates, read before the transaction began (see [`candidates`]).
    candidates: Vec<i64>,
}

/// The batch a locked claim holds until its transaction ends.
struct Batch(Arc<Vec<Claimed>>);

impl Kept for Batch {
    // Nothing to store: the marks are the body's.
    async fn store<DB: Backend>(&self, _: &mut DB::Connection, _: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

impl<DB: Backend> Plan<DB> for LockedClaim {
    type Value = Relayed;
    type Reply = Relayed;
    type Kept = Batch;

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Relayed, Batch>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.outbox();
        // First in a transaction idem began (`Entry::Fresh`): it may still set its level.
        if let Some(isolation) = sql.claim_isolation {
            DB::execute(tx, isolation, &[]).await?;
        }
        let rows = if sql.claim_kind == Claim::Candidates {
            let seqs: Vec<Param<'_>> = self.candidates.iter().copied().map(Param::Int).collect();
            DB::fetch_all(tx, &sql.lock(seqs.len()), &seqs).await?
        } else {
            DB::fetch_all(tx, &sql.claim, &[Param::Int(self.batch)]).await?
        };
        let batch = decode(rows)?;
        if batch.is_empty() {
            return Ok(Entered::Done {
                reply: Relayed::default(),
                commit: false,
            });
        }
        Ok(Entered::Run(Batch(Arc::new(batch))))
    }

    fn encode(&self, _: &Relayed) -> Result<String, Error<Infallible>> {
        // Nothing to store.
        Ok("null".to_owned())
    }

    fn applied(&self, relayed: Relayed) -> Relayed {
        relayed
    }

    fn labels(&self) -> Labels<'_> {
        Labels::default()
    }

    fn outcome_name(relayed: &Relayed) -> &'static str {
        relayed.name()
    }
}

/// A leased claim (SQLite), committed before its batch is published.
struct LeasedClaim {
    batch: i64,
    lease: i64,
}

impl<DB: Backend> Plan<DB> for LeasedClaim {
    type Value = Infallible;
    type Reply = Vec<Claimed>;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Vec<Claimed>>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.outbox();
        let params = [Param::Int(self.batch), Param::Int(self.lease)];
        let batch = decode(DB::fetch_all(tx, &sql.claim, &params).await?)?;
        Ok(Entered::Done {
            commit: !batch.is_empty(),
            reply: batch,
        })
    }

    no_body!(Vec<Claimed>);

    fn labels(&self) -> Labels<'_> {
        Labels::default()
    }

    fn outcome_name(batch: &Vec<Claimed>) -> &'static str {
        if batch.is_empty() { "idle" } else { "claimed" }
    }
}

/// What a batch's publishing came to, to be marked: the acknowledged messages published
/// (one statement), each failed one failed.
struct Marks<'a, DB: Backend, P> {
    relay: &'a Relay<DB, P>,
    dialect: Dialect,
    batch: &'a [Claimed],
    results: &'a [Result<Published, String>],
    /// When the batch was claimed.
    at: Instant,
}

impl<DB: Backend, P: Publisher> Marks<'_, DB, P> {
    async fn mark<D: Backend>(&self, conn: &mut D::Connection) -> Result<Relayed, sqlx::Error> {
        let sql = self.dialect.outbox();
        let mut relayed = Relayed {
            claimed: self.batch.len(),
            ..Relayed::default()
        };
        let published: Vec<Param<'_>> = self
            .batch
            .iter()
            .zip(self.results)
            .filter(|(_, r)| r.is_ok())
            .map(|(c, _)| Param::Int(c.outgoing.seq))
            .collect();
        if !published.is_empty() {
            D::execute(conn, &sql.published(published.len()), &published).await?;
            relayed.published = published.len();
        }
        let max_attempts = self.relay.max_attempts;
        for (claimed, result) in self.batch.iter().zip(self.results) {
            let Err(error) = result else { continue };
            let attempt = claimed.outgoing.attempt;
            let dead = attempt >= max_attempts;
            let delay = self.relay.delay(attempt, claimed.outgoing.seq);
            let error = storable(error);
            let params = [
                Param::Int(claimed.outgoing.seq),
                Param::Text(&error),
                Param::Int(millis(delay)),
                Param::Int(i64::from(max_attempts)),
            ];
            let marked = D::execute(conn, &sql.failed, &params).await?;
            relayed.failed += 1;
            if dead {
                relayed.dead += 1;
                if marked > 0 {
                    // Its key's later messages, out of the claims' way until it is requeued
                    // or discarded (idem_sql::outbox, "held").
                    let key = [
                        Param::Text(&claimed.outgoing.ordering_key),
                        Param::Int(claimed.outgoing.seq),
                    ];
                    D::execute(conn, &sql.hold, &key).await?;
                }
            }
        }
        Ok(relayed)
    }

    /// After the commit: the log lines and the counters.
    fn observe(&self) {
        let elapsed = millis(self.at.elapsed());
        for (claimed, result) in self.batch.iter().zip(self.results) {
            let outgoing = &claimed.outgoing;
            match result {
                Ok(_) => observe_published(claimed.claimed_at - claimed.created_at + elapsed),
                Err(error) if outgoing.attempt >= self.relay.max_attempts => {
                    tracing::error!(
                        id = %outgoing.id,
                        ordering_key = %outgoing.ordering_key,
                        attempts = outgoing.attempt,
                        error = %error,
                        "idem: an outbox message is dead after its last attempt; its ordering key waits until it is requeued or discarded"
                    );
                    observe_failed(true);
                }
                Err(error) => {
                    tracing::warn!(
                        id = %outgoing.id,
                        attempt = outgoing.attempt,
                        error = %error,
                        "idem: publishing an outbox message failed; it is tried again later"
                    );
                    observe_failed(false);
                }
            }
        }
    }
}

/// The marks of a leased batch (SQLite), in a write transaction of their own.
impl<DB: Backend, P: Publisher> Plan<DB> for Marks<'_, DB, P> {
    type Value = Infallible;
    type Reply = Relayed;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Relayed>, Error<Infallible>> {
        Ok(Entered::Done {
            reply: self.mark::<DB>(tx).await?,
            commit: true,
        })
    }

    no_body!(Relayed);

    fn labels(&self) -> Labels<'_> {
        Labels::default()
    }

    fn outcome_name(relayed: &Relayed) -> &'static str {
        relayed.name()
    }

    fn settled(&self, _: &Relayed) {
        self.observe();
    }
}

impl Relayed {
    fn name(&self) -> &'static str {
        if self.claimed == 0 { "idle" } else { "relayed" }
    }
}

/// An attempt's error as it is stored: at most 2,000 characters, and no NUL, which
/// PostgreSQL's `text` refuses (SQLSTATE 22021, aborting the transaction and with it the
/// marks of the batch's acknowledged messages): a NUL, like every other control character
/// but a line break or a tab, becomes U+FFFD. Whatever a broker or a publisher says, the
/// failure is recorded.
fn storable(error: &str) -> String {
    error
        .chars()
        .take(2000)
        .map(|c| match c {
            '\n' | '\t' => c,
            c if c.is_control() => char::REPLACEMENT_CHARACTER,
            c => c,
        })
        .collect()
}

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Which of two futures finished first.
enum Either<A, B> {
    Left(A),
    Right(B),
}

impl<A, B> Either<A, B> {
    fn is_left(&self) -> bool {
        matches!(self, Either::Left(_))
    }
}

async fn first_of<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if let Poll::Ready(done) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(done));
        }
        if let Poll::Ready(done) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(done));
        }
        Poll::Pending
    })
    .await
}

/// What wakes an idle relay: the poll interval, and on PostgreSQL the notification a
/// message's commit sends (`idem_outbox`).
struct Wake {
    #[cfg(feature = "postgres")]
    listener: Option<sqlx::postgres::PgListener>,
}

impl Wake {
    async fn listen<DB: Backend>(pool: &Pool<DB>, notifications: bool) -> Wake {
        #[cfg(feature = "postgres")]
        {
            let pool: &dyn std::any::Any = pool;
            let listener = match pool.downcast_ref::<Pool<sqlx::Postgres>>() {
                // Behind a transaction pooler (statements unnamed), the session that
                // ran LISTEN goes back to the pooler's pool with the transaction.
                Some(pool) if notifications && !crate::backend::unnamed(Dialect::Postgres) => {
                    listening(pool).await
                }
                _ => None,
            };
            Wake { listener }
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (pool, notifications);
            Wake {}
        }
    }

    /// Waits for a notification or `poll`, whichever comes first.
    async fn wait(&mut self, poll: Duration) {
        #[cfg(feature = "postgres")]
        if let Some(listener) = &mut self.listener {
            match tokio::time::timeout(poll, listener.recv()).await {
                Ok(Ok(_)) => {
                    // One batch answers every notification already here.
                    while listener.next_buffered().is_some() {}
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "idem: the outbox relay's LISTEN connection failed; polling until it is back");
                    tokio::time::sleep(poll).await;
                }
                Err(_) => {}
            }
            return;
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(feature = "postgres")]
async fn listening(pool: &Pool<sqlx::Postgres>) -> Option<sqlx::postgres::PgListener> {
    let mut listener = match sqlx::postgres::PgListener::connect_with(pool).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "idem: the outbox relay cannot LISTEN; it polls");
            return None;
        }
    };
    match listener.listen(idem_sql::outbox::CHANNEL).await {
        Ok(()) => Some(listener),
        Err(e) => {
            tracing::warn!(error = %e, "idem: the outbox relay cannot LISTEN; it polls");
            None
        }
    }
}

fn observe_published(latency_ms: i64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("idem_outbox_published_total").increment(1);
        metrics::histogram!("idem_outbox_publish_latency_seconds")
            .record(latency_ms.max(0) as f64 / 1000.0);
    }
    let _ = latency_ms;
}

fn observe_failed(dead: bool) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("idem_outbox_failed_total").increment(1);
        if dead {
            metrics::counter!("idem_outbox_dead_total").increment(1);
        }
    }
    let _ = dead;
}

#[cfg(feature = "metrics")]
fn observe_backlog(backlog: &Backlog) {
    metrics::gauge!("idem_outbox_pending").set(backlog.pending as f64);
    metrics::gauge!("idem_outbox_oldest_pending_seconds")
        .set(backlog.oldest.map_or(0.0, |d| d.as_secs_f64()));
}
