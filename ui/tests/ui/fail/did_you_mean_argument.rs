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

// An unknown argument close to a valid one: the message suggests it.
impl Order {
    #[idempotent(key = "order_id", form = "CREATED", to = "PAID")]
    async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }
}

fn main() {}
