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

// An event that keeps the state (no declared edge needed), and one that moves it; in the
// transaction form and the one-statement form; an event version of any integer type.
#[idempotent(machine = Order, key = "order_id", from = "PAID", to = "PAID", watermark = "event")]
async fn note_payment(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: i64,
    event: u32,
) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED", watermark = "event", set(carrier))]
async fn ship(
    pool: &sqlx::SqlitePool,
    order_id: i64,
    event: &i64,
    carrier: String,
) -> Result<(), sqlx::Error> {
    Ok(())
}

#[allow(dead_code)]
async fn callers(pool: &sqlx::SqlitePool) {
    let noted: idem::Outcome<(), Order> = note_payment(pool, 1, 3).await.unwrap();
    let _ = matches!(
        noted,
        idem::Outcome::Superseded {
            version: 4,
            event: 3,
            ..
        }
    );
    let _ = ship(pool, 1, &4, "dhl".into()).await;
}

fn main() {}
