//! The console's actions: POSTs checked by the guard (read-only, another site, the
//! person's token), run through idem's own functions as the person acting, then redirected
//! back to their page with a note of what was done.

use super::Shared;
use super::guard::{Actor, note_signature, refusal, refused};
use super::pages::{Looked, base};
use crate::backend::Backend;
use crate::http::token::form_field;
use crate::inbox::{Inbox, MessageKey};
use crate::outbox;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{OriginalUri, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};

/// The most dead messages an action on a group reads.
const MAX_GROUP: u32 = 100_000;

/// Back to `page`, with `note` to show there, signed.
fn back(secret: &[u8], looked_base: &str, page: &str, note: &str) -> Response {
    let location = format!(
        "{looked_base}{page}?note={}&sig={}",
        encode(note),
        note_signature(secret, note)
    );
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// Percent-encoding of a query value: everything but the unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The guard's 403, if the form in `body` may not act.
fn guarded<DB: Backend>(
    shared: &Shared<DB>,
    headers: &HeaderMap,
    actor: &Actor,
    body: &[u8],
) -> Option<Response> {
    let token = form_field(body, "csrf");
    refusal(shared, headers, actor, token.as_deref()).map(|why| refused(StatusCode::FORBIDDEN, why))
}

fn database(e: impl std::fmt::Display) -> Response {
    refused(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("the database refused: {e}"),
    )
}

/// `POST /outbox`: `action` (`requeue`, `discard`) on the dead message `id`, or on every
/// dead message whose last error is `error`.
pub(crate) async fn outbox<DB: Backend>(
    (State(shared), Extension(actor), OriginalUri(original), uri): Looked<DB>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = guarded(&shared, &headers, &actor, &body) {
        return refused;
    }
    let field = |name: &str| form_field(&body, name);
    let pool = &shared.pool;
    let ids: Vec<String> = match (field("id"), field("error")) {
        (Some(id), _) => vec![id],
        (None, Some(error)) => match outbox::dead_by_error(pool, MAX_GROUP).await {
            Ok(groups) => groups
                .into_iter()
                .filter(|group| group.error == error)
                .flat_map(|group| group.messages.into_iter().map(|m| m.id))
                .collect(),
            Err(e) => return database(e),
        },
        (None, None) => return refused(StatusCode::BAD_REQUEST, "name a message or an error"),
    };
    let action = field("action");
    let mut done = 0;
    for id in &ids {
        let changed = match action.as_deref() {
            Some("requeue") => outbox::requeue_by(pool, id, &actor.0).await,
            Some("discard") => {
                let discarded = outbox::discard(pool, id).await;
                if let Ok(true) = discarded {
                    tracing::info!(id = %id, by = %actor.0, "idem outbox message discarded");
                }
                discarded
            }
            _ => return refused(StatusCode::BAD_REQUEST, "unknown action"),
        };
        match changed {
            Ok(true) => done += 1,
            Ok(false) => {}
            Err(e) => return database(e),
        }
    }
    let verb = if action.as_deref() == Some("requeue") {
        "requeued"
    } else {
        "discarded"
    };
    let mut note = format!("{} {verb} {done} dead message(s)", actor.0);
    if done < ids.len() {
        note.push_str(&format!(
            "; {} were no longer dead (requeued or discarded meanwhile)",
            ids.len() - done
        ));
    }
    back(&shared.secret, &base(&original, &uri), "/outbox", &note)
}

/// `POST /inbox`: `action` (`release`, `revive`) on the record of `group` and `key`.
pub(crate) async fn inbox<DB: Backend>(
    (State(shared), Extension(actor), OriginalUri(original), uri): Looked<DB>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = guarded(&shared, &headers, &actor, &body) {
        return refused;
    }
    let field = |name: &str| form_field(&body, name);
    let (Some(group), Some(key)) = (field("group"), field("key")) else {
        return refused(StatusCode::BAD_REQUEST, "name a group and a key");
    };
    let (Ok(inbox), Ok(message)) = (Inbox::new(group.as_str()), MessageKey::new(key.as_str()))
    else {
        return refused(StatusCode::BAD_REQUEST, "not a group or key idem records");
    };
    let pool = &shared.pool;
    let (changed, verb, needs) = match field("action").as_deref() {
        Some("release") => (
            inbox.release(pool, &message, &actor.0).await,
            "released the lease of",
            "PROCESSING",
        ),
        Some("revive") => (
            inbox.revive(pool, &message, &actor.0).await,
            "revived",
            "DEAD",
        ),
        _ => return refused(StatusCode::BAD_REQUEST, "unknown action"),
    };
    let note = match changed {
        Ok(true) => format!("{} {verb} `{key}` in `{group}`", actor.0),
        Ok(false) => format!("`{key}` in `{group}` is no longer {needs}: nothing changed"),
        Err(e) => return database(e),
    };
    back(&shared.secret, &base(&original, &uri), "/inbox", &note)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_is_encoded_for_the_query() {
        assert_eq!(super::encode("a b&c=`d`"), "a%20b%26c%3D%60d%60");
    }
}
