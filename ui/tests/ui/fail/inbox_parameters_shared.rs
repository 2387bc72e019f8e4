use idem::idempotent;
use idem::inbox::{Inbox, MessageKey};
use sqlx::{Sqlite, Transaction};

// The message key and the payload cannot be the same parameter; `body` is not a parameter.
#[idempotent(inbox = "inbox", message = "key", payload = "key")]
async fn consume(tx: &mut Transaction<'_, Sqlite>, inbox: &Inbox, key: &MessageKey) -> Result<(), sqlx::Error> {
    let _ = (tx, inbox, key);
    Ok(())
}

#[idempotent(inbox = "inbox", message = "key", payload = "body")]
async fn consume_more(tx: &mut Transaction<'_, Sqlite>, inbox: &Inbox, key: &MessageKey) -> Result<(), sqlx::Error> {
    let _ = (tx, inbox, key);
    Ok(())
}

fn main() {}
