// The card's form: handlers as associated functions of the machine need no `machine = …`
// (`Self` is the machine), with every form of the attribute; a method of another type
// still names its machine.
use idem::{StateMachine, idempotent, inbox::Inbox, inbox::MessageKey};
use sqlx::{Sqlite, SqlitePool, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
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

impl Order {
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    pub async fn pay(
        tx: &mut Transaction<'_, Sqlite>,
        order_id: i64,
        amount: i64,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query("INSERT INTO payments (order_id, amount) VALUES ($1, $2)")
            .bind(order_id)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
        // `Self` in the body is the machine, as in any associated function.
        let _: Self = Self::Paid;
        Ok(amount)
    }

    #[idempotent(key = "order_id", from = "PAID", to = "SHIPPED", version = "seen",
                 set(shipped_at = now(), carrier))]
    async fn ship(
        tx: &mut Transaction<'_, Sqlite>,
        order_id: i64,
        seen: Option<i64>,
        carrier: String,
    ) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }

    #[idempotent(key = "order_id", create = "CREATED", set(amount))]
    async fn open(pool: &SqlitePool, order_id: i64, amount: i64) -> Result<(), sqlx::Error> {
        Ok(())
    }

    #[idempotent(
        key = "order_id",
        from = "CREATED",
        to = "CANCELLED",
        inbox = "inbox",
        message = "message",
        payload = "payload"
    )]
    async fn cancel_on_message(
        tx: &mut Transaction<'_, Sqlite>,
        inbox: &Inbox,
        message: &MessageKey,
        payload: &[u8],
        order_id: i64,
    ) -> Result<(), sqlx::Error> {
        let _ = (tx, payload);
        Ok(())
    }

    #[idempotent(key = "order_id", from = "CREATED", to = "CANCELLED")]
    async fn cancel(pool: &SqlitePool, order_id: i64) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

struct Warehouse;

impl Warehouse {
    // Not the machine's impl: the machine is named.
    #[idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
    async fn ship(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        order_id: i64,
    ) -> Result<(), sqlx::Error> {
        let _ = tx;
        Ok(())
    }
}

#[allow(dead_code)]
async fn call(pool: &SqlitePool, inbox: &Inbox, message: &MessageKey) {
    let _: idem::Handled<Result<i64, sqlx::Error>, Order> = Order::pay(pool, 7, 1000).await;
    let _: idem::Handled<Result<(), sqlx::Error>, Order> =
        Order::ship(pool, 7, None, "DHL".into()).await;
    let _: idem::Created<Result<(), sqlx::Error>, Order> = Order::open(pool, 7, 1000).await;
    let _: idem::ConsumedTransition<Result<(), sqlx::Error>, Order> =
        Order::cancel_on_message(pool, inbox, message, b"{}", 7).await;
    let _: idem::Handled<Result<(), sqlx::Error>, Order> = Order::cancel(pool, 7).await;
    let _: idem::Handled<Result<(), sqlx::Error>, Order> = Warehouse.ship(pool, 7).await;
}

fn main() {}
