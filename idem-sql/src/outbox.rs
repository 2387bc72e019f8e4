//! The outbox's statements (the table `idem_outbox`), and which of them each dialect runs.
//! Every value is bound.
//!
//! A message is a row written in the transaction of the effect it announces; a relay claims
//! rows, publishes them, and marks each once the broker acknowledged it. Times are
//! milliseconds since the Unix epoch from the database's clock ([`Dialect::now_millis`]),
//! written `{now}` in the templates below, as the inbox's are.
//!
//! **Order per ordering key, without a high-water mark.** A relay claims only the *head*
//! of each ordering key: a pending message with no unpublished message of its key and a
//! lower `seq` (the NOT EXISTS of every claim). It never remembers how far it read, so
//! a message whose transaction commits after a higher `seq` was published (PostgreSQL's
//! sequences and InnoDB's AUTO_INCREMENT hand out numbers at INSERT, not at COMMIT) is
//! claimed by the next batch after its commit, never skipped. A claimed head stays
//! unpublished until its relay marks it, so no other relay claims its successors meanwhile:
//! on PostgreSQL and MySQL the head is locked (`FOR UPDATE SKIP LOCKED`: other relays pass
//! over it), on SQLite its `claimed_until` lease is set in the claiming write transaction.
//!
//! **A dead message's key is held out of the claim's way.** A claim walks the due messages
//! in `seq` order; a message behind a dead head is not due (it is not its key's head),
//! but were it left among the due ones, every claim would walk past all of them before
//! reaching another key's. So the messages behind a dead head are *held*: `dead_at = 0`
//! ([`HELD`]), out of the index the claim walks, which only holds `dead_at IS NULL`. The
//! relay holds a key's pending messages when its head dies ([`HOLD`], in the transaction
//! that marks it dead); staging holds a message whose key's head is dead or held
//! ([`HELD_IF_HEAD_IS`]; on MySQL the relay does, before each claim); requeuing or
//! discarding the dead message releases them ([`RELEASE`]).
//! Holding never decides order (the NOT EXISTS does): a message held by mistake would only
//! wait, and a relay releases, once a minute, what is held behind no dead message
//! ([`STRANDED`]: a staging that read a dead head racing its requeue); a message left
//! unheld behind a dead head only costs the claim one row.

use crate::dialect::Dialect;
use std::sync::LazyLock;

/// Stages a message; does nothing if a message with its id is in the outbox already.
/// `$1` id, `$2` ordering key, `$3` destination, `$4` routing key, `$5` payload (bytes),
/// `$6` headers (a JSON array of `[name, value]` pairs), `$7` when it is due (milliseconds
/// since the epoch: `Message::deliver_at`) or NULL, `$8` a delay from now in milliseconds
/// (0 unless delayed: `deliver_after`); due now unless delayed, by the database's clock.
/// Held ([`HELD`]) if its key's head is dead or held (read in the same statement:
/// [`HELD_IF_HEAD_IS`]); `WHERE 1 = 1` keeps SQLite from reading `ON CONFLICT` as a join's.
pub const INSERT: &str = "INSERT INTO idem_outbox \
    (id, ordering_key, destination, routing_key, payload, headers, created_at, attempts, next_attempt_at, dead_at) \
    SELECT $1, $2, $3, $4, $5, $6, {now}, 0, COALESCE($7, {now} + $8), {held} WHERE 1 = 1 \
    ON CONFLICT (id) DO NOTHING";

/// [`INSERT`] on PostgreSQL, which also notifies the channel `idem_outbox` in the same
/// transaction (delivered at its COMMIT, never for a rollback): a relay that listens wakes
/// up at once. Returns `staged`, the rows inserted.
pub const INSERT_NOTIFYING: &str = "WITH staged AS (INSERT INTO idem_outbox \
    (id, ordering_key, destination, routing_key, payload, headers, created_at, attempts, next_attempt_at, dead_at) \
    SELECT $1, $2, $3, $4, $5, $6, {now}, 0, COALESCE($7, {now} + $8), {held} \
    ON CONFLICT (id) DO NOTHING RETURNING seq) \
    SELECT COUNT(*) AS staged FROM (SELECT pg_notify('idem_outbox', '') FROM staged) AS notified";

