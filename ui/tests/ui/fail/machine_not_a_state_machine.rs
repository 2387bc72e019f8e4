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

// `machine` names a type without `#[derive(StateMachine)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Invoice {
    Open,
    Paid,
}

#[idempotent(machine = Invoice, key = "invoice_id", from = "OPEN", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, invoice_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}
