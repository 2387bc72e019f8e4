// A state name is stored with every first result: longer than the results table's
// `from_state` and `to_state` columns (64 bytes), it would not fit them.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(to(Paid))]
    Created,
    #[state(name = "PAID_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")]
    Paid,
}

fn main() {}
