use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status", version = "version")]
enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

// Serializable but not deserializable: a duplicate could not get it back. One error, too.
#[derive(serde::Serialize)]
struct Receipt {
    payment_id: i64,
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<Receipt, sqlx::Error> {
    let _ = tx;
    Ok(Receipt { payment_id: 1 })
}

fn main() {}
