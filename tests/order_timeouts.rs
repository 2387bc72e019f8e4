//! 1,000 orders racing their timeouts (`examples/timeouts/race.rs`), on a SQLite file,
//! PostgreSQL and MariaDB: each order stages its own delayed `order.timeout` when it is
//! created, its payment comes at a random moment within two seconds and cancels the
//! timeout, and a timeout that comes first (or whose cancel came too late) cancels the
//! order through an inbox + transition; the broker hands every message out twice. Every
//! order ends PAID or CANCELLED with exactly one effect, and both sides of the race were
//! won (some orders paid, some cancelled).

use crate::chain::{any_pool, database};
use std::time::Duration;

#[path = "../examples/timeouts/race.rs"]
mod race;

const ORDERS: i64 = 1000;

async fn orders_race_their_timeouts(backend: &str) {
    let Some(url) = database(backend).await else {
        return;
    };
    let pool = any_pool(&url, 8).await;
    if backend == "sqlite" {
        sqlx::raw_sql("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await
            .unwrap();
    }
    race::setup(&pool).await.unwrap();
    let report = race::race(&pool, ORDERS, Duration::from_secs(2), 41)
        .await
        .unwrap();
    assert_eq!(report.wrong, 0, "{report:?}");
    assert_eq!(report.paid + report.cancelled, ORDERS, "{report:?}");
    assert!(
        report.paid > ORDERS / 10 && report.cancelled > ORDERS / 10,
        "one side of the race never won: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ends_paid_or_cancelled_once_sqlite() {
    orders_race_their_timeouts("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ends_paid_or_cancelled_once_postgres() {
    orders_race_their_timeouts("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ends_paid_or_cancelled_once_mysql() {
    orders_race_their_timeouts("mysql").await;
}
