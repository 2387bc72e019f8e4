//! The transactional outbox: messages staged in the transaction of the effect they
//! announce, and a relay that publishes them afterwards, at least once, each under an id
//! the next hop deduplicates on.
//!
//! A handler that published from its body would publish before its commit (a phantom
//! message when the transaction rolls back) or after it (lost when the process dies in
//! between). Staged with [`stage`], the message is a row of `idem_outbox` written in the
//! handler's transaction: it exists if and only if the effect committed. A [`Relay`]
//! claims staged messages, publishes them with a [`Publisher`] (NATS JetStream with the
//! feature `nats`, RabbitMQ with `rabbitmq`, or your own), and marks each one published
//! after the broker's acknowledgement.
//!
//! - **Ids are deterministic** ([`EffectKey`]): the digest of what identifies the handler's
//!   effect and the message's position among those its body stages. A body that runs again
//!   stages the same ids (staging an id already there does nothing); a duplicate call
//!   stages nothing, because its body does not run. The relay passes the id on
//!   (`Nats-Msg-Id`, AMQP `message_id`), and the next hop's inbox deduplicates on it.
//! - **Order per ordering key** (by default the handler's): a message is never published
//!   while an earlier message of its key is unpublished, however many relays run.
//! - **Failures** back off with jitter; a message that used all its attempts is dead, and
//!   holds back its key's later messages until [`requeue`]d or [`discard`]ed.
//!
//! The guide's outbox page has the SQL, the guarantees and the windows that remain:
//! [`idem::guide::outbox`](https://docs.rs/idem/latest/idem/guide/outbox/index.html).

#[cfg(feature = "kafka")]
pub mod kafka;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
mod relay;
mod stage;

pub use crate::work::effect::EffectKey;
pub use message::{
    Destination, MAX_HEADERS_LEN, MAX_NAME_LEN, MAX_ORDERING_KEY_LEN, MAX_PAYLOAD_LEN, Message,
};
pub use relay::{
    MAX_BATCH_SIZE, Outgoing, PublishError, Published, Publisher, Relay, RelayHandle, Relayed,
};
pub(crate) use stage::stage_in;
pub use stage::{cancel, set_notify, stage};

use crate::backend::{Backend, Opened, Param, Record};
use crate::error::Error;
use crate::work::observe::Labels;
use crate::work::unit::{Entered, Entry, Plan, no_body, stages_only};
use sqlx::Pool;
use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

/// The header NATS JetStream deduplicates on; the relay sets it to the message's id.
pub const ID_HEADER: &str = "Nats-Msg-Id";

/// The id of a staged message: 64 hex digits derived from its effect, or the id it was
/// given ([`Message::id`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub(crate) String);

impl MessageId {
    /// The id, as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> String {
        id.0
    }
}

/// Why a message cannot be staged. [`stage`] returns it inside
/// [`sqlx::Error::Encode`]; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxError {
    /// The message is not valid as built: what is wrong with it.
    InvalidMessage(String),
    /// It has no id, and is staged outside a handler's body, so none can be derived.
    NoEffect,
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxError::InvalidMessage(problem) => {
                write!(f, "idem: the message cannot be staged: {problem}")
            }
            OutboxError::NoEffect => f.write_str(
                "idem: the message has no id and is staged outside a handler's body, which \
                 would derive one: give it a stable id with Message::id (the same on every \
                 retry), or, in the inbox's receipt form, stage it with Receipt::stage",
            ),
        }
    }
}

impl std::error::Error for OutboxError {}

impl From<OutboxError> for sqlx::Error {
    fn from(e: OutboxError) -> sqlx::Error {
        sqlx::Error::Encode(Box::new(e))
    }
}

/// Why a consumed message gives no inbox key: it carries no id (not published by an idem
/// relay), or one that is no key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IncomingKeyError {
    /// The message has no id (`Nats-Msg-Id`, AMQP `message_id`, Kafka's `idem-message-id`
    /// header).
    Missing,
    /// Its id is not UTF-8 text (a Kafka header holds bytes).
    NotText,
    /// Its id is no message key.
    Invalid(crate::KeyError),
}

