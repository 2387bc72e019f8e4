//! A body that panics is a failed call: the panic is caught where idem polls the body, so
//! that it rolls the call back and is answered as an error ([`Error::Panicked`]), instead
//! of unwinding through a consumer's loop, a batch or a relay.
//!
//! [`Error::Panicked`]: crate::Error::Panicked

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::task::Poll;

/// What a body panicked with: the panic's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panicked(pub(crate) String);

impl Panicked {
    fn of(panic: &(dyn Any + Send)) -> Panicked {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        Panicked(message)
    }

    /// The panic's message.
    pub(crate) fn message(&self) -> &str {
        &self.0
    }
}

/// `future`'s output, or what it panicked with. The future is not polled again after a
/// panic (it is dropped with the call); what it held (a transaction) rolls back.
pub(crate) async fn unwound<F: Future>(future: F) -> Result<F::Output, Panicked> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(Panicked::of(&*panic))),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_with_its_message() {
        assert_eq!(unwound(async { 7 }).await, Ok(7));
        let caught = unwound(async {
            tokio::task::yield_now().await;
            panic!("boom {}", 1)
        })
        .await;
        assert_eq!(caught, Err(Panicked("boom 1".to_owned())));
        let caught = unwound(async { std::panic::panic_any(3u8) }).await;
        assert_eq!(caught.unwrap_err().message(), "a panic without a message");
    }
}
