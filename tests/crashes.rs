//! Crash tests: a child process makes one call and is killed with SIGKILL at a named point
//! in it, then the call is delivered again, on the same database, by a process that did
//! not crash. Every effect happens exactly once, nothing is lost, and no key stays locked
//! longer than its lease.
//!
//! The points are idem's own ([`FaultPoint`]), compiled in only for tests by the
//! `fault-injection` feature. The child installs a hook that reports each point it passes
//! and, at the point under test, blocks until the parent kills it: the kill lands exactly
//! there, with no timing involved. The child is this test binary running only its ignored
//! test [`crash_child`].
//!
//! The calls, each on PostgreSQL, MariaDB and an SQLite file:
//! - `transition`: an `#[idempotent]` transition CREATED → PAID whose body writes an effect;
//! - `inbox`: the same transition as a message consumer, its inbox record in the same
//!   transaction;
//! - `leased`: a leased inbox claim, an outside call (to a service that deduplicates by
//!   idempotency key), then the lease's completion;
//! - `statement`: the one-statement form (a handler without a transaction) whose result
//!   must be stored with the transition: on PostgreSQL one autocommit statement, so the
//!   row and the result are committed once the UPDATE returns; on SQLite and MariaDB one
//!   transaction, so neither is before COMMIT.

use crate::brokers;
use crate::child;
use crate::common;

use brokers::Db;
use child::{ChildProcess, report};
use idem::fault::FaultPoint;
use idem::inbox::{Clock, SystemClock};
use idem::{Outcome, StateMachine};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

/// What a body returns: which process ran it (and wrote the effect's `amount`), so a
/// replayed first result can be told from a fresh one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub process: i64,
}

fn this_process() -> i64 {
    i64::from(std::process::id())
}

const ORDER: i64 = 7;
const GROUP: &str = "crash-tests";
const MESSAGE: &str = "order-7-paid";
const PAYLOAD: &[u8] = br#"{"order_id":7}"#;
/// The leased inbox's lease: the longest a crashed claim may hold its key.
const LEASE: Duration = Duration::from_secs(30);

/// The outside service of the leased call: it deduplicates by idempotency key and counts
/// the calls it received.
const EXTERNAL: &str = "CREATE TABLE external_charges (
    idempotency_key TEXT PRIMARY KEY,
    process BIGINT NOT NULL,
    calls BIGINT NOT NULL
)";

/// [`EXTERNAL`] on MySQL (a `VARCHAR` key).
const EXTERNAL_MYSQL: &str = "CREATE TABLE external_charges (
    idempotency_key VARCHAR(255) PRIMARY KEY,
    process BIGINT NOT NULL,
    calls BIGINT NOT NULL
)";

/// The points each call passes, in order.
fn points(scenario: &str) -> &'static [FaultPoint] {
    use FaultPoint::*;
    match scenario {
        "transition" => &[Transitioned, BodyDone, Committed],
        "inbox" => &[Recorded, Transitioned, BodyDone, Committed],
        "leased" => &[Claimed, WorkDone, Committed],
        "statement" => &[Transitioned, Committed],
        other => panic!("no scenario {other}"),
    }
}

