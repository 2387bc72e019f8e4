// A state that transitions to itself makes no progress.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Created, Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

fn main() {}
