// Two states stored under the same name could not be told apart in the database.
use idem::StateMachine;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "CREATED")]
    Paid,
}

fn main() {}