impl fmt::Display for IncomingKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IncomingKeyError::Missing => f.write_str(
                "the message carries no id (Nats-Msg-Id, AMQP message_id or the Kafka header idem-message-id): it was not published by an idem relay, or its id was stripped",
            ),
            IncomingKeyError::NotText => f.write_str("the message's id is not UTF-8 text"),
            IncomingKeyError::Invalid(e) => write!(f, "the message's id is no message key: {e}"),
        }
    }
}

impl std::error::Error for IncomingKeyError {}

/// The unpublished messages: how many, how many of them are dead or held behind a dead
/// one, and how long the oldest has waited (by the database's clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages not published yet, the dead ones included.
    pub pending: u64,
    /// Of those, the dead ones: each holds back the rest of its ordering key.
    pub dead: u64,
    /// Of those, the ones held back behind a dead message of their ordering key: they go
    /// on once it is [`requeue`]d or [`discard`]ed.
    pub held: u64,
    /// The age of the oldest unpublished message; `None` when there is none.
    pub oldest: Option<Duration>,
}

/// The outbox's backlog: export [`Backlog::pending`] and [`Backlog::oldest`] as gauges and
/// alert when `dead` is above zero (a spawned relay with the feature `metrics` exports
/// `idem_outbox_pending` and `idem_outbox_oldest_pending_seconds` itself).
pub async fn backlog<DB: Backend>(pool: &Pool<DB>) -> Result<Backlog, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = DB::dialect(conn)?.outbox();
    let row = DB::fetch(conn, &sql.backlog, &[])
        .await?
        .unwrap_or_default();
    opened.end(true).await?;
    Ok(Backlog::of(&row))
}

impl Backlog {
    fn of(row: &Record) -> Backlog {
        Backlog {
            pending: row.int("pending").map_or(0, |n| n.max(0) as u64),
            dead: row.int("dead").map_or(0, |n| n.max(0) as u64),
            held: row.int("held").map_or(0, |n| n.max(0) as u64),
            oldest: row
                .int("oldest_age")
                .map(|ms| Duration::from_millis(ms.max(0) as u64)),
        }
    }
}

/// One destination's part of the outbox's [`Backlog`] ([`backlog_by_destination`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationBacklog {
    /// The destination (a subject, an exchange, a topic), as [`Message`]s name it.
    pub destination: String,
    /// Its unpublished messages: pending, dead, held, the oldest's age.
    pub backlog: Backlog,
}

/// The outbox's [`backlog`] per destination, the destinations in order; one with nothing
/// unpublished is left out. One read of the unpublished messages: which destination a
/// dead message blocks, and where the oldest waits.
pub async fn backlog_by_destination<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<Vec<DestinationBacklog>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = DB::dialect(conn)?.outbox();
    let rows = DB::fetch_all(conn, &sql.backlog_by_destination, &[]).await?;
    opened.end(true).await?;
    Ok(rows
        .into_iter()
        .map(|mut row| DestinationBacklog {
            backlog: Backlog::of(&row),
            destination: row.take_text("destination").unwrap_or_default(),
        })
        .collect())
}

/// How long until the next live message comes due (a delayed message, or a failed one's
/// next attempt) by the database's clock, among those that came due `since` ago or later
/// (zero for one due already): `None` when there is none.
pub(crate) async fn next_due<DB: Backend>(
    pool: &Pool<DB>,
    since: Duration,
) -> Result<Option<Duration>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = DB::dialect(conn)?.outbox();
    // Whole milliseconds, as the database's now is, rounded up with one more: a claim and
    // this read within the same millisecond, or across one tick of it, still overlap.
    let since = Param::Int(crate::inbox::millis_up(since).saturating_add(1));
    let row = DB::fetch(conn, &sql.next_due, &[since]).await?;
    opened.end(true).await?;
    Ok(row
        .and_then(|row| row.int("wait"))
        .map(|ms| Duration::from_millis(ms.max(0) as u64)))
}

