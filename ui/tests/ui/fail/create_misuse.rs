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


// A creation makes the row in an initial state: no `from`/`to`, not a state the machine
// reaches by a transition.
#[idempotent(machine = Order, key = "order_id", create = "CREATED", from = "CREATED")]
async fn open(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", create = "PAID")]
async fn paid(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}
