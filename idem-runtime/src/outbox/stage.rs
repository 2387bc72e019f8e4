//! Staging: a message written into `idem_outbox` in the transaction of its effect.

use super::message::Due;
use super::{MAX_ORDERING_KEY_LEN, Message, MessageId, OutboxError};
use crate::backend::{Backend, Param, insert_unless_taken};
use crate::value::hex::hex;
use crate::work::effect::{self, CallScope};
use sha2::{Digest, Sha256};
use sqlx::Transaction;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

/// Stages `message` in `tx`: it is published after `tx` commits, and never if `tx` rolls
/// back. Inside a handler's body its id is derived from the handler's effect and its
/// position among the messages the body stages ([`EffectKey`](super::EffectKey)), and its
/// ordering key is by default the handler's; outside one, give it an id
/// ([`Message::id`]). Staging an id that is in the outbox already does nothing and returns
/// the same id.
///
/// Fails with the database's error, or with [`sqlx::Error::Encode`] holding an
/// [`OutboxError`] for a message that cannot be staged (what is wrong with it; nothing is
/// written).
///
/// ```
/// use idem::outbox::{self, Message};
/// use sqlx::{Sqlite, Transaction};
///
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "order_id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// #[derive(serde::Serialize)]
/// struct GrantCoupon { order_id: i64 }
///
/// impl Order {
///     #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
///     async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
///         // Committed with the order's move to PAID, or not at all.
///         outbox::stage(tx, Message::json("coupon.grant", &GrantCoupon { order_id })).await?;
///         Ok(())
///     }
/// }
/// # use idem::idempotent;
/// ```
pub async fn stage<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    message: Message,
) -> Result<MessageId, sqlx::Error> {
    let scope = effect::current();
    stage_in::<DB>(tx, scope.as_deref(), message).await
}

/// Stages `message` on `conn` (in a transaction) for the call `scope`, if any.
pub(crate) async fn stage_in<DB: Backend>(
    conn: &mut DB::Connection,
    scope: Option<&CallScope>,
    message: Message,
) -> Result<MessageId, sqlx::Error> {
    message.check()?;
    let id = match (&message.id, scope) {
        (Some(id), _) => id.clone(),
        (None, Some(scope)) => scope.effect().message_id(scope.next_position()),
        (None, None) => return Err(OutboxError::NoEffect.into()),
    };
    let ordering_key = match (&message.ordering_key, scope) {
        (Some(key), _) => Cow::Borrowed(key.as_str()),
        (None, Some(scope)) => default_ordering_key(scope),
        // Its own key: ordered with nothing else.
        (None, None) => Cow::Borrowed(id.as_str()),
    };
    let headers = message.headers_json();
    let (at, after) = match message.due {
        Some(Due::At(at)) => (Param::Int(at), Param::Int(0)),
        Some(Due::After(after)) => (Param::Null, Param::Int(after)),
        None => (Param::Null, Param::Int(0)),
    };
    let params = [
        Param::Text(&id),
        Param::Text(&ordering_key),
        Param::Text(&message.destination.name),
        Param::Text(&message.destination.routing_key),
        Param::Bytes(&message.payload),
        Param::Text(&headers),
        at,
        after,
    ];
    let dialect = DB::dialect(conn)?;
    let sql = dialect.outbox();
    if NOTIFY.load(Ordering::Relaxed) && sql.insert_returns_row {
        DB::fetch(conn, &sql.insert, &params).await?;
    } else {
        insert_unless_taken::<DB>(conn, dialect, &sql.insert_quiet, &params).await?;
    }
    Ok(MessageId(id))
}

/// Cancels the staged message `id` in `tx` (a later transaction than its staging): `true`
/// if it was not published yet, and now never will be; `false` if it was published
/// already, is being published (a relay holds it: on PostgreSQL and MySQL this waits for
/// that relay, then finds it published), or was never staged. It commits or rolls back with
/// `tx`. For a delayed message that became moot — the payment came, the timeout needs not
/// fire — and, since a cancel can come too late, keep the consumer's side safe as well: a
/// transition refuses a timeout for an order already paid.
///
/// ```
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::outbox::{self, Message};
/// use std::time::Duration;
///
/// idem::migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// let timeout = Message::json("order.timeout", &7)
///     .id("order:7:timeout")
///     .deliver_after(Duration::from_secs(1800));
/// outbox::stage(&mut tx, timeout).await?;
/// tx.commit().await?;
///
/// // The payment came first: the timeout is moot.
/// let mut tx = pool.begin().await?;
/// assert!(outbox::cancel(&mut tx, "order:7:timeout").await?);
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn cancel<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    id: &str,
) -> Result<bool, sqlx::Error> {
    let conn: &mut DB::Connection = tx;
    let cancel = &DB::dialect(conn)?.outbox().cancel;
    Ok(DB::execute(conn, cancel, &[Param::Text(id)]).await? > 0)
}

static NOTIFY: AtomicBool = AtomicBool::new(true);

/// Whether staging on PostgreSQL notifies the channel `idem_outbox` (the default), which
/// wakes a listening relay at the commit. Process-wide. PostgreSQL queues notifications
/// under one lock taken at COMMIT, so transactions that stage commit one at a time: off,
/// concurrent stagers commit in parallel and relays find their messages by polling
/// ([`Relay::poll_interval`](super::Relay::poll_interval)). BENCHMARKS.md has both.
pub fn set_notify(on: bool) {
    NOTIFY.store(on, Ordering::Relaxed);
}

/// The ordering key of the messages a call stages by default: the call's qualified key
/// (`machine/key` for a transition or a creation, `group/key` for an inbox handler or an
/// HTTP request), or its digest (`sha256:…`) when longer than 255 bytes.
fn default_ordering_key(scope: &CallScope) -> Cow<'_, str> {
    let key = scope.qualified_key();
    if key.len() <= MAX_ORDERING_KEY_LEN {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("sha256:{}", hex(&Sha256::digest(key.as_bytes()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work::observe::Labels;

    #[test]
    fn the_default_ordering_key_is_the_calls_or_its_digest() {
        let scope = |key: &str| {
            CallScope::of(&Labels {
                machine: Some("order"),
                transition: Some(("CREATED", "PAID")),
                group: None,
                key: Some(key),
            })
            .unwrap()
        };
        assert_eq!(default_ordering_key(&scope("7")), "order/7");
        let long = scope(&"k".repeat(300));
        let key = default_ordering_key(&long);
        assert!(key.starts_with("sha256:"), "{key}");
        assert_eq!(key.len(), 7 + 64);
        assert_eq!(
            default_ordering_key(&long),
            key,
            "the same call, the same key"
        );
    }
}
