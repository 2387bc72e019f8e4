// A free function names its machine; an expected version and columns the UPDATE also sets.
#[idempotent(machine = crate::orders::Order, key = "order_id", from = "PAID", to = "SHIPPED",
             version = "seen", set(shipped_at = now(), carrier = "carrier_name"))]
pub async fn ship(
    tx: &mut Transaction<'_, Postgres>,
    order_id: i64,
    seen: Option<i64>,
    carrier_name: String,
) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}
