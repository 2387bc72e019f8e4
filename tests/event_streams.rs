//! Event streams with watermarks (`watermark = "event"`): an account's events carry their
//! position in its stream; the UPDATE requires `version < event` and sets `version = event`,
//! so an event older than the row and a duplicate are both stopped by the guard and told
//! apart by the version: `Superseded`, or `AlreadyDone` with the first result. On SQLite
//! and PostgreSQL, in the transaction form and the one-statement form; 32 concurrent
//! copies of an event; and a model-based test of random out-of-order, duplicated streams
//! (failures kept in `tests/event_streams.regressions`).

use crate::common;
use crate::harness;

use harness::{Harness, config, harness};
use idem::testing::assert_applied_once;
use idem::{Error, Outcome, StateMachine};
use proptest::prelude::*;
use std::sync::OnceLock;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "accounts", key = "account_id", state = "status")]
pub enum Account {
    #[state(name = "OPEN", to(Closed))]
    Open,
    #[state(name = "CLOSED")]
    Closed,
}

const TABLES: &str = "
    CREATE TABLE accounts (
        account_id BIGINT PRIMARY KEY,
        status TEXT NOT NULL,
        version BIGINT NOT NULL DEFAULT 0,
        balance BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE applied_events (
        account_id BIGINT NOT NULL,
        event BIGINT NOT NULL
    );
";

macro_rules! stream_handlers {
    ($module:ident, $db:ty) => {
        stream_handlers!($module, $db, positional = false);
    };
    ($module:ident, $db:ty, positional = $positional:expr) => {
        pub mod $module {
            use super::*;
            use sqlx::Transaction;

            /// A deposit, the `event`th of the account's stream: the balance moves and the
            /// event is recorded, once; the new balance is the result.
            #[idem::idempotent(
                machine = Account, key = "account_id", from = "OPEN", to = "OPEN",
                watermark = "event"
            )]
            pub async fn deposit(
                tx: &mut Transaction<'_, $db>,
                account_id: i64,
                event: i64,
                amount: i64,
            ) -> Result<i64, sqlx::Error> {
                sqlx::query(common::placed(
                    $positional,
                    "INSERT INTO applied_events (account_id, event) VALUES ($1, $2)",
                ))
                .bind(account_id)
                .bind(event)
                .execute(&mut **tx)
                .await?;
                if $positional {
                    // MySQL: no UPDATE … RETURNING.
                    sqlx::query("UPDATE accounts SET balance = balance + ? WHERE account_id = ?")
                        .bind(amount)
                        .bind(account_id)
                        .execute(&mut **tx)
                        .await?;
                    return sqlx::query_scalar("SELECT balance FROM accounts WHERE account_id = ?")
                        .bind(account_id)
                        .fetch_one(&mut **tx)
                        .await;
                }
                sqlx::query_scalar(
                    "UPDATE accounts SET balance = balance + $2 WHERE account_id = $1 RETURNING balance",
                )
                .bind(account_id)
                .bind(amount)
                .fetch_one(&mut **tx)
                .await
            }

            /// A snapshot event, in the one-statement form: the balance as of `event`.
            #[idem::idempotent(
                machine = Account, key = "account_id", from = "OPEN", to = "OPEN",
                watermark = "event", set(balance)
            )]
            pub async fn snapshot(
                pool: &sqlx::Pool<$db>,
                account_id: i64,
                event: u32,
                balance: i64,
            ) -> Result<i64, std::convert::Infallible> {
                Ok(balance)
            }

            /// The event that closes the account: a transition, with the event's version.
            #[idem::idempotent(
                machine = Account, key = "account_id", from = "OPEN", to = "CLOSED",
                watermark = "event"
            )]
            pub async fn close(
                tx: &mut Transaction<'_, $db>,
                account_id: i64,
                event: i64,
            ) -> Result<(), sqlx::Error> {
                let _ = tx;
                Ok(())
            }
        }
    };
}
stream_handlers!(on_sqlite, sqlx::Sqlite);
stream_handlers!(on_postgres, sqlx::Postgres);
stream_handlers!(on_mysql, sqlx::MySql, positional = true);

