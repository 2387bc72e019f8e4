// The machine's declaration is wrong; its handlers should not drown that error in
// follow-on errors about their states.
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders; drop", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn main() {}
