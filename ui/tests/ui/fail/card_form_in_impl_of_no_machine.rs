use idem::idempotent;
use sqlx::{Sqlite, Transaction};

struct Payments;

// Without `machine = …` the machine is the type of the handler's `impl`, and `Payments`
// is no state machine: name the machine, or derive it.
impl Payments {
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }
}

fn main() {}