macro_rules! stream_tests {
    ($module:ident, $handlers:ident, $pool:ty, $setup:expr) => {
        stream_tests!($module, $handlers, $pool, $setup, positional = false);
    };
    ($module:ident, $handlers:ident, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use $handlers::{close, deposit, snapshot};

            async fn setup() -> Option<$pool> {
                let pool: $pool = $setup?;
                sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
                idem::create_results_table::<Account, _>(&pool).await.unwrap();
                sqlx::query("INSERT INTO accounts (account_id, status) VALUES (1, 'OPEN'), (2, 'OPEN')")
                    .execute(&pool)
                    .await
                    .unwrap();
                Some(pool)
            }

            async fn account(pool: &$pool, id: i64) -> (String, i64, i64) {
                sqlx::query_as(common::placed($positional, "SELECT status, version, balance FROM accounts WHERE account_id = $1"))
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn applied(pool: &$pool) -> Vec<i64> {
                sqlx::query_scalar("SELECT event FROM applied_events ORDER BY event")
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn an_old_event_and_a_duplicate_are_told_apart_by_the_version() {
                let Some(pool) = setup().await else { return };
                assert_eq!(deposit(&pool, 1, 1, 100).await.unwrap(), Outcome::Applied(100));
                assert_eq!(deposit(&pool, 1, 2, 50).await.unwrap(), Outcome::Applied(150));
                // Event 2 again: the same event, its first result replayed.
                assert_eq!(
                    deposit(&pool, 1, 2, 50).await.unwrap(),
                    Outcome::AlreadyDone { current: Account::Open, first_result: Some(150) }
                );
                // Event 1 again, after 2: older than the row.
                let old = deposit(&pool, 1, 1, 100).await.unwrap();
                assert_eq!(old, Outcome::Superseded { current: Account::Open, version: 2, event: 1 });
                assert!(old.is_done(), "an old event is acked");
                // A gap is no error: 4 applies, then 3 is older.
                assert_eq!(deposit(&pool, 1, 4, 1).await.unwrap(), Outcome::Applied(151));
                assert!(matches!(
                    deposit(&pool, 1, 3, 7).await.unwrap(),
                    Outcome::Superseded { version: 4, event: 3, .. }
                ));
                assert_eq!(account(&pool, 1).await, ("OPEN".to_owned(), 4, 151));
                assert_eq!(applied(&pool).await, [1, 2, 4]);
                // Another account's stream is its own.
                assert_eq!(deposit(&pool, 2, 1, 5).await.unwrap(), Outcome::Applied(5));
            }

            #[tokio::test]
            async fn an_event_version_that_is_none_is_refused_and_nothing_is_written() {
                let Some(pool) = setup().await else { return };
                for bad in [0, -3] {
                    match deposit(&pool, 1, bad, 100).await {
                        Err(Error::InvalidWatermark { value }) => assert_eq!(value, bad.to_string()),
                        other => panic!("{other:?}"),
                    }
                }
                let message = deposit(&pool, 1, 0, 1).await.unwrap_err().to_string();
                assert_eq!(
                    message,
                    "invalid event version 0: a stream's events count from 1 (a row starts at version 0); nothing was written"
                );
                assert!(matches!(snapshot(&pool, 1, 0, 9).await, Err(Error::InvalidWatermark { .. })));
                assert_eq!(account(&pool, 1).await, ("OPEN".to_owned(), 0, 0));
                assert!(applied(&pool).await.is_empty());
            }

            #[tokio::test]
            async fn a_closing_event_moves_the_state_and_later_events_are_refused() {
                let Some(pool) = setup().await else { return };
                assert!(deposit(&pool, 1, 3, 10).await.unwrap().is_applied());
                assert_eq!(close(&pool, 1, 5).await.unwrap(), Outcome::Applied(()));
                assert_eq!(account(&pool, 1).await, ("CLOSED".to_owned(), 5, 10));
                assert_eq!(
                    close(&pool, 1, 5).await.unwrap(),
                    Outcome::AlreadyDone { current: Account::Closed, first_result: None }
                );
                // Older than the closing event: superseded; newer: the account is closed.
                assert!(matches!(deposit(&pool, 1, 4, 1).await.unwrap(), Outcome::Superseded { .. }));
                assert!(matches!(deposit(&pool, 1, 6, 1).await.unwrap(), Outcome::IllegalState { .. }));
                assert_eq!(account(&pool, 1).await, ("CLOSED".to_owned(), 5, 10));
            }

            #[tokio::test]
            async fn the_one_statement_form_takes_snapshots_in_order() {
                let Some(pool) = setup().await else { return };
                assert_eq!(snapshot(&pool, 2, 7, 70).await.unwrap(), Outcome::Applied(70));
                assert!(matches!(snapshot(&pool, 2, 6, 60).await.unwrap(), Outcome::Superseded { .. }));
                assert_eq!(
                    snapshot(&pool, 2, 7, 71).await.unwrap(),
                    Outcome::AlreadyDone { current: Account::Open, first_result: Some(70) }
                );
                assert_eq!(snapshot(&pool, 2, 9, 90).await.unwrap(), Outcome::Applied(90));
                assert_eq!(account(&pool, 2).await, ("OPEN".to_owned(), 9, 90));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn thirty_two_copies_of_an_event_apply_once() {
                let Some(pool) = setup().await else { return };
                let seen = assert_applied_once(32, || {
                    let pool = pool.clone();
                    async move { deposit(&pool, 1, 3, 25).await }
                })
                .await;
                assert_eq!((seen.result, seen.replays), (25, 31));
                assert_eq!(applied(&pool).await, [3]);
            }

            /// Every event of a stream twice, all at once: each is applied at most once, the
            /// row ends at the last, and every delivery is applied, a duplicate or
            /// superseded.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stream_delivered_twice_at_once_ends_at_its_last_event() {
                let Some(pool) = setup().await else { return };
                let tasks: Vec<_> = (1..=20i64)
                    .flat_map(|event| [event, event])
                    .map(|event| {
                        let pool = pool.clone();
                        tokio::spawn(async move { (event, deposit(&pool, 1, event, event).await.unwrap()) })
                    })
                    .collect();
                let mut applied_events = Vec::new();
                for task in tasks {
                    let (event, outcome) = task.await.unwrap();
                    match outcome {
                        Outcome::Applied(_) => applied_events.push(event),
                        Outcome::AlreadyDone { .. } | Outcome::Superseded { .. } => {}
                        other => panic!("event {event}: {other:?}"),
                    }
                }
                applied_events.sort();
                let mut unique = applied_events.clone();
                unique.dedup();
                assert_eq!(applied_events, unique, "an event applied twice");
                assert_eq!(applied(&pool).await, applied_events);
                let (_, version, balance) = account(&pool, 1).await;
                assert_eq!(version, 20);
                assert_eq!(balance, applied_events.iter().sum::<i64>());
            }
        }
    };
}

stream_tests!(
    sqlite,
    on_sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("streams-{}", common::next_id()), 4).await)
);
stream_tests!(
    postgres,
    on_postgres,
    sqlx::PgPool,
    common::postgres(&format!("streams_{}", common::next_id()), 8).await
);
stream_tests!(
    mysql,
    on_mysql,
    sqlx::MySqlPool,
    common::mysql(&format!("streams_{}", common::next_id()), 8).await,
    positional = true
);

