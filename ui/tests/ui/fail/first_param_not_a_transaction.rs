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

// The first parameter is the transaction the body runs in.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(order_id: i64, tx: &mut Transaction<'_, Sqlite>) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}
