// PAID -> REFUNDED -> PAID: a duplicate of an old transition could apply again.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID", to(Refunded))]
    Paid,
    #[state(name = "REFUNDED", to(Paid))]
    Refunded,
}

fn main() {}