/// [`INSERT`] on MySQL, which has no `ON CONFLICT`: a staged id fails with the
/// duplicate-key error (1062), read as "nothing inserted" (`seq` is generated, so `id` is
/// the only unique key a row can repeat). It does not hold: an `INSERT` that reads its own
/// table takes shared locks under REPEATABLE READ, and would wait for a relay publishing the
/// key's head (and a relay would pass over a head that a staging transaction had read), and
/// a read of its own would cost staging a round trip (measured: a quarter of its
/// throughput). MySQL's relays hold instead, before each claim ([`CANDIDATES`]).
pub const INSERT_MYSQL: &str = "INSERT INTO idem_outbox \
    (id, ordering_key, destination, routing_key, payload, headers, created_at, attempts, next_attempt_at) \
    VALUES ($1, $2, $3, $4, $5, $6, {now}, 0, COALESCE($7, {now} + $8))";

/// What `dead_at` holds for a message held behind its key's dead head: not a time (no
/// message dies at the epoch), and not dead itself. Any other value is dead (`dead_at <>
/// 0`): a time idem wrote, or whatever a hand wrote, which is then listed, requeued and
/// discarded as dead rather than kept out of every list.
pub const HELD: i64 = 0;

/// The `dead_at` of the head of key `$2` (its pending message of lowest `seq`, one step along
/// the index of pending messages, whatever the key's backlog) as the staged message's:
/// [`HELD`] behind a dead or held head (PostgreSQL, SQLite). Not read
/// in a SERIALIZABLE transaction on PostgreSQL (its read would take predicate locks on the
/// index of pending messages, and concurrent stagers would fail each other's commits): a
/// relay holds what such a staging leaves unheld ([`HOLD`], now and then for each dead
/// message). The subquery only reads `$2`, so PostgreSQL runs it only if its branch is
/// reached.
pub const HELD_IF_HEAD_IS: &str = "CASE WHEN {serializable} THEN NULL \
    WHEN (SELECT h.dead_at FROM idem_outbox h \
    WHERE h.ordering_key = $2 AND h.published_at IS NULL ORDER BY h.seq LIMIT 1) IS NOT NULL \
    THEN 0 END";

/// Holds the pending messages of key `$1` after its dead head `$2` (its `seq`): in the
/// transaction that marks it dead, and now and then by a relay, after [`LOCK_DEAD`], for
/// what a staging left unheld.
pub const HOLD: &str = "UPDATE idem_outbox {unheld} SET dead_at = 0 \
    WHERE ordering_key = $1 AND seq > $2 AND published_at IS NULL AND dead_at IS NULL";

/// Releases the held messages of key `$1`, unless a dead message still holds it back (two
/// dead messages in one key: a message whose transaction committed after a later one of
/// its key died). Run after a requeue or discard, and for [`STRANDED`] keys.
pub const RELEASE: &str = "UPDATE idem_outbox SET dead_at = NULL \
    WHERE ordering_key = $1 AND published_at IS NULL AND dead_at = 0 \
    AND NOT EXISTS (SELECT 1 FROM idem_outbox d \
        WHERE d.ordering_key = $1 AND d.published_at IS NULL AND d.dead_at <> 0)";

/// Locks dead message `$1` (its `seq`) if it is still dead, before [`HOLD`] outside the
/// transaction that killed it: a requeue or discard waits for the hold to commit, and
/// releases what it held (`FOR UPDATE` is dropped on SQLite, whose writer is alone).
pub const LOCK_DEAD: &str =
    "SELECT seq FROM idem_outbox WHERE seq = $1 AND dead_at <> 0 FOR UPDATE";

/// The dead messages with unheld messages of their key behind them, their keys and `seq`s,
/// at most `$1`, for [`HOLD`]. Read without locking. On MySQL this read and [`HOLD`] name
/// their indexes (`FORCE INDEX`): the dead messages along `idem_outbox_due`, where InnoDB
/// would rather read every pending message along `idem_outbox_published` (a relay at 0.64
/// of a loop by hand, against 0.8), and the unheld ones per key along `idem_outbox_unheld`,
/// where it stepped over every held message of the key (a claim behind 400,000 held, 76×
/// an empty outbox's).
pub const DEAD_HEADS: &str = "SELECT d.ordering_key, d.seq FROM idem_outbox d {dead_index} \
    WHERE {holding} \
    ORDER BY d.seq LIMIT $1";

