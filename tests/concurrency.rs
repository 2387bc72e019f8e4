//! Many tasks on separate connections deliver the same transition for the same keys at
//! once: exactly one call applies per key, every other call is a duplicate that replays the
//! winner's result, and the body's side effect happens exactly once per key.

use crate::common;

use idem::{Outcome, StateMachine};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::collections::HashMap;

const TASKS: usize = 32;
const KEYS: i64 = 200;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(to(Paid))]
    Created,
    Paid,
}

/// What every delivery of every key ended as.
#[derive(Default)]
struct Tally {
    applied: HashMap<i64, Vec<String>>,
    duplicates: HashMap<i64, Vec<Option<String>>>,
}

/// `$late_conflicts`: whether calls may lose a conflict after their body ran (at COMMIT
/// or in a body statement), which idem cannot retry alone: only under SERIALIZABLE. The
/// calls go through `idem::retry`, which counts them.
macro_rules! race {
    ($name:ident, $db:ty, $pool:ty, $late_conflicts:expr, $setup:expr) => {
        race!(
            $name,
            $db,
            $pool,
            $late_conflicts,
            $setup,
            positional = false
        );
    };
    ($name:ident, $db:ty, $pool:ty, $late_conflicts:expr, $setup:expr, positional = $positional:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(
                tx: &mut sqlx::Transaction<'_, $db>,
                order_id: i64,
                task: usize,
            ) -> Result<String, sqlx::Error> {
                let insert = "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)";
                sqlx::query(common::placed($positional, insert))
                    .bind(order_id)
                    .bind(task as i64)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("order {order_id} paid by task {task}"))
            }

            let Some(pool): Option<$pool> = $setup else {
                return;
            };
            idem::create_results_table::<Order, _>(&pool).await.unwrap();
            let mut insert = String::from("INSERT INTO orders (order_id, status) VALUES ");
            insert.push_str(
                &(1..=KEYS)
                    .map(|k| format!("({k}, 'CREATED')"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            sqlx::query(&insert).execute(&pool).await.unwrap();

            let mut handles = Vec::new();
            for task in 0..TASKS {
                let pool2 = pool.clone();
                handles.push(tokio::spawn(async move {
                    let mut keys: Vec<i64> = (1..=KEYS).collect();
                    keys.shuffle(&mut rand::rngs::StdRng::seed_from_u64(task as u64));
                    let mut outcomes = Vec::with_capacity(keys.len());
                    let mut calls = 0;
                    for key in keys {
                        let outcome = idem::retry(|| {
                            calls += 1;
                            pay(&pool2, key, task)
                        })
                        .await
                        .unwrap_or_else(|e| panic!("task {task}, key {key}: {e}"));
                        outcomes.push((key, outcome));
                    }
                    (outcomes, calls)
                }));
            }
            let (mut tally, mut calls) = (Tally::default(), 0);
            for handle in handles {
                let (outcomes, task_calls) = handle.await.unwrap();
                calls += task_calls;
                for (key, outcome) in outcomes {
                    match outcome {
                        Outcome::Applied(result) => {
                            tally.applied.entry(key).or_default().push(result)
                        }
                        Outcome::AlreadyDone {
                            current: Order::Paid,
                            first_result,
                        } => tally.duplicates.entry(key).or_default().push(first_result),
                        other => panic!("key {key}: unexpected {other:?}"),
                    }
                }
            }

            for key in 1..=KEYS {
                let applied = &tally.applied[&key];
                assert_eq!(
                    applied.len(),
                    1,
                    "key {key} applied {} times",
                    applied.len()
                );
                let duplicates = &tally.duplicates[&key];
                assert_eq!(duplicates.len(), TASKS - 1, "key {key}");
                for replayed in duplicates {
                    assert_eq!(
                        replayed.as_ref(),
                        Some(&applied[0]),
                        "key {key}: replay differs"
                    );
                }
            }
            let effects: Vec<(i64, i64)> =
                sqlx::query_as("SELECT order_id, COUNT(*) FROM effects GROUP BY order_id")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            assert_eq!(effects.len(), KEYS as usize);
            assert!(
                effects.iter().all(|&(_, n)| n == 1),
                "duplicated effects: {effects:?}"
            );
            let paid: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND version = 1",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(paid, KEYS);
            let retried = calls - TASKS * KEYS as usize;
            eprintln!("{retried} calls retried by idem::retry after a late conflict");
            if !$late_conflicts {
                assert_eq!(retried, 0, "only SERIALIZABLE may conflict after the body");
            }
        }
    };
}

race!(
    sqlite_file_32_connections,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    false,
    Some(common::sqlite_file("concurrency", TASKS as u32).await)
);
race!(
    postgres_32_connections,
    sqlx::Postgres,
    sqlx::PgPool,
    false,
    common::postgres("concurrency", TASKS as u32).await
);

// Under REPEATABLE READ the loser of a race does not wait and match nothing: its UPDATE
// fails with a serialization failure (40001). idem retries it (the body has not run), and
// the retry sees the winner's commit: a duplicate, never an error, never two applications.
race!(
    postgres_repeatable_read_32_connections,
    sqlx::Postgres,
    sqlx::PgPool,
    false,
    common::postgres_with(
        "concurrency_rr",
        TASKS as u32,
        // The backslash keeps the space inside the startup packet's `-c` option.
        &[("default_transaction_isolation", "repeatable\\ read")]
    )
    .await
);

// Under SERIALIZABLE, PostgreSQL also aborts some transactions after the body ran, at
// COMMIT or in the body's INSERT ("could not serialize access due to read/write
// dependencies among transactions"): everything was rolled back, and `idem::retry` calls
// the handler again. Still one application per key, every other call a duplicate.
race!(
    postgres_serializable_32_connections,
    sqlx::Postgres,
    sqlx::PgPool,
    true,
    common::postgres_with(
        "concurrency_ser",
        TASKS as u32,
        &[("default_transaction_isolation", "serializable")]
    )
    .await
);

// MySQL and MariaDB under REPEATABLE READ (InnoDB's default): the loser's UPDATE waits for
// the winner's row lock and then reads the committed row (an UPDATE always does), matching
// nothing; the classifying read locks it too, so it sees what the UPDATE saw.
race!(
    mysql_32_connections,
    sqlx::MySql,
    sqlx::MySqlPool,
    false,
    common::mysql("concurrency", TASKS as u32).await,
    positional = true
);
race!(
    mysql_read_committed_32_connections,
    sqlx::MySql,
    sqlx::MySqlPool,
    false,
    common::mysql_with(
        "concurrency_rc",
        TASKS as u32,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    )
    .await,
    positional = true
);
// SERIALIZABLE makes every read a locking one: deadlocks (1213) may end a transaction
// after its body ran, and `idem::retry` calls the handler again.
race!(
    mysql_serializable_32_connections,
    sqlx::MySql,
    sqlx::MySqlPool,
    true,
    common::mysql_with(
        "concurrency_ser",
        TASKS as u32,
        "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"
    )
    .await,
    positional = true
);
