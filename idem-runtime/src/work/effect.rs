//! What identifies an effect, and the ids derived from it: a staged message's id, the
//! idempotency key of a call to an outside API.
//!
//! Every handler's body runs in a *call scope*, set by the unit of work around the body
//! (`Held::run`): the effect it belongs to and how many ids the body has derived so far
//! (the messages it staged). The ids are digests of the effect and never random, so a body
//! that runs again (after a rollback, a lost conflict at COMMIT, a crash, a redelivery that
//! finds no record) derives the same ones; a duplicate call derives none, because its body
//! does not run. The stages use it (the outbox's ids and default ordering key), and it
//! knows none of them.

use crate::value::hex::hex;
use crate::work::observe::Labels;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// The identity of one effect: the SHA-256 of what identifies the call that applies it,
/// each part length-prefixed so that no two calls share a digest —
///
/// `"idem/effect/1"`, the machine's id, the transition's source and target state names (a
/// creation's source is empty), the consumer group, and the key: the business key for a
/// transition or a creation (also under an inbox), the message key for an inbox handler,
/// the scoped key record for an HTTP request.
///
/// A transition is applied at most once per key (the machine's graph has no cycles), a
/// message processed once per group, a key record answered once: so one effect has one
/// key, whichever process, attempt or redelivery computes it.
///
/// [`current`](Self::current) is the key of the handler whose body is running;
/// [`derive`](Self::derive) makes the idempotency key of a call to an outside API from it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EffectKey([u8; 32]);

impl EffectKey {
    /// The key of the effect whose handler body is running on this task, if one is: inside
    /// the body of an `#[idempotent]` handler, of [`idem::run`](crate::run), of
    /// [`Inbox::process`](crate::inbox::Inbox::process), of a route behind the HTTP layer.
    /// `None` elsewhere.
    pub fn current() -> Option<EffectKey> {
        CALL.try_with(|call| call.as_ref().map(|c| c.effect()))
            .ok()
            .flatten()
    }

    /// An effect key of your own, for code that stages messages outside a handler: the
    /// digest of `parts` (length-prefixed, after `"idem/effect/user/1"`), so the same parts
    /// always make the same key.
    pub fn of(parts: &[&str]) -> EffectKey {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/effect/user/1");
        for p in parts {
            part(&mut digest, p.as_bytes());
        }
        EffectKey(digest.finalize().into())
    }

    /// A stable idempotency key for a call this effect makes outside the database (a
    /// payment provider's `Idempotency-Key`): the hex SHA-256 of the effect and `purpose`
    /// (64 characters). The same effect and purpose give the same key on every attempt,
    /// takeover and redelivery; different purposes, different keys.
    pub fn derive(&self, purpose: &str) -> String {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/derived/1");
        part(&mut digest, &self.0);
        part(&mut digest, purpose.as_bytes());
        hex(&digest.finalize())
    }

    /// The id of the message staged `position`-th (from 0) by this effect's body: the hex
    /// SHA-256 of `"idem/message/1"`, the effect and the position (64 characters).
    pub fn message_id(&self, position: u32) -> String {
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/message/1");
        part(&mut digest, &self.0);
        part(&mut digest, &position.to_be_bytes());
        hex(&digest.finalize())
    }

    /// The digest, as hex (64 characters).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The effect of the message `key` of consumer group `group`.
    pub(crate) fn of_message(group: &str, key: &str) -> EffectKey {
        EffectKey::of_labels(&Labels {
            group: Some(group),
            key: Some(key),
            ..Labels::default()
        })
    }

    fn of_labels(labels: &Labels<'_>) -> EffectKey {
        let (from, to) = labels.transition.unwrap_or(("", ""));
        let mut digest = Sha256::new();
        part(&mut digest, b"idem/effect/1");
        for p in [
            labels.machine.unwrap_or(""),
            from,
            to,
            labels.group.unwrap_or(""),
            labels.key.unwrap_or(""),
        ] {
            part(&mut digest, p.as_bytes());
        }
        EffectKey(digest.finalize().into())
    }
}

impl fmt::Debug for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EffectKey({})", self.to_hex())
    }
}

impl fmt::Display for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// One part of a digest: its length (8 bytes, big-endian), then its bytes.
fn part(digest: &mut Sha256, bytes: &[u8]) {
    digest.update((bytes.len() as u64).to_be_bytes());
    digest.update(bytes);
}