/// A dead message `d` with unheld messages of its key behind it ([`DEAD_HEADS`]).
const HOLDING: &str = "d.published_at IS NULL AND d.dead_at <> 0 \
    AND EXISTS (SELECT 1 FROM idem_outbox u {unheld} WHERE u.ordering_key = d.ordering_key \
        AND u.dead_at IS NULL AND u.seq > d.seq AND u.published_at IS NULL)";

/// The ordering key of dead message `$1` (its id), to release its key once it is requeued
/// or discarded.
pub const DEAD_KEY: &str = "SELECT ordering_key FROM idem_outbox WHERE id = $1 AND dead_at <> 0";

/// At most `$1` keys with held messages and no dead one: held by a staging that read its
/// key's head dead while the head was being requeued or discarded. A relay releases them
/// now and then ([`RELEASE`]); read without locking. The dead keys are read once (an
/// uncorrelated `NOT IN`), not once per held message.
pub const STRANDED: &str = "SELECT DISTINCT h.ordering_key FROM idem_outbox h \
    WHERE h.published_at IS NULL AND h.dead_at = 0 \
    AND h.ordering_key NOT IN (SELECT d.ordering_key FROM idem_outbox d \
        WHERE d.published_at IS NULL AND d.dead_at <> 0) \
    LIMIT $1";

/// The columns a claim reads, and `now`, the database's time then.
const CLAIMED: &str = "seq, id, ordering_key, destination, routing_key, payload, headers, \
    attempts, created_at, {now} AS now";

/// The heads that are due: pending, not dead, their next attempt reached, and no
/// unpublished message of their key before them, leaving out a delayed one not due yet
/// (never attempted, due later): a delayed message takes its place in its key's order when
/// it is due, and holds back nothing until then. A message that failed holds its key's
/// later messages back through its backoff. On SQLite and MySQL both reads name their
/// index (`INDEXED BY`, `FORCE INDEX`): with the statistics of `ANALYZE` taken behind a dead
/// head, SQLite would rather walk the table in `seq` order and look for a predecessor along
/// the primary key, through every held message (measured: 34× an empty outbox's claim with
/// 20,000 held), and InnoDB walk the held messages along `idem_outbox_published` (11× with
/// 100,000 held).
const DUE_HEADS: &str = "o.published_at IS NULL AND o.dead_at IS NULL \
    AND o.next_attempt_at <= {now} \
    AND NOT EXISTS (SELECT 1 FROM idem_outbox p {indexed_pending} \
        WHERE p.ordering_key = o.ordering_key AND p.seq < o.seq AND p.published_at IS NULL \
        AND (p.attempts > 0 OR p.next_attempt_at <= {now}))";

/// The `seq`s of at most `$1` due heads, in the order they came due (`next_attempt_at`,
/// then `seq`, along `idem_outbox_due_at`, so that messages due later are never scanned),
/// read without locking, in autocommit
/// before the claiming transaction (MySQL, whose claim then locks each one by its primary
/// key: [`LOCK_ONE_MYSQL`]); `dead_key` NULL. In the same read, at most 100 dead messages
/// with unheld messages of their key behind them ([`DEAD_HEADS`]), their `seq`s and keys
/// (`dead_key`): MySQL's staging does not hold ([`INSERT_MYSQL`]), so its relay holds
/// ([`HOLD`]) before it claims, without a round trip more (a read of its own cost the relay
/// a tenth of its throughput).
pub const CANDIDATES: &str = "(SELECT o.seq, NULL AS dead_key FROM idem_outbox o {indexed_due} \
        WHERE {due} ORDER BY o.next_attempt_at, o.seq LIMIT $1) \
    UNION ALL (SELECT d.seq, d.ordering_key AS dead_key FROM idem_outbox d {dead_index} \
        WHERE {holding} \
        ORDER BY d.seq LIMIT 100)";

