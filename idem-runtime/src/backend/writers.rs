//! One writer at a time per SQLite database, queued in the process.
//!
//! SQLite admits one write transaction at a time. Left to the busy handler, waiting
//! writers poll with growing sleeps, unfairly: under contention one can starve past its
//! busy timeout and fail with SQLITE_BUSY. idem instead queues the writers of a process on
//! a FIFO async mutex per database file before `BEGIN IMMEDIATE`, so the busy timeout only
//! has to cover other processes. PostgreSQL needs none of this: its row locks queue.
//!
//! - **One queue per database, however it is named.** The queue is keyed by the file's
//!   canonical path, so `a.db`, `./a.db` and an absolute path share one, and so do a
//!   `SqlitePool` and an `AnyPool` on the same file. The registry holds queues weakly: a
//!   queue lives while a writer holds or waits for it, so pools that come and go (in-memory
//!   databases in tests) leave nothing behind.
//! - **Never waiting for itself.** A handler called with the pool from inside another
//!   handler's body, on the same database, would wait for a turn its own caller holds:
//!   that is refused at once with a clear error (pass the transaction instead). Another
//!   writer of the task that holds the turn (futures joined in one task, which take turns,
//!   or a lease completed while a receipt of the same task is open, which cannot) waits at
//!   most [`SELF_WAIT`], then fails with an error that says so.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Which SQLite database a pool writes to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub enum Database {
    /// A file, by its canonical path.
    File(PathBuf),
    /// An in-memory database, or a file that cannot be resolved: by its name as given.
    Named(String),
}

impl Database {
    /// The database of the file name sqlx holds for a pool.
    #[cfg_attr(not(any(feature = "sqlite", feature = "any")), allow(dead_code))]
    pub(crate) fn of_file(name: &Path) -> Database {
        match std::fs::canonicalize(name) {
            Ok(path) => Database::File(path),
            Err(_) => Database::Named(name.display().to_string()),
        }
    }

    /// The database of a `sqlite:` URL (an `sqlx::Any` pool's), parsed as sqlx does: the
    /// path after the scheme and an optional `//`, up to the query.
    #[cfg(feature = "any")]
    pub(crate) fn of_url(url: &str) -> Database {
        let rest = url.strip_prefix("sqlite:").unwrap_or(url);
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or(rest);
        if path.is_empty() || path == ":memory:" {
            return Database::Named(url.to_owned());
        }
        Database::of_file(Path::new(path))
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::File(path) => write!(f, "{}", path.display()),
            Database::Named(name) => f.write_str(name),
        }
    }
}

/// Who holds a turn: a Tokio task, or a thread outside any task (`block_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Holder {
    fn current() -> Holder {
        match tokio::task::try_id() {
            Some(id) => Holder::Task(id),
            None => Holder::Thread(std::thread::current().id()),
        }
    }
}

struct Queue {
    turn: Arc<AsyncMutex<()>>,
    holder: Mutex<Option<Holder>>,
}

/// Held from `BEGIN IMMEDIATE` to `COMMIT`/`ROLLBACK`.
pub(crate) struct WriterGuard {
    queue: Arc<Queue>,
    database: Database,
    _turn: OwnedMutexGuard<()>,
}

impl fmt::Debug for WriterGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterGuard")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl WriterGuard {
    /// The database whose turn this is.
    pub(crate) fn database(&self) -> &Database {
        &self.database
    }
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        *self
            .queue
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// How long a writer waits for a turn held by its own task before it gives up.
pub(crate) const SELF_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

static QUEUES: Mutex<Option<HashMap<Database, Weak<Queue>>>> = Mutex::new(None);

tokio::task_local! {
    /// The databases whose turn the handler bodies being polled hold.
    static HELD: Vec<Database>;
}

/// Runs `body` (a handler's body) knowing that it holds the turn of `database`, so that a
/// handler it calls with the pool on the same database is refused instead of waiting for
/// itself.
pub(crate) async fn holding<F: Future>(database: Option<Database>, body: F) -> F::Output {
    let Some(database) = database else {
        return body.await;
    };
    let mut held = HELD.try_with(Clone::clone).unwrap_or_default();
    held.push(database);
    HELD.scope(held, body).await
}

fn queue(database: &Database) -> Arc<Queue> {
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    let queues = queues.get_or_insert_with(HashMap::new);
    if let Some(queue) = queues.get(database).and_then(Weak::upgrade) {
        return queue;
    }
    // Forget the queues nobody holds or waits for any more.
    queues.retain(|_, queue| queue.strong_count() > 0);
    let queue = Arc::new(Queue {
        turn: Arc::default(),
        holder: Mutex::new(None),
    });
    queues.insert(database.clone(), Arc::downgrade(&queue));
    queue
}

