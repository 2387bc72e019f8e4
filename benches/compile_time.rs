//! What `#[idempotent]` costs at compile time: `cargo check` of a crate with 100 annotated
//! handlers — in the card's form (associated functions in `impl Order`, no `machine`) and
//! as free functions naming `machine = Order` — against the same 100 handlers written by
//! hand (the conditional UPDATE, the classifying SELECT, the outcome), all on PostgreSQL
//! through sqlx.
//!
//! ```sh
//! cargo bench -p idem --bench compile_time
//! ```
//!
//! The three crates are generated under the target directory, share one target directory
//! (their dependencies are checked once, first), and are checked `IDEM_BENCH_ROUNDS` times
//! (default 5) each, in a rotating order, after touching their source. The results and the machine
//! are in BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const HANDLERS: usize = 100;

/// The three transitions the handlers cycle through: (from, to, function-name prefix).
const TRANSITIONS: [(&str, &str, &str); 3] = [
    ("CREATED", "PAID", "pay"),
    ("PAID", "SHIPPED", "ship"),
    ("CREATED", "CANCELLED", "cancel"),
];

const MACHINE: &str = r#"
use sqlx::{Postgres, Transaction};

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}
"#;

fn annotated(n: usize) -> String {
    handler(n, "machine = Order, ")
}

/// The card's form: the same handler as an associated function of the machine.
fn card(n: usize) -> String {
    handler(n, "")
}

fn handler(n: usize, machine: &str) -> String {
    let (from, to, verb) = TRANSITIONS[n % TRANSITIONS.len()];
    format!(
        r#"
#[idem::idempotent({machine}key = "order_id", from = "{from}", to = "{to}")]
pub async fn {verb}_{n}(tx: &mut Transaction<'_, Postgres>, order_id: i64, amount: i64) -> Result<i64, sqlx::Error> {{
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, '{verb}', $2)")
        .bind(order_id).bind(amount).execute(&mut **tx).await?;
    Ok(amount)
}}
"#
    )
}

/// The same handler by hand: what a careful author writes without idem (one transaction,
/// the conditional UPDATE with the version guard, the effect, a classifying SELECT on a
/// miss, a typed outcome). No stored first result: hand-written code rarely has one.
fn hand_written(n: usize) -> String {
    let (from, to, verb) = TRANSITIONS[n % TRANSITIONS.len()];
    let later = match to {
        "PAID" => r#"["PAID", "SHIPPED"]"#,
        "SHIPPED" => r#"["SHIPPED"]"#,
        _ => r#"["CANCELLED"]"#,
    };
    format!(
        r#"
pub async fn {verb}_{n}(pool: &PgPool, order_id: i64, amount: i64) -> Result<Outcome<i64>, sqlx::Error> {{
    let mut tx = pool.begin().await?;
    let updated = sqlx::query(
        "UPDATE orders SET status = $2, version = version + 1 WHERE order_id = $1 AND status = $3 AND version IS NOT NULL",
    )
    .bind(order_id).bind("{to}").bind("{from}")
    .execute(&mut *tx).await?
    .rows_affected();
    if updated == 1 {{
        sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, '{verb}', $2)")
            .bind(order_id).bind(amount).execute(&mut *tx).await?;
        tx.commit().await?;
        return Ok(Outcome::Applied(amount));
    }}
    let row: Option<(String, i64)> = sqlx::query_as("SELECT status, version FROM orders WHERE order_id = $1")
        .bind(order_id).fetch_optional(&mut *tx).await?;
    tx.rollback().await?;
    Ok(match row {{
        None => Outcome::NotFound,
        Some((state, _)) if {later}.contains(&state.as_str()) => Outcome::AlreadyDone(state),
        Some((state, _)) => Outcome::IllegalState(state),
    }})
}}
"#
    )
}

const HAND_WRITTEN_PRELUDE: &str = r#"
use sqlx::PgPool;

#[derive(Debug, PartialEq)]
pub enum Outcome<T> {
    Applied(T),
    AlreadyDone(String),
    IllegalState(String),
    NotFound,
}
"#;

