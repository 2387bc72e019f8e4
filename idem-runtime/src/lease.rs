//! Leases across instances, kept in the database: a critical section over resources idem
//! does not own, with a **fencing token** for those resources to check.
//!
//! "Locks manage concurrency, constraints manage correctness": a lease keeps two instances
//! from doing the same work at once most of the time, and its token keeps a holder that
//! lost its lease without knowing it (paused by a long garbage collection, partitioned,
//! its process stopped) from writing once another holder has taken over.
//!
//! - [`Lease::acquire`] takes the lease `name` for `ttl`, if no one holds it, in a short
//!   transaction of its own: its row in `idem_leases` gets the next **fence** (a number that
//!   rises by one with every holder) and ends `ttl` from now, **by the database's clock**, so
//!   instances whose clocks disagree agree on whether it lasts.
//! - While held, the lease is **kept alive**: a task extends it to a whole `ttl` from now
//!   every third of it. A process that dies stops extending it, and the lease ends at most
//!   one `ttl` after its last extension; another instance may then take it, with a higher
//!   fence.
//! - It ends on [`Lease::release`], or when the guard is dropped (released in the
//!   background), or when its holder stops extending it.
//!
//! ## The fence, checked by the resource
//!
//! A holder can lose its lease without learning it in time: paused for longer than `ttl`,
//! it wakes up believing it still holds it. Pass [`Lease::fence`] along with every write
//! to the resource the lease protects, and have the resource refuse a write with a fence
//! lower than one it has already seen. In SQL, the resource keeps the highest fence it has
//! accepted and conditions each write on it:
//!
//! ```sql
//! UPDATE ledger SET balance = $1, fence = $2 WHERE account = $3 AND fence <= $2
//! ```
//!
//! Zero rows updated means a later holder has written: the late holder's write is refused
//! by the resource itself, whatever the late holder believes. (`<=`, not `<`: a holder may
//! write several times with its own fence.)
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::lease::Lease;
//! use std::time::Duration;
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! idem::migrate(&pool).await?;
//!
//! let lease = Lease::acquire(&pool, "nightly-report", Duration::from_secs(30))
//!     .await?
//!     .expect("no one else holds it");
//! // Another instance asking now gets `None`.
//! assert!(Lease::acquire(&pool, "nightly-report", Duration::from_secs(30)).await?.is_none());
//!
//! let fence = lease.fence(); // pass it to the resource with each write
//! # let _ = fence;
//! lease.release().await?;
//!
//! // The next holder's fence is higher.
//! let next = Lease::acquire(&pool, "nightly-report", Duration::from_secs(30)).await?.unwrap();
//! assert_eq!(next.fence(), fence + 1);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```

use crate::backend::{Backend, Param};
use crate::error::Error;
use crate::inbox::millis;
use crate::value::key::{KeyError, valid_text};
use crate::work::observe::Labels;
use crate::work::unit::{Entered, Entry, Plan, no_body, stages_only};
use sqlx::Pool;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// A lease held by this instance (see the [module](self)): its fence, kept alive while
/// held, released on [`release`](Lease::release) or drop.
pub struct Lease<DB: Backend> {
    shared: Arc<Shared<DB>>,
    /// The task that keeps the lease alive (absent outside a Tokio runtime).
    beats: Option<tokio::task::JoinHandle<()>>,
    released: bool,
}

/// What the guard and its keep-alive task share.
struct Shared<DB: Backend> {
    pool: Pool<DB>,
    name: String,
    fence: i64,
    ttl: Duration,
    /// When the lease ends, as last taken or extended (the database's clock).
    until: AtomicI64,
    /// Whether no later holder has been seen to take it.
    held: AtomicBool,
    lost: watch::Sender<bool>,
}

impl<DB: Backend> fmt::Debug for Lease<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.shared.name)
            .field("fence", &self.shared.fence)
            .field("ttl", &self.shared.ttl)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

/// Why a lease could not be asked for.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseError {
    /// The name is not a valid key (empty, longer than 255 bytes, a control character).
    Name(KeyError),
    /// The lease is shorter than a millisecond.
    TooShort,
    /// The database failed.
    Database(Error<Infallible>),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Name(e) => write!(f, "invalid lease name: {e}"),
            LeaseError::TooShort => f.write_str("a lease lasts at least one millisecond"),
            LeaseError::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LeaseError::Name(e) => Some(e),
            LeaseError::TooShort => None,
            LeaseError::Database(e) => Some(e),
        }
    }
}

