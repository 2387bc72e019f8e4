//! `idem::lease::Lease` on a SQLite file, PostgreSQL and MariaDB:
//!
//! - one holder at a time; the next holder's fence is higher; release and drop end a lease
//!   at once, and a lease kept alive outlives its `ttl` many times over;
//! - a holder paused past its `ttl` (its whole runtime blocked, as a long garbage collection
//!   or a stopped process would) loses the lease to a later holder, and its late write,
//!   checked by the resource with the documented `fence <= $token`, is refused;
//! - an invalid name or a lease under a millisecond is refused before any statement.

use crate::common;
use idem::lease::{Lease, LeaseError};
use sqlx::Pool;
use std::time::{Duration, Instant};

/// The resource the lease protects: one account, with the highest fence it accepted.
async fn ledger<DB: idem::Backend>(pool: &Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    for sql in [
        "DROP TABLE IF EXISTS lease_ledger",
        "CREATE TABLE lease_ledger (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence BIGINT NOT NULL)",
        "INSERT INTO lease_ledger (account, balance, fence) VALUES (1, 0, 0)",
    ] {
        sqlx::raw_sql(sql).execute(pool).await.unwrap();
    }
}

/// A write to the resource with `fence`, as the lease's docs say to check it: whether it
/// was accepted.
async fn write<DB: idem::Backend>(pool: &Pool<DB>, fence: i64) -> bool
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let balance = || async {
        let (balance,): (i64,) =
            sqlx::query_as("SELECT balance FROM lease_ledger WHERE account = 1")
                .fetch_one(pool)
                .await
                .unwrap();
        balance
    };
    let before = balance().await;
    let sql = format!(
        "UPDATE lease_ledger SET balance = balance + 1, fence = {fence} WHERE account = 1 AND fence <= {fence}"
    );
    sqlx::raw_sql(&sql).execute(pool).await.unwrap();
    balance().await == before + 1
}

async fn leases<DB: idem::Backend>(pool: Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    i64: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    idem::migrate(&pool).await.unwrap();
    ledger(&pool).await;
    let name = format!("lease-{}", common::next_id());
    let ttl = Duration::from_millis(900);

    // One holder at a time; release ends it at once; the next fence is higher.
    let first = Lease::acquire(&pool, &name, ttl).await.unwrap().unwrap();
    assert!(first.is_held());
    assert!(Lease::acquire(&pool, &name, ttl).await.unwrap().is_none());
    let fence = first.fence();
    assert!(first.release().await.unwrap());
    let second = Lease::acquire(&pool, &name, ttl).await.unwrap().unwrap();
    assert_eq!(second.fence(), fence + 1);

    // Kept alive, it outlives its ttl many times over.
    tokio::time::sleep(ttl * 3).await;
    assert!(second.is_held());
    assert!(Lease::acquire(&pool, &name, ttl).await.unwrap().is_none());

    // Dropped, it is released in the background: the next holder need not wait for it
    // to expire.
    drop(second);
    let started = Instant::now();
    let third = Lease::acquire_within(
        &pool,
        &name,
        ttl,
        Duration::from_secs(5),
        Duration::from_millis(20),
    )
    .await
    .unwrap()
    .expect("the dropped lease was released");
    assert!(
        started.elapsed() < ttl,
        "released on drop, not expired: {:?}",
        started.elapsed()
    );
    assert_eq!(third.fence(), fence + 2);
    third.release().await.unwrap();

    // A holder paused past its ttl: its runtime blocked, its keep-alive with it. It has a
    // pool of its own: a connection opened on its runtime dies with it, and must not be
    // left in the pool the rest of the test uses.
    let (taken, take) = std::sync::mpsc::channel::<i64>();
    let (wrote, late) = std::sync::mpsc::channel::<(bool, bool, bool)>();
    let holder_options = (*pool.connect_options()).clone();
    let holder_name = name.clone();
    let holder = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let holder_pool = sqlx::pool::PoolOptions::<DB>::new()
                .max_connections(2)
                .connect_with(holder_options)
                .await
                .unwrap();
            let lease = Lease::acquire(&holder_pool, &holder_name, ttl)
                .await
                .unwrap()
                .unwrap();
            assert!(write(&holder_pool, lease.fence()).await, "its first write");
            taken.send(lease.fence()).unwrap();
            // The pause: nothing on this runtime runs, the lease's beats included.
            std::thread::sleep(ttl * 3);
            // It wakes up believing it holds the lease, and writes.
            let accepted = write(&holder_pool, lease.fence()).await;
            let extended = lease.extend().await.unwrap();
            wrote.send((accepted, extended, lease.is_held())).unwrap();
        });
    });
    let paused = take.recv().unwrap();
    let later = Lease::acquire_within(
        &pool,
        &name,
        ttl,
        Duration::from_secs(10),
        Duration::from_millis(50),
    )
    .await
    .unwrap()
    .expect("the paused holder's lease expired");
    assert_eq!(later.fence(), paused + 1);
    assert!(
        write(&pool, later.fence()).await,
        "the later holder's write"
    );
    let (accepted, extended, held) = late.recv().unwrap();
    holder.join().unwrap();
    assert!(!accepted, "the paused holder's late write was accepted");
    assert!(
        !extended,
        "the paused holder extended a lease a later holder took"
    );
    assert!(!held, "the paused holder still believes it holds the lease");
    let (balance, fence): (i64, i64) =
        sqlx::query_as("SELECT balance, fence FROM lease_ledger WHERE account = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((balance, fence), (2, later.fence()));
    later.release().await.unwrap();

    // Bad input, refused before any statement.
    assert!(matches!(
        Lease::acquire(&pool, &"x".repeat(256), ttl).await,
        Err(LeaseError::Name(idem::KeyError::TooLong { len: 256 }))
    ));
    assert!(matches!(
        Lease::acquire(&pool, "", ttl).await,
        Err(LeaseError::Name(idem::KeyError::Empty))
    ));
    assert!(matches!(
        Lease::acquire(&pool, &name, Duration::from_micros(10)).await,
        Err(LeaseError::TooShort)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_sqlite() {
    leases(common::sqlite_file(&format!("leases-{}", common::next_id()), 4).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_postgres() {
    let Some(pool) = common::postgres("leases", 4).await else {
        return;
    };
    leases(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_mysql() {
    let Some(pool) = common::mysql("leases", 4).await else {
        return;
    };
    leases(pool).await;
}
