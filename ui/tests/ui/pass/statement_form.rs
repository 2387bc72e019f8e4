use idem::{StateMachine, idempotent};

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

type Db = sqlx::Pool<sqlx::Postgres>;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Receipt {
    amount: i64,
}

// The one-statement form on every spelling of a pool: `Pool<DB>`, sqlx's aliases, an alias
// of one's own; with `set`, a version guard and a stored result.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", set(amount))]
async fn pay(pool: &sqlx::SqlitePool, order_id: i64, amount: i64) -> Result<Receipt, sqlx::Error> {
    Ok(Receipt { amount })
}

#[idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED", version = "seen")]
async fn ship(db: &Db, order_id: i64, seen: Option<i64>) -> Result<(), std::convert::Infallible> {
    Ok(())
}

#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
async fn cancel(pool: &sqlx::Pool<sqlx::Any>, order_id: i64) -> Result<(), String> {
    Err("no".into())
}

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
async fn callers(lite: &sqlx::SqlitePool, pg: &sqlx::PgPool, any: &sqlx::AnyPool) {
    let paying = pay(lite, 1, 5);
    assert_send(&paying);
    let mut tx = pg.begin().await.unwrap();
    let _ = ship(&mut tx, 1, None).await;
    let _ = ship(pg, 1, Some(3)).await;
    let _ = cancel(any, 1).await;
}

fn main() {}
