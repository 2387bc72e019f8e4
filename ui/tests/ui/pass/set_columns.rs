use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

/// A newtype bound as an integer.
struct Cents(i64);

impl idem::ToColumn for Cents {
    const TYPE: idem::ColumnType = idem::ColumnType::Int;
    fn to_column(&self) -> Result<idem::ColumnValue, idem::ColumnProblem> {
        Ok(idem::ColumnValue::Int(self.0))
    }
}

// Parameters of every bound kind, by reference and optional; the clock; a raw identifier;
// the key parameter bound again to another column.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID",
             set(paid_at = now(), amount, note, r#type = "kind", rate, flagged, blob, copy = "order_id"))]
async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    amount: Cents,
    note: Option<&str>,
    kind: &String,
    rate: f32,
    flagged: bool,
    blob: Vec<u8>,
) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
fn pay_is_send(pool: &sqlx::SqlitePool) {
    let kind = String::new();
    let future = pay(pool, 1, Cents(5), None, &kind, 1.0, true, vec![]);
    assert_send(&future);
}

fn main() {}