/// A dead message: it used all its attempts, and holds back its ordering key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadMessage {
    /// Its id.
    pub id: String,
    /// Its ordering key, whose later messages wait for it.
    pub ordering_key: String,
    /// Its subject or exchange.
    pub destination: String,
    /// Its routing key.
    pub routing_key: String,
    /// The attempts it made.
    pub attempts: u32,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it was staged, and when it died (milliseconds since the Unix epoch, by the
    /// database's clock).
    pub created_at_millis: i64,
    /// When it died.
    pub dead_at_millis: i64,
}

impl DeadMessage {
    /// The failure group it belongs to: its last error, exactly (empty when none was
    /// recorded), as [`DeadGroup::error`] names it.
    pub fn group(&self) -> &str {
        self.last_error.as_deref().unwrap_or_default()
    }
}

/// The dead messages, oldest first, at most `limit`.
pub async fn dead<DB: Backend>(
    pool: &Pool<DB>,
    limit: u32,
) -> Result<Vec<DeadMessage>, sqlx::Error> {
    let rows = read(pool, |sql| &sql.dead, limit).await?;
    Ok(rows
        .into_iter()
        .map(|mut row| DeadMessage {
            id: row.take_text("id").unwrap_or_default(),
            ordering_key: row.take_text("ordering_key").unwrap_or_default(),
            destination: row.take_text("destination").unwrap_or_default(),
            routing_key: row.take_text("routing_key").unwrap_or_default(),
            attempts: row
                .int("attempts")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            last_error: row.take_text("last_error"),
            created_at_millis: row.int("created_at").unwrap_or(0),
            dead_at_millis: row.int("dead_at").unwrap_or(0),
        })
        .collect())
}

/// Dead messages that died of the same last error: a failure group, as the command line
/// (`idem outbox dead`) and the console show them — fix the cause once, then requeue the
/// group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadGroup {
    /// The last error they share, exactly (empty when none was recorded).
    pub error: String,
    /// Its messages, oldest first.
    pub messages: Vec<DeadMessage>,
}

/// The dead messages ([`dead`]: at most `limit`, the oldest) grouped by their exact last
/// error, the largest group first (then by error).
pub async fn dead_by_error<DB: Backend>(
    pool: &Pool<DB>,
    limit: u32,
) -> Result<Vec<DeadGroup>, sqlx::Error> {
    Ok(by_error(dead(pool, limit).await?))
}

pub(crate) fn by_error(dead: Vec<DeadMessage>) -> Vec<DeadGroup> {
    let mut groups: std::collections::BTreeMap<String, Vec<DeadMessage>> = Default::default();
    for message in dead {
        groups
            .entry(message.group().to_owned())
            .or_default()
            .push(message);
    }
    let mut groups: Vec<DeadGroup> = groups
        .into_iter()
        .map(|(error, messages)| DeadGroup { error, messages })
        .collect();
    groups.sort_by(|a, b| {
        b.messages
            .len()
            .cmp(&a.messages.len())
            .then_with(|| a.error.cmp(&b.error))
    });
    groups
}

/// Sends a dead message again, as new (its attempts from 0, due now): `true` if `id` was
/// dead. Its ordering key goes on once it is published: the messages held behind it are
/// released in the same transaction ([`Backlog::held`]).
pub async fn requeue<DB: Backend>(pool: &Pool<DB>, id: &str) -> Result<bool, Error<Infallible>> {
    requeued(pool, id, None).await
}

/// [`requeue`], noting who did it: the message's last error reads `requeued by <by>` until
/// its next attempt (a failure writes its own), and the requeue is logged (`tracing`, at
/// INFO).
pub async fn requeue_by<DB: Backend>(
    pool: &Pool<DB>,
    id: &str,
    by: &str,
) -> Result<bool, Error<Infallible>> {
    let note = format!("requeued by {by}");
    let done = requeued(pool, id, Some(&note)).await?;
    if done {
        tracing::info!(id, by, "idem outbox message requeued");
    }
    Ok(done)
}

