//! The cost of one scheduled occurrence (`idem::schedule::Job::tick`) against the claim one
//! writes by hand: `INSERT INTO claims (job, at) … ON CONFLICT DO NOTHING` in the job's
//! transaction, then the body if the row was inserted. The body is the same for both, one
//! insert. Occurrences come one after another (a test clock moves one period per tick, so
//! each tick finds exactly one due), on PostgreSQL, one instance.
//!
//! Rounds alternate the two (`IDEM_BENCH_ROUNDS`, default 3, of `IDEM_BENCH_OCCURRENCES`
//! occurrences each, default 2,000); the ratio is the hand loop's time over idem's (above 1:
//! idem is faster), the median of the rounds' ratios.
//!
//! ```sh
//! IDEM_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test cargo bench -p idem --bench schedule --features schedule
//! ```
//!
//! The results are in BENCHMARKS.md.

#[path = "support/env.rs"]
mod env;

use env::env_usize;
use idem::inbox::ManualClock;
use idem::schedule::{Job, Schedule};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;
use std::time::{Duration, Instant};

const START: i64 = 1_800_000_000_000;

async fn prepare(url: &str) -> PgPool {
    let schema = "idem_bench_schedule";
    let admin = PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .options([("search_path", schema)]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE reports (job TEXT NOT NULL, at TEXT NOT NULL); \
         CREATE TABLE claims (job TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY (job, at));",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

/// `n` occurrences through idem: a tick each, the clock a period further each time.
async fn idem_round(pool: &PgPool, round: usize, n: usize) -> Duration {
    let clock = ManualClock::new(START);
    let job = Job::new(
        format!("idem-{round}"),
        Schedule::every(Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
    .clock(clock.clone());
    let started = Instant::now();
    for _ in 0..n {
        let tick = job
            .tick(pool, |tx, occurrence| {
                let at = occurrence.key().to_owned();
                Box::pin(async move {
                    sqlx::query("INSERT INTO reports (job, at) VALUES ('idem', $1)")
                        .bind(at)
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            })
            .await
            .unwrap();
        assert!(tick.ran().is_some(), "{tick:?}");
        clock.advance(Duration::from_secs(1));
    }
    started.elapsed()
}

/// `n` occurrences claimed by hand, in the job's transaction.
async fn hand_round(pool: &PgPool, round: usize, n: usize) -> Duration {
    let job = format!("hand-{round}");
    let started = Instant::now();
    for i in 0..n {
        let at = START + i as i64 * 1000;
        let mut tx = pool.begin().await.unwrap();
        let claimed =
            sqlx::query("INSERT INTO claims (job, at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(&job)
                .bind(at)
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected();
        assert_eq!(claimed, 1);
        sqlx::query("INSERT INTO reports (job, at) VALUES ('hand', $1)")
            .bind(at.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    started.elapsed()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Ok(url) = std::env::var("IDEM_BENCH_POSTGRES_URL") else {
        eprintln!("set IDEM_BENCH_POSTGRES_URL to run the schedule benchmark");
        return;
    };
    let rounds = env_usize("IDEM_BENCH_ROUNDS", 3);
    let n = env_usize("IDEM_BENCH_OCCURRENCES", 2_000);
    let pool = prepare(&url).await;
    // Warm both paths' statements and the tables.
    idem_round(&pool, 1000, 50).await;
    hand_round(&pool, 1000, 50).await;
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let idem = idem_round(&pool, round, n).await;
        let hand = hand_round(&pool, round, n).await;
        let ratio = hand.as_secs_f64() / idem.as_secs_f64();
        println!(
            "round {round}: idem {:.0} occurrences/s, by hand {:.0}/s, ratio {ratio:.2}",
            n as f64 / idem.as_secs_f64(),
            n as f64 / hand.as_secs_f64()
        );
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "occurrence against a hand-written claim: median {:.2} (min {:.2}, max {:.2})",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}
