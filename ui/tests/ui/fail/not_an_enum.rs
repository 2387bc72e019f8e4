// The derive goes on an enum whose variants are the states.
use idem::StateMachine;

#[derive(StateMachine)]
#[machine(table = "orders", key = "order_id")]
struct Order {
    status: String,
}

fn main() {}
