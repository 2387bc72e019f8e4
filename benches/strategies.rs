//! idem against the SQL its users would write by hand, on PostgreSQL, MariaDB and SQLite.
//!
//! Six ways to make "pay this order" idempotent (and idem's variants: a stored result, a
//! span, the caller's transaction, columns set by the UPDATE, no transaction), on two
//! workloads (every key once; every key three times, shuffled), at 1, 8 and 32 concurrent
//! tasks. Every cell runs each strategy `ROUNDS` times, in a fresh random order per round,
//! so noise hits all strategies alike; the table shows the median.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p idem --bench strategies
//! ```
//!
//! Without the URLs only SQLite runs; `IDEM_BENCH_SQLITE=0` skips SQLite. `IDEM_BENCH_KEYS`
//! (default 1000) and `IDEM_BENCH_ROUNDS` (default 5) scale it; `IDEM_BENCH_STRATEGIES`
//! (e.g. `idem,dedup`) runs only some strategies, with the floor. The results and the machine are in
//! BENCHMARKS.md.

#[path = "../tests/common/statement_log.rs"]
mod statement_log;

#[path = "support/formatting.rs"]
mod formatting;

#[path = "support/chart.rs"]
mod chart;

use chart::median;

use idem::StateMachine;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Strategy {
    /// `#[idempotent]`, the body inserts the payment and returns `()` (nothing stored).
    Idem,
    /// The same, returning a receipt number, stored as the first result.
    IdemStored,
    /// `Idem` with a `tracing` subscriber that formats every span field (as a log
    /// formatter would): the cost of the span against no subscriber.
    IdemTraced,
    /// `Idem` inside the caller's transaction: the caller begins (SQLite: `BEGIN
    /// IMMEDIATE`) and commits; idem works in a savepoint.
    IdemInTransaction,
    /// `Idem` that also records the payment's time and amount on the order, with a second
    /// UPDATE in its body.
    IdemColumnsInBody,
    /// The same, with `set(paid_at = now(), amount)`: in the transition's own UPDATE, one
    /// statement fewer.
    IdemColumnsSet,
    /// The one-statement form: no transaction parameter, the payment's time and amount set
    /// by the transition's UPDATE, nothing else: one autocommit statement.
    IdemOneStatement,
    /// That statement by hand: the conditional UPDATE in autocommit, a classifying SELECT
    /// on a miss. The physical limit of one round trip.
    HandWrittenOneStatement,
    /// The floor: conditional UPDATE, the insert if it matched, a classifying SELECT if not.
    HandWritten,
    /// The floor on SQLite through a single connection (one writer, no busy waiting).
    HandWrittenOneConnection,
    /// The floor that also stores the first result as idem does (a row in `idem_results`,
    /// in the same transaction): what storing costs in itself, against idem's stored form.
    HandWrittenStored,
    /// By hand, with idem's statements (PostgreSQL: the UPDATE that classifies a miss;
    /// SQLite: the UPDATE and idem's classifying read): tells the statements' cost from the
    /// runtime's.
    HandWrittenIdemStatement,
    /// SELECT the state, insert and UPDATE if it was CREATED: not idempotent.
    CheckThenAct,
    /// SELECT … FOR UPDATE (SQLite: BEGIN IMMEDIATE, then SELECT), then insert and UPDATE.
    ForUpdate,
    /// INSERT the key into a dedup table ON CONFLICT DO NOTHING, then insert and UPDATE.
    DedupTable,
}

impl Strategy {
    /// The name `IDEM_BENCH_STRATEGIES` selects it by.
    fn short(self) -> &'static str {
        match self {
            Strategy::Idem => "idem",
            Strategy::IdemStored => "idem-stored",
            Strategy::IdemTraced => "idem-traced",
            Strategy::IdemInTransaction => "idem-tx",
            Strategy::IdemColumnsInBody => "idem-columns-body",
            Strategy::IdemColumnsSet => "idem-set",
            Strategy::IdemOneStatement => "idem-one-statement",
            Strategy::HandWrittenOneStatement => "one-statement",
            Strategy::HandWritten => "floor",
            Strategy::HandWrittenOneConnection => "floor-1",
            Strategy::HandWrittenStored => "floor-stored",
            Strategy::HandWrittenIdemStatement => "idem-statement",
            Strategy::CheckThenAct => "check-then-act",
            Strategy::ForUpdate => "for-update",
            Strategy::DedupTable => "dedup",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Strategy::Idem => "idem",
            Strategy::IdemStored => "idem, result stored",
            Strategy::IdemTraced => "idem, traced",
            Strategy::IdemInTransaction => "idem, in the caller's transaction",
            Strategy::IdemColumnsInBody => "idem, columns by the body's UPDATE",
            Strategy::IdemColumnsSet => "idem, columns by `set(…)`",
            Strategy::IdemOneStatement => "idem, one statement (no transaction)",
            Strategy::HandWrittenOneStatement => "hand-written, one autocommit UPDATE",
            Strategy::HandWritten => "hand-written (floor)",
            Strategy::HandWrittenOneConnection => "hand-written, 1 connection",
            Strategy::HandWrittenStored => "hand-written, result stored",
            Strategy::HandWrittenIdemStatement => "hand-written, idem's statement",
            Strategy::CheckThenAct => "check-then-act",
            Strategy::ForUpdate => "SELECT … FOR UPDATE",
            Strategy::DedupTable => "dedup table",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Workload {
    Unique,
    Duplicates,
}

impl Workload {
    /// For file names.
    fn short(self) -> &'static str {
        match self {
            Workload::Unique => "unique",
            Workload::Duplicates => "duplicates",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Unique => "every key once",
            Workload::Duplicates => "every key 3×, shuffled",
        }
    }

    /// The keys in delivery order (seeded: every strategy gets the same sequence).
    fn keys(self, keys: i64, seed: u64) -> Vec<i64> {
        let copies = match self {
            Workload::Unique => 1,
            Workload::Duplicates => 3,
        };
        let mut all: Vec<i64> = (1..=keys)
            .flat_map(|k| std::iter::repeat_n(k, copies))
            .collect();
        all.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        all
    }
}

/// One timed run.
#[derive(Debug, Clone, Copy)]
struct Run {
    ops_per_sec: f64,
    duplicate_effects: i64,
    errors: u64,
}

/// Statements per operation (BEGIN, COMMIT and ROLLBACK not counted).
#[derive(Debug, Clone, Copy, Default)]
struct Statements {
    first: f64,
    duplicate: f64,
}

const TABLES_POSTGRES: &str = "
    DROP TABLE IF EXISTS orders, payments, processed;
    CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0,
                         paid_at TIMESTAMPTZ, amount BIGINT);
    CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE processed (dedup_key TEXT PRIMARY KEY);
