// `to(...)` names a variant that does not exist: the message lists the variants.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Payed))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

fn main() {}
