// The card's form: an associated function of the machine, which is then `Self`.
impl Order {
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    async fn pay(
        tx: &mut Transaction<'_, Sqlite>,
        order_id: i64,
        amount: i64,
    ) -> Result<Receipt, sqlx::Error> {
        let payment_id = sqlx::query_scalar(
            "INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(order_id)
        .bind(amount)
        .fetch_one(&mut **tx)
        .await?;
        Ok(Receipt { payment_id })
    }
}