/// What the model expects of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Applied(i64),
    AlreadyDone(i64),
    Superseded { version: i64 },
}

/// The reference: an event applies when it is newer than the row, and the row takes it.
#[derive(Default)]
struct Model {
    version: i64,
    balance: i64,
    results: std::collections::BTreeMap<i64, i64>,
    applied: Vec<i64>,
}

impl Model {
    fn deliver(&mut self, event: i64) -> Expected {
        if event > self.version {
            self.version = event;
            self.balance += amount(event);
            self.results.insert(event, self.balance);
            self.applied.push(event);
            Expected::Applied(self.balance)
        } else if event == self.version {
            Expected::AlreadyDone(self.results[&event])
        } else {
            Expected::Superseded {
                version: self.version,
            }
        }
    }
}

fn amount(event: i64) -> i64 {
    event * 10 + 1
}

/// A stream of up to 8 events, each delivered one to three times, in a random order.
fn deliveries() -> impl Strategy<Value = Vec<i64>> {
    (1..=8i64)
        .prop_flat_map(|events| {
            proptest::collection::vec(1..=3usize, events as usize).prop_map(|copies| {
                copies
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &n)| std::iter::repeat_n(i as i64 + 1, n))
                    .collect::<Vec<_>>()
            })
        })
        .prop_shuffle()
}

