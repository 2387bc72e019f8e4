//! Reconciliation at scale: `idem::reconcile` of a consumer group's 10 million done inbox
//! records against a table of 10 million payments, on PostgreSQL.
//!
//! A schema is filled once (and kept for the next run) with `IDEM_BENCH_RECONCILE_ROWS`
//! (default 10,000,000) done records of the group `payments` and one payment per record
//! (`payments (message_key TEXT, amount BIGINT)`, indexed on `message_key`), then analyzed.
//! Each run plants the three findings afresh: 10 keys paid twice, 10 payments without a
//! record, and `IDEM_BENCH_RECONCILE_MISSING` (default 1,000,000) payments deleted — a
//! million records without an effect, streamed and counted with 100 kept, to show the
//! memory stays bounded however many there are.
//!
//! Each round (`IDEM_BENCH_ROUNDS`, default 3) runs, in turn: the floor — the two tables
//! read once each (`SELECT count(*)` of the payments and of the group's done records),
//! which any reconciliation must at least do — and `reconcile` with `limit` 100. Reported:
//! the medians, the ratio of reconcile to the floor (per round, then its median and range),
//! and the process's peak resident memory before and after.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! cargo bench -p idem --bench reconcile
//! ```
//!
//! `IDEM_BENCH_REFILL=1` fills the schema again. The results are in BENCHMARKS.md.

#[path = "support/chart.rs"]
mod chart;
#[path = "support/env.rs"]
mod env;

use chart::median;
use env::env_usize;
use idem::reconcile::{Effects, Records, reconcile};
use sqlx::PgPool;
use std::time::Instant;

const CHUNK: usize = 1_000_000;
const PLANTED: usize = 10;

