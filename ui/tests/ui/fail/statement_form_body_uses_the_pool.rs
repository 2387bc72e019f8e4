use idem::{StateMachine, idempotent};

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


// Without a transaction the body runs before any statement: it has no database.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(pool: &sqlx::SqlitePool, order_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
        .bind(order_id)
        .execute(pool)
        .await?;
    Ok(())
}

fn main() {}