impl From<Error<Infallible>> for LeaseError {
    fn from(e: Error<Infallible>) -> LeaseError {
        LeaseError::Database(e)
    }
}

impl<DB: Backend> Lease<DB> {
    /// Takes the lease `name` for `ttl` if no one holds it (`None` if another holder's
    /// lease lasts), in a short transaction of its own, and keeps it alive from then on
    /// (a task on the current Tokio runtime extends it every third of `ttl`).
    ///
    /// The lease's row is made on first use, in idem's table `idem_leases`
    /// ([`migrate`](crate::migrate) makes it).
    pub async fn acquire(
        pool: &Pool<DB>,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<Lease<DB>>, LeaseError> {
        let name = valid_text(name.to_owned()).map_err(LeaseError::Name)?;
        let ttl_millis = millis(ttl);
        if ttl_millis < 1 {
            return Err(LeaseError::TooShort);
        }
        let plan = Step {
            name: &name,
            op: Op::Acquire {
                holder: holder(),
                ttl: ttl_millis,
            },
        };
        let Reply::Held { fence, until } = stages_only(pool, &plan).await? else {
            return Ok(None);
        };
        let (lost, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            pool: pool.clone(),
            name,
            fence,
            ttl,
            until: AtomicI64::new(until),
            held: AtomicBool::new(true),
            lost,
        });
        let beats = tokio::runtime::Handle::try_current()
            .ok()
            .map(|runtime| runtime.spawn(keep_alive(Arc::clone(&shared))));
        Ok(Some(Lease {
            shared,
            beats,
            released: false,
        }))
    }

    /// [`acquire`](Self::acquire), trying again every `every` until it gets the lease or
    /// `wait` has passed (`None` then): a bounded wait for a holder to finish.
    pub async fn acquire_within(
        pool: &Pool<DB>,
        name: &str,
        ttl: Duration,
        wait: Duration,
        every: Duration,
    ) -> Result<Option<Lease<DB>>, LeaseError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(lease) = Lease::acquire(pool, name, ttl).await? {
                return Ok(Some(lease));
            }
            if tokio::time::Instant::now() + every > deadline {
                return Ok(None);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this holder: higher than every earlier holder's of this name.
    /// Pass it to the resource with every write (see the [module](self)).
    pub fn fence(&self) -> i64 {
        self.shared.fence
    }

    /// When the lease ends unless extended, in milliseconds since the epoch by the
    /// database's clock (as last taken or extended).
    pub fn until_millis(&self) -> i64 {
        self.shared.until.load(Ordering::Acquire)
    }

    /// Whether this holder still holds the lease as far as it knows: `false` once an
    /// extension found that a later holder took it. A holder that was paused may still
    /// believe it holds it; the fence, checked by the resource, is what refuses it.
    pub fn is_held(&self) -> bool {
        self.shared.held.load(Ordering::Acquire)
    }

    /// Resolves when an extension finds that a later holder took the lease: select on it
    /// to stop the work the lease protects.
    pub async fn lost(&self) {
        let mut lost = self.shared.lost.subscribe();
        // The sender lives in `shared`, which `self` keeps: `wait_for` ends only when lost.
        let _ = lost.wait_for(|lost| *lost).await;
    }

    /// Extends the lease to a whole `ttl` from now, now (the keep-alive task does it every
    /// third of `ttl`). `false` if a later holder took it.
    pub async fn extend(&self) -> Result<bool, LeaseError> {
        extend(&self.shared).await
    }

    /// Ends the lease now, so the next holder need not wait for it to expire. `false` if a
    /// later holder had taken it already.
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        self.released = true;
        if let Some(beats) = self.beats.take() {
            beats.abort();
        }
        let plan = Step {
            name: &self.shared.name,
            op: Op::Release {
                fence: self.shared.fence,
            },
        };
        let released = matches!(
            stages_only(&self.shared.pool, &plan).await?,
            Reply::Done(true)
        );
        self.shared.held.store(false, Ordering::Release);
        Ok(released)
    }
}

impl<DB: Backend> Drop for Lease<DB> {
    fn drop(&mut self) {
        if let Some(beats) = self.beats.take() {
            beats.abort();
        }
        if self.released {
            return;
        }
        // Released in the background, as well as it can be: if it cannot, the lease
        // expires by itself after `ttl`.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(&self.shared);
            runtime.spawn(async move {
                let plan = Step {
                    name: &shared.name,
                    op: Op::Release {
                        fence: shared.fence,
                    },
                };
                if let Err(e) = stages_only(&shared.pool, &plan).await {
                    tracing::warn!(lease = %shared.name, error = %e, "idem: a dropped lease could not be released; it ends when it expires");
                }
            });
        }
    }
}

