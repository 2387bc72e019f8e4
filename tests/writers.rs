//! The SQLite writer queue: one queue per database file however it is named or pooled, and
//! never a writer waiting for itself.

use crate::common;

use idem::inbox::{Inbox, MessageKey, Received};
use idem::{Error, Outcome, StateMachine};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Sqlite, SqlitePool, Transaction};
use std::time::Duration;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

/// Holds the writer's turn for `hold` inside its body.
#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn slow_pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    hold: Duration,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    tokio::time::sleep(hold).await;
    Ok(())
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay_any(tx: &mut Transaction<'_, sqlx::Any>, order_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Calls another handler with the pool from inside its body: a mistake on SQLite.
#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay_then_nested(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    pool: &SqlitePool,
) -> Result<(), Error<sqlx::Error>> {
    let _ = &tx;
    let _ = slow_pay(pool, order_id + 1, Duration::ZERO).await?;
    Ok(())
}

/// A pool on `url` whose busy timeout is short: writers that do not queue in the process
/// collide on SQLite's busy handler and give up quickly.
async fn pool(url: &str) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(
            idem::sqlite_options(url)
                .unwrap()
                .busy_timeout(Duration::from_millis(50)),
        )
        .await
        .unwrap()
}

async fn seeded(name: &str) -> std::path::PathBuf {
    let path = common::scratch_file(name);
    let setup = pool(&format!("sqlite:{}", path.display())).await;
    sqlx::raw_sql(common::TABLES).execute(&setup).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED')")
        .execute(&setup)
        .await
        .unwrap();
    idem::migrate(&setup).await.unwrap();
    setup.close().await;
    path
}

/// `path` relative to the working directory (`..` where they part).
fn relative_to_cwd(path: &std::path::Path) -> std::path::PathBuf {
    let cwd = std::env::current_dir().unwrap();
    let common = cwd
        .components()
        .zip(path.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = std::path::PathBuf::new();
    for _ in cwd.components().skip(common) {
        relative.push("..");
    }
    for part in path.components().skip(common) {
        relative.push(part);
    }
    relative
}

/// Two pools on one file, named differently, share one queue: the second waits for the
/// first writer's turn instead of losing to SQLite's busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_names_of_one_file_share_one_queue() {
    let path = seeded("writers-names.db").await;
    // Relative to the working directory, which this test leaves as it is: the other tests
    // of this binary run meanwhile, and some read files relative to it.
    let relative = relative_to_cwd(&path);
    let dotted = pool(&format!("sqlite:./{}", relative.display())).await;
    let relative = pool(&format!("sqlite:{}", relative.display())).await;
    let first =
        tokio::spawn(async move { slow_pay(&relative, 1, Duration::from_millis(1500)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = slow_pay(&dotted, 2, Duration::ZERO).await;
    assert!(matches!(second, Ok(Outcome::Applied(()))), "{second:?}");
    assert!(matches!(first.await.unwrap(), Ok(Outcome::Applied(()))));
}

/// A `SqlitePool` and an `AnyPool` on one file share one queue too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_pool_and_an_any_pool_share_one_queue() {
    let path = seeded("writers-any.db").await;
    let url = format!("sqlite://{}", path.display());
    let sqlite = pool(&url).await;
    sqlx::any::install_default_drivers();
    let any = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        // The busy timeout, as short as the other pool's.
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("PRAGMA busy_timeout = 50")
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let first =
        tokio::spawn(async move { slow_pay(&sqlite, 1, Duration::from_millis(1500)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = pay_any(&any, 2).await;
    assert!(matches!(second, Ok(Outcome::Applied(()))), "{second:?}");
    assert!(matches!(first.await.unwrap(), Ok(Outcome::Applied(()))));
}

/// A handler called with the pool from inside another handler's body, on the same
/// database, is refused at once with an error that says what to do; it used to wait for
/// its own caller forever.
#[tokio::test]
async fn a_nested_writer_is_refused_instead_of_waiting_for_itself() {
    let path = seeded("writers-nested.db").await;
    let pool = pool(&format!("sqlite:{}", path.display())).await;
    let nested = tokio::time::timeout(Duration::from_secs(10), pay_then_nested(&pool, 1, &pool))
        .await
        .expect("the nested call must not wait for itself");
    match nested {
        Err(Error::Handler(Error::Database(e))) => {
            assert!(
                e.to_string().contains("Pass the transaction instead"),
                "{e}"
            );
        }
        other => panic!("expected the nested writer's error, got {other:?}"),
    }
    // The outer call rolled back with its body's error: order 1 is still CREATED.
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "CREATED");
}

/// Completing a lease while a receipt holds the writer, in the same task, ends (with the
/// database's busy error) instead of waiting forever.
#[tokio::test]
async fn a_lease_completed_while_a_receipt_is_open_does_not_hang() {
    let path = seeded("writers-lease.db").await;
    let pool = pool(&format!("sqlite:{}", path.display())).await;
    let inbox = Inbox::new("writers").unwrap();
    let (first, second) = (
        MessageKey::new("m1").unwrap(),
        MessageKey::new("m2").unwrap(),
    );
    let idem::inbox::Claimed::Work(lease) =
        inbox.claim::<_, i64>(&pool, &second, b"p").await.unwrap()
    else {
        panic!("a first claim works");
    };
    let Received::New(receipt) = inbox.receive::<_, i64>(&pool, &first, b"p").await.unwrap() else {
        panic!("a first delivery is new");
    };
    let completed = tokio::time::timeout(
        Duration::from_secs(10),
        lease.complete(&pool, Ok::<_, String>(7)),
    )
    .await
    .expect("completing the lease must not wait for the open receipt forever");
    assert!(
        completed.is_err(),
        "the receipt holds SQLite's one writer: {completed:?}"
    );
    drop(receipt);
}
