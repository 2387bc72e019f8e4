//! The fast path in front of the database (feature `redis`): duplicates answered from
//! Redis without a transaction, the database still the only source of truth.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let cache = idem::cache::Redis::open("redis://127.0.0.1:6379", "orders")?
//!     .ttl(Duration::from_secs(600));
//! cache.attach(&pool).await?;
//! // Every handler, inbox and HTTP layer that runs from `pool` now asks Redis first.
//! # Ok(()) }
//! ```
//!
//! # What it does
//!
//! - **Written only after the commit.** When a call from an attached pool commits a first
//!   result (a transition's `Applied`, an inbox's `Processed`, the HTTP layer's stored
//!   response), idem writes it to Redis (`SET key value PX ttl`) after the COMMIT returned, on a task
//!   of its own, best effort. A body that fails, a refusal or a transaction that rolls
//!   back writes nothing, so Redis never holds a result the database does not. A duplicate
//!   the database answered is written too, so hits resume after Redis lost its data.
//! - **Read first.** A call first asks Redis (`GET`) under [`Redis::read_timeout`]
//!   (5 ms by default). A hit answers the duplicate without a database round trip; a miss,
//!   a timeout, an error, or a value idem cannot read (another program's, an older
//!   format, another payload under the same message key) goes to the database, exactly as
//!   without the cache.
//! - **Never a single point of failure.** Redis's errors are never returned. Once 5
//!   requests within a second failed and they are at least half of them
//!   ([`Redis::breaker`]), the cache is skipped for its cool-down (5 s), then tried again.
//!
//! # What a cached answer carries, and where it applies
//!
//! The first result is the one the database would replay. A transition's `current` is
//! the transition's target (the state its first call left the row in), not a fresh read;
//! an inbox or HTTP entry answers only a delivery of the same payload (a request with the
//! same fingerprint), anything else goes to the database. It applies to calls that begin a
//! transaction of their own from an attached pool: transition handlers (not event streams
//! nor creations), `idem::run`, the inbox in both modes and the message handlers, the HTTP
//! layer in both modes. The guide's page has the details:
//! [`idem::guide::cache`](https://docs.rs/idem/latest/idem/guide/cache/index.html).
//!
//! # Keys and expiry
//!
//! A key is `namespace:` and the hex SHA-256 of the database's name (read once, at
//! [`attach`](Redis::attach)), the kind of record and what identifies the call: no
//! business key or message key reaches Redis. Two databases holding the same machines
//! under the same name (shards) need a namespace each. An entry lives [`Redis::ttl`]
//! (10 minutes by default), and may not outlive the records the database keeps:
//! [`Inbox::purge`](crate::inbox::Inbox::purge) and the sweepers refuse a retention
//! shorter than the TTL of the cache attached to their pool
//! ([`Error::RetentionBelowCache`](crate::Error::RetentionBelowCache)).
//!
//! # Observability
//!
//! The span's `idem.cache` is `hit`, `miss`, `foreign` (a value idem cannot read),
//! `error`, `timeout` or `skipped` (the breaker is open). With the feature `metrics`,
//! `idem_cache_reads_total{result}` counts the same, and
//! `idem_cache_writes_total{result}` the writes (`ok`, `error`, `skipped`).
//! [`Redis::stats`] has the same counts in the process.

mod breaker;
mod identity;
mod store;

/// The `redis` crate idem's fast path is built on, for a
/// [`ConnectionManager`](redis::aio::ConnectionManager) of your own.
pub use redis;
use store::Attached;

use crate::backend::Backend;
use breaker::Breaker;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest namespace, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// A Redis fast path, to [`attach`](Redis::attach) to a pool. Cloning it shares its
/// connection, breaker and counts.
#[derive(Clone)]
pub struct Redis {
    conn: redis::aio::ConnectionManager,
    namespace: Arc<str>,
    ttl: Duration,
    read_timeout: Duration,
    write_timeout: Duration,
    threshold: u32,
    cool_down: Duration,
    shared: Arc<Shared>,
}

