// A message handler: the delivery is recorded in the inbox, in the body's transaction.
#[idempotent(inbox = "inbox", message = "key", payload = "payload")]
async fn record_payment(
    tx: &mut Transaction<'_, Postgres>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
) -> Result<i64, sqlx::Error> {
    let payment: Payment = serde_json::from_slice(payload).map_err(|e| sqlx::Error::Decode(e.into()))?;
    sqlx::query_scalar("INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id")
        .bind(payment.order_id)
        .bind(payment.amount)
        .fetch_one(&mut **tx)
        .await
}
