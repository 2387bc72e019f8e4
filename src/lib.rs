//! # idem — database handlers that are idempotent by construction
//!
//! Duplicates are the normal life of a distributed system: retries after a timeout,
//! at-least-once brokers, double clicks, a crash between commit and ack. idem turns a
//! handler annotated with `#[idempotent(key = "order_id", from = "CREATED", to = "PAID")]`
//! (the complete one is below) into one conditional `UPDATE` with a version guard, run in
//! the same transaction as the handler's body, and returns an [`Outcome`] that tells
//! **already done** (a duplicate: succeed quietly, replay the first result) from **illegal
//! state** (a bug: fail loudly), **not found** and **stale version**.
//!
//! ## A complete handler
//!
//! ```
//! use idem::{Outcome, StateMachine, idempotent};
//! use sqlx::{Sqlite, Transaction};
//!
//! /// The order workflow, declared once. Misuse at a handler is a compile error.
//! #[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
//! #[machine(table = "orders", key = "order_id", state = "status", version = "version")]
//! enum Order {
//!     #[state(name = "CREATED", to(Paid, Cancelled))]
//!     Created,
//!     #[state(name = "PAID", to(Shipped))]
//!     Paid,
//!     #[state(name = "SHIPPED")]
//!     Shipped,
//!     #[state(name = "CANCELLED")]
//!     Cancelled,
//! }
//!
//! #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
//! struct Receipt { payment_id: i64 }
//!
//! impl Order {
//!     /// Records the payment and moves the order CREATED → PAID, at most once per order.
//!     /// In the machine's `impl`, the machine is `Self`: no `machine = Order` needed.
//!     #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
//!     async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64, amount: i64)
//!         -> Result<Receipt, sqlx::Error>
//!     {
//!         let payment_id = sqlx::query_scalar(
//!             "INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id")
//!             .bind(order_id).bind(amount)
//!             .fetch_one(&mut **tx).await?;
//!         Ok(Receipt { payment_id })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect_with(idem::sqlite_options("sqlite::memory:")?).await?;
//! sqlx::raw_sql("CREATE TABLE orders (order_id INTEGER PRIMARY KEY, status TEXT NOT NULL,
//!                                     version INTEGER NOT NULL DEFAULT 0);
//!                CREATE TABLE payments (id INTEGER PRIMARY KEY, order_id INTEGER, amount INTEGER);
//!                INSERT INTO orders (order_id, status) VALUES (7, 'CREATED');")
//!     .execute(&pool).await?;
//! idem::create_results_table::<Order, _>(&pool).await?;
//!
//! let first = Order::pay(&pool, 7, 1000).await?;   // the payment callback
//! let again = Order::pay(&pool, 7, 1000).await?;   // the provider retries it
//! assert_eq!(first, Outcome::Applied(Receipt { payment_id: 1 }));
//! assert_eq!(again, Outcome::AlreadyDone {
//!     current: Order::Paid,
//!     first_result: Some(Receipt { payment_id: 1 }),  // the first result, replayed
//! });
//! # Ok(()) }
//! ```
//!
//! Outside the machine's `impl` (a free function, a method of another type), the handler
//! names its machine: `#[idempotent(machine = Order, key = "order_id", …)]`.
//!
//! The handler keeps its name, visibility, attributes and parameters, except that the
//! transaction parameter becomes the pool the transaction comes from (`&Pool<Sqlite>`):
//! the handler begins, commits or rolls back its own transaction. Its return type becomes
//! [`Handled`]`<Result<Receipt, sqlx::Error>, Order>`, that is
//! `Result<Outcome<Receipt, Order>, idem::Error<sqlx::Error>>`, and its future is `Send`.
//!
//! ## What runs
//!
//! After `BEGIN` (`BEGIN IMMEDIATE` on SQLite), one conditional `UPDATE` and, only when it
//! matched nothing, a classifying `SELECT` that reads the row and the stored first result.
//! The exact text is on the machine's [`Definition::sql`], in the rustdoc the derive writes
//! on the enum, and in the guide's [SQL reference](guide::sql).
//!
//! ## The guide
//!
//! Everything else is in [`guide`], a page a topic: [transitions and keys](guide::transitions)
//! (columns set by the move, the one-statement form, watermarks, creations, your own
//! transaction), the [SQL reference](guide::sql), [message consumers](guide::inbox),
//! [HTTP APIs](guide::http), [the outbox](guide::outbox), [observability](guide::observability),
//! [bad data and schema checks](guide::schema), [testing your handlers](guide::testing), and
//! [what the tests prove](guide::proofs).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use idem_macros::{StateMachine, idempotent};

pub mod guide;
pub use idem_runtime::*;

#[doc(hidden)]
pub use idem_runtime::__private;

/// A declared transition of a machine, checked at compile time: an unknown state or an
/// undeclared transition stops the build with a message that lists what the machine
/// declares. For [`run`] and the other APIs that take a [`Transition`].
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// const PAY: idem::Transition = idem::transition!(Order, "CREATED" => "PAID");
/// assert_eq!((PAY.from_name(), PAY.to_name()), ("CREATED", "PAID"));
/// ```
///
/// ```compile_fail
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "id")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// // error: state machine `Order` declares no transition `PAID` -> `CREATED`; …
/// let back = idem::transition!(Order, "PAID" => "CREATED");
/// ```
#[macro_export]
macro_rules! transition {
    ($machine:ty, $from:expr => $to:expr $(,)?) => {{
        const TRANSITION: $crate::Transition =
            match $crate::Transition::try_new::<$machine>($from, $to) {
                ::core::result::Result::Ok(transition) => transition,
                ::core::result::Result::Err(message) => ::core::panic!("{}", message.as_str()),
            };
        TRANSITION
    }};
}
