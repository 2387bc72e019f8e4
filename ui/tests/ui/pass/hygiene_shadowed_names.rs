// The generated code must not resolve any name at the call site: a user module full of
// items named like the ones the expansion uses still compiles.
#![allow(dead_code, non_camel_case_types, non_snake_case, unused_imports)]

// A crate-root module named like the `core` the expansion reaches for with `::core`.
mod core {
    pub mod panic {}
    pub fn panic() {}
}

// Names of the prelude and of `idem`, shadowed in the scope of the handler.
mod workflow {
    use ::idem::idempotent;
    use ::sqlx::Sqlite;

    pub struct Result;
    pub struct Option;
    pub struct Some;
    pub struct None;
    pub struct Ok;
    pub struct Err;
    pub struct Transition;
    pub struct Outcome;
    pub struct Machine;
    pub struct Error;
    pub struct Handled;
    pub struct Source;
    pub struct CallKey;
    pub struct IntoKey;
    pub struct IntoVersion;
    pub struct Transaction;
    pub struct Definition;
    pub fn run() {}
    pub fn resolve() {}
    pub fn state_error() {}
    pub fn transition_error() {}
    pub mod __private {}
    pub mod idem {}
    pub mod sqlx {}
    pub mod std {}
    pub mod core {}

    #[derive(::idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    #[machine(
        table = "orders",
        key = "order_id",
        state = "status",
        version = "version"
    )]
    pub enum Order {
        #[state(name = "CREATED", to(Paid))]
        Created,
        #[state(name = "PAID")]
        Paid,
    }

    // Parameters named like the expansion's locals, and a body that uses them: the
    // generated `let`s must not shadow them.
    #[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", version = "__idem_version")]
    pub async fn pay(
        tx: &mut ::sqlx::Transaction<'_, Sqlite>,
        order_id: i64,
        __idem_key: i64,
        __idem_version: ::core::option::Option<i64>,
        held: i64,
        __idem_plan: i64,
    ) -> ::core::result::Result<i64, ::sqlx::Error> {
        let message: &'static str = "the body's own locals";
        let _ = (message, tx);
        ::core::result::Result::Ok(__idem_key + order_id + held + __idem_plan)
    }
}

fn main() {}
