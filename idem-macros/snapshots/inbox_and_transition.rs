// Both stages in one unit of work: the inbox record and the transition.
impl Order {
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID",
                 inbox = "inbox", message = "key", payload = "payload")]
    async fn pay_on_message(
        tx: &mut Transaction<'_, Postgres>,
        inbox: &Inbox,
        key: &MessageKey,
        payload: &[u8],
        order_id: i64,
    ) -> Result<(), sqlx::Error> {
        let _ = (tx, payload);
        Ok(())
    }
}
