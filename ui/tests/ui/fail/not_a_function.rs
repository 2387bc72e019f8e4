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

// The attribute on something that is not a function.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
struct Pay {
    order_id: i64,
}

fn main() {}
