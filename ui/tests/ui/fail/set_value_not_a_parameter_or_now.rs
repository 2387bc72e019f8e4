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


// A column is set from a parameter (its name, as a string) or the database's clock.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID",
             set(paid_at = today()))]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED",
             set(carrier = carrier))]
async fn ship(tx: &mut Transaction<'_, Sqlite>, order_id: i64, carrier: String) -> Result<(), sqlx::Error> {
    let _ = (tx, carrier);
    Ok(())
}

fn main() {}
