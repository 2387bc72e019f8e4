// `Archived` is in no `to(...)` list and lists none.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
    #[state(name = "ARCHIVED")]
    Archived,
}

fn main() {}
