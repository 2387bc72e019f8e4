//! What idem's span and counters cost a call, counted in CPU instructions (repeatable, unlike
//! time on a shared machine). Run under callgrind, see BENCHMARKS.md:
//!
//! ```sh
//! cargo bench -p idem --bench span_cost --no-run
//! for mode in none traced traced-all metrics; do for calls in 1000 3000; do
//!   IDEM_SPAN_COST_MODE=$mode IDEM_SPAN_COST_CALLS=$calls valgrind --tool=callgrind \
//!     --callgrind-out-file=/dev/null target/release/deps/span_cost-* 2>&1 | grep Collected
//! done; done
//! ```
//!
//! Each run makes `calls` first deliveries and `calls` duplicates of one transition on an
//! in-memory SQLite database (no I/O: the cheapest call there is, so the share of the span
//! is the largest it can be). The difference between two runs of different lengths, divided
//! by the extra calls, is the cost of one call without the setup.
//!
//! Modes: `none` (no subscriber, no recorder), `traced` (a subscriber enabled for idem's
//! spans that formats every field, as a log formatter does), `traced-all` (the same for
//! every span and event, sqlx's statement logs included), `metrics` (a recorder that keeps
//! every counter).

#[path = "support/formatting.rs"]
mod formatting;

use formatting::Formatting;
use idem::StateMachine;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    order_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Keeps every counter's total.
#[derive(Default)]
struct Recorder(std::sync::Mutex<std::collections::HashMap<metrics::Key, Arc<AtomicU64>>>);

struct Cell(Arc<AtomicU64>);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let cell = self
            .0
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        metrics::Counter::from_arc(Arc::new(Cell(cell)))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

fn main() {
    let mode = std::env::var("IDEM_SPAN_COST_MODE").unwrap_or_else(|_| "none".into());
    let calls: i64 = std::env::var("IDEM_SPAN_COST_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    match mode.as_str() {
        "none" => {}
        "traced" | "traced-all" => {
            let subscriber = Formatting::new(mode == "traced");
            tracing::subscriber::set_global_default(subscriber).unwrap();
        }
        "metrics" => metrics::set_global_recorder(Recorder::default()).unwrap(),
        other => panic!(
            "IDEM_SPAN_COST_MODE: unknown mode {other:?} (none, traced, traced-all, metrics)"
        ),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(idem::sqlite_options("sqlite::memory:").unwrap())
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0);
             CREATE TABLE payments (order_id INTEGER NOT NULL);",
        )
        .execute(&pool)
        .await
        .unwrap();
        idem::migrate(&pool).await.unwrap();
        sqlx::query(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $1) \
             INSERT INTO orders (order_id, status) SELECT n, 'CREATED' FROM g",
        )
        .bind(calls)
        .execute(&pool)
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let mut applied = 0;
        for round in 0..2 {
            for order_id in 1..=calls {
                let outcome = pay(&pool, order_id).await.unwrap();
                applied += i64::from(outcome.is_applied());
                assert_eq!(outcome.is_applied(), round == 0);
            }
        }
        assert_eq!(applied, calls);
        eprintln!(
            "mode {mode}: {} calls in {:?}",
            2 * calls,
            started.elapsed()
        );
    });
}
