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


// One value per column; and a column is an SQL identifier.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID",
             set(amount, amount = "cents", r#naïve = "cents"))]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64, amount: i64, cents: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, amount, cents);
    Ok(())
}

fn main() {}