/// Locks one candidate (`$n` its seq) if it is still pending and due (the locking read
/// sees the latest commit: a candidate another relay has just failed is due later, and is
/// passed over), passing over it if another relay holds it. A claim is the `UNION ALL` of
/// one per candidate ([`OutboxSql::lock`]): InnoDB locks a row found by an equality on the
/// primary key alone, while a locking read of a range or an `IN` list (under its default
/// REPEATABLE READ) also locks the gaps it scanned, and every INSERT of a new message would
/// wait for the relay's batch to be published and committed.
///
/// With it, the row of its key's bucket in `idem_outbox_locks` ([`MYSQL_KEY_BUCKETS`]),
/// passed over as well if another relay holds it: while a relay publishes a message of a
/// key, no other relay claims another of it, not even one with a lower `seq` whose
/// transaction committed after the first was claimed (AUTO_INCREMENT hands out `seq` at
/// INSERT). Two keys sharing a bucket only wait for each other.
pub const LOCK_ONE_MYSQL: &str = "(SELECT {claimed} FROM idem_outbox o \
    JOIN idem_outbox_locks l ON l.bucket = CRC32(o.ordering_key) % %buckets% \
    WHERE o.seq = $n AND o.published_at IS NULL AND o.dead_at IS NULL \
    AND o.next_attempt_at <= {now} FOR UPDATE SKIP LOCKED)";

/// How many lock rows `idem_outbox_locks` holds on MySQL (its migration makes them): a
/// claim locks, with each message, the row of its ordering key's bucket (`CRC32` of the key
/// modulo this), and passes over a message whose bucket another relay holds ([`LOCK_ONE_MYSQL`]).
/// MySQL's `GET_LOCK` is held by a session, not a transaction, and refused on Galera.
pub const MYSQL_KEY_BUCKETS: u32 = 16_384;

/// Claims at most `$1` due heads, in the order they came due (`next_attempt_at`, then `seq`,
/// along `idem_outbox_due_at`: messages delayed or backing off for later are never
/// scanned), locking them until the relay's transaction
/// ends and passing over those another relay holds (PostgreSQL; only the outer rows are
/// locked, `OF o`). Each head also takes its ordering key's transaction-scoped advisory
/// lock (class [`ADVISORY_CLASS`], the `hashtext` of the table's oid and the key: advisory
/// locks are the database's, and outboxes in two schemas of one database must not hold
/// back each other's keys), and a key whose lock another
/// relay holds is passed over: while a relay publishes a message of a key, no other relay
/// claims another of it — not even one with a lower `seq` whose transaction committed after
/// the first was claimed (a sequence hands out `seq` at INSERT). Two keys sharing a hash
/// only wait for each other. The planner may try the lock on a row before it knows the row
/// is a head: the key is then held back until this relay commits, a delay, never a
/// message out of order (that key's head is this relay's, not due, or not committed yet).
pub const CLAIM_LOCKED_POSTGRES: &str = "SELECT {claimed} FROM idem_outbox o WHERE {due} \
    AND pg_try_advisory_xact_lock(%class%, hashtext(o.tableoid::text || ' ' || o.ordering_key)) \
    ORDER BY o.next_attempt_at, o.seq LIMIT $1 FOR UPDATE OF o SKIP LOCKED";

/// The first key of the outbox's advisory locks on PostgreSQL (`pg_try_advisory_xact_lock(int,
/// int)`): `0x1de3_0b0c`, idem's own, so that they share no lock with an application's.
pub const ADVISORY_CLASS: i32 = 0x1de3_0b0c;

/// Claims at most `$1` due heads for `$2` milliseconds (SQLite, inside the writer's
/// `BEGIN IMMEDIATE`, committed before publishing): a head whose claim lives is passed
/// over, and keeps its key's successors back, until its relay marks it or the claim ends.
pub const CLAIM_LEASED: &str = "UPDATE idem_outbox SET claimed_until = {now} + $2 \
    WHERE seq IN (SELECT o.seq FROM idem_outbox o {indexed_due} WHERE {due} \
        AND (o.claimed_until IS NULL OR o.claimed_until <= {now}) \
        ORDER BY o.next_attempt_at, o.seq LIMIT $1) \
    RETURNING {claimed}";

