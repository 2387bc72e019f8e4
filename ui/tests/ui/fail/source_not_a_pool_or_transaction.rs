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

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

// A handler takes a pool or a transaction, not a bare connection.
async fn caller(conn: &mut sqlx::SqliteConnection) {
    let _ = pay(conn, 7).await;
}

fn main() {}