/// Writes a crate `name` with `items` under `root`; its manifest pins the dependencies of
/// this workspace (its lock file is copied).
fn write_crate(
    root: &Path,
    name: &str,
    prelude: &str,
    items: impl Iterator<Item = String>,
) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let idem = env!("CARGO_MANIFEST_DIR");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
idem = {{ path = "{idem}", default-features = false, features = ["postgres"] }}
sqlx = {{ version = "0.8.6", default-features = false, features = ["runtime-tokio", "postgres"] }}

[workspace]
"#
        ),
    )
    .unwrap();
    std::fs::copy(Path::new(idem).join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let mut source = String::from("#![allow(dead_code)]\n");
    source.push_str(prelude);
    for item in items {
        source.push_str(&item);
    }
    std::fs::write(dir.join("src/lib.rs"), source).unwrap();
    dir
}

/// `cargo check` of the crate in `dir`, after touching its source; how long it took.
fn check(dir: &Path, target: &Path) -> Duration {
    let lib = dir.join("src/lib.rs");
    let source = std::fs::read(&lib).unwrap();
    std::fs::write(&lib, source).unwrap();
    let started = Instant::now();
    // The toolchain this was built with, not whatever a `rust-toolchain` file in a
    // dependency's directory would select through rustup's proxies.
    let cargo = Path::new(env!("CARGO"));
    let status = Command::new(cargo)
        .args(["check", "--quiet", "--offline", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .env("RUSTC", cargo.with_file_name("rustc"))
        .status()
        .unwrap();
    let took = started.elapsed();
    assert!(status.success(), "cargo check failed in {}", dir.display());
    took
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idem-compile-bench");
    let target = root.join("target");
    let card_form = write_crate(
        &root,
        "handlers_card",
        MACHINE,
        std::iter::once("impl Order {\n".to_owned())
            .chain((0..HANDLERS).map(card))
            .chain(std::iter::once("}\n".to_owned())),
    );
    let with_idem = write_crate(
        &root,
        "handlers_idem",
        MACHINE,
        (0..HANDLERS).map(annotated),
    );
    let by_hand = write_crate(
        &root,
        "handlers_by_hand",
        HAND_WRITTEN_PRELUDE,
        (0..HANDLERS).map(hand_written),
    );
    let crates = [
        (
            "`#[idempotent]`, the card's form (in `impl Order`)",
            card_form,
        ),
        ("`#[idempotent(machine = Order, …)]`", with_idem),
        ("hand-written handlers", by_hand),
    ];
    eprintln!("checking the dependencies once…");
    for (_, dir) in &crates {
        check(dir, &target);
    }

    let mut times = vec![Vec::new(); crates.len()];
    for round in 0..rounds {
        // Rotate which goes first, so drift hits all.
        for i in 0..crates.len() {
            let c = (round + i) % crates.len();
            times[c].push(check(&crates[c].1, &target));
        }
    }
    let medians: Vec<Duration> = times.iter().cloned().map(median).collect();
    println!(
        "`cargo check` of {HANDLERS} handlers, median of {rounds} (after touching the source):\n"
    );
    println!("| crate | median | all runs |");
    println!("|---|---:|---|");
    for (((name, _), median), runs) in crates.iter().zip(&medians).zip(&times) {
        let runs: Vec<String> = runs
            .iter()
            .map(|d| format!("{:.2}", d.as_secs_f64()))
            .collect();
        println!(
            "| {name} | {:.2} s | {} |",
            median.as_secs_f64(),
            runs.join(", ")
        );
    }
    let hand = medians[2].as_secs_f64();
    println!();
    for (name, median) in crates.iter().map(|c| c.0).zip(&medians).take(2) {
        println!(
            "{name} / hand-written: ratio {:.2}; {:+.1} ms per handler",
            median.as_secs_f64() / hand,
            (median.as_secs_f64() - hand) * 1000.0 / HANDLERS as f64
        );
    }
    println!(
        "card's form / `machine = Order`: ratio {:.2}",
        medians[0].as_secs_f64() / medians[1].as_secs_f64()
    );
}
