// A handler can be a method: `&self` stays the receiver, the transaction is the first
// parameter after it, and the body can use `self`.
use idem::{StateMachine, idempotent};
use sqlx::{Sqlite, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

struct Payments {
    currency: String,
}

impl Payments {
    #[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
    async fn pay(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        order_id: i64,
        amount: i64,
    ) -> Result<String, sqlx::Error> {
        sqlx::query("INSERT INTO payments (order_id, amount, currency) VALUES ($1, $2, $3)")
            .bind(order_id)
            .bind(amount)
            .bind(&self.currency)
            .execute(&mut **tx)
            .await?;
        Ok(format!("{amount} {}", self.currency))
    }
}

#[allow(dead_code)]
async fn call(payments: &Payments, pool: &sqlx::SqlitePool) {
    let _: idem::Handled<Result<String, sqlx::Error>, Order> = payments.pay(pool, 7, 100).await;
}

fn main() {
    let _ = Payments {
        currency: "EUR".into(),
    };
}
