//! The order machine of the README, on `common::TABLES`'s `orders` table, for the tests
//! that need no machine of their own.
//!
//! Include it with `#[path = "common/order.rs"] mod order;`.

#![allow(dead_code)]

#[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}