/// Marks published messages: `{seqs}` is the list of their `seq`s, `$1, $2, …`
/// ([`OutboxSql::published`]). Without `AND published_at IS NULL`: the relay holds the rows
/// it marks (locked, or leased on SQLite, where a second mark after a lost lease is
/// harmless), and with that predicate PostgreSQL plans the UPDATE along the partial index of
/// pending messages, scanning it whole (measured: a relay at 0.6 of a loop written by hand,
/// 1.1 without).
pub const PUBLISHED: &str = "UPDATE idem_outbox \
    SET published_at = {now}, attempts = attempts + 1, last_error = NULL, claimed_until = NULL \
    WHERE seq IN ({seqs})";

/// Records a failed attempt at `$1` seq: `$2` the error, its next attempt `$3` milliseconds
/// from now, dead once it has made `$4` attempts. `dead_at` is assigned before `attempts`:
/// MySQL evaluates the assignments of an UPDATE in order, each seeing the ones before it.
pub const FAILED: &str = "UPDATE idem_outbox \
    SET dead_at = CASE WHEN attempts + 1 >= $4 THEN {now} ELSE NULL END, \
    attempts = attempts + 1, last_error = $2, next_attempt_at = {now} + $3, claimed_until = NULL \
    WHERE seq = $1 AND published_at IS NULL";

/// Cancels a staged message (`$1` id) not published yet and not being published (a relay
/// that claimed it holds its row on PostgreSQL and MySQL, so this waits for it and then
/// finds it published; on SQLite its claim is a lease, which this passes over), in the
/// caller's transaction: the rows deleted.
pub const CANCEL: &str = "DELETE FROM idem_outbox WHERE id = $1 AND published_at IS NULL \
    AND (claimed_until IS NULL OR claimed_until <= {now})";

/// Puts a dead message (`$1` id) back, as new: attempts from 0, due now; its last error
/// becomes `$2` (who requeued it; `''`: none).
pub const REQUEUE: &str = "UPDATE idem_outbox \
    SET dead_at = NULL, attempts = 0, last_error = NULLIF($2, ''), next_attempt_at = {now}, claimed_until = NULL \
    WHERE id = $1 AND dead_at <> 0";

/// Deletes a dead message (`$1` id): its key's successors go on without it.
pub const DISCARD: &str = "DELETE FROM idem_outbox WHERE id = $1 AND dead_at <> 0";

/// The dead messages, oldest first, at most `$1`.
pub const DEAD: &str = "SELECT seq, id, ordering_key, destination, routing_key, attempts, \
    last_error, created_at, dead_at \
    FROM idem_outbox WHERE published_at IS NULL AND dead_at <> 0 ORDER BY seq LIMIT $1";

/// How many milliseconds until the next live message comes due (a delayed message, or a
/// failed one's next attempt), by the database's clock, among those that came due less
/// than `$1` milliseconds ago or later; NULL when there is none. An idle relay sleeps
/// until then rather than a whole poll interval; `$1` is the time since its last claim
/// began, so that a message that came due after that claim's now is found (its wait is
/// then negative: claim again at once), and one due before it, which the claim passed over
/// (behind its key's head), is not. One probe of `idem_outbox_due_at`.
pub const NEXT_DUE: &str = "SELECT MIN(o.next_attempt_at) - {now} AS wait \
    FROM idem_outbox o {indexed_due} \
    WHERE o.published_at IS NULL AND o.dead_at IS NULL AND o.next_attempt_at > {now} - $1";

/// What [`BACKLOG`] and [`BACKLOG_BY_DESTINATION`] count of the unpublished messages.
macro_rules! backlog_counts {
    () => {
        "COUNT(*) AS pending, \
         COUNT(CASE WHEN dead_at <> 0 THEN 1 END) AS dead, \
         COUNT(CASE WHEN dead_at = 0 THEN 1 END) AS held, \
         {now} - MIN(created_at) AS oldest_age \
         FROM idem_outbox WHERE published_at IS NULL"
    };
}

/// How many messages are unpublished (dead and held ones included), how many of them are
/// dead, how many are held behind a dead one, and the age in milliseconds of the oldest
/// unpublished one (NULL for none).
pub const BACKLOG: &str = concat!("SELECT ", backlog_counts!());

/// [`BACKLOG`] per destination, in the destinations' order.
pub const BACKLOG_BY_DESTINATION: &str = concat!(
    "SELECT destination, ",
    backlog_counts!(),
    " GROUP BY destination ORDER BY destination"
);