/// The process's peak resident memory, in MiB (`VmHWM`).
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn schema(url: &str, rows: usize) -> PgPool {
    let schema = format!("idem_bench_reconcile_{rows}");
    let admin = PgPool::connect(url).await.unwrap();
    let refill = std::env::var("IDEM_BENCH_REFILL").is_ok_and(|v| v == "1");
    let filled: Option<i64> = sqlx::query_scalar(
        // Filled to the end: the index is made last.
        "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'payments_message_key'",
    )
    .bind(&schema)
    .fetch_optional(&admin)
    .await
    .unwrap();
    let fill = refill || filled != Some(1);
    if fill {
        sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .execute(&admin)
        .await
        .unwrap();
    }
    let path = format!("SET search_path TO {schema}");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move {
                sqlx::Executor::execute(conn, path.as_str()).await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .unwrap();
    if fill {
        let started = Instant::now();
        idem::migrate(&pool).await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (message_key TEXT NOT NULL, amount BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        for from in (1..=rows).step_by(CHUNK) {
            let to = (from + CHUNK - 1).min(rows) as i64;
            sqlx::query(
                "INSERT INTO idem_inbox (consumer_group, message_key, fingerprint, status, attempts, created_at, updated_at) \
                 SELECT 'payments', 'k' || g, repeat('0', 64), 'SUCCESS', 1, 0, 0 FROM generate_series($1, $2) g",
            )
            .bind(from as i64)
            .bind(to)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("INSERT INTO payments SELECT 'k' || g, 100 FROM generate_series($1, $2) g")
                .bind(from as i64)
                .bind(to)
                .execute(&pool)
                .await
                .unwrap();
        }
        run(
            &pool,
            &[
                "CREATE INDEX payments_message_key ON payments (message_key)",
                "VACUUM ANALYZE idem_inbox",
                "VACUUM ANALYZE payments",
            ],
        )
        .await;
        eprintln!(
            "filled {rows} records and payments in {:.0?}",
            started.elapsed()
        );
    }
    pool
}

/// Plants the findings: `PLANTED` keys paid twice, `PLANTED` payments without a record,
/// `missing` payments deleted. Undone by [`restore`].
async fn plant(pool: &PgPool, missing: usize) {
    sqlx::raw_sql(&format!(
        "INSERT INTO payments SELECT 'k' || g, 100 FROM generate_series(1, {PLANTED}) g; \
         INSERT INTO payments SELECT 'rogue' || g, 100 FROM generate_series(1, {PLANTED}) g; \
         CREATE TABLE IF NOT EXISTS deleted (message_key TEXT NOT NULL, amount BIGINT NOT NULL); \
         WITH gone AS (DELETE FROM payments WHERE message_key IN \
             (SELECT 'k' || g FROM generate_series(1000001, 1000000 + {missing}) g) RETURNING *) \
         INSERT INTO deleted SELECT * FROM gone; \
         ANALYZE payments"
    ))
    .execute(pool)
    .await
    .unwrap();
}

async fn restore(pool: &PgPool) {
    let duplicates = format!(
        "DELETE FROM payments WHERE ctid IN (SELECT min(ctid) FROM payments \
         WHERE message_key IN (SELECT 'k' || g FROM generate_series(1, {PLANTED}) g) GROUP BY message_key)"
    );
    run(
        pool,
        &[
            "DELETE FROM payments WHERE message_key LIKE 'rogue%'",
            &duplicates,
            "INSERT INTO payments SELECT * FROM deleted",
            "DROP TABLE deleted",
            "VACUUM ANALYZE payments",
        ],
    )
    .await;
}

/// Runs each statement on its own (`VACUUM` cannot run inside a transaction block, which a
/// string of several statements is).
async fn run(pool: &PgPool, statements: &[&str]) {
    for statement in statements {
        sqlx::raw_sql(statement).execute(pool).await.unwrap();
    }
}

async fn floor(pool: &PgPool) -> (i64, i64) {
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(pool)
        .await
        .unwrap();
    let records: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_inbox WHERE consumer_group = 'payments' AND status = 'SUCCESS'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (effects, records)
}

fn main() {
    let Ok(url) = std::env::var("IDEM_BENCH_POSTGRES_URL") else {
        eprintln!("set IDEM_BENCH_POSTGRES_URL to run the reconciliation benchmark");
        return;
    };
    let rows = env_usize("IDEM_BENCH_RECONCILE_ROWS", 10_000_000);
    let missing =
        env_usize("IDEM_BENCH_RECONCILE_MISSING", 1_000_000).min(rows.saturating_sub(1_000_000));
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = schema(&url, rows).await;
        plant(&pool, missing).await;
        let before = peak_mib();
        let (mut floors, mut reconciles, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..rounds {
            let started = Instant::now();
            let counted = floor(&pool).await;
            let floor_took = started.elapsed();
            let started = Instant::now();
            let report = reconcile(
                &pool,
                &Records::inbox("payments"),
                &Effects::table("payments", "message_key"),
                100,
            )
            .await
            .unwrap();
            let took = started.elapsed();
            assert_eq!(report.effects as i64, counted.0);
            assert_eq!(report.records as i64, counted.1);
            assert_eq!(report.duplicates.count, PLANTED as u64);
            assert_eq!(report.effects_without_record.count, PLANTED as u64);
            assert_eq!(report.records_without_effect.count, missing as u64);
            assert_eq!(report.records_without_effect.first.len(), 100.min(missing));
            floors.push(floor_took.as_secs_f64());
            reconciles.push(took.as_secs_f64());
            ratios.push(took.as_secs_f64() / floor_took.as_secs_f64());
            last = Some(report);
        }
        let after = peak_mib();
        restore(&pool).await;
        let report = last.unwrap();
        println!(
            "{rows} done records against {} payments; planted {PLANTED} duplicates, {PLANTED} payments \
             without a record, {missing} records without a payment; {rounds} rounds\n",
            report.effects
        );
        println!("| | seconds (median) | min–max |");
        println!("|---|---:|---:|");
        let range = |v: &[f64]| {
            let (min, max) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            format!("{min:.2}–{max:.2}")
        };
        println!(
            "| the floor: both tables counted | {:.2} | {} |",
            median(floors.clone()),
            range(&floors)
        );
        println!(
            "| `reconcile` (three checks, limit 100) | {:.2} | {} |",
            median(reconciles.clone()),
            range(&reconciles)
        );
        println!(
            "\nreconcile / floor: {:.2} (per round {})",
            median(ratios.clone()),
            range(&ratios)
        );
        println!(
            "peak resident memory: {before:.1} MiB before, {after:.1} MiB after \
             ({missing} findings streamed, 100 kept)"
        );
    });
}
