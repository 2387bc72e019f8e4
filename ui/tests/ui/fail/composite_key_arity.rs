use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tenant_orders", key = ("tenant_id", "order_id"), state = "status")]
enum TenantOrder {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

// The machine is keyed by two columns; the handler names one parameter.
#[idempotent(machine = TenantOrder, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, tenant: &str, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, tenant);
    Ok(())
}

fn main() {}
