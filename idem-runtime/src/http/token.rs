//! One-time form tokens: the server issues a token with each form, signed and with an
//! expiry; the form's submit carries it (a hidden field, or `Idempotency-Key`) and the
//! layer uses it as the request's idempotency key. The submit is consumed by the record's
//! insert into a unique key (one statement, no check-then-act): a double submit runs once,
//! and the second gets the first response. A token that is forged or expired is refused
//! before anything runs.
//!
//! Tokens are stateless (nothing is stored when one is issued): `v1.<expiry>.<nonce>.<mac>`,
//! the expiry in milliseconds since the epoch, a 128-bit nonce from the operating system's
//! random generator, and the HMAC-SHA256 of both under your secret (RustCrypto's `hmac`),
//! in lowercase hex. A token is one exact string: the same token with its MAC in uppercase
//! is refused as forged, since it would be another idempotency key for the same form.

use crate::inbox::{Clock, SystemClock};
use crate::value::hex::hex;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;

/// The shortest secret [`FormTokens::new`] accepts: 32 bytes (HMAC-SHA256's output).
pub const MIN_SECRET_LEN: usize = 32;

/// Issues and checks one-time form tokens; give it to
/// [`IdempotencyLayer::form_tokens`](super::IdempotencyLayer::form_tokens).
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), idem::http::WeakSecret> {
/// let secret = b"read 32 random bytes or more from your configuration";
/// let tokens = idem::http::FormTokens::new(secret, Duration::from_secs(3600))?;
/// let token = tokens.issue();
/// // <input type="hidden" name="idem_token" value="{token}">
/// assert!(token.starts_with("v1."));
/// assert!(tokens.check(&token).is_ok());
/// # Ok(()) }
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

/// A form-token secret shorter than [`MIN_SECRET_LEN`] bytes, refused by
/// [`FormTokens::new`]: anyone who guesses it forges tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeakSecret {
    /// The secret's length, in bytes.
    pub len: usize,
}

impl core::fmt::Display for WeakSecret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "a form-token secret must be at least {MIN_SECRET_LEN} bytes, this one is {}: use {MIN_SECRET_LEN} random bytes or more, the same on every instance",
            self.len
        )
    }
}

impl std::error::Error for WeakSecret {}

impl FormTokens {
    /// Tokens signed with `secret` (keep it secret and the same on every instance), valid
    /// for `ttl` after they are issued. A secret shorter than [`MIN_SECRET_LEN`] (32 bytes)
    /// is refused. The layer refuses a `ttl` longer than its retention
    /// ([`IdempotencyLayer::form_tokens`](super::IdempotencyLayer::form_tokens)): a token
    /// must expire before its record can be purged, or a resubmit would run again.
    pub fn new(secret: impl AsRef<[u8]>, ttl: Duration) -> Result<Self, WeakSecret> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(WeakSecret { len: secret.len() });
        }
        Ok(FormTokens {
            secret: Arc::from(secret),
            ttl,
            field: "idem_token".to_owned(),
            clock: Arc::new(SystemClock),
        })
    }

    /// How long a token is valid after it is issued.
    pub fn ttl(&self) -> Duration {
        self.ttl
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
        let mac = hex(&mac_of(&self.secret, body.as_bytes()));
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
        let expected = hex(&mac_of(&self.secret, body.as_bytes()));
        if !constant_time_eq(expected.as_bytes(), mac.as_bytes()) {
            return Err(TokenProblem::Forged);
        }
        if self.clock.now_millis() >= expiry {
            return Err(TokenProblem::Expired);
        }
        Ok(())
    }
}

/// 128 bits from the operating system's random generator, hex.
fn nonce() -> String {
    let mut bytes = [0u8; 16];
    // The generator fails only where the operating system has none (or it is not seeded
    // yet, at early boot): no token can be issued safely then.
    getrandom::fill(&mut bytes).expect("the operating system's random generator failed");
    hex(&bytes)
}

/// HMAC-SHA256 (RFC 2104), RustCrypto's.
fn mac_of(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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
        let mac = mac_of(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    const SECRET: &[u8] = b"a secret of thirty-two bytes, no less";

    #[test]
    fn a_secret_shorter_than_32_bytes_is_refused() {
        let refused = FormTokens::new(b"secret", Duration::from_secs(60)).unwrap_err();
        assert_eq!(refused, WeakSecret { len: 6 });
        assert!(refused.to_string().contains("at least 32 bytes"));
        assert!(FormTokens::new([7u8; 31], Duration::from_secs(60)).is_err());
        assert!(FormTokens::new([7u8; 32], Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn tokens_are_unique_signed_and_expire() {
        let clock = ManualClock::new(1_000_000);
        let tokens = FormTokens::new(SECRET, Duration::from_secs(60))
            .unwrap()
            .clock(clock.clone());
        let (a, b) = (tokens.issue(), tokens.issue());
        assert_ne!(a, b);
        assert!(a.len() <= 255);
        assert_eq!(tokens.check(&a), Ok(()));
        let other = FormTokens::new(
            b"another secret of thirty-two bytes",
            Duration::from_secs(60),
        )
        .unwrap()
        .clock(clock.clone());
        assert_eq!(other.check(&a), Err(TokenProblem::Forged));
        let altered = a.replacen("v1.1060000", "v1.9060000", 1);
        assert_eq!(tokens.check(&altered), Err(TokenProblem::Forged));
        assert_eq!(tokens.check("hello"), Err(TokenProblem::Malformed));
        assert_eq!(tokens.check("v1.x.y.z"), Err(TokenProblem::Malformed));
        // Valid until the last millisecond before its expiry, expired at it.
        clock.advance(Duration::from_millis(59_999));
        assert_eq!(tokens.check(&a), Ok(()));
        clock.advance(Duration::from_millis(1));
        assert_eq!(tokens.check(&a), Err(TokenProblem::Expired));
    }

    #[test]
    fn a_token_is_one_exact_string() {
        let tokens = FormTokens::new(SECRET, Duration::from_secs(60)).unwrap();
        let token = tokens.issue();
        let (body, mac) = token.rsplit_once('.').unwrap();
        assert!(mac.bytes().any(|b| b.is_ascii_lowercase()), "{mac}");
        // The same MAC in uppercase would be another key for the same form: forged.
        let upper = format!("{body}.{}", mac.to_ascii_uppercase());
        assert_eq!(tokens.check(&upper), Err(TokenProblem::Forged));
        let nonce = body.rsplit('.').next().unwrap();
        let upper_nonce = token.replacen(nonce, &nonce.to_ascii_uppercase(), 1);
        if upper_nonce != token {
            assert_eq!(tokens.check(&upper_nonce), Err(TokenProblem::Forged));
        }
    }

    #[test]
    fn nonces_come_from_the_operating_system() {
        let nonces: std::collections::HashSet<String> = (0..1000).map(|_| nonce()).collect();
        assert_eq!(nonces.len(), 1000);
        assert!(nonces.iter().all(|n| n.len() == 32));
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
