//! Whose keys a layer keeps, in its type: a layer is a tower `Layer` only once it says so,
//! so a layer that would put every caller in one scope by omission does not compile.

/// The scope of a layer's keys, chosen with
/// [`IdempotencyLayer::principal`](super::IdempotencyLayer::principal) ([`PerPrincipal`]) or
/// [`IdempotencyLayer::unscoped`](super::IdempotencyLayer::unscoped) ([`Shared`]).
/// Sealed: [`ScopeUnset`] does not implement it, which is the point.
#[diagnostic::on_unimplemented(
    message = "this `IdempotencyLayer` does not say whose keys it keeps",
    label = "the layer is applied here without `.principal(…)` or `.unscoped()`",
    note = "scope keys per caller with `.principal(|parts| …)` (its tenant, API key or user), so no caller is served another's response",
    note = "or share one scope across all callers, knowingly, with `.unscoped()`"
)]
pub trait KeyScope: sealed::Sealed {}

/// Keys scoped per principal ([`IdempotencyLayer::principal`](super::IdempotencyLayer::principal)).
#[derive(Debug, Clone, Copy)]
pub enum PerPrincipal {}

/// Keys shared across all callers ([`IdempotencyLayer::unscoped`](super::IdempotencyLayer::unscoped)).
#[derive(Debug, Clone, Copy)]
pub enum Shared {}

/// A layer fresh from [`IdempotencyLayer::new`](super::IdempotencyLayer::new): whose keys it
/// keeps is not said yet, and it cannot be applied until it is.
#[derive(Debug, Clone, Copy)]
pub enum ScopeUnset {}

impl KeyScope for PerPrincipal {}
impl KeyScope for Shared {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::PerPrincipal {}
    impl Sealed for super::Shared {}
    impl Sealed for super::ScopeUnset {}
}