/// The call a handler's body runs for: what identifies it, and how many ids it has
/// derived in order (the messages it staged). Every call makes one, most never derive
/// any: the digest and the qualified key are computed on first use.
#[derive(Debug)]
pub(crate) struct CallScope {
    machine: Option<&'static str>,
    transition: Option<(&'static str, &'static str)>,
    group: Option<String>,
    key: String,
    effect: OnceLock<EffectKey>,
    qualified: OnceLock<String>,
    derived: AtomicU32,
}

impl CallScope {
    /// The scope of a call about `labels`; `None` for a call with no key (nothing to derive
    /// from).
    pub(crate) fn of(labels: &Labels<'_>) -> Option<Arc<CallScope>> {
        Some(Arc::new(CallScope {
            machine: labels.machine,
            transition: labels.transition,
            group: labels.group.map(str::to_owned),
            key: labels.key?.to_owned(),
            effect: OnceLock::new(),
            qualified: OnceLock::new(),
            derived: AtomicU32::new(0),
        }))
    }

    fn labels(&self) -> Labels<'_> {
        Labels {
            machine: self.machine,
            transition: self.transition,
            group: self.group.as_deref(),
            key: Some(&self.key),
        }
    }

    /// The effect's key.
    pub(crate) fn effect(&self) -> EffectKey {
        *self
            .effect
            .get_or_init(|| EffectKey::of_labels(&self.labels()))
    }

    /// The call's key, qualified by what it is a key of: `machine/key` for a transition or
    /// a creation, `group/key` for an inbox handler or an HTTP request, the key alone
    /// otherwise.
    pub(crate) fn qualified_key(&self) -> &str {
        self.qualified.get_or_init(|| {
            let key = &self.key;
            match (self.machine, &self.group) {
                (Some(machine), _) => format!("{machine}/{key}"),
                (None, Some(group)) => format!("{group}/{key}"),
                (None, None) => key.clone(),
            }
        })
    }

    /// The position of the next id derived in the call, from 0.
    pub(crate) fn next_position(&self) -> u32 {
        self.derived.fetch_add(1, Ordering::Relaxed)
    }
}

tokio::task_local! {
    /// The call whose handler body is being polled on this task.
    static CALL: Option<Arc<CallScope>>;
}

/// Runs `body` in the call scope `scope` (`None`: outside any, even inside another's body).
pub(crate) async fn within<F: Future>(scope: Option<Arc<CallScope>>, body: F) -> F::Output {
    CALL.scope(scope, body).await
}

/// The call scope of the body being polled, if any.
pub(crate) fn current() -> Option<Arc<CallScope>> {
    CALL.try_with(Clone::clone).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels<'a>(
        machine: Option<&'static str>,
        group: Option<&'a str>,
        key: &'a str,
    ) -> Labels<'a> {
        Labels {
            machine,
            transition: machine.map(|_| ("CREATED", "PAID")),
            group,
            key: Some(key),
        }
    }

    #[test]
    fn an_effect_has_one_key_and_each_part_counts() {
        let pay = CallScope::of(&labels(Some("order"), None, "7")).unwrap();
        let again = CallScope::of(&labels(Some("order"), None, "7")).unwrap();
        assert_eq!(pay.effect(), again.effect());
        assert_ne!(
            pay.effect(),
            CallScope::of(&labels(Some("order"), None, "8"))
                .unwrap()
                .effect()
        );
        assert_ne!(
            pay.effect(),
            CallScope::of(&labels(Some("order"), Some("billing"), "7"))
                .unwrap()
                .effect()
        );
        // Length prefixes: moving a byte from one part to the next is another effect.
        assert_ne!(EffectKey::of(&["ab", "c"]), EffectKey::of(&["a", "bc"]));
        assert_eq!(pay.qualified_key(), "order/7");
        assert_eq!(
            CallScope::of(&labels(None, Some("billing"), "m-1"))
                .unwrap()
                .qualified_key(),
            "billing/m-1"
        );
        assert!(CallScope::of(&Labels::default()).is_none());
    }

    #[test]
    fn ids_are_digests_of_the_effect_and_the_position() {
        let effect = EffectKey::of(&["order", "7"]);
        assert_eq!(effect.message_id(0), effect.message_id(0));
        assert_ne!(effect.message_id(0), effect.message_id(1));
        assert_eq!(effect.message_id(0).len(), 64);
        assert_ne!(effect.derive("charge"), effect.derive("refund"));
        assert_ne!(effect.derive("charge"), effect.message_id(0));
        // Pinned: the derivation is documented, and a change would re-send every message
        // staged before an upgrade under a new id.
        assert_eq!(
            EffectKey::of(&[]).to_hex(),
            hex(&Sha256::digest(
                [&18u64.to_be_bytes()[..], b"idem/effect/user/1"].concat()
            ))
        );
    }
}
