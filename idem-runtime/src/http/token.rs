//! One-time form tokens: the server issues a token with each form, signed and with an
//! expiry; the form's submit carries it (a hidden field, or `Idempotency-Key`) and the
//! layer uses it as the request's idempotency key. The submit is consumed by the record's
//! insert into a unique key (one statement, no check-then-act): a double submit runs once,
//! and the second gets the first response. A token that is forged or expired is refused
//! before anything runs.
//!
//! Tokens are stateless (nothing is stored when one is issued): `v1.<expiry>.<nonce>.<mac>`,
//! the expiry in milliseconds since the epoch, a 128-bit nonce, and the HMAC-SHA256 of both
//! under your secret.

use crate::hex::hex;
use crate::inbox::{Clock, SystemClock};
use sha2::{Digest, Sha256};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Issues and checks one-time form tokens; give it to
/// [`IdempotencyLayer::form_tokens`](super::IdempotencyLayer::form_tokens).
///
/// ```
/// use std::time::Duration;
/// let tokens = idem::http::FormTokens::new(b"a secret of 32 bytes or more.....", Duration::from_secs(3600));
/// let token = tokens.issue();
/// // <input type="hidden" name="idem_token" value="{token}">
/// assert!(token.starts_with("v1."));
/// assert!(tokens.check(&token).is_ok());
/// ```
#[derive(Clone)]
pub struct FormTokens {
    secret: Arc<[u8]>,
    ttl: Duration,
    field: String,
    clock: Arc<dyn Clock>,
}

impl core::fmt::Debug for FormTokens {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FormTokens")
            .field("ttl", &self.ttl)
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

/// Why a form token was refused (a 400, nothing runs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenProblem {
    /// Not a token this server issues.
    Malformed,
    /// Its signature does not match: not issued with this secret, or altered.
    Forged,
    /// Issued, but its time ran out: reload the form.
    Expired,
}

impl core::fmt::Display for TokenProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TokenProblem::Malformed => "the form token is not one this server issues",
            TokenProblem::Forged => "the form token's signature does not match",
            TokenProblem::Expired => {
                "the form token has expired: reload the form and submit it again"
            }
        })
    }
}

impl std::error::Error for TokenProblem {}

impl FormTokens {
    /// Tokens signed with `secret` (keep it secret and the same on every instance; 32
    /// random bytes or more), valid for `ttl` after they are issued. Keep `ttl` within the
    /// layer's retention, so that a token is refused as expired before its record could be
    /// purged and the form run again.
    pub fn new(secret: impl AsRef<[u8]>, ttl: Duration) -> Self {
        FormTokens {
            secret: Arc::from(secret.as_ref()),
            ttl,
            field: "idem_token".to_owned(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The form field that carries the token (by default `idem_token`), in an
    /// `application/x-www-form-urlencoded` body.
    pub fn field(mut self, name: impl Into<String>) -> Self {
        self.field = name.into();
        self
    }

    /// Where expiries are read (the system clock by default).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The name of the field that carries the token.
    pub fn field_name(&self) -> &str {
        &self.field
    }

    /// A new token, valid for the ttl from now.
    pub fn issue(&self) -> String {
        let expiry = self
            .clock
            .now_millis()
            .saturating_add(i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX));
        let nonce = nonce();
        let body = format!("v1.{expiry}.{nonce}");
        let mac = hex(&hmac(&self.secret, body.as_bytes()));
        format!("{body}.{mac}")
    }

    /// Whether `token` was issued with this secret and has not expired.
    pub fn check(&self, token: &str) -> Result<(), TokenProblem> {
        let (body, mac) = token.rsplit_once('.').ok_or(TokenProblem::Malformed)?;
        let mut parts = body.split('.');
        let (Some("v1"), Some(expiry), Some(nonce), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenProblem::Malformed);
        };
        let expiry: i64 = expiry.parse().map_err(|_| TokenProblem::Malformed)?;
        if nonce.len() != 32 || mac.len() != 64 {
            return Err(TokenProblem::Malformed);
        }
        let expected = hex(&hmac(&self.secret, body.as_bytes()));
        if !constant_time_eq(expected.as_bytes(), mac.as_bytes()) {
            return Err(TokenProblem::Forged);
        }
        if self.clock.now_millis() >= expiry {
            return Err(TokenProblem::Expired);
        }
        Ok(())
    }
}

/// 128 bits, unique in the process (a counter) and unpredictable across processes
/// (hashed with the standard library's randomly keyed hasher).
fn nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hash = Sha256::new();
    for _ in 0..2 {
        let mut keyed = std::collections::hash_map::RandomState::new().build_hasher();
        keyed.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hash.update(keyed.finish().to_be_bytes());
    }
    hash.update(std::process::id().to_be_bytes());
    hex(&hash.finalize()[..16])
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of the form field `name` in an `application/x-www-form-urlencoded` body.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(key)? == name).then(|| decode(value)).flatten()
    })
}

/// Percent-decoding, with `+` as a space.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::ManualClock;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = hmac(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_are_unique_signed_and_expire() {
        let clock = ManualClock::new(1_000_000);
        let tokens = FormTokens::new(b"secret", Duration::from_secs(60)).clock(clock.clone());
        let (a, b) = (tokens.issue(), tokens.issue());
        assert_ne!(a, b);
        assert!(a.len() <= 255);
        assert_eq!(tokens.check(&a), Ok(()));
        let other =
            FormTokens::new(b"another secret", Duration::from_secs(60)).clock(clock.clone());
        assert_eq!(other.check(&a), Err(TokenProblem::Forged));
        let altered = a.replacen("v1.1060000", "v1.9060000", 1);
        assert_eq!(tokens.check(&altered), Err(TokenProblem::Forged));
        assert_eq!(tokens.check("hello"), Err(TokenProblem::Malformed));
        assert_eq!(tokens.check("v1.x.y.z"), Err(TokenProblem::Malformed));
        clock.advance(Duration::from_secs(60));
        assert_eq!(tokens.check(&a), Err(TokenProblem::Expired));
    }

    #[test]
    fn the_token_is_read_from_a_form_body() {
        let body = b"amount=10&idem_token=v1.5.ab%2Ecd&note=a+b";
        assert_eq!(
            form_field(body, "idem_token").as_deref(),
            Some("v1.5.ab.cd")
        );
        assert_eq!(form_field(body, "note").as_deref(), Some("a b"));
        assert_eq!(form_field(body, "missing"), None);
        assert_eq!(form_field(b"idem_token=%zz", "idem_token"), None);
    }
}
