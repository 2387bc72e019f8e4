//! The fast path's reads and writes on Redis: bounded by their timeouts, behind the
//! breaker, counted, and never an error for the caller.

use super::{Redis, Stat};
use crate::value::hex::hex;
use crate::work::fast::{CacheKey, FirstResults, part};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
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
    /// The writer task's queue (started on the first write, again if its runtime ended):
    /// key, value, and the entry's life in milliseconds.
    writer: Mutex<Option<mpsc::Sender<Write>>>,
}

impl Attached {
    pub(crate) fn new(redis: Redis, identity: &str) -> Attached {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/cache/database/1");
        part(&mut digest, identity.as_bytes());
        Attached {
            redis,
            database: digest.finalize().into(),
            writer: Mutex::new(None),
        }
    }

    fn read<T>(&self, stat: Stat, span: &Span) -> Option<T> {
        self.redis.count(stat, 1);
        span.record("idem.cache", stat.name());
        #[cfg(feature = "metrics")]
        metrics::counter!("idem_cache_reads_total", "result" => stat.name()).increment(1);
        None
    }
}

impl FirstResults for Attached {
    fn ttl(&self) -> Duration {
        self.redis.ttl
    }

    /// The Redis key of `key` in this database: `namespace:` and a digest.
    fn key(&self, key: &CacheKey) -> String {
        let mut digest = Sha256::new();
        digest.update(self.database);
        digest.update(key.0);
        format!("{}:{}", self.redis.namespace, hex(&digest.finalize()))
    }

    /// The plan's value under `key`, if Redis answers in time with one of idem's; counted
    /// and recorded in `span` when it does not (a hit or a foreign value is recorded by
    /// [`answered`](Self::answered), once the plan read it).
    fn get<'a>(
        &'a self,
        key: &'a str,
        span: &'a Span,
    ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>> {
        Box::pin(async move {
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
        })
    }

    /// The plan read the value: it answered the call (`hit`) or could not use it.
    fn answered(&self, hit: bool, span: &Span) {
        let _ = self.read::<()>(if hit { Stat::Hit } else { Stat::Foreign }, span);
    }

    /// Queues `value` under `key` for the writer task, which writes what is queued in one
    /// pipeline (`SET … PX life` each), within the write timeout; counted. The entry lives
    /// the TTL less `age` (how old its record already is, by the database's clock); nothing
    /// is written for a record as old as the TTL. Skipped (and counted) while the breaker is
    /// open, outside a Tokio runtime, or when the queue is full: the call never waits for a
    /// write.
    fn put(&self, key: String, value: String, age: Duration) {
        let Some(life) = self
            .redis
            .ttl
            .checked_sub(age)
            .filter(|life| !life.is_zero())
        else {
            return;
        };
        let life = u64::try_from(life.as_millis()).unwrap_or(u64::MAX).max(1);
        if !self.redis.circuit().allows() {
            return write_counted(&self.redis, Stat::WriteSkipped, 1);
        }
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut item = (key, value, life);
        for _ in 0..2 {
            let sender = match &*writer {
                Some(sender) => sender.clone(),
                None => match spawn_writer(self.redis.clone()) {
                    Some(sender) => writer.insert(sender).clone(),
                    None => return write_counted(&self.redis, Stat::WriteSkipped, 1),
                },
            };
            match sender.try_send(item) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return write_counted(&self.redis, Stat::WriteSkipped, 1);
                }
                // Its runtime ended (a test's, a runtime the pool outlived): start another.
                Err(mpsc::error::TrySendError::Closed(back)) => {
                    item = back;
                    *writer = None;
                }
            }
        }
        write_counted(&self.redis, Stat::WriteSkipped, 1);
    }
}

/// The most writes waiting for the writer; more are skipped.
const QUEUED_WRITES: usize = 4096;
/// The most writes in one pipeline.
const WRITES_PER_PIPELINE: usize = 256;

/// Starts the writer task of `redis` on the current runtime; its queue, or `None` outside
/// a runtime. The task ends when its queue's senders are gone.
/// A write queued for the writer task: key, value, life in milliseconds.
type Write = (String, String, u64);

fn spawn_writer(redis: Redis) -> Option<mpsc::Sender<Write>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (sender, mut queue) = mpsc::channel::<Write>(QUEUED_WRITES);
    runtime.spawn(async move {
        let mut batch = Vec::with_capacity(WRITES_PER_PIPELINE);
        while queue.recv_many(&mut batch, WRITES_PER_PIPELINE).await > 0 {
            let n = batch.len() as u64;
            let mut pipe = redis::pipe();
            for (key, value, life) in batch.drain(..) {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(format!("{ENVELOPE}{value}"))
                    .arg("PX")
                    .arg(life)
                    .ignore();
            }
            let mut conn = redis.conn.clone();
            let written =
                tokio::time::timeout(redis.write_timeout, pipe.query_async::<()>(&mut conn));
            let stat = match written.await {
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
            write_counted(&redis, stat, n);
        }
    });
    Some(sender)
}

fn write_counted(redis: &Redis, stat: Stat, n: u64) {
    redis.count(stat, n);
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_cache_writes_total", "result" => stat.name()).increment(n);
}
