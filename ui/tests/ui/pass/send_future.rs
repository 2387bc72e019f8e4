// A pub handler's future is `Send`, so it can be spawned on a multi-threaded runtime.
// The future is built, never polled: no database is needed.
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", version = "version")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub payment_id: i64,
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    amount: i64,
) -> Result<Receipt, sqlx::Error> {
    let payment_id =
        sqlx::query_scalar("INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id")
            .bind(order_id)
            .bind(amount)
            .fetch_one(&mut **tx)
            .await?;
    Ok(Receipt { payment_id })
}

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
fn pay_is_send(pool: &sqlx::SqlitePool) {
    let future = pay(pool, 1, 2);
    assert_send(&future);
}

fn main() {}
