// Text keys, owned and borrowed.
#![allow(dead_code)]
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "reference")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[idempotent(machine = Order, key = "reference", from = "CREATED", to = "PAID")]
async fn pay_owned(tx: &mut Transaction<'_, Sqlite>, reference: String) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1")
        .bind(&reference)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(machine = Order, key = "reference", from = "CREATED", to = "PAID")]
async fn pay_borrowed(
    tx: &mut Transaction<'_, Sqlite>,
    reference: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT $1")
        .bind(reference)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn call(pool: &sqlx::SqlitePool) {
    let reference = String::from("order-7");
    let _ = pay_borrowed(pool, &reference).await;
    let _ = pay_owned(pool, reference).await;
}

fn main() {}
