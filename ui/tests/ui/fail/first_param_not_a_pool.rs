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


// A shared reference first is taken for a pool; this one is not.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(amount: &i64, order_id: i64) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