";

const TABLES_SQLITE: &str = "
    CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0,
                         paid_at TEXT, amount BIGINT);
    CREATE TABLE payments (id INTEGER PRIMARY KEY, order_id BIGINT NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE processed (dedup_key TEXT PRIMARY KEY);
";

const TABLES_MYSQL: &str = "
    DROP TABLE IF EXISTS orders, payments, processed;
    CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, version BIGINT NOT NULL DEFAULT 0,
                         paid_at DATETIME(6), amount BIGINT);
    CREATE TABLE payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE processed (dedup_key VARCHAR(64) PRIMARY KEY);
";

/// A statement of the benchmark's own as `positional` backends (MySQL) take it: each `$n`,
/// in order, a `?`.
fn placed(positional: bool, sql: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    if !positional {
        return sql;
    }
    static PLACED: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut placed = PLACED.get_or_init(Default::default).lock().unwrap();
    placed.entry(sql).or_insert_with(|| {
        let p = idem_sql::placeholder::positional(sql);
        assert!(p.order.iter().enumerate().all(|(i, n)| i == *n), "{sql}");
        Box::leak(p.text.into_owned().into_boxed_str())
    })
}

const PAYMENT: &str = "INSERT INTO payments (order_id, amount) VALUES ($1, 100)";
const MARK_PAID: &str =
    "UPDATE orders SET status = 'PAID', version = version + 1 WHERE order_id = $1";

