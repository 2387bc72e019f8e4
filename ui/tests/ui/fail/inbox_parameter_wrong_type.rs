use idem::idempotent;
use idem::inbox::MessageKey;
use sqlx::{Sqlite, Transaction};

// `inbox` must name an `&Inbox` (or anything that borrows as one), not a group name.
#[idempotent(inbox = "group", message = "key", payload = "body")]
async fn consume(tx: &mut Transaction<'_, Sqlite>, group: &str, key: &MessageKey, body: &[u8]) -> Result<(), sqlx::Error> {
    let _ = (tx, group, key, body);
    Ok(())
}

fn main() {}
