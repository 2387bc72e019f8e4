//! One writer at a time per SQLite database, queued in the process.
//!
//! SQLite admits one write transaction at a time. Left to the busy handler, waiting
//! writers poll with growing sleeps, unfairly: under contention one can starve past its
//! busy timeout and fail with SQLITE_BUSY. idem instead queues the writers of a process on
//! a FIFO async mutex per database file before `BEGIN IMMEDIATE`, so the busy timeout only
//! has to cover other processes. PostgreSQL needs none of this: its row locks queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Held from `BEGIN IMMEDIATE` to `COMMIT`/`ROLLBACK`.
pub(crate) type WriterGuard = OwnedMutexGuard<()>;

static QUEUES: Mutex<Option<HashMap<String, Arc<AsyncMutex<()>>>>> = Mutex::new(None);

/// Waits for the turn to write to the database identified by `key` (its file name).
pub(crate) async fn wait_turn(key: String) -> WriterGuard {
    let queue = {
        let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
        queues
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_default()
            .clone()
    };
    queue.lock_owned().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writers_to_one_database_take_turns_and_others_do_not_wait() {
        let first = wait_turn("a.db".into()).await;
        let other_db =
            tokio::time::timeout(std::time::Duration::from_secs(1), wait_turn("b.db".into())).await;
        assert!(other_db.is_ok(), "another database must not wait");
        let same_db = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            wait_turn("a.db".into()),
        )
        .await;
        assert!(
            same_db.is_err(),
            "a second writer to the same database must wait"
        );
        drop(first);
        let after =
            tokio::time::timeout(std::time::Duration::from_secs(1), wait_turn("a.db".into())).await;
        assert!(
            after.is_ok(),
            "the turn passes on when the first writer is done"
        );
    }
}
