//! The console's guard: every request authorized by the user's function before anything is
//! read; every action checked against cross-site forgery; every response marked not to be
//! framed or cached.

use super::{Authorize, Shared};
use crate::backend::Backend;
use crate::http::token::constant_time_eq;
use crate::value::hex::hex;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderValue};
use sha2::Sha256;
use std::sync::Arc;

/// Who is acting, as the authorization function named them.
#[derive(Clone, Debug)]
pub(crate) struct Actor(pub(crate) String);

/// Authorizes the request (401 without a name), then marks the response.
pub(crate) async fn admit(authorize: Arc<Authorize>, request: Request, next: Next) -> Response {
    let (mut head, body) = request.into_parts();
    let mut response = match authorize(&head) {
        None => refused(StatusCode::UNAUTHORIZED, "not authorized"),
        Some(actor) => {
            head.extensions.insert(Actor(actor));
            next.run(Request::from_parts(head, body)).await
        }
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        // `same-origin`: a POST from the console carries its `Origin` (with `no-referrer`,
        // a browser sends `Origin: null`, which the guard refuses).
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A plain-text refusal.
pub(crate) fn refused(status: StatusCode, why: &str) -> Response {
    (status, why.to_owned()).into_response()
}

/// The token an action's form carries for `actor`: the HMAC-SHA256 of their name under the
/// console's secret, in hex.
pub(crate) fn token(secret: &[u8], actor: &str) -> String {
    signed(secret, b"token", actor)
}

/// The signature of the note an action leaves for its page (`?note=…&sig=…`), so that a link
/// from elsewhere cannot make the console say what it did not do.
pub(crate) fn note_signature(secret: &[u8], note: &str) -> String {
    signed(secret, b"note", note)
}

/// Whether `signature` is `note`'s (compared in constant time).
pub(crate) fn note_is_signed(secret: &[u8], note: &str, signature: &str) -> bool {
    constant_time_eq(
        signature.as_bytes(),
        note_signature(secret, note).as_bytes(),
    )
}

/// The HMAC-SHA256 of `text` for `purpose` under the console's secret, in hex.
fn signed(secret: &[u8], purpose: &[u8], text: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
    mac.update(b"idem-console\0");
    mac.update(purpose);
    mac.update(b"\0");
    mac.update(text.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// Why an action may not run, if it may not: in read-only mode, from another site, or
/// without `actor`'s token (compared in constant time). The caller answers 403 with it.
pub(crate) fn refusal<DB: Backend>(
    shared: &Shared<DB>,
    headers: &HeaderMap,
    actor: &Actor,
    token: Option<&str>,
) -> Option<&'static str> {
    if shared.read_only {
        return Some("the console is read-only");
    }
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if text(header::HeaderName::from_static("sec-fetch-site")) == Some("cross-site") {
        return Some("refused: a request from another site");
    }
    if let (Some(origin), Some(host)) = (text(header::ORIGIN), text(header::HOST)) {
        let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if authority != host {
            return Some("refused: a request from another origin");
        }
    }
    let Some(token) = token else {
        return Some("refused: the form carries no token; reload the page");
    };
    if !constant_time_eq(
        token.as_bytes(),
        self::token(&shared.secret, &actor.0).as_bytes(),
    ) {
        return Some("refused: the form's token is not yours; reload the page");
    }
    None
}
