// An optional version guard: `Some(v)` guards, `None` does not.
#![allow(dead_code)]
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", version = "version")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", version = "expected")]
async fn pay(
    db: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    expected: Option<i64>,
) -> Result<(), sqlx::Error> {
    // The transaction parameter may have any name.
    let _ = (db, order_id, expected);
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", version = "expected")]
async fn pay_guarded(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    expected: i64,
) -> Result<(), sqlx::Error> {
    let _ = (tx, order_id, expected);
    Ok(())
}

async fn call(pool: &sqlx::SqlitePool) {
    let _ = pay(pool, 7, Some(3)).await;
    let _ = pay(pool, 7, None).await;
    let _ = pay_guarded(pool, 7, 3).await;
}

fn main() {}