/// One bounded batch of retention (PostgreSQL): messages published more than `$1`
/// milliseconds ago, at most `$2`, passing over rows another transaction holds.
pub const PURGE_POSTGRES: &str = "DELETE FROM idem_outbox WHERE seq IN (\
    SELECT seq FROM idem_outbox WHERE published_at < {now} - $1 \
    ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// One bounded batch of retention (MySQL, which deletes with a `LIMIT` directly, oldest
/// first along the index on `published_at`).
pub const PURGE_MYSQL: &str = "DELETE FROM idem_outbox WHERE published_at < {now} - $1 \
    ORDER BY published_at LIMIT $2";

/// One bounded batch of retention (SQLite).
pub const PURGE_SQLITE: &str = "DELETE FROM idem_outbox WHERE seq IN (\
    SELECT seq FROM idem_outbox WHERE published_at < {now} - $1 \
    ORDER BY published_at LIMIT $2)";

/// How many messages a purge with retention `$1` milliseconds would delete now, as `n`.
pub const PURGEABLE: &str = "SELECT COUNT(*) AS n FROM idem_outbox WHERE published_at < {now} - $1";

/// Whether a relay claims by row lock for the length of its transaction (PostgreSQL,
/// MySQL) or by a lease it commits before publishing (SQLite, whose one writer a relay must
/// not hold while it waits for a broker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// `SELECT … FOR UPDATE SKIP LOCKED`, in the transaction that marks them (PostgreSQL).
    Locked,
    /// The candidates read in autocommit, then each locked by its key ([`LOCK_ONE_MYSQL`])
    /// in the transaction that marks them (MySQL).
    Candidates,
    /// `UPDATE … SET claimed_until`, committed; marked in a second transaction.
    Leased,
}

/// The outbox's statements as one dialect spells them ([`Dialect::outbox`]).
#[derive(Debug)]
pub struct OutboxSql {
    /// [`INSERT_NOTIFYING`] on PostgreSQL (it returns a row), [`INSERT`] on SQLite,
    /// [`INSERT_MYSQL`] on MySQL.
    pub insert: String,
    /// [`INSERT`] (no notification), for PostgreSQL when staging does not notify (the
    /// notification's lock at COMMIT serializes the commits of concurrent stagers);
    /// elsewhere [`insert`](Self::insert).
    pub insert_quiet: String,
    /// Whether [`insert`](Self::insert) returns its count as a row (`staged`); never
    /// [`insert_quiet`](Self::insert_quiet).
    pub insert_returns_row: bool,
    /// How a relay claims.
    pub claim_kind: Claim,
    /// [`CLAIM_LOCKED_POSTGRES`], [`CLAIM_LEASED`] or [`CANDIDATES`].
    pub claim: String,
    /// [`LOCK_ONE_MYSQL`], `$n` to be numbered by [`lock`](Self::lock).
    lock_one: String,
    /// What a locked claim runs first in its transaction (PostgreSQL): `READ COMMITTED`,
    /// whatever the default. The claim is written for it, and a SERIALIZABLE relay would take
    /// part in the predicate locking of the handlers that stage (their COMMIT could fail with
    /// a serialization failure because a relay read the outbox). MySQL's claim reads its
    /// candidates in autocommit instead, which never locks.
    pub claim_isolation: Option<&'static str>,
    /// [`PUBLISHED`], `{seqs}` to be spelled by [`published`](Self::published).
    published: String,
    /// [`FAILED`].
    pub failed: String,
    /// [`REQUEUE`].
    pub requeue: String,
    /// [`DISCARD`].
    pub discard: String,
    /// [`CANCEL`].
    pub cancel: String,
    /// [`DEAD`].
    pub dead: String,
    /// [`BACKLOG`].
    pub backlog: String,
    /// [`BACKLOG_BY_DESTINATION`].
    pub backlog_by_destination: String,
    /// [`NEXT_DUE`].
    pub next_due: String,
    /// [`PURGE_POSTGRES`], [`PURGE_SQLITE`] or [`PURGE_MYSQL`].
    pub purge: String,
    /// [`PURGEABLE`].
    pub purgeable: String,
    /// [`HOLD`].
    pub hold: String,
    /// [`LOCK_DEAD`].
    pub lock_dead: String,
    /// [`DEAD_HEADS`].
    pub dead_heads: String,
    /// [`RELEASE`].
    pub release: String,
    /// [`DEAD_KEY`].
    pub dead_key: String,
    /// [`STRANDED`].
    pub stranded: String,
}

