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

// Key parameters are named by strings, as everywhere in the attribute.
#[idempotent(machine = TenantOrder, key = (tenant, order_id), from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, tenant: &str, order_id: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, tenant, order_id);
    Ok(())
}

fn main() {}
