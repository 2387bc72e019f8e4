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


// A watermark is one guard of the version column: not with an expected version, not with
// an inbox (the version already tells a redelivered event), and it names a parameter.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID",
             version = "seen", watermark = "event")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64, seen: i64, event: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, seen, event);
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED", watermark = "evnt")]
async fn ship(tx: &mut Transaction<'_, Sqlite>, order_id: i64, event: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, event);
    Ok(())
}

#[idempotent(inbox = "inbox", message = "key", payload = "payload",
             machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED", watermark = "event")]
async fn cancel(
    tx: &mut Transaction<'_, Sqlite>,
    inbox: &idem::inbox::Inbox,
    key: &idem::inbox::MessageKey,
    payload: &[u8],
    order_id: i64,
    event: i64,
) -> Result<(), sqlx::Error> {
    let _ = (tx, inbox, key, payload, event);
    Ok(())
}

fn main() {}
