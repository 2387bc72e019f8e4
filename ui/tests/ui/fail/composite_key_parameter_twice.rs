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

// One parameter cannot hold two key columns.
#[idempotent(machine = TenantOrder, key = ("order_id", "order_id"), from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, tenant: &str, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, tenant);
    Ok(())
}

fn main() {}