macro_rules! backend {
    ($module:ident, $db:ty, $variant:ident) => {
        backend!($module, $db, $variant, positional = false);
    };
    ($module:ident, $db:ty, $variant:ident, positional = $positional:expr) => {
        mod $module {
            use super::*;
            use idem::inbox::{Claimed, Delivery, Inbox, ManualClock, MessageKey};
            use sqlx::{Pool, Transaction};

            type P = Pool<$db>;

            /// The effect: one row in `effects`, written by the body.
            async fn effect(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<Receipt, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', $2)"))
                    .bind(order_id)
                    .bind(this_process())
                    .execute(&mut **tx)
                    .await?;
                Ok(Receipt {
                    process: this_process(),
                })
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            pub async fn pay(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<Receipt, sqlx::Error> {
                effect(tx, order_id).await
            }

            #[idem::idempotent(
                inbox = "inbox", message = "key", payload = "payload",
                machine = Order, key = "order_id", from = "CREATED", to = "PAID"
            )]
            pub async fn pay_message(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                key: &MessageKey,
                payload: &[u8],
                order_id: i64,
            ) -> Result<Receipt, sqlx::Error> {
                effect(tx, order_id).await
            }

            /// The one-statement form: no transaction, the body decides the result first.
            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            pub async fn pay_at_once(pool: &P, order_id: i64) -> Result<Receipt, sqlx::Error> {
                let _ = order_id;
                Ok(Receipt {
                    process: this_process(),
                })
            }

            /// The outside call: the service records the first call per idempotency key
            /// and counts every call; it answers with the process of the first.
            async fn call_outside(pool: &P, key: &MessageKey) -> Result<i64, sqlx::Error> {
                if $positional {
                    // MySQL: no RETURNING after an upsert.
                    sqlx::query(
                        "INSERT INTO external_charges (idempotency_key, process, calls) VALUES (?, ?, 1) \
                         ON DUPLICATE KEY UPDATE calls = calls + 1",
                    )
                    .bind(key.as_str())
                    .bind(this_process())
                    .execute(pool)
                    .await?;
                    return sqlx::query_scalar("SELECT process FROM external_charges WHERE idempotency_key = ?")
                        .bind(key.as_str())
                        .fetch_one(pool)
                        .await;
                }
                sqlx::query_scalar(
                    "INSERT INTO external_charges (idempotency_key, process, calls) VALUES ($1, $2, 1) \
                     ON CONFLICT (idempotency_key) DO UPDATE SET calls = external_charges.calls + 1 \
                     RETURNING process",
                )
                .bind(key.as_str())
                .bind(this_process())
                .fetch_one(pool)
                .await
            }

            /// A leased delivery: claim, call outside, complete.
            pub async fn charge(
                pool: &P,
                inbox: &Inbox,
            ) -> Result<Delivery<i64>, idem::Error<sqlx::Error>> {
                let key = MessageKey::new(MESSAGE).unwrap();
                match inbox
                    .claim::<_, i64>(pool, &key, PAYLOAD)
                    .await
                    .map_err(idem::Error::widen)?
                {
                    Claimed::Work(lease) => {
                        let charged = call_outside(pool, lease.key()).await;
                        lease.complete(pool, charged).await
                    }
                    Claimed::Done(delivery) => Ok(delivery),
                }
            }

            fn leased_inbox() -> Inbox {
                Inbox::new(GROUP).unwrap().lease(LEASE)
            }

            fn pool(db: Db) -> P {
                match db {
                    Db::$variant(pool) => pool,
                    #[allow(unreachable_patterns)]
                    _ => unreachable!(),
                }
            }

            /// The child's one call (never returns if its crash point is reached).
            pub async fn call(db: Db, scenario: &str) -> String {
                let pool = pool(db);
                match scenario {
                    "transition" => format!("{:?}", pay(&pool, ORDER).await.unwrap()),
                    "inbox" => {
                        let (inbox, key) = (Inbox::new(GROUP).unwrap(), MessageKey::new(MESSAGE).unwrap());
                        format!("{:?}", pay_message(&pool, &inbox, &key, PAYLOAD, ORDER).await.unwrap())
                    }
                    "leased" => format!("{:?}", charge(&pool, &leased_inbox()).await.unwrap()),
                    "statement" => format!("{:?}", pay_at_once(&pool, ORDER).await.unwrap()),
                    other => panic!("no scenario {other}"),
                }
            }

            async fn count(pool: &P, sql: &str) -> i64 {
                sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
            }

            async fn status(pool: &P) -> (String, i64) {
                sqlx::query_as(common::placed($positional, "SELECT status, version FROM orders WHERE order_id = $1"))
                    .bind(ORDER)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn effect_process(pool: &P) -> i64 {
                count(pool, "SELECT amount FROM effects").await
            }

            /// A child makes the call of `scenario` and is killed at `point`; the call is
            /// delivered again here.
            pub async fn crash(name: &str, scenario: &str, point: FaultPoint) {
                let db = match stringify!($variant) {
                    "Postgres" => match Db::postgres(name, 2).await {
                        Some(db) => db,
                        None => return,
                    },
                    "MySql" => match Db::mysql(name, 2).await {
                        Some(db) => db,
                        None => return,
                    },
                    _ => Db::sqlite(name, 2).await,
                };
                let spec = db.spec();
                let pool = pool(db);
                sqlx::query(common::placed($positional, "INSERT INTO orders (order_id, status) VALUES ($1, 'CREATED')"))
                    .bind(ORDER)
                    .execute(&pool)
                    .await
                    .unwrap();
                let external = if $positional { EXTERNAL_MYSQL } else { EXTERNAL };
                sqlx::query(external).execute(&pool).await.unwrap();

                let env = [
                    ("IDEM_CRASH_DB", spec),
                    ("IDEM_CRASH_SCENARIO", scenario.to_owned()),
                    ("IDEM_CRASH_POINT", point.name().to_owned()),
                ];
                let mut child = ChildProcess::spawn("crashes::crash_child", &env, &[]);
                let child_process: i64 = child
                    .step("process ")
                    .await
                    .trim_start_matches("process ")
                    .parse()
                    .unwrap();
                // The child passed the points before this one, in order, and stands here.
                let passed = points(scenario);
                let at = passed.iter().position(|p| *p == point).expect("a point of the call");
                for before in &passed[..at] {
                    child.step(&format!("point {}", before.name())).await;
                }
                child.step(&format!("crash-point {}", point.name())).await;

                // The one statement of PostgreSQL's one-statement form commits itself.
                let autocommitted = scenario == "statement"
                    && stringify!($variant) == "Postgres"
                    && point == FaultPoint::Transitioned;
                let committed = point == FaultPoint::Committed || autocommitted;
                // What another connection sees while the child stands at the point.
                let (effects, state) = match scenario {
                    "leased" => (count(&pool, "SELECT COUNT(*) FROM external_charges").await, None),
                    _ => (count(&pool, "SELECT COUNT(*) FROM effects").await, Some(status(&pool).await)),
                };
                let outside_done = scenario == "leased" && point != FaultPoint::Claimed;
                // The one-statement form's body writes no effect.
                let effect = scenario != "statement" && (committed || outside_done);
                assert_eq!(effects, i64::from(effect), "effects at the point");
                if let Some(state) = state {
                    let expected = if committed { ("PAID", 1) } else { ("CREATED", 0) };
                    assert_eq!((state.0.as_str(), state.1), expected, "the order at the point");
                }

                child.kill();

                // The redelivery, from a process that did not crash. Nothing the killed
                // child held (a row lock, SQLite's write lock, a lease) may block it past
                // the lease.
                let redelivered = tokio::time::timeout(
                    LEASE + Duration::from_secs(10),
                    redeliver(&pool, scenario, point, committed, child_process),
                )
                .await
                .expect("the key stayed stuck after the crash");
                eprintln!("redelivered: {redelivered}");

                // Exactly once, nothing lost.
                match scenario {
                    "leased" => {
                        let (process, calls): (i64, i64) =
                            sqlx::query_as("SELECT process, calls FROM external_charges")
                                .fetch_one(&pool)
                                .await
                                .unwrap();
                        // The outside call runs again only if the crash came after it and
                        // before its outcome was recorded; the service absorbed the repeat.
                        let expected_calls = if point == FaultPoint::WorkDone { 2 } else { 1 };
                        assert_eq!(calls, expected_calls, "calls to the outside service");
                        let first = if point == FaultPoint::Claimed { this_process() } else { child_process };
                        assert_eq!(process, first, "the charge was made once, by the first caller");
                        let record: (String, Option<String>, i64) = sqlx::query_as(
                            "SELECT status, result, attempts FROM idem_inbox",
                        )
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                        let attempts = if committed { 1 } else { 2 };
                        assert_eq!(record, ("SUCCESS".to_owned(), Some(first.to_string()), attempts));
                    }
                    "statement" => {
                        assert_eq!(status(&pool).await, ("PAID".to_owned(), 1));
                        let results = count(&pool, "SELECT COUNT(*) FROM idem_results").await;
                        assert_eq!(results, 1, "the first result, stored once");
                    }
                    _ => {
                        assert_eq!(count(&pool, "SELECT COUNT(*) FROM effects").await, 1, "one effect");
                        assert_eq!(status(&pool).await, ("PAID".to_owned(), 1));
                        let first = if committed { child_process } else { this_process() };
                        assert_eq!(effect_process(&pool).await, first);
                        let records = count(&pool, "SELECT COUNT(*) FROM idem_inbox").await;
                        assert_eq!(records, i64::from(scenario == "inbox"));
                    }
                }
            }

            /// Delivers the call again; checks the outcome against what committed before
            /// the kill.
            async fn redeliver(
                pool: &P,
                scenario: &str,
                point: FaultPoint,
                committed: bool,
                child: i64,
            ) -> String {
                let child_receipt = Receipt { process: child };
                let mine = Receipt { process: this_process() };
                match scenario {
                    "transition" | "statement" => {
                        let outcome = if scenario == "statement" {
                            pay_at_once(pool, ORDER).await.unwrap()
                        } else {
                            pay(pool, ORDER).await.unwrap()
                        };
                        let expected = if committed {
                            Outcome::AlreadyDone { current: Order::Paid, first_result: Some(child_receipt) }
                        } else {
                            Outcome::Applied(mine)
                        };
                        assert_eq!(outcome, expected);
                        format!("{outcome:?}")
                    }
                    "inbox" => {
                        let (inbox, key) = (Inbox::new(GROUP).unwrap(), MessageKey::new(MESSAGE).unwrap());
                        let delivery = pay_message(pool, &inbox, &key, PAYLOAD, ORDER).await.unwrap();
                        let expected = if committed {
                            Delivery::Duplicate { first_result: Some(child_receipt) }
                        } else {
                            Delivery::Processed(mine)
                        };
                        assert_eq!(delivery, expected);
                        format!("{delivery:?}")
                    }
                    "leased" => {
                        let inbox = leased_inbox();
                        let now = SystemClock.now_millis();
                        let delivery = charge(pool, &inbox).await.unwrap();
                        if committed {
                            assert_eq!(delivery, Delivery::Duplicate { first_result: Some(child) });
                            return format!("{delivery:?}");
                        }
                        // The claim outlived its process: the key is held, but no longer
                        // than the lease…
                        let Delivery::InProgress { lease_until_millis: Some(until) } = delivery else {
                            panic!("a held lease should report InProgress, got {delivery:?}");
                        };
                        assert!(until <= now + LEASE.as_millis() as i64, "held past its lease");
                        // …and taken over once it expires (the clock moved to its end).
                        let later = inbox.clock(ManualClock::new(until));
                        let delivery = charge(pool, &later).await.unwrap();
                        let first = if point == FaultPoint::Claimed { this_process() } else { child };
                        assert_eq!(delivery, Delivery::Processed(first));
                        assert_eq!(later.counters().takeovers, 1);
                        format!("{delivery:?}")
                    }
                    other => panic!("no scenario {other}"),
                }
            }
        }
    };
}

backend!(on_postgres, sqlx::Postgres, Postgres);
backend!(on_sqlite, sqlx::Sqlite, Sqlite);
backend!(on_mysql, sqlx::MySql, MySql, positional = true);

#[test]
#[ignore = "the child process of the crash tests, which run it"]
fn crash_child() {
    let Ok(spec) = std::env::var("IDEM_CRASH_DB") else {
        eprintln!("crash_child runs only as the child of a crash test");
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let scenario = var("IDEM_CRASH_SCENARIO");
    let point = FaultPoint::from_name(&var("IDEM_CRASH_POINT")).expect("a fault point");
    child::stop_at(point);
    report(&format!("process {}", this_process()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(async {
        let db = Db::connect(&spec).await;
        match db {
            Db::Postgres(_) => on_postgres::call(db, &scenario).await,
            Db::Sqlite(_) => on_sqlite::call(db, &scenario).await,
            Db::MySql(_) => on_mysql::call(db, &scenario).await,
        }
    });
    report(&format!("outcome {outcome}"));
}

macro_rules! crash_tests {
    ($($test:ident: $scenario:literal at $point:ident;)*) => {
        mod killed {
            use super::*;
            $(
                mod $test {
                    use super::*;
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn postgres() {
                        let name = concat!("crash_pg_", stringify!($test));
                        on_postgres::crash(name, $scenario, FaultPoint::$point).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn mysql() {
                        let name = concat!("crash_my_", stringify!($test));
                        on_mysql::crash(name, $scenario, FaultPoint::$point).await;
                    }
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sqlite() {
                        let name = concat!("crash_sqlite_", stringify!($test));
                        on_sqlite::crash(name, $scenario, FaultPoint::$point).await;
                    }
                }
            )*
        }
    };
}

crash_tests! {
    transition_after_the_update: "transition" at Transitioned;
    transition_after_the_body: "transition" at BodyDone;
    transition_after_the_commit: "transition" at Committed;
    inbox_after_the_record: "inbox" at Recorded;
    inbox_after_the_update: "inbox" at Transitioned;
    inbox_after_the_body: "inbox" at BodyDone;
    inbox_after_the_commit: "inbox" at Committed;
    leased_after_the_claim: "leased" at Claimed;
    leased_after_the_outside_call: "leased" at WorkDone;
    leased_after_the_commit: "leased" at Committed;
    statement_after_the_update: "statement" at Transitioned;
    statement_after_the_commit: "statement" at Committed;
}
