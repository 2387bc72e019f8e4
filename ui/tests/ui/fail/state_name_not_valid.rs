// State names are bound as parameters, but are still restricted to a safe charset.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID ")]
    Paid,
}

fn main() {}
