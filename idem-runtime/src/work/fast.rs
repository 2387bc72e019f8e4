//! The fast path as the unit of work sees it: before a call from a pool begins, its
//! duplicate may be answered from the cache attached to that pool (feature `redis`,
//! [`idem::cache`](crate::cache)); after it commits, its first result is written there.
//! Without the feature, or for a pool with nothing attached, every step is a no-op.
//!
//! What a plan puts in the cache and reads back is its own ([`Plan::cache_key`],
//! [`Plan::cache_value`], [`Plan::cached_reply`]); the unit of work only says when.

use crate::backend::Backend;
use crate::work::unit::Plan;
use sha2::{Digest, Sha256};
use sqlx::Pool;
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

/// The fast path of one call: the cache attached to its pool and the call's key there, or
/// nothing.
#[derive(Default)]
pub(crate) struct Fast {
    #[cfg(feature = "redis")]
    on: Option<(std::sync::Arc<crate::cache::Attached>, String)>,
}

impl Fast {
    /// The fast path of `plan`'s call from `pool`: nothing unless a cache is attached to
    /// the pool and the call is valid (its input checked: only then, so a call from a pool
    /// without a cache checks it once, in the unit of work) and its replies can be cached.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn of<DB: Backend, P: Plan<DB>>(pool: &Pool<DB>, plan: &P) -> Fast {
        #[cfg(feature = "redis")]
        {
            let Some(attached) = crate::cache::attached(pool) else {
                return Fast::default();
            };
            if plan.check().is_err() {
                return Fast::default();
            }
            let Some(key) = plan.cache_key() else {
                return Fast::default();
            };
            let redis_key = attached.redis_key(&key);
            Fast {
                on: Some((attached, redis_key)),
            }
        }
        #[cfg(not(feature = "redis"))]
        Fast::default()
    }

    /// The duplicate's reply, if the cache holds the first result and it answers this
    /// call; recorded in `span` (`idem.cache`) and counted either way.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn answer<DB: Backend, P: Plan<DB>>(
        &self,
        plan: &P,
        span: &Span,
    ) -> Option<P::Reply> {
        #[cfg(feature = "redis")]
        if let Some((attached, key)) = &self.on {
            let value = attached.get(key, span).await?;
            let reply = plan.cached_reply(&value);
            attached.answered(reply.is_some(), span);
            return reply;
        }
        None
    }

    /// Writes the first result of a call that committed (or of a duplicate the database
    /// answered) to the cache, after the commit, on a task of its own. `age`: how old the
    /// record it stands for was when the database answered (a duplicate's); the entry then
    /// lives only the rest of the TTL, never past its record's retention, and none is
    /// written for a record older than the TTL.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn remember(&self, value: Option<String>, age: Option<std::time::Duration>) {
        #[cfg(feature = "redis")]
        if let (Some((attached, key)), Some(value)) = (&self.on, value) {
            attached.put(key.clone(), value, age.unwrap_or_default());
        }
    }

    /// Whether a cache is on for this call (values are worth computing).
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.on.is_some();
        #[cfg(not(feature = "redis"))]
        false
    }
}