/// Extends the lease every third of its `ttl` until a later holder is found to hold it.
async fn keep_alive<DB: Backend>(shared: Arc<Shared<DB>>) {
    let every = (shared.ttl / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(every).await;
        match extend(&shared).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => tracing::warn!(
                lease = %shared.name,
                error = %e,
                "idem: the lease could not be extended; trying again at the next beat"
            ),
        }
    }
}

async fn extend<DB: Backend>(shared: &Shared<DB>) -> Result<bool, LeaseError> {
    let plan = Step {
        name: &shared.name,
        op: Op::Extend {
            fence: shared.fence,
            ttl: millis(shared.ttl),
        },
    };
    match stages_only(&shared.pool, &plan).await? {
        Reply::Held { until, .. } => {
            shared.until.store(until, Ordering::Release);
            Ok(true)
        }
        Reply::Done(_) => {
            if shared.held.swap(false, Ordering::AcqRel) {
                tracing::warn!(lease = %shared.name, fence = shared.fence, "idem: the lease was taken by a later holder");
            }
            shared.lost.send_replace(true);
            Ok(false)
        }
    }
}

/// Who holds a lease, for the people reading `idem_leases`: the host and the process.
fn holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let holder = format!("{host}:{}", std::process::id());
    holder.chars().take(255).collect()
}

/// One short unit of work on a lease's row.
struct Step<'a> {
    name: &'a str,
    op: Op,
}

enum Op {
    Acquire { holder: String, ttl: i64 },
    Extend { fence: i64, ttl: i64 },
    Release { fence: i64 },
}

enum Reply {
    /// Held by this fence until then.
    Held { fence: i64, until: i64 },
    /// Not held (acquire, extend); released or not (release).
    Done(bool),
}

impl<DB: Backend> Plan<DB> for Step<'_> {
    type Value = Infallible;
    type Reply = Reply;
    type Kept = ();

    async fn enter(
        &self,
        tx: &mut DB::Connection,
        _: Entry,
    ) -> Result<Entered<Reply>, Error<Infallible>> {
        let sql = DB::dialect(tx)?.leases();
        let name = Param::Text(self.name);
        let reply = match &self.op {
            Op::Acquire { holder, ttl } => {
                DB::execute(tx, &sql.lease_ensure, &[name]).await?;
                let params = [name, Param::Text(holder), Param::Int(*ttl), Param::Null];
                if DB::execute(tx, &sql.lease_acquire, &params).await? == 1 {
                    self.held::<DB>(tx, None).await?
                } else {
                    Reply::Done(false)
                }
            }
            Op::Extend { fence, ttl } => {
                let params = [name, Param::Int(*fence), Param::Int(*ttl), Param::Null];
                DB::execute(tx, &sql.lease_extend, &params).await?;
                // Judged by the row as it is now, not by the count of rows changed (MySQL
                // counts a row whose values did not change as none).
                self.held::<DB>(tx, Some(*fence)).await?
            }
            Op::Release { fence } => {
                let params = [name, Param::Int(*fence), Param::Null];
                Reply::Done(DB::execute(tx, &sql.lease_release, &params).await? == 1)
            }
        };
        Ok(Entered::Done {
            reply,
            commit: true,
        })
    }

    no_body!(Reply);

    fn labels(&self) -> Labels<'_> {
        Labels {
            key: Some(self.name),
            ..Labels::default()
        }
    }

    fn outcome_name(reply: &Reply) -> &'static str {
        match reply {
            Reply::Held { .. } => "held",
            Reply::Done(_) => "done",
        }
    }
}

impl Step<'_> {
    /// The lease's row, as held by `fence` (any fence: the one just taken).
    async fn held<DB: Backend>(
        &self,
        tx: &mut DB::Connection,
        fence: Option<i64>,
    ) -> Result<Reply, Error<Infallible>> {
        let sql = DB::dialect(tx)?.leases();
        let row = DB::fetch(tx, &sql.lease_read, &[Param::Text(self.name), Param::Null]).await?;
        let found = row.and_then(|row| Some((row.int("fence")?, row.int("lease_until")?)));
        Ok(match found {
            Some((found, until)) if fence.is_none_or(|fence| fence == found) => Reply::Held {
                fence: found,
                until,
            },
            _ => Reply::Done(false),
        })
    }
}
