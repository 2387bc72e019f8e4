use idem::StateMachine;

// A composite key names each column once, and none of them is the version column.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tenant_orders", key = ("tenant_id", "tenant_id", "version"))]
enum TenantOrder {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

fn main() {}
