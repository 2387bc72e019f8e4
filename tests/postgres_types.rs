//! PostgreSQL column types users have: a state column of an ENUM type (and `varchar`),
//! in both of idem's classification forms.

use crate::common;

use idem::{Classification, Outcome, StateMachine};
use sqlx::{PgPool, Postgres, Transaction};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "shipments", key = "shipment_id", state = "status")]
pub enum Shipment {
    #[state(name = "CREATED", to(Packed, Cancelled))]
    Created,
    #[state(name = "PACKED", to(Sent))]
    Packed,
    #[state(name = "SENT")]
    Sent,
    #[state(name = "CANCELLED")]
    Cancelled,
}

#[idem::idempotent(machine = Shipment, key = "shipment_id", from = "CREATED", to = "PACKED")]
async fn pack(tx: &mut Transaction<'_, Postgres>, shipment_id: i64) -> Result<i64, sqlx::Error> {
    let _ = tx;
    Ok(shipment_id * 10)
}

#[idem::idempotent(machine = Shipment, key = "shipment_id", from = "PACKED", to = "SENT")]
async fn send(tx: &mut Transaction<'_, Postgres>, shipment_id: i64) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn setup(name: &str, column_type: &str) -> Option<PgPool> {
    let pool = common::postgres(name, 2).await?;
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TYPE shipment_status AS ENUM ('CREATED', 'PACKED', 'SENT', 'CANCELLED');
         CREATE TABLE shipments (
             shipment_id BIGINT PRIMARY KEY,
             status {column_type} NOT NULL,
             version BIGINT NOT NULL DEFAULT 0
         );
         INSERT INTO shipments (shipment_id, status) VALUES (1, 'CREATED'), (2, 'CANCELLED'), (3, 'CREATED');"
    ))
    .execute(&pool)
    .await
    .unwrap();
    Some(pool)
}

/// Every outcome, in each classification form.
async fn every_outcome(pool: &PgPool) {
    sqlx::query("UPDATE shipments SET status = 'CREATED', version = 0 WHERE shipment_id IN (1, 3)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM idem_results")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(pack(pool, 1).await.unwrap(), Outcome::Applied(10));
    assert_eq!(
        pack(pool, 1).await.unwrap(),
        Outcome::AlreadyDone {
            current: Shipment::Packed,
            first_result: Some(10)
        }
    );
    assert!(matches!(
        pack(pool, 2).await.unwrap(),
        Outcome::IllegalState {
            current: Shipment::Cancelled,
            ..
        }
    ));
    assert!(matches!(
        send(pool, 3).await.unwrap(),
        Outcome::NotYet {
            current: Shipment::Created,
            ..
        }
    ));
    assert_eq!(pack(pool, 404).await.unwrap(), Outcome::NotFound);
    assert!(send(pool, 1).await.unwrap().is_applied());
    let status: String =
        sqlx::query_scalar("SELECT status::text FROM shipments WHERE shipment_id = 1")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(status, "SENT");
}

#[tokio::test]
async fn an_enum_state_column_works_in_both_classification_forms() {
    for column_type in ["shipment_status", "VARCHAR(16)"] {
        let schema = format!("types_{}_{}", column_type.len(), common::next_id());
        let Some(pool) = setup(&schema, column_type).await else {
            return;
        };
        // Pinning the form process-wide is safe here: every test of this binary works in
        // either form.
        for form in [Classification::Inline, Classification::OnMiss] {
            idem::set_postgres_classification(form);
            every_outcome(&pool).await;
        }
        idem::set_postgres_classification(Classification::Adaptive);
    }
}

/// `idem::verify` accepts an ENUM state column, and `idem::enforce` works on one: the CHECK
/// and the trigger compare the states as text.
#[tokio::test]
async fn an_enum_state_column_is_verified_and_enforced() {
    let Some(pool) = setup(
        &format!("types_enforce_{}", common::next_id()),
        "shipment_status",
    )
    .await
    else {
        return;
    };
    let report = idem::verify::<Shipment, _>(&pool).await.unwrap();
    assert!(report.is_ok(), "{report}");
    idem::enforce::<Shipment, _>(&pool).await.unwrap();
    assert_eq!(pack(&pool, 1).await.unwrap(), Outcome::Applied(10));
    assert!(send(&pool, 1).await.unwrap().is_applied());
    let refused = sqlx::query("UPDATE shipments SET status = 'SENT' WHERE shipment_id = 3")
        .execute(&pool)
        .await
        .unwrap_err();
    let refused = refused.as_database_error().unwrap();
    assert_eq!(refused.code().as_deref(), Some("23514"));
    assert_eq!(
        refused.message(),
        "idem: CREATED -> SENT is not a transition of the state machine Shipment"
    );
}
