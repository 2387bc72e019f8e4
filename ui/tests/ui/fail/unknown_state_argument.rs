// A misspelled state argument: the message lists the valid ones.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", next(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

fn main() {}