/// What the clones of one [`Redis`] share.
#[derive(Debug, Default)]
struct Shared {
    stats: [AtomicU64; Stat::COUNT],
    breaker: std::sync::OnceLock<Breaker>,
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("read_timeout", &self.read_timeout)
            .field("write_timeout", &self.write_timeout)
            .finish_non_exhaustive()
    }
}

/// Why a fast path could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheError {
    /// The namespace is empty, longer than [`MAX_NAMESPACE_LEN`], or has a character other
    /// than ASCII letters, digits and `-_.:/`.
    Namespace(String),
    /// A setting out of range: what is wrong with it.
    Setting(&'static str),
    /// The Redis URL could not be parsed.
    Redis(redis::RedisError),
    /// The database's name could not be read at [`attach`](Redis::attach).
    Database(sqlx::Error),
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::Namespace(ns) => write!(
                f,
                "the cache namespace {ns:?} is not 1 to {MAX_NAMESPACE_LEN} ASCII letters, digits or `-_.:/`"
            ),
            CacheError::Setting(problem) => write!(f, "the cache's setting: {problem}"),
            CacheError::Redis(e) => write!(f, "the Redis connection: {e}"),
            CacheError::Database(e) => write!(f, "reading the database's name: {e}"),
        }
    }
}

impl std::error::Error for CacheError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CacheError::Redis(e) => Some(e),
            CacheError::Database(e) => Some(e),
            _ => None,
        }
    }
}

fn valid_namespace(namespace: String) -> Result<Arc<str>, CacheError> {
    let fits = !namespace.is_empty() && namespace.len() <= MAX_NAMESPACE_LEN;
    let plain = namespace
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
    if fits && plain {
        Ok(namespace.into())
    } else {
        Err(CacheError::Namespace(namespace))
    }
}

impl Redis {
    /// A fast path on `conn` (the `redis` crate's reconnecting connection manager), its
    /// keys under `namespace`; 10-minute entries, 5 ms reads, 100 ms writes, and a breaker
    /// that opens for 5 s once 5 requests in a second failed, half of them or more.
    pub fn new(
        conn: redis::aio::ConnectionManager,
        namespace: impl Into<String>,
    ) -> Result<Redis, CacheError> {
        Ok(Redis {
            conn,
            namespace: valid_namespace(namespace.into())?,
            ttl: Duration::from_secs(600),
            read_timeout: Duration::from_millis(5),
            write_timeout: Duration::from_millis(100),
            threshold: 5,
            cool_down: Duration::from_secs(5),
            shared: Arc::default(),
        })
    }