impl OutboxSql {
    fn of(dialect: Dialect) -> OutboxSql {
        let now = dialect.now_millis();
        let serializable = match dialect {
            Dialect::Postgres => "current_setting('transaction_isolation') = 'serializable'",
            // SQLite's transactions are serializable, and its one writer makes the read safe;
            // MySQL does not read (INSERT_MYSQL).
            Dialect::Sqlite | Dialect::MySql => "0 = 1",
        };
        let indexed = |index: &str| match dialect {
            Dialect::Sqlite => format!("INDEXED BY {index}"),
            Dialect::MySql => format!("FORCE INDEX ({index})"),
            Dialect::Postgres => String::new(),
        };
        let unheld = match dialect {
            Dialect::MySql => "FORCE INDEX (idem_outbox_unheld)",
            Dialect::Postgres | Dialect::Sqlite => "",
        };
        let dead_index = match dialect {
            Dialect::MySql => "FORCE INDEX (idem_outbox_due)",
            // SQLite's and PostgreSQL's index of due messages leaves the dead out.
            Dialect::Postgres | Dialect::Sqlite => "",
        };
        let spell = |template: &str| {
            template
                .replace("{claimed}", CLAIMED)
                .replace("{due}", DUE_HEADS)
                .replace("{holding}", HOLDING)
                .replace("{held}", HELD_IF_HEAD_IS)
                .replace("{indexed_due}", &indexed("idem_outbox_due_at"))
                .replace("{unheld}", unheld)
                .replace("{dead_index}", dead_index)
                .replace("{indexed_pending}", &indexed("idem_outbox_pending"))
                .replace("{serializable}", serializable)
                .replace("{now}", now)
                .replace("%class%", &ADVISORY_CLASS.to_string())
                .replace("%buckets%", &MYSQL_KEY_BUCKETS.to_string())
        };
        OutboxSql {
            insert: spell(match dialect {
                Dialect::Postgres => INSERT_NOTIFYING,
                Dialect::Sqlite => INSERT,
                Dialect::MySql => INSERT_MYSQL,
            }),
            insert_quiet: spell(match dialect {
                Dialect::Postgres | Dialect::Sqlite => INSERT,
                Dialect::MySql => INSERT_MYSQL,
            }),
            insert_returns_row: dialect == Dialect::Postgres,
            claim_kind: match dialect {
                Dialect::Postgres => Claim::Locked,
                Dialect::MySql => Claim::Candidates,
                Dialect::Sqlite => Claim::Leased,
            },
            claim: spell(match dialect {
                Dialect::Postgres => CLAIM_LOCKED_POSTGRES,
                Dialect::Sqlite => CLAIM_LEASED,
                Dialect::MySql => CANDIDATES,
            }),
            published: spell(PUBLISHED),
            lock_one: spell(LOCK_ONE_MYSQL),
            claim_isolation: match dialect {
                Dialect::Postgres => Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
                Dialect::Sqlite | Dialect::MySql => None,
            },
            failed: spell(FAILED),
            requeue: spell(REQUEUE),
            discard: DISCARD.to_owned(),
            cancel: spell(CANCEL),
            dead: DEAD.to_owned(),
            backlog: spell(BACKLOG),
            backlog_by_destination: spell(BACKLOG_BY_DESTINATION),
            next_due: spell(NEXT_DUE),
            purgeable: spell(PURGEABLE),
            purge: spell(match dialect {
                Dialect::Postgres => PURGE_POSTGRES,
                Dialect::Sqlite => PURGE_SQLITE,
                Dialect::MySql => PURGE_MYSQL,
            }),
            hold: spell(HOLD),
            lock_dead: match dialect {
                Dialect::Sqlite => LOCK_DEAD.replace(" FOR UPDATE", ""),
                Dialect::Postgres | Dialect::MySql => LOCK_DEAD.to_owned(),
            },
            dead_heads: spell(DEAD_HEADS),
            release: RELEASE.to_owned(),
            dead_key: DEAD_KEY.to_owned(),
            stranded: STRANDED.to_owned(),
        }
    }
}

