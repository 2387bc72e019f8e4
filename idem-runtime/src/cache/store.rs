//! The fast path's reads and writes on Redis: bounded by their timeouts, behind the
//! breaker, counted, and never an error for the caller.

use super::{Redis, Stat};
use crate::value::hex::hex;
use crate::work::fast::{CacheKey, part};
use sha2::{Digest, Sha256};
use std::time::Duration;
use tracing::Span;

/// What idem writes before a plan's value: its format, so that a value of another program
/// (or of a later format) under the key is a miss, never a misread.
const ENVELOPE: &str = "idem/1\n";

/// A cache attached to a pool: the cache and the digest of the database it is attached
/// for.
#[derive(Debug)]
pub(crate) struct Attached {
    redis: Redis,
    database: [u8; 32],
}

impl Attached {
    pub(crate) fn new(redis: Redis, identity: &str) -> Attached {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/cache/database/1");
        part(&mut digest, identity.as_bytes());
        Attached {
            redis,
            database: digest.finalize().into(),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.redis.ttl
    }

    /// The Redis key of `key` in this database: `namespace:` and a digest.
    pub(crate) fn redis_key(&self, key: &CacheKey) -> String {
        let mut digest = Sha256::new();
        digest.update(self.database);
        digest.update(key.0);
        format!("{}:{}", self.redis.namespace, hex(&digest.finalize()))
    }

    /// The plan's value under `key`, if Redis answers in time with one of idem's; counted
    /// and recorded in `span` when it does not (a hit or a foreign value is recorded by
    /// [`answered`](Self::answered), once the plan read it).
    pub(crate) async fn get(&self, key: &str, span: &Span) -> Option<String> {
        let redis = &self.redis;
        let breaker = redis.circuit();
        if !breaker.allows() {
            return self.read(Stat::Skipped, span);
        }
        let mut conn = redis.conn.clone();
        let mut get = redis::cmd("GET");
        get.arg(key);
        let get = get.query_async::<Option<Vec<u8>>>(&mut conn);
        let value = match tokio::time::timeout(redis.read_timeout, get).await {
            Err(_) => {
                breaker.failed();
                return self.read(Stat::Timeout, span);
            }
            Ok(Err(e)) if e.code() == Some("WRONGTYPE") => {
                // Not a string: another program's key. Redis itself answered.
                breaker.succeeded();
                return self.read(Stat::Foreign, span);
            }
            Ok(Err(e)) => {
                breaker.failed();
                tracing::debug!(error = %e, "idem: the cache could not be read; asking the database");
                return self.read(Stat::Error, span);
            }
            Ok(Ok(value)) => value,
        };
        breaker.succeeded();
        let Some(bytes) = value else {
            return self.read(Stat::Miss, span);
        };
        match String::from_utf8(bytes)
            .ok()
            .and_then(|text| text.strip_prefix(ENVELOPE).map(str::to_owned))
        {
            Some(value) => Some(value),
            None => self.read(Stat::Foreign, span),
        }
    }

    /// The plan read the value: it answered the call (`hit`) or could not use it.
    pub(crate) fn answered(&self, hit: bool, span: &Span) {
        let _ = self.read::<()>(if hit { Stat::Hit } else { Stat::Foreign }, span);
    }

    fn read<T>(&self, stat: Stat, span: &Span) -> Option<T> {
        self.redis.count(stat);
        span.record("idem.cache", stat.name());
        #[cfg(feature = "metrics")]
        metrics::counter!("idem_cache_reads_total", "result" => stat.name()).increment(1);
        None
    }

    /// Writes `value` under `key` on a task of its own (none outside a Tokio runtime), for
    /// the TTL, within the write timeout; counted.
    pub(crate) fn put(&self, key: String, value: String) {
        let redis = self.redis.clone();
        if !redis.circuit().allows() {
            return write_counted(&redis, Stat::WriteSkipped);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return write_counted(&redis, Stat::WriteSkipped);
        };
        let ttl = u64::try_from(redis.ttl.as_millis()).unwrap_or(u64::MAX);
        runtime.spawn(async move {
            let mut conn = redis.conn.clone();
            let mut set = redis::cmd("SET");
            set.arg(&key)
                .arg(format!("{ENVELOPE}{value}"))
                .arg("PX")
                .arg(ttl);
            let set = set.query_async::<()>(&mut conn);
            let stat = match tokio::time::timeout(redis.write_timeout, set).await {
                Ok(Ok(())) => {
                    redis.circuit().succeeded();
                    Stat::Written
                }
                Ok(Err(e)) => {
                    redis.circuit().failed();
                    tracing::debug!(error = %e, "idem: the cache could not be written");
                    Stat::WriteFailed
                }
                Err(_) => {
                    redis.circuit().failed();
                    Stat::WriteFailed
                }
            };
            write_counted(&redis, stat);
        });
    }
}

fn write_counted(redis: &Redis, stat: Stat) {
    redis.count(stat);
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_cache_writes_total", "result" => stat.name()).increment(1);
}