    /// [`new`](Self::new) on a connection manager to `url` that connects on first use, so
    /// a service starts while Redis is down. Fails only on a URL or namespace it cannot
    /// use. Call it inside a Tokio runtime.
    pub fn open(url: &str, namespace: impl Into<String>) -> Result<Redis, CacheError> {
        let namespace = valid_namespace(namespace.into())?;
        let client = redis::Client::open(url).map_err(CacheError::Redis)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(250)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config)
            .map_err(CacheError::Redis)?;
        Redis::new(conn, namespace.to_string())
    }

    /// How long an entry lives (by default 10 minutes; at least 1 ms). Cover the window in
    /// which duplicates come (a broker's redeliveries, clients' retries); it may not be
    /// longer than the database keeps its records (see the [module](self)).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a call waits for Redis's answer before it goes to the database (by default
    /// 5 ms).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// How long a write after a commit may take before it is given up (by default
    /// 100 ms). Writes run on a task of their own: the call does not wait for them.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// Skips the cache for `cool_down` once, within a second, at least `failures` requests
    /// failed (errors or timeouts) and they are at least half of its requests (by default
    /// 5 and 5 s). A ratio, not a run of failures: a few reads that exceed the timeout
    /// together among many that succeed (a saturated CPU) do not turn the cache off.
    pub fn breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.threshold = failures.max(1);
        self.cool_down = cool_down;
        self
    }

    /// The entries' time to live.
    pub fn ttl_period(&self) -> Duration {
        self.ttl
    }

    /// What the fast path (and its clones) did so far.
    pub fn stats(&self) -> CacheStats {
        let read = |stat: Stat| self.shared.stats[stat as usize].load(Ordering::Relaxed);
        CacheStats {
            hits: read(Stat::Hit),
            misses: read(Stat::Miss),
            foreign: read(Stat::Foreign),
            errors: read(Stat::Error),
            timeouts: read(Stat::Timeout),
            skipped: read(Stat::Skipped),
            writes: read(Stat::Written),
            write_failures: read(Stat::WriteFailed),
            writes_skipped: read(Stat::WriteSkipped),
        }
    }

    /// Makes every call that begins from `pool` (and its clones) ask this cache first, and
    /// write its first result there after its commit. Reads the database's name once, for
    /// the keys. Attaching again replaces the pool's cache.
    ///
    /// Fails, attaching nothing, on a TTL or timeout of zero, or when the database's name
    /// cannot be read.
    pub async fn attach<DB: Backend>(&self, pool: &sqlx::Pool<DB>) -> Result<(), CacheError> {
        if self.ttl < Duration::from_millis(1) {
            return Err(CacheError::Setting("the TTL must be at least 1 ms"));
        }
        if self.read_timeout.is_zero() || self.write_timeout.is_zero() {
            return Err(CacheError::Setting("the timeouts must be above zero"));
        }
        let identity = identity::identity(pool)
            .await
            .map_err(CacheError::Database)?;
        self.shared
            .breaker
            .get_or_init(|| Breaker::new(self.threshold, self.cool_down));
        crate::work::fast::attach(pool, Arc::new(Attached::new(self.clone(), &identity)));
        Ok(())
    }

    fn count(&self, stat: Stat, n: u64) {
        self.shared.stats[stat as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn circuit(&self) -> &Breaker {
        self.shared
            .breaker
            .get_or_init(|| Breaker::new(self.threshold, self.cool_down))
    }
}

/// Detaches the cache from `pool`: its calls go to the database only. Entries already in
/// Redis stay until they expire.
pub fn detach<DB: Backend>(pool: &sqlx::Pool<DB>) {
    crate::work::fast::detach(pool);
}

/// What a [`Redis`] fast path did, see [`Redis::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CacheStats {
    /// Calls answered from the cache.
    pub hits: u64,
    /// Calls that found nothing in it.
    pub misses: u64,
    /// Calls that found a value idem cannot use there (not idem's, another payload).
    pub foreign: u64,
    /// Reads that failed.
    pub errors: u64,
    /// Reads that took longer than the read timeout.
    pub timeouts: u64,
    /// Calls that skipped the cache while its breaker was open.
    pub skipped: u64,
    /// First results written.
    pub writes: u64,
    /// Writes that failed or timed out.
    pub write_failures: u64,
    /// Writes skipped while the breaker was open.
    pub writes_skipped: u64,
}

#[derive(Debug, Clone, Copy)]
enum Stat {
    Hit,
    Miss,
    Foreign,
    Error,
    Timeout,
    Skipped,
    Written,
    WriteFailed,
    WriteSkipped,
}

impl Stat {
    const COUNT: usize = 9;

    fn name(self) -> &'static str {
        match self {
            Stat::Hit => "hit",
            Stat::Miss => "miss",
            Stat::Foreign => "foreign",
            Stat::Error | Stat::WriteFailed => "error",
            Stat::Timeout => "timeout",
            Stat::Skipped | Stat::WriteSkipped => "skipped",
            Stat::Written => "ok",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_plain_and_short() {
        assert!(valid_namespace("orders-eu/1:v2".into()).is_ok());
        for bad in ["", "with space", "ключ", &"x".repeat(MAX_NAMESPACE_LEN + 1)] {
            match valid_namespace(bad.into()) {
                Err(CacheError::Namespace(ns)) => assert_eq!(ns, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
