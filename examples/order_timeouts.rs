//! Orders racing their timeouts: each order created stages `order.timeout` for a moment of
//! its own (`Message::deliver_after`, by the database's clock); its payment, coming at a
//! random moment, moves it `CREATED → PAID` and cancels the timeout (`outbox::cancel`); a
//! timeout that comes first — or whose cancel came too late — cancels the order through an
//! inbox + transition `CREATED → CANCELLED`, which refuses an order already paid. Every
//! order ends PAID or CANCELLED, with exactly one effect.
//!
//! ```text
//! cargo run -p idem --example order_timeouts                 # an SQLite temp file
//! cargo run -p idem --example order_timeouts -- DATABASE_URL [ORDERS]
//! ```
//!
//! `DATABASE_URL`: `sqlite:…`, `postgres://…` or `mysql://…` (a database of its own: the
//! example creates its tables). `tests/order_timeouts.rs` runs the race on SQLite,
//! PostgreSQL and MariaDB.

#[path = "timeouts/race.rs"]
mod race;

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let url = match args.next() {
        Some(url) => url,
        None => {
            let path =
                std::env::temp_dir().join(format!("idem-order-timeouts-{}.db", std::process::id()));
            let _ = std::fs::remove_file(&path);
            format!("sqlite:{}?mode=rwc", path.display())
        }
    };
    let orders: i64 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(300);
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    if url.starts_with("sqlite:") {
        sqlx::raw_sql("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    race::setup(&pool).await?;
    // Timeouts and payments within two seconds of each other: about half of each win.
    let report = race::race(&pool, orders, Duration::from_secs(2), 7).await?;
    println!("{report:?}");
    println!(
        "{orders} orders: {} paid, {} cancelled by their timeout, {} late payments refused, {} late timeouts refused",
        report.paid, report.cancelled, report.late_payments, report.late_timeouts
    );
    if report.wrong > 0 || report.paid + report.cancelled != orders {
        eprintln!("{} orders ended wrong", report.wrong);
        std::process::exit(1);
    }
    Ok(())
}
