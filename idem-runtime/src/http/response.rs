//! A response as the key record keeps it: status, the headers chosen to be replayed, and
//! the body (UTF-8 as text, anything else in base64), or no body when it was too large to
//! keep or streamed.

use axum_core::body::Body;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The stored form of a response (JSON in the key record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: StoredBody,
}

/// The stored body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StoredBody {
    /// UTF-8 text, as is.
    Text(String),
    /// Other bytes, base64.
    Base64(String),
    /// Not kept: larger than the layer keeps, or streamed. A replay has an empty body.
    Omitted,
}

impl StoredResponse {
    /// The response's status, the headers named in `replayed` (and only those), and its
    /// body if there is one to keep.
    pub(crate) fn of(
        parts: &http::response::Parts,
        replayed: &[HeaderName],
        body: Option<&Bytes>,
    ) -> Self {
        let headers = replayed
            .iter()
            .flat_map(|name| {
                parts.headers.get_all(name).iter().filter_map(move |value| {
                    value
                        .to_str()
                        .ok()
                        .map(|v| (name.as_str().to_owned(), v.to_owned()))
                })
            })
            .collect();
        let body = match body {
            None => StoredBody::Omitted,
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => StoredBody::Text(text.to_owned()),
                Err(_) => StoredBody::Base64(STANDARD.encode(bytes)),
            },
        };
        StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body,
        }
    }

    /// The response a repeat gets: the first status, headers and body, and
    /// `Idempotent-Replayed: true`. `None` if the stored form is damaged (not written by
    /// this layer).
    pub(crate) fn replay(&self) -> Option<Response<Body>> {
        let body = match &self.body {
            StoredBody::Text(text) => Body::from(text.clone()),
            StoredBody::Base64(encoded) => Body::from(STANDARD.decode(encoded).ok()?),
            StoredBody::Omitted => Body::empty(),
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            headers.append(name, HeaderValue::from_str(value).ok()?);
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Some(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_replays_as_it_was_kept() {
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::CREATED;
        parts
            .headers
            .insert("location", HeaderValue::from_static("/orders/7"));
        parts
            .headers
            .insert("set-cookie", HeaderValue::from_static("secret"));
        let names = [HeaderName::from_static("location")];
        let binary = Bytes::from_static(&[0xff, 0x00, 0x01]);
        for body in [Some(Bytes::from_static(b"{\"id\":7}")), Some(binary), None] {
            let stored = StoredResponse::of(&parts, &names, body.as_ref());
            let json = serde_json::to_string(&stored).unwrap();
            let back: StoredResponse = serde_json::from_str(&json).unwrap();
            assert_eq!(back, stored);
            let replay = back.replay().unwrap();
            assert_eq!(replay.status(), StatusCode::CREATED);
            assert_eq!(replay.headers()["location"], "/orders/7");
            assert!(
                replay.headers().get("set-cookie").is_none(),
                "only named headers replay"
            );
            assert_eq!(replay.headers()["idempotent-replayed"], "true");
        }
    }
}
