//! Procedural macros of [idem](https://docs.rs/idem). Use them through the `idem` crate,
//! which documents them: `#[derive(idem::StateMachine)]` and `#[idem::idempotent]`.
//!
//! Each entry point calls an `*_inner` function over `proc_macro2` (parse → validate →
//! expand); every error is reported at once, on the token that is wrong.

#![forbid(unsafe_code)]

mod ctxt;
mod handler;
mod ident;
mod keys;
mod machine;
#[cfg(test)]
mod snapshots;
mod suggest;

use proc_macro::TokenStream;

/// Declares a state machine on an enum whose variants are its states.
///
/// ```
/// #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// #[machine(table = "orders", key = "order_id", state = "status", version = "version")]
/// enum Order {
///     #[state(name = "CREATED", to(Paid, Cancelled))]
///     Created,
///     #[state(name = "PAID", to(Shipped))]
///     Paid,
///     #[state(name = "SHIPPED")]
///     Shipped,
///     Cancelled, // stored as "CANCELLED"
/// }
///
/// use idem::Machine;
/// assert_eq!(Order::from_db("PAID"), Some(Order::Paid));
/// assert!(Order::IDEM_SQL.of(idem::Dialect::Postgres).transition.starts_with("WITH upd AS ("));
/// ```
///
/// `#[machine(...)]` on the enum:
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `table = "…"` | the table with one row per business key (`schema.table` allowed) | required |
/// | `key = "…"` | its key column; for a composite key, the columns in order: `key = ("tenant_id", "order_id")` | required |
/// | `state = "…"` | the column holding the state name | `"state"` |
/// | `version = "…"` | the integer column every transition increments | `"version"` |
/// | `results = "…"` | the table keeping first results | `"idem_results"` |
///
/// `#[state(...)]` on a variant: `name = "…"` (the database name; default: the variant in
/// `SCREAMING_SNAKE_CASE`) and `to(Variant, …)` (the legal transitions from this state).
///
/// Checked at compile time: names are plain SQL identifiers (they are quoted in the SQL,
/// so they are case-sensitive on PostgreSQL), state names are unique, targets exist, and
/// the transitions form no self-loop, no cycle and leave no state unconnected: idempotency
/// by state needs every transition to make progress.
///
/// Generates an `idem::Machine` impl and an associated constant `IDEM_SQL` whose rustdoc
/// shows every statement idem runs for the machine, per backend.
#[proc_macro_derive(StateMachine, attributes(machine, state))]
pub fn derive_state_machine(input: TokenStream) -> TokenStream {
    machine::derive_inner(input.into()).into()
}

