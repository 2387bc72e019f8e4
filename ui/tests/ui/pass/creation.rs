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

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Receipt {
    amount: i64,
}

// A creation under a text key, with columns, returning a stored result.
#[idempotent(machine = Order, key = "order_id", create = "CREATED", set(amount, created_at = now()))]
async fn create(
    tx: &mut Transaction<'_, Sqlite>,
    order_id: &str,
    amount: i64,
) -> Result<Receipt, sqlx::Error> {
    let _ = tx;
    Ok(Receipt { amount })
}

// Without a transaction: the body first, then one statement.
#[idempotent(machine = Order, key = "order_id", create = "CREATED", set(amount))]
async fn open(pool: &sqlx::PgPool, order_id: i64, amount: i64) -> Result<(), String> {
    if amount < 0 {
        return Err("negative".into());
    }
    Ok(())
}

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
async fn callers(pool: &sqlx::SqlitePool, pg: &sqlx::PgPool) {
    let opened: idem::Creation<(), Order> = open(pg, 1, 5).await.unwrap();
    let _ = opened.is_created();
    let creating = create(pool, "T-1", 5);
    assert_send(&creating);
    match creating.await.unwrap() {
        idem::Creation::Created(receipt) => assert_eq!(receipt.amount, 5),
        idem::Creation::Duplicate {
            current,
            first_result,
        } => {
            let _ = (current, first_result);
        }
        idem::Creation::Conflict { current } => {
            let _: Order = current;
        }
    }
}

fn main() {}
