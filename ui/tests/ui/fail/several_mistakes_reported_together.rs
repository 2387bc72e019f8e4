// One build reports every mistake of a declaration, each on its token, not only the first.
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders; drop", key = "order_id", colour = "red")]
enum Order {
    #[state(name = "CREATED", to(Payed, Created))]
    Created,
    #[state(name = "CREATED")]
    Paid,
    #[state(name = "ARCHIVED")]
    Archived,
}

// And every mistake of a handler site, too.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "invoices", key = "invoice_id")]
enum Invoice {
    #[state(name = "OPEN", to(Paid))]
    Open,
    #[state(name = "PAID")]
    Paid,
}

#[idempotent(machine = Invoice, key = "id", from = "PAID", to = "PAID", retries = 3)]
fn pay(tx: &mut Transaction<'_, Sqlite>, invoice_id: i64) {
    let _ = tx;
}

// And the unknown states of a handler whose arguments parse.
#[idempotent(machine = Invoice, key = "invoice_id", from = "OPN", to = "PAYED")]
async fn settle(tx: &mut Transaction<'_, Sqlite>, invoice_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}
