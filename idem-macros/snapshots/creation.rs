// A creation: the row is inserted in its initial state under its key.
impl PayOrder {
    #[idempotent(key = "out_trade_no", create = "CREATED", set(amount))]
    async fn open(
        tx: &mut Transaction<'_, Sqlite>,
        out_trade_no: String,
        amount: i64,
    ) -> Result<String, sqlx::Error> {
        let _ = tx;
        Ok(out_trade_no)
    }
}
