//! What "the same request" means: the SHA-256 of the method, the path and query as the client
//! sent them (axum's `OriginalUri` where a router left one: `Router::nest` strips its prefix
//! from the URI the layer sees), the headers the layer is told to compare, and the body's
//! bytes exactly as sent (no JSON canonicalization: a client retries by resending the same
//! bytes). Each part is length-prefixed, so no two different requests hash alike by shifting
//! bytes between parts. The scope (principal) and the key are hashed apart, into the
//! record's key.

use crate::value::hex::hex;
use http::HeaderName;
use http::request::Parts;
use sha2::{Digest, Sha256};

/// The request's fingerprint, hex.
pub(crate) fn fingerprint(parts: &Parts, compared: &[HeaderName], body: &[u8]) -> String {
    let mut hash = Sha256::new();
    part(&mut hash, parts.method.as_str().as_bytes());
    // The path the client sent: behind `Router::nest`, the URI the layer sees has lost the
    // prefix (`/accounts/A` of `/accounts/A/transfers`), and axum keeps the original.
    let uri = match parts.extensions.get::<axum::extract::OriginalUri>() {
        Some(original) => &original.0,
        None => &parts.uri,
    };
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    part(&mut hash, target.as_bytes());
    for name in compared {
        part(&mut hash, name.as_str().as_bytes());
        let values = parts.headers.get_all(name);
        hash.update((values.iter().count() as u64).to_be_bytes());
        for value in values {
            part(&mut hash, value.as_bytes());
        }
    }
    part(&mut hash, body);
    hex(&hash.finalize())
}

/// The record's key: the digest of the scope (the principal, empty without one) and the
/// client's key, so keys are never stored as sent and one principal's key cannot name
/// another's record.
pub(crate) fn record_key(scope: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    part(&mut hash, b"idem-http-key");
    part(&mut hash, scope.as_bytes());
    part(&mut hash, key.as_bytes());
    hex(&hash.finalize())
}

fn part(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, content_type: &str) -> Parts {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(())
            .unwrap();
        request.into_parts().0
    }

    #[test]
    fn every_part_of_a_request_counts() {
        let ct = [HeaderName::from_static("content-type")];
        let base = fingerprint(&parts("POST", "/orders", "application/json"), &ct, b"{}");
        assert_eq!(
            base,
            fingerprint(&parts("POST", "/orders", "application/json"), &ct, b"{}")
        );
        for other in [
            fingerprint(&parts("PUT", "/orders", "application/json"), &ct, b"{}"),
            fingerprint(
                &parts("POST", "/orders?x=1", "application/json"),
                &ct,
                b"{}",
            ),
            fingerprint(&parts("POST", "/orders", "text/plain"), &ct, b"{}"),
            fingerprint(&parts("POST", "/orders", "application/json"), &ct, b"{ }"),
        ] {
            assert_ne!(base, other);
        }
        // a header that is not compared does not count
        assert_eq!(
            fingerprint(&parts("POST", "/orders", "text/plain"), &[], b"{}"),
            fingerprint(&parts("POST", "/orders", "application/json"), &[], b"{}"),
        );
    }

    #[test]
    fn the_path_is_the_one_the_client_sent() {
        let ct = [HeaderName::from_static("content-type")];
        // Behind `Router::nest("/accounts/{id}", …)` both requests reach the layer as
        // `/transfers`, with the client's path kept as axum's `OriginalUri`.
        let nested = |original: &str| {
            let mut parts = parts("POST", "/transfers", "application/json");
            parts
                .extensions
                .insert(axum::extract::OriginalUri(original.parse().unwrap()));
            fingerprint(&parts, &ct, b"{}")
        };
        assert_ne!(
            nested("/accounts/A/transfers"),
            nested("/accounts/B/transfers")
        );
        assert_eq!(
            nested("/accounts/A/transfers"),
            fingerprint(
                &parts("POST", "/accounts/A/transfers", "application/json"),
                &ct,
                b"{}"
            ),
            "the same request as the un-nested route's"
        );
    }

    #[test]
    fn scopes_and_keys_do_not_run_together() {
        assert_ne!(record_key("ab", "c"), record_key("a", "bc"));
        assert_ne!(record_key("tenant-a", "k"), record_key("tenant-b", "k"));
        assert_eq!(record_key("", "k").len(), 64);
    }
}