macro_rules! model_run {
    ($name:ident, $handlers:ident, $pool:ty) => {
        async fn $name(pool: &$pool, deliveries: &[i64]) -> Result<(), TestCaseError> {
            sqlx::raw_sql(
                "DELETE FROM accounts; DELETE FROM applied_events; DELETE FROM idem_results;
                 INSERT INTO accounts (account_id, status) VALUES (1, 'OPEN');",
            )
            .execute(pool)
            .await
            .unwrap();
            let mut model = Model::default();
            for &event in deliveries {
                let outcome = $handlers::deposit(pool, 1, event, amount(event))
                    .await
                    .unwrap();
                let seen = match outcome {
                    Outcome::Applied(balance) => Expected::Applied(balance),
                    Outcome::AlreadyDone {
                        first_result: Some(balance),
                        ..
                    } => Expected::AlreadyDone(balance),
                    Outcome::Superseded {
                        version, event: e, ..
                    } => {
                        prop_assert_eq!(e, event);
                        Expected::Superseded { version }
                    }
                    other => return Err(TestCaseError::fail(format!("event {event}: {other:?}"))),
                };
                prop_assert_eq!(
                    seen,
                    model.deliver(event),
                    "event {} of {:?}",
                    event,
                    deliveries
                );
            }
            let row: (i64, i64) =
                sqlx::query_as("SELECT version, balance FROM accounts WHERE account_id = 1")
                    .fetch_one(pool)
                    .await
                    .unwrap();
            prop_assert_eq!(row, (model.version, model.balance));
            let applied: Vec<i64> =
                sqlx::query_scalar("SELECT event FROM applied_events ORDER BY event")
                    .fetch_all(pool)
                    .await
                    .unwrap();
            let mut expected = model.applied.clone();
            expected.sort();
            prop_assert_eq!(applied, expected);
            Ok(())
        }
    };
}
model_run!(run_sqlite, on_sqlite, sqlx::SqlitePool);
model_run!(run_postgres, on_postgres, sqlx::PgPool);
model_run!(run_mysql, on_mysql, sqlx::MySqlPool);

async fn with_tables<P>(pool: P) -> P
where
    for<'c> &'c P: sqlx::Executor<'c>,
{
    sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
    pool
}

fn sqlite() -> &'static Harness<sqlx::SqlitePool> {
    static HARNESS: OnceLock<Harness<sqlx::SqlitePool>> = OnceLock::new();
    HARNESS.get_or_init(|| {
        harness(async || {
            let pool = with_tables(common::sqlite_file("streams-model", 2).await).await;
            idem::create_results_table::<Account, _>(&pool)
                .await
                .unwrap();
            pool
        })
    })
}

fn postgres() -> Option<&'static Harness<sqlx::PgPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::PgPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::postgres_url()?;
            Some(harness(async || {
                let pool = with_tables(common::postgres("streams_model", 2).await.unwrap()).await;
                idem::create_results_table::<Account, _>(&pool)
                    .await
                    .unwrap();
                pool
            }))
        })
        .as_ref()
}

fn mysql() -> Option<&'static Harness<sqlx::MySqlPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::MySqlPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::mysql_url()?;
            Some(harness(async || {
                let pool = with_tables(common::mysql("streams_model", 2).await.unwrap()).await;
                idem::create_results_table::<Account, _>(&pool)
                    .await
                    .unwrap();
                pool
            }))
        })
        .as_ref()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mysql_streams_agree_with_the_model(deliveries in deliveries()) {
        if let Some(h) = mysql() {
            h.runtime.block_on(run_mysql(&h.pool, &deliveries))?;
        }
    }

    #[test]
    fn sqlite_streams_agree_with_the_model(deliveries in deliveries()) {
        let h = sqlite();
        h.runtime.block_on(run_sqlite(&h.pool, &deliveries))?;
    }

    #[test]
    fn postgres_streams_agree_with_the_model(deliveries in deliveries()) {
        if let Some(h) = postgres() {
            h.runtime.block_on(run_postgres(&h.pool, &deliveries))?;
        }
    }
}