/// Waits for the turn to write to `database`; an error if a handler body holding it asks
/// again (it would wait for itself), or if its own task held it for more than
/// [`SELF_WAIT`].
pub(crate) async fn wait_turn(database: Database) -> Result<WriterGuard, sqlx::Error> {
    if HELD
        .try_with(|held| held.contains(&database))
        .unwrap_or(false)
    {
        return Err(sqlx::Error::Configuration(Box::new(NestedWriter(database))));
    }
    let queue = queue(&database);
    let me = Holder::current();
    let mine = *queue.holder.lock().unwrap_or_else(PoisonError::into_inner) == Some(me);
    let turn = if mine {
        match tokio::time::timeout(SELF_WAIT, queue.turn.clone().lock_owned()).await {
            Ok(turn) => turn,
            Err(_) => return Err(sqlx::Error::Configuration(Box::new(SelfWait(database)))),
        }
    } else {
        queue.turn.clone().lock_owned().await
    };
    *queue.holder.lock().unwrap_or_else(PoisonError::into_inner) = Some(me);
    Ok(WriterGuard {
        queue,
        database,
        _turn: turn,
    })
}

/// A writer waited [`SELF_WAIT`] for a turn that its own task holds.
#[derive(Debug)]
pub(crate) struct SelfWait(Database);

impl fmt::Display for SelfWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this task already holds the writer's turn on the SQLite database {} (an open \
             `Receipt` or transaction of idem's) and waited {} s for it again; SQLite has one \
             writer: finish or drop the open one first, or do this work in its transaction",
            self.0,
            SELF_WAIT.as_secs()
        )
    }
}

impl std::error::Error for SelfWait {}

/// A handler was called with the pool inside another handler's transaction on the same
/// SQLite database.
#[derive(Debug)]
pub(crate) struct NestedWriter(Database);

impl fmt::Display for NestedWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a handler was called with the pool from inside another handler's transaction on \
             the same SQLite database ({}); SQLite has one writer, so it would wait for itself \
             forever. Pass the transaction instead: `handler(&mut *tx, …)`",
            self.0
        )
    }
}

impl std::error::Error for NestedWriter {}

#[cfg(test)]
pub(crate) fn live_queues() -> usize {
    let queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    queues
        .as_ref()
        .map_or(0, |q| q.values().filter(|w| w.strong_count() > 0).count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn named(name: &str) -> Database {
        Database::Named(name.into())
    }

    #[tokio::test]
    async fn writers_to_one_database_take_turns_and_others_do_not_wait() {
        let first = tokio::spawn(async {
            let guard = wait_turn(named("a.db")).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(guard);
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let other_db = tokio::time::timeout(Duration::from_secs(1), wait_turn(named("b.db"))).await;
        assert!(other_db.is_ok(), "another database must not wait");
        let same_db = tokio::spawn(async {
            tokio::time::timeout(Duration::from_millis(50), wait_turn(named("a.db"))).await
        });
        assert!(
            same_db.await.unwrap().is_err(),
            "a writer of another task to the same database must wait"
        );
        first.await.unwrap();
        let after = tokio::spawn(async {
            tokio::time::timeout(Duration::from_secs(1), wait_turn(named("a.db"))).await
        });
        assert!(
            after.await.unwrap().is_ok(),
            "the turn passes on when the first writer is done"
        );
    }

    #[test]
    fn one_file_is_one_database_however_it_is_named() {
        let dir = std::env::temp_dir().join(format!("idem-writers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.db");
        std::fs::write(&file, b"").unwrap();
        let plain = Database::of_file(&file);
        let dotted = Database::of_file(&dir.join(".").join("a.db"));
        assert_eq!(plain, dotted);
        assert!(matches!(plain, Database::File(_)));
        #[cfg(feature = "any")]
        {
            let url = Database::of_url(&format!("sqlite://{}?mode=rwc", file.display()));
            assert_eq!(plain, url);
            assert!(matches!(
                Database::of_url("sqlite::memory:"),
                Database::Named(_)
            ));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn futures_of_one_task_take_turns() {
        let db = named("siblings.db");
        let (a, b) = tokio::join!(
            async {
                let guard = wait_turn(db.clone()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                drop(guard);
            },
            async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                wait_turn(db.clone()).await.map(drop)
            }
        );
        let () = a;
        assert!(b.is_ok(), "{b:?}");
    }

    #[tokio::test]
    async fn queues_nobody_uses_are_forgotten() {
        for n in 0..100 {
            drop(wait_turn(named(&format!("memory-{n}"))).await.unwrap());
        }
        assert!(live_queues() < 5, "{} queues left", live_queues());
    }

    #[tokio::test]
    async fn a_body_holding_the_turn_is_refused_not_deadlocked() {
        let db = named("nested.db");
        let guard = wait_turn(db.clone()).await.unwrap();
        let nested = holding(Some(db.clone()), async {
            tokio::time::timeout(Duration::from_secs(1), wait_turn(db.clone())).await
        })
        .await;
        let error = nested
            .expect("refused at once, not after waiting")
            .unwrap_err();
        assert!(
            error.to_string().contains("would wait for itself"),
            "{error}"
        );
        // Outside the body, the same task waits a bounded time for its own turn, then says so.
        let again = tokio::time::timeout(SELF_WAIT * 2, wait_turn(db)).await;
        let error = again.expect("bounded").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("already holds the writer's turn"),
            "{error}"
        );
        drop(guard);
    }
}
