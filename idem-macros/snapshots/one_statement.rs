// A pool instead of a transaction: the body runs first, then one statement.
impl Order {
    #[idempotent(key = "order_id", from = "CREATED", to = "CANCELLED")]
    async fn cancel(pool: &PgPool, order_id: i64) -> Result<(), sqlx::Error> {
        Ok(())
    }
}