async fn requeued<DB: Backend>(
    pool: &Pool<DB>,
    id: &str,
    note: Option<&str>,
) -> Result<bool, Error<Infallible>> {
    let plan = Admin {
        statement: |sql| &sql.requeue,
        params: vec![Param::Text(id), Param::Text(note.unwrap_or(""))],
        name: "requeued",
        around: Around::Revives,
    };
    stages_only(pool, &plan).await.map(|(n, _)| n > 0)
}

/// Deletes a dead message without publishing it: `true` if `id` was dead. Its ordering
/// key's later messages go on without it, released in the same transaction.
///
/// Nothing of it is left to note who did it in: log that yourself (the CLI's `idem outbox
/// discard` does, on its standard error).
pub async fn discard<DB: Backend>(pool: &Pool<DB>, id: &str) -> Result<bool, Error<Infallible>> {
    let plan = Admin {
        statement: |sql| &sql.discard,
        params: vec![Param::Text(id)],
        name: "discarded",
        around: Around::Revives,
    };
    stages_only(pool, &plan).await.map(|(n, _)| n > 0)
}

/// Deletes the messages published more than `retention` ago, oldest first, in
/// transactions of at most `batch` rows so that staging interleaves; how many it deleted.
/// Unpublished and dead messages are never purged. A spawned relay runs it now and then
/// ([`Relay::retention`]).
pub async fn purge<DB: Backend>(
    pool: &Pool<DB>,
    retention: Duration,
    batch: u32,
) -> Result<u64, Error<Infallible>> {
    let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let batch = i64::from(batch.max(1));
    let mut total = 0;
    loop {
        let plan = Admin {
            statement: |sql| &sql.purge,
            params: vec![Param::Int(retention), Param::Int(batch)],
            name: "purged",
            around: Around::Nothing,
        };
        let (deleted, _) = stages_only(pool, &plan).await?;
        total += deleted;
        if deleted < batch as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// How many messages [`purge`] with `retention` would delete now (a dry run), by the
/// database's clock.
pub async fn purgeable<DB: Backend>(
    pool: &Pool<DB>,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = &DB::dialect(conn)?.outbox().purgeable;
    let row = DB::fetch(conn, sql, &[Param::Int(retention)]).await?;
    opened.end(true).await?;
    Ok(row.and_then(|r| r.int("n")).map_or(0, |n| n.max(0) as u64))
}

/// Releases what is held behind no dead message (`idem_sql::outbox::STRANDED`: a staging
/// that read its key's head dead while it was being requeued), at most `keys` keys; how
/// many messages it released. A spawned relay runs it now and then.
pub(crate) async fn release_stranded<DB: Backend>(
    pool: &Pool<DB>,
    keys: u32,
) -> Result<u64, Error<Infallible>> {
    let rows = read(pool, |sql| &sql.stranded, keys).await?;
    let mut released = 0;
    for key in rows
        .into_iter()
        .filter_map(|mut row| row.take_text("ordering_key"))
    {
        let plan = Admin {
            statement: |sql| &sql.release,
            params: vec![Param::Text(&key)],
            name: "released",
            around: Around::Nothing,
        };
        released += stages_only(pool, &plan).await?.0;
    }
    Ok(released)
}

/// Holds what a staging left unheld behind the dead messages (one that read its key's
/// head before it died, or ran under SERIALIZABLE, which does not read it), at most `dead`
/// of them; how many messages it held. A spawned relay runs it now and then.
pub(crate) async fn hold_behind_dead<DB: Backend>(
    pool: &Pool<DB>,
    dead: u32,
) -> Result<u64, Error<Infallible>> {
    let rows = read(pool, |sql| &sql.dead_heads, dead).await?;
    let mut held = 0;
    for mut row in rows {
        if let (Some(key), Some(seq)) = (row.take_text("ordering_key"), row.int("seq")) {
            held += hold_behind(pool, &key, seq).await?;
        }
    }
    Ok(held)
}

/// Holds the unheld messages of `key` behind its dead message `seq`, if it is still dead;
/// how many.
pub(crate) async fn hold_behind<DB: Backend>(
    pool: &Pool<DB>,
    key: &str,
    seq: i64,
) -> Result<u64, Error<Infallible>> {
    let plan = Admin {
        statement: |sql| &sql.hold,
        params: vec![Param::Text(key), Param::Int(seq)],
        name: "held",
        around: Around::HoldsBehindDead,
    };
    Ok(stages_only(pool, &plan).await?.0)
}

/// The rows of one read of the outbox (`statement`, `$1` its limit), in a read-only
/// transaction of its own.
async fn read<DB: Backend>(
    pool: &Pool<DB>,
    statement: fn(&'static idem_sql::outbox::OutboxSql) -> &'static String,
    limit: u32,
) -> Result<Vec<Record>, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let sql = statement(DB::dialect(conn)?.outbox());
    let rows = DB::fetch_all(conn, sql, &[Param::Int(i64::from(limit))]).await?;
    opened.end(true).await?;
    Ok(rows)
}

/// One statement of the outbox's administration, a unit of work of its own; replies with
/// the rows it changed.
struct Admin<'a> {
    statement: fn(&'static idem_sql::outbox::OutboxSql) -> &'static String,
    params: Vec<Param<'a>>,
    /// Its outcome's name, for the span and the counters.
    name: &'static str,
    /// What it does around its statement for the messages held behind a dead one.
    around: Around,
}

/// What an [`Admin`] statement does around itself for the messages held behind a dead one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Around {
    /// Nothing.
    Nothing,
    /// It takes a dead message (`$1`, its id) out of the dead: the messages held behind it
    /// are released in its transaction.
    Revives,
    /// It holds behind a dead message (`$2`, its `seq`) if it is still dead, locked first
    /// ([`LOCK_DEAD`](idem_sql::outbox::LOCK_DEAD)): a requeue waits for the hold, and
    /// then releases it.
    HoldsBehindDead,
}

impl<DB: Backend> Plan<DB> for Admin<'_> {
    type Value = Infallible;
    type Reply = (u64, &'static str);
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<(u64, &'static str)>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.outbox();
        let key = match self.around {
            Around::Revives => match DB::fetch(tx, &sql.dead_key, &self.params[..1]).await? {
                Some(mut row) => row.take_text("ordering_key"),
                None => None,
            },
            Around::HoldsBehindDead => {
                let dead = DB::fetch(tx, &sql.lock_dead, &self.params[1..]).await?;
                if dead.is_none() {
                    return Ok(Entered::Done {
                        reply: (0, self.name),
                        commit: true,
                    });
                }
                None
            }
            Around::Nothing => None,
        };
        let changed = DB::execute(tx, (self.statement)(sql), &self.params).await?;
        if changed > 0
            && let Some(key) = &key
        {
            DB::execute(tx, &sql.release, &[Param::Text(key)]).await?;
        }
        Ok(Entered::Done {
            reply: (changed, self.name),
            commit: true,
        })
    }

    no_body!((u64, &'static str));

    fn labels(&self) -> Labels<'_> {
        Labels::default()
    }

    fn outcome_name(reply: &(u64, &'static str)) -> &'static str {
        reply.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(id: &str, error: Option<&str>) -> DeadMessage {
        DeadMessage {
            id: id.to_owned(),
            ordering_key: String::new(),
            destination: String::new(),
            routing_key: String::new(),
            attempts: 3,
            last_error: error.map(str::to_owned),
            created_at_millis: 0,
            dead_at_millis: 0,
        }
    }

    #[test]
    fn dead_messages_group_by_their_exact_error_largest_first() {
        let groups = by_error(vec![
            dead("a", Some("timeout")),
            dead("b", Some("refused")),
            dead("c", None),
            dead("d", Some("refused")),
            dead("e", Some("timeout ")),
        ]);
        let seen: Vec<(&str, Vec<&str>)> = groups
            .iter()
            .map(|g| {
                let ids = g.messages.iter().map(|m| m.id.as_str()).collect();
                (g.error.as_str(), ids)
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("refused", vec!["b", "d"]),
                ("", vec!["c"]),
                ("timeout", vec!["a"]),
                ("timeout ", vec!["e"]),
            ]
        );
    }
}
