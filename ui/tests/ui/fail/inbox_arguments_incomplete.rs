use idem::idempotent;
use idem::inbox::Inbox;
use sqlx::{Sqlite, Transaction};

// `message` and `payload` are missing: an inbox handler names all three parameters.
#[idempotent(inbox = "inbox")]
async fn consume(tx: &mut Transaction<'_, Sqlite>, inbox: &Inbox, body: &[u8]) -> Result<(), sqlx::Error> {
    let _ = (tx, inbox, body);
    Ok(())
}

fn main() {}
