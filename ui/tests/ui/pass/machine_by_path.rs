// The machine is declared in one module and named by path from another: absolute from the
// crate's root (this case is the module `machine_by_path` of `tests/ui.rs`), and relative.
#![allow(dead_code)]

mod orders {
    #[derive(idem::StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
    #[machine(table = "orders", key = "order_id")]
    pub enum Order {
        #[state(name = "CREATED", to(Paid))]
        Created,
        #[state(name = "PAID")]
        Paid,
    }
}

mod handlers {
    use sqlx::{Sqlite, Transaction};

    #[idem::idempotent(machine = crate::machine_by_path::orders::Order, key = "order_id", from = "CREATED", to = "PAID")]
    pub async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<(), sqlx::Error> {
        let _ = (tx, order_id);
        Ok(())
    }

    pub mod nested {
        #[idem::idempotent(machine = super::super::orders::Order, key = "order_id", from = "CREATED", to = "PAID")]
        pub async fn pay(
            tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
            order_id: i64,
        ) -> Result<(), sqlx::Error> {
            let _ = (tx, order_id);
            Ok(())
        }
    }
}

fn main() {}