/// Makes an `async fn` an idempotent state transition of a declared machine.
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "order_id", state = "status")]
/// # enum Order {
/// #     #[state(name = "CREATED", to(Paid))] Created,
/// #     #[state(name = "PAID", to(Shipped))] Paid,
/// #     #[state(name = "SHIPPED")] Shipped,
/// # }
/// use sqlx::{Sqlite, Transaction};
///
/// impl Order {
///     // An associated function of the machine: `Self` is the machine.
///     #[idem::idempotent(key = "order_id", from = "CREATED", to = "PAID")]
///     async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
///         sqlx::query("INSERT INTO payments (order_id) VALUES ($1)")
///             .bind(order_id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     }
/// }
///
/// // Anywhere else, the handler names its machine.
/// #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
/// async fn ship(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
///     let _ = (tx, order_id);
///     Ok(())
/// }
///
/// // The transaction parameter became the pool; the result, an outcome.
/// async fn caller(pool: &sqlx::SqlitePool) -> Result<(), idem::Error<sqlx::Error>> {
///     let outcome: idem::Outcome<(), Order> = Order::pay(pool, 7).await?;
///     assert!(outcome.is_done());
///     let _shipped = ship(pool, 7).await?;
///     Ok(())
/// }
/// ```
///
/// | argument | meaning |
/// |---|---|
/// | `machine = Path` | the `#[derive(StateMachine)]` enum; optional in `impl` of that enum, where the machine is `Self` |
/// | `key = "param"` | the parameter holding the row's key (`i64`, `i32`, `String`, `&str`, …); for a machine with a composite key, one parameter per key column, in the machine's order: `key = ("tenant", "order_id")` |
/// | `from = "STATE"` | the state the row must be in |
/// | `to = "STATE"` | the state it moves to; `from → to` must be declared |
/// | `version = "param"` | optional: a parameter (`i64` or `Option<i64>`) with the version the caller read; the transition then also requires `version = $n` |
/// | `watermark = "param"` | optional, instead of `version`: a parameter (any integer type) with the version an event of a stream carries; the transition requires `version < $n` and sets `version = $n`, an older event is `Outcome::Superseded`, the same one again `AlreadyDone` with its own first result; `from == to` is then allowed (an event that keeps the state) |
/// | `create = "STATE"` | instead of `from`, `to`, `version`, `watermark`: the handler creates the row in the initial state `STATE` under its key, with one `INSERT … ON CONFLICT (key) DO NOTHING`, and returns `idem::Creation` (`Created`, `Duplicate` with the first result, `Conflict` for the same key with other `set(…)` values) |
/// | `set(column = "param", column = now(), column, …)` | optional: columns the same UPDATE also sets, from a parameter (any `idem::ToColumn`: integers, floats, `bool`, text, bytes, `uuid::Uuid`, an `Option` of one for NULL), from the database's clock (`CURRENT_TIMESTAMP`), or, written alone, from the parameter of the column's name. Not the key, state or version column |
///
/// ```
/// # #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
/// # #[machine(table = "orders", key = "order_id", state = "status")]
/// # enum Order { #[state(name = "CREATED", to(Paid))] Created, #[state(name = "PAID")] Paid }
/// # use sqlx::{Sqlite, Transaction};
/// // UPDATE "orders"
/// // SET "status" = $3, "version" = "version" + 1, "paid_at" = CURRENT_TIMESTAMP, "amount" = $4
/// // WHERE "order_id" = $1 AND "status" = $2 AND "version" IS NOT NULL
/// #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID",
///                    set(paid_at = now(), amount = "amount_cents"))]
/// async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64, amount_cents: i64)
///     -> Result<(), sqlx::Error>
/// {
///     let _ = tx; // nothing else to write: the UPDATE did it all
///     Ok(())
/// }
/// ```
///
/// The first parameter must be the transaction, `&mut sqlx::Transaction<'_, DB>` with `DB`
/// one of `Sqlite`, `Postgres`, `Any`, or a pool, `&sqlx::Pool<DB>` (`&PgPool`, or any
/// alias of one): then the handler takes no transaction, its body runs first (it must not
/// need the database), and the transition and its stored result are one statement on
/// PostgreSQL. The function must be `async` and return `Result<T, E>` with
/// `T: Serialize + DeserializeOwned` (the stored first result).
///
/// The generated function keeps the name, attributes, visibility and other parameters. Its
/// transaction parameter becomes `&sqlx::Pool<DB>` and its return type
/// `idem::Handled<Result<T, E>, Machine>` = `Result<idem::Outcome<T, Machine>, idem::Error<E>>`.
/// It begins a transaction, runs the conditional UPDATE, runs the body only if the row
/// moved, stores the result, and commits; any other outcome rolls back an empty
/// transaction. Every misuse is a compile error on the offending token; a misspelled state,
/// parameter or argument gets a "did you mean" with the near name.
///
/// Without `machine = …` the machine is `Self`: the handler must be an associated function
/// (or method) in an `impl` of the machine. Outside any `impl` rustc reports "cannot find
/// type `Self`" on the attribute; in the `impl` of a type that is no state machine, the error
/// says to name the machine or derive it.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::idempotent_inner(args.into(), item.into()).into()
}
