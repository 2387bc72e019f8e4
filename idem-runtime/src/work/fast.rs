//! The fast path as the unit of work sees it: before a call from a pool begins, its
//! duplicate may be answered from the store of first results attached to that pool (the
//! Redis cache of feature `redis`, [`idem::cache`](crate::cache)); after it commits, its
//! first result is written there. For a pool with nothing attached, every step is a no-op.
//!
//! What a plan puts in the store and reads back is its own ([`Plan::cache_key`],
//! [`Plan::cache_value`], [`Plan::cached_reply`]); the unit of work only says when. What
//! the store is, is the attaching module's: it implements [`FirstResults`] and registers it
//! here ([`attach`]), and the unit of work never names it.

use crate::backend::Backend;
use crate::work::unit::Plan;
use sha2::{Digest, Sha256};
use sqlx::Pool;
use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::Span;

/// What identifies the first result of a call in the cache: the SHA-256 of the kind of
/// record and the parts that identify it (length-prefixed, so no two calls share one),
/// never the parts themselves, so no key of a caller's reaches the cache.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CacheKey(pub(crate) [u8; 32]);

impl CacheKey {
    /// The key of the `kind` record identified by `parts`.
    pub(crate) fn new(kind: &str, parts: &[&str]) -> CacheKey {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/cache/1");
        part(&mut digest, kind.as_bytes());
        for p in parts {
            part(&mut digest, p.as_bytes());
        }
        CacheKey(digest.finalize().into())
    }
}

pub(crate) fn part(digest: &mut Sha256, bytes: &[u8]) {
    digest.update((bytes.len() as u64).to_be_bytes());
    digest.update(bytes);
}

/// A store of first results in front of the database, as the unit of work uses it. Its
/// reads and writes never fail the call: a store that cannot answer answers nothing.
pub(crate) trait FirstResults: Send + Sync {
    /// The store's own key for `key`.
    fn key(&self, key: &CacheKey) -> String;

    /// The value stored under `key`, if the store answers in time with one of idem's;
    /// recorded in `span` when it does not.
    fn get<'a>(
        &'a self,
        key: &'a str,
        span: &'a Span,
    ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

    /// The plan read the value `get` returned: it answered the call (`hit`), or it could
    /// not use it.
    fn answered(&self, hit: bool, span: &Span);

    /// Writes `value` under `key` in the background, to live the store's TTL less `age`
    /// (how old its record already is); never waits.
    fn put(&self, key: String, value: String, age: Duration);

    /// How long an entry lives: the records it stands for must be kept at least as long.
    fn ttl(&self) -> Duration;
}

/// Which store is attached to which pool: pools are told apart by their connect options,
/// which a pool and its clones share (and which the registry keeps alive, so that no other
/// pool can take their address).
struct Entry {
    id: usize,
    _options: Arc<dyn Any + Send + Sync>,
    store: Arc<dyn FirstResults>,
}

static REGISTRY: RwLock<Vec<Entry>> = RwLock::new(Vec::new());
/// Whether any pool has a store: the one load a call makes when none has.
static ANY: AtomicBool = AtomicBool::new(false);

fn id_of<DB: Backend>(pool: &Pool<DB>) -> (usize, Arc<dyn Any + Send + Sync>) {
    let options = pool.connect_options();
    let id = Arc::as_ptr(&options) as *const () as usize;
    (id, options)
}

/// Makes every call that begins from `pool` (and its clones) ask `store` first, replacing
/// the store attached before.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn attach<DB: Backend>(pool: &Pool<DB>, store: Arc<dyn FirstResults>) {
    let (id, options) = id_of(pool);
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    registry.retain(|entry| entry.id != id);
    registry.push(Entry {
        id,
        _options: options,
        store,
    });
    ANY.store(true, Ordering::Release);
}

/// Detaches the store from `pool`: its calls go to the database only.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn detach<DB: Backend>(pool: &Pool<DB>) {
    let (id, _) = id_of(pool);
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    registry.retain(|entry| entry.id != id);
    ANY.store(!registry.is_empty(), Ordering::Release);
}

/// The store attached to `pool`, if any.
fn attached<DB: Backend>(pool: &Pool<DB>) -> Option<Arc<dyn FirstResults>> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let (id, _) = id_of(pool);
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry
        .iter()
        .find(|entry| entry.id == id)
        .map(|entry| entry.store.clone())
}

/// The TTL of the store attached to `pool`, if any: the shortest retention its records
/// may have.
pub(crate) fn attached_ttl<DB: Backend>(pool: &Pool<DB>) -> Option<Duration> {
    attached(pool).map(|store| store.ttl())
}

/// The fast path of one call: the cache attached to its pool and the call's key there, or
/// nothing.
#[derive(Default)]
pub(crate) struct Fast {
    on: Option<(Arc<dyn FirstResults>, String)>,
}

impl Fast {
    /// The fast path of `plan`'s call from `pool`: nothing unless a cache is attached to
    /// the pool and the call is valid (its input checked: only then, so a call from a pool
    /// without a cache checks it once, in the unit of work) and its replies can be cached.
    pub(crate) fn of<DB: Backend, P: Plan<DB>>(pool: &Pool<DB>, plan: &P) -> Fast {
        let Some(store) = attached(pool) else {
            return Fast::default();
        };
        if plan.check().is_err() {
            return Fast::default();
        }
        let Some(key) = plan.cache_key() else {
            return Fast::default();
        };
        let key = store.key(&key);
        Fast {
            on: Some((store, key)),
        }
    }

    /// The duplicate's reply, if the cache holds the first result and it answers this
    /// call; recorded in `span` (`idem.cache`) and counted either way.
    pub(crate) async fn answer<DB: Backend, P: Plan<DB>>(
        &self,
        plan: &P,
        span: &Span,
    ) -> Option<P::Reply> {
        let (store, key) = self.on.as_ref()?;
        let value = store.get(key, span).await?;
        let reply = plan.cached_reply(&value);
        store.answered(reply.is_some(), span);
        reply
    }

    /// Writes the first result of a call that committed (or of a duplicate the database
    /// answered) to the cache, after the commit, on a task of its own. `age`: how old the
    /// record it stands for was when the database answered (a duplicate's); the entry then
    /// lives only the rest of the TTL, never past its record's retention, and none is
    /// written for a record older than the TTL.
    pub(crate) fn remember(&self, value: Option<String>, age: Option<Duration>) {
        if let (Some((store, key)), Some(value)) = (&self.on, value) {
            store.put(key.clone(), value, age.unwrap_or_default());
        }
    }

    /// Whether a store is on for this call (values are worth computing).
    pub(crate) fn is_on(&self) -> bool {
        self.on.is_some()
    }
}