impl OutboxSql {
    /// [`PUBLISHED`] for `n` messages, their `seq`s bound as `$1` to `$n`.
    pub fn published(&self, n: usize) -> String {
        let seqs: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
        self.published.replace("{seqs}", &seqs.join(", "))
    }

    /// The claim of `n` candidates ([`LOCK_ONE_MYSQL`] for each), their `seq`s bound as
    /// `$1` to `$n`.
    pub fn lock(&self, n: usize) -> String {
        let parts: Vec<String> = (1..=n)
            .map(|i| self.lock_one.replace("$n", &format!("${i}")))
            .collect();
        parts.join(" UNION ALL ")
    }
}

static POSTGRES: LazyLock<OutboxSql> = LazyLock::new(|| OutboxSql::of(Dialect::Postgres));
static SQLITE: LazyLock<OutboxSql> = LazyLock::new(|| OutboxSql::of(Dialect::Sqlite));
static MYSQL: LazyLock<OutboxSql> = LazyLock::new(|| OutboxSql::of(Dialect::MySql));

/// The channel PostgreSQL notifies when a message is staged ([`INSERT_NOTIFYING`]).
pub const CHANNEL: &str = "idem_outbox";

impl Dialect {
    /// The outbox's statements as this dialect spells them (built once per dialect).
    pub fn outbox(self) -> &'static OutboxSql {
        match self {
            Dialect::Postgres => &POSTGRES,
            Dialect::Sqlite => &SQLITE,
            Dialect::MySql => &MYSQL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_per_destination_counts_what_the_backlog_counts() {
        assert_eq!(
            BACKLOG,
            "SELECT COUNT(*) AS pending, COUNT(CASE WHEN dead_at <> 0 THEN 1 END) AS dead, \
             COUNT(CASE WHEN dead_at = 0 THEN 1 END) AS held, {now} - MIN(created_at) AS \
             oldest_age FROM idem_outbox WHERE published_at IS NULL"
        );
        assert_eq!(
            BACKLOG_BY_DESTINATION,
            BACKLOG.replace("SELECT ", "SELECT destination, ")
                + " GROUP BY destination ORDER BY destination"
        );
    }

    #[test]
    fn every_template_is_spelled_and_timed_by_the_database() {
        for dialect in Dialect::ALL {
            let sql = dialect.outbox();
            for statement in [
                &sql.insert,
                &sql.claim,
                &sql.published(2),
                &sql.failed,
                &sql.requeue,
                &sql.backlog,
                &sql.purge,
            ] {
                assert!(!statement.contains('{'), "{statement}");
                assert!(!statement.contains('}'), "{statement}");
                assert!(
                    statement.contains(dialect.now_millis()),
                    "{dialect:?}: {statement}"
                );
            }
        }
        assert!(Dialect::Postgres.outbox().insert.contains("pg_notify"));
        assert!(Dialect::Postgres.outbox().insert_returns_row);
        assert!(!Dialect::MySql.outbox().insert.contains("ON CONFLICT"));
        assert!(!Dialect::MySql.outbox().claim.contains("FOR UPDATE"));
        let lock = Dialect::MySql.outbox().lock(2);
        assert!(lock.contains("o.seq = $1 AND") && lock.contains(") UNION ALL (SELECT"));
        assert!(lock.contains("o.seq = $2 AND") && lock.ends_with("FOR UPDATE SKIP LOCKED)"));
        assert!(
            Dialect::Postgres
                .outbox()
                .claim
                .contains("FOR UPDATE OF o SKIP LOCKED")
        );
        assert_eq!(Dialect::Sqlite.outbox().claim_kind, Claim::Leased);
        assert!(
            Dialect::Sqlite
                .outbox()
                .published(3)
                .contains("seq IN ($1, $2, $3)")
        );
        assert!(Dialect::Sqlite.outbox().claim.contains("claimed_until"));
    }

    /// MySQL assigns in order: the dead test reads `attempts` before it is incremented.
    #[test]
    fn a_failure_decides_death_before_counting_the_attempt() {
        let failed = Dialect::MySql.outbox().failed.as_str();
        let dead = failed.find("dead_at =").unwrap();
        let counted = failed.find("attempts = attempts + 1").unwrap();
        assert!(dead < counted, "{failed}");
    }
}