macro_rules! backend {
    ($module:ident, $db:ty, sqlite = $sqlite:expr, begin_write = $begin_write:expr, lock = $lock:expr, reset = $reset:expr) => {
        backend!($module, $db, sqlite = $sqlite, begin_write = $begin_write, lock = $lock, reset = $reset, positional = false, dedup = "INSERT INTO processed (dedup_key) VALUES ($1) ON CONFLICT DO NOTHING");
    };
    ($module:ident, $db:ty, sqlite = $sqlite:expr, begin_write = $begin_write:expr, lock = $lock:expr, reset = $reset:expr, positional = $positional:expr, dedup = $dedup:expr) => {
        mod $module {
            use super::*;
            use sqlx::{Pool, Transaction};

            /// `sql` as this backend binds it.
            fn q(sql: &'static str) -> &'static str {
                placed($positional, sql)
            }

            pub type P = Pool<$db>;

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay(tx: &mut Transaction<'_, $db>, order_id: i64) -> Result<(), sqlx::Error> {
                sqlx::query(q(PAYMENT))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_stored(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
            ) -> Result<i64, sqlx::Error> {
                sqlx::query(q(PAYMENT))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(order_id * 100)
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_columns_in_body(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(
                    q("UPDATE orders SET paid_at = CURRENT_TIMESTAMP, amount = $1 WHERE order_id = $2"),
                )
                .bind(amount)
                .bind(order_id)
                .execute(&mut **tx)
                .await?;
                sqlx::query(q(PAYMENT))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "PAID",
                set(paid_at = now(), amount)
            )]
            async fn pay_columns_set(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(q(PAYMENT))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            #[idem::idempotent(
                machine = Order, key = "order_id", from = "CREATED", to = "PAID",
                set(paid_at = now(), amount)
            )]
            async fn pay_at_once(
                pool: &P,
                order_id: i64,
                amount: i64,
            ) -> Result<(), std::convert::Infallible> {
                Ok(())
            }

            /// The conditional UPDATE alone, in autocommit; on a miss, what the row is.
            async fn one_statement(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let updated = sqlx::query(
                    q("UPDATE orders SET status = 'PAID', version = version + 1, \
                     paid_at = CURRENT_TIMESTAMP, amount = $1 \
                     WHERE order_id = $2 AND status = 'CREATED'"),
                )
                .bind(100i64)
                .bind(order_id)
                .execute(pool)
                .await?
                .rows_affected();
                if updated == 1 {
                    return Ok(true);
                }
                let state: Option<String> =
                    sqlx::query_scalar(q("SELECT status FROM orders WHERE order_id = $1"))
                        .bind(order_id)
                        .fetch_optional(pool)
                        .await?;
                assert_eq!(state.as_deref(), Some("PAID"));
                Ok(false)
            }

            /// A write transaction as a careful hand-writer opens it.
            async fn begin_write(pool: &P) -> Result<Transaction<'static, $db>, sqlx::Error> {
                match $begin_write {
                    Some(statement) => pool.begin_with(statement).await,
                    None => pool.begin().await,
                }
            }

            /// The effect, committed.
            async fn pay_and_commit(
                mut tx: Transaction<'static, $db>,
                order_id: i64,
            ) -> Result<bool, sqlx::Error> {
                sqlx::query(q(PAYMENT))
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(true)
            }

            /// The floor, storing the first result as idem does: a row of `idem_results`
            /// with the result's JSON, in the same transaction.
            async fn hand_written_stored(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let mut tx = begin_write(pool).await?;
                let updated = sqlx::query(
                    q("UPDATE orders SET status = 'PAID', version = version + 1 \
                     WHERE order_id = $1 AND status = 'CREATED'"),
                )
                .bind(order_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if updated == 1 {
                    sqlx::query(q(PAYMENT))
                        .bind(order_id)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(q("INSERT INTO idem_results \
                         (machine, entity_key, from_state, to_state, result) \
                         VALUES ('Order', $1, 'CREATED', 'PAID', $2)"))
                    .bind(order_id.to_string())
                    .bind((order_id * 100).to_string())
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    return Ok(true);
                }
                // A duplicate: the first result, replayed.
                let stored: Option<String> = sqlx::query_scalar(q("SELECT result FROM idem_results \
                     WHERE machine = 'Order' AND entity_key = $1 \
                     AND from_state = 'CREATED' AND to_state = 'PAID'"))
                .bind(order_id.to_string())
                .fetch_optional(&mut *tx)
                .await?;
                tx.rollback().await?;
                assert!(stored.is_some(), "a duplicate replays the first result");
                Ok(false)
            }

            async fn hand_written(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let mut tx = begin_write(pool).await?;
                let updated = sqlx::query(
                    q("UPDATE orders SET status = 'PAID', version = version + 1 \
                     WHERE order_id = $1 AND status = 'CREATED'"),
                )
                .bind(order_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if updated == 1 {
                    return pay_and_commit(tx, order_id).await;
                }
                // Tell a duplicate from a missing or misplaced row.
                let state: Option<String> =
                    sqlx::query_scalar(q("SELECT status FROM orders WHERE order_id = $1"))
                        .bind(order_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                tx.rollback().await?;
                assert_eq!(state.as_deref(), Some("PAID"));
                Ok(false)
            }

            /// idem's SQLite statements, by hand: the UPDATE, and idem's classifying read
            /// on a miss.
            async fn idem_update(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let sql = Order::IDEM_SQL.of(idem::Dialect::Sqlite);
                let mut tx = begin_write(pool).await?;
                let updated = sqlx::query(sql.update)
                    .bind(order_id)
                    .bind("CREATED")
                    .bind("PAID")
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if updated == 1 {
                    return pay_and_commit(tx, order_id).await;
                }
                let row: (i64, Option<String>, Option<i64>, Option<String>) =
                    sqlx::query_as(sql.classify)
                        .bind(order_id)
                        .bind("CREATED")
                        .bind("PAID")
                        .bind(<Order as idem::Machine>::DEFINITION.id)
                        .bind(order_id.to_string())
                        .fetch_one(&mut *tx)
                        .await?;
                tx.rollback().await?;
                assert_eq!(row.1.as_deref(), Some("PAID"));
                Ok(false)
            }

            /// idem's MySQL statements, by hand, as MySQL binds them: each `$n` a `?`, in
            /// the order they appear.
            async fn idem_update_positional(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                use idem_sql::placeholder::positional;
                let sql = Order::IDEM_SQL.of(idem::Dialect::MySql);
                let (update, classify) = (positional(sql.update), positional(sql.classify));
                let id = <Order as idem::Machine>::DEFINITION.id;
                let key_text = order_id.to_string();
                let mut tx = begin_write(pool).await?;
                // `$3` to, `$1` key, `$2` from
                assert_eq!(update.order, [2, 0, 1]);
                let updated = sqlx::query(&update.text)
                    .bind("PAID")
                    .bind(order_id)
                    .bind("CREATED")
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if updated == 1 {
                    return pay_and_commit(tx, order_id).await;
                }
                // `$4` machine, `$5` key as text, `$2` from, `$3` to, `$1` key
                assert_eq!(classify.order, [3, 4, 1, 2, 0]);
                let row: (i64, Option<String>, Option<i64>, Option<String>) =
                    sqlx::query_as(&classify.text)
                        .bind(id)
                        .bind(&key_text)
                        .bind("CREATED")
                        .bind("PAID")
                        .bind(order_id)
                        .fetch_one(&mut *tx)
                        .await?;
                tx.rollback().await?;
                assert_eq!(row.1.as_deref(), Some("PAID"));
                Ok(false)
            }

            async fn idem_statement(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                if $positional {
                    return idem_update_positional(pool, order_id).await;
                }
                if $sqlite {
                    return idem_update(pool, order_id).await;
                }
                type Observed = (
                    Option<i64>,
                    i64,
                    Option<String>,
                    Option<i64>,
                    Option<String>,
                );
                let mut tx = begin_write(pool).await?;
                loop {
                    let row: Observed = sqlx::query_as(Order::IDEM_SQL.of(idem::Dialect::Postgres).transition)
                        .bind(order_id)
                        .bind("CREATED")
                        .bind("PAID")
                        .bind(<Order as idem::Machine>::DEFINITION.id)
                        .bind(order_id.to_string())
                        .fetch_one(&mut *tx)
                        .await?;
                    if row.0.is_some() {
                        return pay_and_commit(tx, order_id).await;
                    }
                    // Still CREATED in this statement's snapshot: a concurrent payment
                    // committed after it began; ask again, as idem does.
                    if row.2.as_deref() == Some("PAID") {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                }
            }

            /// Reads the state (`read`: plain or locking), then pays and marks the order if it
            /// was CREATED.
            async fn read_then_act(
                mut tx: Transaction<'static, $db>,
                read: &'static str,
                order_id: i64,
            ) -> Result<bool, sqlx::Error> {
                let state: Option<String> = sqlx::query_scalar(read)
                    .bind(order_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                if state.as_deref() != Some("CREATED") {
                    tx.rollback().await?;
                    return Ok(false);
                }
                pay_and_mark(tx, order_id).await
            }

            /// The effect and the state change, committed.
            async fn pay_and_mark(
                mut tx: Transaction<'static, $db>,
                order_id: i64,
            ) -> Result<bool, sqlx::Error> {
                sqlx::query(q(MARK_PAID))
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await?;
                pay_and_commit(tx, order_id).await
            }

            async fn in_transaction(
                pool: &P,
                order_id: i64,
            ) -> Result<bool, idem::Error<sqlx::Error>> {
                let mut tx = begin_write(pool).await?;
                let applied = pay(&mut tx, order_id).await?.is_applied();
                tx.commit().await?;
                Ok(applied)
            }

            async fn check_then_act(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let read = q("SELECT status FROM orders WHERE order_id = $1");
                read_then_act(pool.begin().await?, read, order_id).await
            }

            async fn for_update(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                read_then_act(begin_write(pool).await?, q($lock), order_id).await
            }

            async fn dedup_table(pool: &P, order_id: i64) -> Result<bool, sqlx::Error> {
                let mut tx = begin_write(pool).await?;
                let first =
                    sqlx::query(q($dedup))
                        .bind(format!("pay:{order_id}"))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                if !first {
                    tx.rollback().await?;
                    return Ok(false);
                }
                pay_and_mark(tx, order_id).await
            }

            /// One operation: `true` if it applied.
            pub async fn op(strategy: Strategy, pool: &P, order_id: i64) -> Result<bool, String> {
                let applied = match strategy {
                    Strategy::Idem => pay(pool, order_id)
                        .await
                        .map(|o| o.is_applied())
                        .map_err(|e| e.to_string()),
                    Strategy::IdemStored => pay_stored(pool, order_id)
                        .await
                        .map(|o| o.is_applied())
                        .map_err(|e| e.to_string()),
                    Strategy::IdemTraced => {
                        use tracing::instrument::WithSubscriber;
                        pay(pool, order_id)
                            .with_subscriber(crate::formatting_subscriber())
                            .await
                            .map(|o| o.is_applied())
                            .map_err(|e| e.to_string())
                    }
                    Strategy::IdemInTransaction => in_transaction(pool, order_id)
                        .await
                        .map_err(|e| e.to_string()),
                    Strategy::IdemColumnsInBody => pay_columns_in_body(pool, order_id, 100)
                        .await
                        .map(|o| o.is_applied())
                        .map_err(|e| e.to_string()),
                    Strategy::IdemColumnsSet => pay_columns_set(pool, order_id, 100)
                        .await
                        .map(|o| o.is_applied())
                        .map_err(|e| e.to_string()),
                    Strategy::IdemOneStatement => pay_at_once(pool, order_id, 100)
                        .await
                        .map(|o| o.is_applied())
                        .map_err(|e| e.to_string()),
                    Strategy::HandWrittenOneStatement => one_statement(pool, order_id)
                        .await
                        .map_err(|e| e.to_string()),
                    Strategy::HandWritten | Strategy::HandWrittenOneConnection => {
                        hand_written(pool, order_id)
                            .await
                            .map_err(|e| e.to_string())
                    }
                    Strategy::HandWrittenStored => hand_written_stored(pool, order_id)
                        .await
                        .map_err(|e| e.to_string()),
                    Strategy::HandWrittenIdemStatement => idem_statement(pool, order_id)
                        .await
                        .map_err(|e| e.to_string()),
                    Strategy::CheckThenAct => check_then_act(pool, order_id)
                        .await
                        .map_err(|e| e.to_string()),
                    Strategy::ForUpdate => {
                        for_update(pool, order_id).await.map_err(|e| e.to_string())
                    }
                    Strategy::DedupTable => {
                        dedup_table(pool, order_id).await.map_err(|e| e.to_string())
                    }
                };
                applied
            }

            /// Fresh tables with `keys` orders in CREATED.
            pub async fn reset(pool: &P, keys: i64) {
                for statement in $reset {
                    sqlx::query(q(statement))
                        .bind(keys)
                        .execute(pool)
                        .await
                        .unwrap();
                }
            }

            /// Payments beyond one per order, and orders moved more than once: effects a
            /// duplicate delivery repeated (the one-statement strategies' effect is the
            /// order's own columns).
            pub async fn duplicate_effects(pool: &P) -> i64 {
                let payments: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) - COUNT(DISTINCT order_id) FROM payments")
                        .fetch_one(pool)
                        .await
                        .unwrap();
                let moves: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE version > 1")
                        .fetch_one(pool)
                        .await
                        .unwrap();
                payments + moves
            }

            /// Runs `keys` through `strategy` on `tasks` concurrent tasks.
            pub async fn timed(
                pool: &P,
                strategy: Strategy,
                keys: Arc<Vec<i64>>,
                tasks: usize,
            ) -> Run {
                let next = Arc::new(AtomicUsize::new(0));
                let errors = Arc::new(AtomicU64::new(0));
                let started = Instant::now();
                let workers: Vec<_> = (0..tasks)
                    .map(|_| {
                        let (pool, keys, next, errors) =
                            (pool.clone(), keys.clone(), next.clone(), errors.clone());
                        tokio::spawn(async move {
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(&key) = keys.get(i) else { break };
                                if op(strategy, &pool, key).await.is_err() {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        })
                    })
                    .collect();
                for worker in workers {
                    worker.await.unwrap();
                }
                let elapsed = started.elapsed();
                Run {
                    ops_per_sec: keys.len() as f64 / elapsed.as_secs_f64(),
                    duplicate_effects: duplicate_effects(pool).await,
                    errors: errors.load(Ordering::Relaxed),
                }
            }

            /// [`statements`] of each strategy.
            pub async fn statements_of(
                pool: &P,
                strategies: &[Strategy],
            ) -> BTreeMap<Strategy, Statements> {
                let mut all = BTreeMap::new();
                for &strategy in strategies {
                    all.insert(strategy, statements(pool, strategy).await);
                }
                all
            }

            /// Statements per first delivery and per duplicate, from sqlx's statement log.
            async fn statements(pool: &P, strategy: Strategy) -> Statements {
                const N: i64 = 50;
                reset(pool, N).await;
                let mut per = [0.0; 2];
                for pass in 0..2 {
                    statement_log::take_log();
                    for key in 1..=N {
                        op(strategy, pool, key).await.unwrap();
                    }
                    let log = statement_log::take_log();
                    per[pass] = statement_log::inside_transaction(&log).len() as f64 / N as f64;
                }
                Statements {
                    first: per[0],
                    duplicate: per[1],
                }
            }
        }
    };
}

backend!(
    postgres,
    sqlx::Postgres,
    sqlite = false,
    begin_write = None::<&'static str>,
    lock = "SELECT status FROM orders WHERE order_id = $1 FOR UPDATE",
    reset = [
        "TRUNCATE orders, payments, processed, idem_results",
        "INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, $1) g",
    ]
);

backend!(
    sqlite,
    sqlx::Sqlite,
    sqlite = true,
    begin_write = Some("BEGIN IMMEDIATE"),
    lock = "SELECT status FROM orders WHERE order_id = $1",
    reset = [
        "DELETE FROM orders WHERE $1 IS NOT NULL",
        "DELETE FROM payments WHERE $1 IS NOT NULL",
        "DELETE FROM processed WHERE $1 IS NOT NULL",
        "DELETE FROM idem_results WHERE $1 IS NOT NULL",
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $1) \
         INSERT INTO orders (order_id, status) SELECT n, 'CREATED' FROM g",
    ]
);

backend!(
    mysql,
    sqlx::MySql,
    sqlite = false,
    begin_write = None::<&'static str>,
    lock = "SELECT status FROM orders WHERE order_id = $1 FOR UPDATE",
    reset = [
        "DELETE FROM orders WHERE $1 IS NOT NULL",
        "DELETE FROM payments WHERE $1 IS NOT NULL",
        "DELETE FROM processed WHERE $1 IS NOT NULL",
        "DELETE FROM idem_results WHERE $1 IS NOT NULL",
        "INSERT INTO orders (order_id, status) \
         WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $1) \
         SELECT n, 'CREATED' FROM g",
    ],
    positional = true,
    dedup = "INSERT IGNORE INTO processed (dedup_key) VALUES ($1)"
);

/// The formatting subscriber of `support/formatting.rs`, for every span and event.
fn formatting_subscriber() -> tracing::Dispatch {
    static DISPATCH: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    DISPATCH
        .get_or_init(|| tracing::Dispatch::new(formatting::Formatting::new(false)))
        .clone()
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const TASKS: [usize; 3] = [1, 8, 32];

/// `all`, less those `IDEM_BENCH_STRATEGIES` (short names, comma-separated) leaves out; the
/// floor always runs: every ratio is to it.
fn selected(all: &[Strategy]) -> Vec<Strategy> {
    let Ok(only) = std::env::var("IDEM_BENCH_STRATEGIES") else {
        return all.to_vec();
    };
    let only: Vec<&str> = only.split(',').map(str::trim).collect();
    all.iter()
        .copied()
        .filter(|s| *s == Strategy::HandWritten || only.contains(&s.short()))
        .collect()
}
const WORKLOADS: [Workload; 2] = [Workload::Unique, Workload::Duplicates];

/// Every run of every cell: (workload, tasks, strategy) → runs.
type Results = BTreeMap<(Workload, usize, Strategy), Vec<Run>>;

fn report(
    backend: &str,
    strategies: &[Strategy],
    results: &Results,
    statements: &BTreeMap<Strategy, Statements>,
    keys: usize,
) {
    println!("\n### {backend}\n");
    for workload in WORKLOADS {
        let ops = keys * if workload == Workload::Unique { 1 } else { 3 };
        println!("**{}** ({ops} operations per run)\n", workload.name());
        println!(
            "| strategy | tasks | ops/s (median) | ratio to floor (median, min–max) | statements/op | duplicate effects (max per run) | errors |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for tasks in TASKS {
            for &strategy in strategies {
                let runs = &results[&(workload, tasks, strategy)];
                let ops = median(runs.iter().map(|r| r.ops_per_sec).collect());
                let chart::Bar {
                    median: ratio,
                    low,
                    high,
                } = to_floor(results, workload, tasks, strategy);
                let s = statements[&strategy];
                let per_op = match workload {
                    Workload::Unique => s.first,
                    // One first delivery and two duplicates per key.
                    Workload::Duplicates => (s.first + 2.0 * s.duplicate) / 3.0,
                };
                let duplicates = runs.iter().map(|r| r.duplicate_effects).max().unwrap();
                let errors: u64 = runs.iter().map(|r| r.errors).max().unwrap();
                println!(
                    "| {} | {tasks} | {ops:.0} | {ratio:.2} ({low:.2}–{high:.2}) | {per_op:.2} | {duplicates} | {errors} |",
                    strategy.name(),
                );
            }
        }
        println!();
    }
    println!(
        "Statements per operation (first delivery / duplicate), BEGIN/COMMIT/ROLLBACK not counted \
         (the one-statement strategies send none):\n"
    );
    for &strategy in strategies {
        let s = statements[&strategy];
        println!("- {}: {:.2} / {:.2}", strategy.name(), s.first, s.duplicate);
    }
    draw(backend, strategies, results);
}

/// A cell's throughput over the floor's, paired by round (each round ran the strategy and
/// the floor back to back): the median and the range.
fn to_floor(results: &Results, workload: Workload, tasks: usize, strategy: Strategy) -> chart::Bar {
    let floor = &results[&(workload, tasks, Strategy::HandWritten)];
    let ratios = results[&(workload, tasks, strategy)]
        .iter()
        .zip(floor)
        .map(|(run, floor)| run.ops_per_sec / floor.ops_per_sec)
        .collect();
    chart::Bar::of(ratios)
}

/// The charts of one backend: throughput against concurrency, a line per strategy, for each
/// workload; and the forms without a transaction against the hand-written limit.
fn draw(backend: &str, strategies: &[Strategy], results: &Results) {
    let tasks: Vec<String> = TASKS.iter().map(|t| t.to_string()).collect();
    // The ways to make a handler idempotent, side by side; idem's variants are in the
    // second chart and the tables.
    let ways: Vec<Strategy> = [
        Strategy::Idem,
        Strategy::IdemStored,
        Strategy::HandWritten,
        Strategy::CheckThenAct,
        Strategy::ForUpdate,
        Strategy::DedupTable,
    ]
    .into_iter()
    .filter(|s| strategies.contains(s))
    .collect();
    for workload in WORKLOADS {
        // A cell whose calls failed is left out: failing fast is no throughput (SQLite's
        // check-then-act, whose deferred transactions cannot upgrade to writers).
        let series: Vec<chart::Series> = ways
            .iter()
            .map(|&strategy| {
                let values: Vec<Option<f64>> = TASKS
                    .iter()
                    .map(|&t| {
                        let runs = &results[&(workload, t, strategy)];
                        let failed = runs.iter().any(|r| r.errors > 0);
                        (!failed).then(|| median(runs.iter().map(|r| r.ops_per_sec).collect()))
                    })
                    .collect();
                let mut name = strategy.name().replace('`', "");
                if values.iter().any(Option::is_none) {
                    name.push_str(" (failed calls: not drawn)");
                }
                chart::Series { name, values }
            })
            .collect();
        let title = format!("{backend}: {}", workload.name());
        let svg = chart::lines(
            &title,
            "concurrent tasks",
            "operations/s (median)",
            &tasks,
            &series,
        );
        chart::write(
            &format!(
                "strategies-{}-{}",
                chart::slug(backend),
                chart::slug(workload.short())
            ),
            &svg,
        );
    }
    // One statement against the limit: ratios to the floor, first deliveries.
    let compared: Vec<Strategy> = [
        Strategy::IdemOneStatement,
        Strategy::HandWrittenOneStatement,
        Strategy::IdemColumnsSet,
        Strategy::IdemColumnsInBody,
        Strategy::Idem,
    ]
    .into_iter()
    .filter(|s| strategies.contains(s))
    .collect();
    if compared.is_empty() {
        return;
    }
    let groups: Vec<chart::Group> = TASKS
        .iter()
        .map(|&t| chart::Group {
            name: chart::count(t, "task"),
            bars: compared
                .iter()
                .map(|&strategy| Some(to_floor(results, Workload::Unique, t, strategy)))
                .collect(),
        })
        .collect();
    let names: Vec<String> = compared.iter().map(|s| s.name().replace('`', "")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let svg = chart::bars(
        &format!("{backend}: one statement against the limit (every key once)"),
        "throughput / hand-written transaction",
        &names,
        &groups,
        1.0,
    );
    chart::write(&format!("one-statement-{}", chart::slug(backend)), &svg);
}

/// The cells of one backend, interleaved: in each round, each cell runs every strategy once,
/// in a fresh random order.
async fn measure<P, Reset, Timed>(
    strategies: &[Strategy],
    keys: usize,
    rounds: usize,
    pool_for: impl Fn(Strategy, usize) -> P,
    reset: Reset,
    timed: Timed,
) -> Results
where
    Reset: AsyncFn(&P, i64),
    Timed: AsyncFn(&P, Strategy, Arc<Vec<i64>>, usize) -> Run,
{
    let mut results = Results::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // A warm-up round, not recorded: every pooled connection opened and every statement
    // prepared on it, as in a service that has been running for a while.
    for tasks in TASKS {
        let sequence = Arc::new(Workload::Duplicates.keys(keys.min(500) as i64, 99));
        for &strategy in strategies {
            let pool = pool_for(strategy, tasks);
            reset(&pool, keys as i64).await;
            timed(&pool, strategy, sequence.clone(), tasks).await;
        }
    }
    for round in 0..rounds {
        for workload in WORKLOADS {
            let sequence = Arc::new(workload.keys(keys as i64, round as u64));
            for tasks in TASKS {
                let mut order = strategies.to_vec();
                order.shuffle(&mut rng);
                for strategy in order {
                    let pool = pool_for(strategy, tasks);
                    reset(&pool, keys as i64).await;
                    let run = timed(&pool, strategy, sequence.clone(), tasks).await;
                    results
                        .entry((workload, tasks, strategy))
                        .or_default()
                        .push(run);
                }
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    results
}

/// Runs `f` with sqlx's statement log recording (the timed runs run without it). The log
/// is process-wide: SQLite runs its statements on threads of its own.
fn with_statement_log<T>(f: impl AsyncFnOnce() -> T) -> T {
    statement_log::set_recording(true);
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    statement_log::set_recording(false);
    statement_log::take_log();
    result
}

/// The strategies measured on a database server (PostgreSQL, MariaDB).
const SERVER_STRATEGIES: [Strategy; 14] = [
    Strategy::Idem,
    Strategy::IdemStored,
    Strategy::HandWrittenStored,
    Strategy::IdemTraced,
    Strategy::IdemInTransaction,
    Strategy::IdemColumnsInBody,
    Strategy::IdemColumnsSet,
    Strategy::IdemOneStatement,
    Strategy::HandWritten,
    Strategy::HandWrittenIdemStatement,
    Strategy::HandWrittenOneStatement,
    Strategy::CheckThenAct,
    Strategy::ForUpdate,
    Strategy::DedupTable,
];

/// Every cell of a server backend (`$backend`: its module above), on pools from
/// `$connect(max_connections)`, reported under `$title`.
macro_rules! server_cells {
    ($runtime:expr, $backend:ident, $connect:expr, $strategies:expr, $keys:expr, $rounds:expr, $title:expr) => {{
        let connect = $connect;
        let strategies = $strategies;
        let statements = with_statement_log(async || {
            $backend::statements_of(&connect(1).await, &strategies).await
        });
        let pools: BTreeMap<usize, $backend::P> = $runtime.block_on(async {
            let mut pools = BTreeMap::new();
            for tasks in TASKS {
                pools.insert(tasks, connect(tasks as u32).await);
            }
            pools
        });
        let results = $runtime.block_on(measure(
            &strategies,
            $keys,
            $rounds,
            |_, tasks| pools[&tasks].clone(),
            $backend::reset,
            $backend::timed,
        ));
        report($title, &strategies, &results, &statements, $keys);
    }};
}

fn main() {
    let keys = env_number("IDEM_BENCH_KEYS", 1000);
    let rounds = env_number("IDEM_BENCH_ROUNDS", 5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::set_global_default(statement_log::StatementLog).unwrap();
    statement_log::set_recording(false);
    println!(
        "{keys} keys, {rounds} rounds, tasks {TASKS:?}; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    if let Some(url) = std::env::var("IDEM_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let strategies = selected(&SERVER_STRATEGIES);
        let connect = |max: u32| {
            let url = url.clone();
            async move {
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(max)
                    .min_connections(max)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::Executor::execute(conn, "SET search_path TO idem_bench").await?;
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await
                    .unwrap()
            }
        };
        runtime.block_on(async {
            let admin = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::raw_sql("DROP SCHEMA IF EXISTS idem_bench CASCADE; CREATE SCHEMA idem_bench")
                .execute(&admin)
                .await
                .unwrap();
            let pool = connect(1).await;
            sqlx::raw_sql(TABLES_POSTGRES).execute(&pool).await.unwrap();
            idem::migrate(&pool).await.unwrap();
        });
        server_cells!(
            runtime,
            postgres,
            connect,
            strategies,
            keys,
            rounds,
            "PostgreSQL"
        );
    } else {
        eprintln!("PostgreSQL skipped: set IDEM_BENCH_POSTGRES_URL");
    }
    if let Some(url) = std::env::var("IDEM_BENCH_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        bench_mysql(&runtime, &url, keys, rounds);
    } else {
        eprintln!("MySQL skipped: set IDEM_BENCH_MYSQL_URL");
    }
    if std::env::var("IDEM_BENCH_SQLITE").is_ok_and(|v| v == "0") {
        return;
    }

    let strategies = selected(&[
        Strategy::Idem,
        Strategy::IdemStored,
        Strategy::HandWrittenStored,
        Strategy::IdemTraced,
        Strategy::IdemInTransaction,
        Strategy::IdemColumnsInBody,
        Strategy::IdemColumnsSet,
        Strategy::IdemOneStatement,
        Strategy::HandWritten,
        Strategy::HandWrittenOneConnection,
        Strategy::HandWrittenOneStatement,
        Strategy::HandWrittenIdemStatement,
        Strategy::CheckThenAct,
        Strategy::ForUpdate,
        Strategy::DedupTable,
    ]);
    // `synchronous = FULL` is idem's default; `IDEM_BENCH_SQLITE_SYNC=full,normal` measures
    // both, one after the other in this run, each on a fresh file.
    let modes = std::env::var("IDEM_BENCH_SQLITE_SYNC").unwrap_or_else(|_| "full".into());
    for mode in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let synchronous = match mode {
            "full" => sqlx::sqlite::SqliteSynchronous::Full,
            "normal" => sqlx::sqlite::SqliteSynchronous::Normal,
            other => panic!("IDEM_BENCH_SQLITE_SYNC: unknown mode {other:?} (full, normal)"),
        };
        bench_sqlite(&runtime, &strategies, keys, rounds, mode, synchronous);
    }
}

fn bench_sqlite(
    runtime: &tokio::runtime::Runtime,
    strategies: &[Strategy],
    keys: usize,
    rounds: usize,
    mode: &str,
    synchronous: sqlx::sqlite::SqliteSynchronous,
) {
    let path = std::env::temp_dir().join(format!("idem-bench-{mode}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let url = format!("sqlite:{}", path.display());
    let connect = |max: u32| {
        let url = url.clone();
        async move {
            sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(max)
                .min_connections(max)
                .connect_with(idem::sqlite_options(&url).unwrap().synchronous(synchronous))
                .await
                .unwrap()
        }
    };
    runtime.block_on(async {
        let pool = connect(1).await;
        sqlx::raw_sql(TABLES_SQLITE).execute(&pool).await.unwrap();
        idem::migrate(&pool).await.unwrap();
    });
    let statements =
        with_statement_log(async || sqlite::statements_of(&connect(1).await, strategies).await);
    // Eight pooled connections (idem queues its writers on them); one for the single-writer
    // variant of the floor.
    let (pooled, single) = runtime.block_on(async { (connect(8).await, connect(1).await) });
    let results = runtime.block_on(measure(
        strategies,
        keys,
        rounds,
        |strategy, _| match strategy {
            Strategy::HandWrittenOneConnection => single.clone(),
            _ => pooled.clone(),
        },
        sqlite::reset,
        sqlite::timed,
    ));
    report(
        &format!(
            "SQLite (a file, WAL, synchronous = {})",
            mode.to_uppercase()
        ),
        strategies,
        &results,
        &statements,
        keys,
    );
}

fn bench_mysql(runtime: &tokio::runtime::Runtime, url: &str, keys: usize, rounds: usize) {
    use std::str::FromStr;
    let strategies = selected(&SERVER_STRATEGIES);
    let options = sqlx::mysql::MySqlConnectOptions::from_str(url)
        .unwrap()
        .database("idem_bench");
    let connect = |max: u32| {
        let options = options.clone();
        async move {
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(max)
                .min_connections(max)
                .connect_with(options)
                .await
                .unwrap()
        }
    };
    runtime.block_on(async {
        let mut admin: sqlx::MySqlConnection = sqlx::Connection::connect(url).await.unwrap();
        sqlx::raw_sql("DROP DATABASE IF EXISTS idem_bench; CREATE DATABASE idem_bench")
            .execute(&mut admin)
            .await
            .unwrap();
        let pool = connect(1).await;
        sqlx::raw_sql(TABLES_MYSQL).execute(&pool).await.unwrap();
        idem::migrate(&pool).await.unwrap();
    });
    let title = "MariaDB (InnoDB, REPEATABLE READ)";
    server_cells!(runtime, mysql, connect, strategies, keys, rounds, title);
}
