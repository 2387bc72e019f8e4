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

// No transaction, no key.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay() -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
