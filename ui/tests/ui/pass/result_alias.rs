// The return type may be any alias of `Result`.
#![allow(dead_code)]
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[derive(Debug)]
enum PayError {
    Declined,
    Database(sqlx::Error),
}

impl From<sqlx::Error> for PayError {
    fn from(e: sqlx::Error) -> Self {
        PayError::Database(e)
    }
}

type R<T> = Result<T, PayError>;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64, amount: i64) -> R<Receipt> {
    if amount <= 0 {
        return Err(PayError::Declined);
    }
    let payment_id: i64 = sqlx::query_scalar("SELECT $1")
        .bind(order_id)
        .fetch_one(&mut **tx)
        .await?;
    Ok(Receipt { payment_id })
}

async fn call(pool: &sqlx::SqlitePool) {
    let outcome: Result<idem::Outcome<Receipt, Order>, idem::Error<PayError>> =
        pay(pool, 7, 100).await;
    let _ = outcome;
}

fn main() {}
