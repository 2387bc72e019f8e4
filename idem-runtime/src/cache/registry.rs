//! Which cache is attached to which pool: pools are told apart by their connect options,
//! which a pool and its clones share (and which the registry keeps alive, so that no other
//! pool can take their address).

use super::Attached;
use crate::backend::{Backend, Opened, Param};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

struct Entry {
    id: usize,
    _options: Arc<dyn Any + Send + Sync>,
    attached: Arc<Attached>,
}

static REGISTRY: RwLock<Vec<Entry>> = RwLock::new(Vec::new());
/// Whether any pool has a cache: the one load a call makes when none has.
static ANY: AtomicBool = AtomicBool::new(false);

fn id_of<DB: Backend>(pool: &sqlx::Pool<DB>) -> (usize, Arc<dyn Any + Send + Sync>) {
    let options = pool.connect_options();
    let id = Arc::as_ptr(&options) as *const () as usize;
    (id, options)
}

pub(crate) fn attach<DB: Backend>(pool: &sqlx::Pool<DB>, attached: Attached) {
    let (id, options) = id_of(pool);
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    registry.retain(|entry| entry.id != id);
    registry.push(Entry {
        id,
        _options: options,
        attached: Arc::new(attached),
    });
    ANY.store(true, Ordering::Release);
}

/// Detaches the cache from `pool`: its calls go to the database only. Entries already in
/// Redis stay until they expire.
pub fn detach<DB: Backend>(pool: &sqlx::Pool<DB>) {
    let (id, _) = id_of(pool);
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    registry.retain(|entry| entry.id != id);
    ANY.store(!registry.is_empty(), Ordering::Release);
}

/// The cache attached to `pool`, if any.
pub(crate) fn attached<DB: Backend>(pool: &sqlx::Pool<DB>) -> Option<Arc<Attached>> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let (id, _) = id_of(pool);
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    registry
        .iter()
        .find(|entry| entry.id == id)
        .map(|entry| entry.attached.clone())
}

/// The TTL of the cache attached to `pool`, if any.
pub(crate) fn attached_ttl<DB: Backend>(pool: &sqlx::Pool<DB>) -> Option<Duration> {
    attached(pool).map(|attached| attached.ttl())
}

/// The name of the database `pool` works in; for a database without one (SQLite in
/// memory, which no other process can share), a name unique to this process.
pub(crate) async fn identity<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<String, sqlx::Error> {
    let mut opened = Opened::read(pool).await?;
    let conn = opened.connection();
    let statement = DB::dialect(conn)?.database_identity();
    let no_params: [Param<'_>; 0] = [];
    let name = DB::fetch(conn, statement, &no_params)
        .await?
        .and_then(|mut row| row.take_text("identity"))
        .unwrap_or_default();
    opened.end(true).await?;
    if !name.is_empty() {
        return Ok(name);
    }
    static UNNAMED: AtomicU64 = AtomicU64::new(0);
    let n = UNNAMED.fetch_add(1, Ordering::Relaxed);
    Ok(format!("unnamed/{}/{n}", std::process::id()))
}
