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


use idem::inbox::{Inbox, MessageKey};

// A message handler's record commits with what its body writes: it needs a transaction.
#[idempotent(inbox = "inbox", message = "key", payload = "payload")]
async fn record(
    pool: &sqlx::SqlitePool,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {}
