//! Composite keys: a multi-tenant table keyed by `(tenant_id, order_id)`. Two tenants may
//! use the same order number; each row moves, and replays, on its own. Every case runs on a
//! SQLite file and on PostgreSQL.

use crate::common;

use idem::inbox::{Delivery, Inbox, MessageKey};
use idem::{Key, KeyError, Outcome, StateMachine, ToKey};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "tenant_orders",
    key = ("tenant_id", "order_id"),
    state = "status"
)]
pub enum TenantOrder {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

const TABLE: &str = "CREATE TABLE tenant_orders (
    tenant_id TEXT NOT NULL,
    order_id BIGINT NOT NULL,
    status TEXT NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, order_id)
)";

/// [`TABLE`] on MySQL (a `VARCHAR` key column).
const TABLE_MYSQL: &str = "CREATE TABLE tenant_orders (
    tenant_id VARCHAR(64) NOT NULL,
    order_id BIGINT NOT NULL,
    status VARCHAR(16) NOT NULL,
    version BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, order_id)
)";

macro_rules! composite_key_tests {
    ($module:ident, $db:ty, $pool:ty, $setup:expr) => {
        composite_key_tests!($module, $db, $pool, $setup, positional = false);
    };
    ($module:ident, $db:ty, $pool:ty, $setup:expr, positional = $positional:expr) => {
        mod $module {
            use super::*;

            const POSITIONAL: bool = $positional;
            use sqlx::Transaction;

            #[idem::idempotent(
                machine = TenantOrder,
                key = ("tenant", "order_id"),
                from = "CREATED",
                to = "PAID",
                version = "expected"
            )]
            async fn pay(
                tx: &mut Transaction<'_, $db>,
                tenant: &str,
                order_id: i64,
                amount: i64,
                expected: Option<i64>,
            ) -> Result<String, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, $3)"))
                    .bind(order_id)
                    .bind(tenant)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                Ok(format!("{tenant}:{order_id}:{amount}"))
            }

            #[idem::idempotent(
                machine = TenantOrder,
                key = ("tenant", "order_id"),
                from = "PAID",
                to = "SHIPPED"
            )]
            async fn ship(
                tx: &mut Transaction<'_, $db>,
                tenant: String,
                order_id: i64,
            ) -> Result<(), sqlx::Error> {
                let _ = (tx, tenant, order_id);
                Ok(())
            }

            #[idem::idempotent(
                inbox = "inbox",
                message = "message",
                payload = "payload",
                machine = TenantOrder,
                key = ("tenant", "order_id"),
                from = "PAID",
                to = "SHIPPED"
            )]
            async fn ship_message(
                tx: &mut Transaction<'_, $db>,
                inbox: &Inbox,
                message: &MessageKey,
                payload: &[u8],
                tenant: &str,
                order_id: i64,
            ) -> Result<String, sqlx::Error> {
                let _ = (tx, payload);
                Ok(format!("shipped {tenant}:{order_id}"))
            }

            async fn setup(rows: &str) -> Option<$pool> {
                let pool: $pool = $setup?;
                idem::migrate(&pool).await.unwrap();
                sqlx::query(if POSITIONAL { TABLE_MYSQL } else { TABLE }).execute(&pool).await.unwrap();
                sqlx::query(&format!(
                    "INSERT INTO tenant_orders (tenant_id, order_id, status) VALUES {rows}"
                ))
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            async fn status(pool: &$pool, tenant: &str, order_id: i64) -> String {
                sqlx::query_scalar(
                    common::placed($positional, "SELECT status FROM tenant_orders WHERE tenant_id = $1 AND order_id = $2"),
                )
                .bind(tenant)
                .bind(order_id)
                .fetch_one(pool)
                .await
                .unwrap()
            }

            async fn effects(pool: &$pool) -> i64 {
                sqlx::query_scalar("SELECT COUNT(*) FROM effects")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn tenants_sharing_an_order_number_move_and_replay_separately() {
                let Some(pool) = setup("('acme', 7, 'CREATED'), ('globex', 7, 'CREATED')").await
                else {
                    return;
                };
                assert_eq!(
                    pay(&pool, "acme", 7, 100, None).await.unwrap(),
                    Outcome::Applied("acme:7:100".to_owned())
                );
                // the other tenant's order 7 is untouched
                assert_eq!(status(&pool, "globex", 7).await, "CREATED");
                assert_eq!(
                    pay(&pool, "acme", 7, 999, None).await.unwrap(),
                    Outcome::AlreadyDone {
                        current: TenantOrder::Paid,
                        first_result: Some("acme:7:100".to_owned())
                    }
                );
                // globex's first call applies, and its duplicate replays globex's result
                assert_eq!(
                    pay(&pool, "globex", 7, 200, None).await.unwrap(),
                    Outcome::Applied("globex:7:200".to_owned())
                );
                assert_eq!(
                    pay(&pool, "globex", 7, 1, None).await.unwrap(),
                    Outcome::AlreadyDone {
                        current: TenantOrder::Paid,
                        first_result: Some("globex:7:200".to_owned())
                    }
                );
                assert_eq!(effects(&pool).await, 2);
                let mut stored: Vec<String> = sqlx::query_scalar(if POSITIONAL {
                    // sqlx reads a `_bin` column as bytes.
                    "SELECT CAST(entity_key AS CHAR) FROM idem_results WHERE machine = 'tenant_orders'"
                } else {
                    "SELECT entity_key FROM idem_results WHERE machine = 'tenant_orders'"
                })
                .fetch_all(&pool)
                .await
                .unwrap();
                stored.sort();
                assert_eq!(stored, [r#"["acme",7]"#, r#"["globex",7]"#]);
            }

            #[tokio::test]
            async fn every_outcome_is_told_apart_on_a_composite_key() {
                let Some(pool) = setup(
                    "('acme', 9, 'CREATED'), ('acme', 10, 'CANCELLED'), ('acme', 11, 'CREATED')",
                )
                .await
                else {
                    return;
                };
                // no such row: the order number exists, but for another tenant
                assert_eq!(
                    pay(&pool, "globex", 9, 1, None).await.unwrap(),
                    Outcome::NotFound
                );
                assert_eq!(
                    pay(&pool, "acme", 8, 1, None).await.unwrap(),
                    Outcome::NotFound
                );
                assert_eq!(
                    ship(&pool, "acme".to_owned(), 9).await.unwrap(),
                    Outcome::NotYet {
                        current: TenantOrder::Created,
                        from: TenantOrder::Paid,
                        to: TenantOrder::Shipped
                    }
                );
                assert_eq!(
                    ship(&pool, "acme".to_owned(), 10).await.unwrap(),
                    Outcome::IllegalState {
                        current: TenantOrder::Cancelled,
                        from: TenantOrder::Paid,
                        to: TenantOrder::Shipped
                    }
                );
                assert_eq!(
                    pay(&pool, "acme", 11, 1, Some(5)).await.unwrap(),
                    Outcome::StaleVersion {
                        expected: 5,
                        actual: 0
                    }
                );
                assert!(pay(&pool, "acme", 11, 1, Some(0)).await.unwrap().is_applied());
                assert_eq!(
                    ship(&pool, "acme".to_owned(), 11).await.unwrap(),
                    Outcome::Applied(())
                );
                assert_eq!(effects(&pool).await, 1);
            }

            #[tokio::test]
            async fn a_malformed_part_is_refused_before_any_statement() {
                let Some(pool) = setup("('acme', 7, 'CREATED')").await else {
                    return;
                };
                match pay(&pool, "", 7, 1, None).await {
                    Err(idem::Error::InvalidKey(KeyError::Empty)) => {}
                    other => panic!("expected an empty key part to be refused, got {other:?}"),
                }
                match pay(&pool, "ac\nme", 7, 1, None).await {
                    Err(idem::Error::InvalidKey(KeyError::ControlCharacter { position: 2 })) => {}
                    other => panic!("expected a control character to be refused, got {other:?}"),
                }
                assert_eq!(status(&pool, "acme", 7).await, "CREATED");
                assert_eq!(effects(&pool).await, 0);
            }

            #[tokio::test]
            async fn the_function_form_checks_the_number_of_parts() {
                let Some(pool) = setup("('acme', 12, 'CREATED')").await else {
                    return;
                };
                const PAY: idem::Transition = idem::transition!(TenantOrder, "CREATED" => "PAID");
                let body = async |_: &mut Transaction<'static, $db>| Ok::<_, sqlx::Error>(());
                let refused: Result<Outcome<(), TenantOrder>, _> =
                    idem::run(&pool, PAY, Key::Int(12).into(), None, body).await;
                match refused {
                    Err(idem::Error::InvalidKey(KeyError::WrongArity {
                        columns: 2,
                        parts: 1,
                    })) => {}
                    other => panic!("expected a wrong number of key parts, got {other:?}"),
                }
                assert_eq!(status(&pool, "acme", 12).await, "CREATED");
                let key = ("acme", 12).to_key().into();
                let applied: Outcome<(), TenantOrder> =
                    idem::run(&pool, PAY, key, None, body).await.unwrap();
                assert_eq!(applied, Outcome::Applied(()));
                assert_eq!(status(&pool, "acme", 12).await, "PAID");
            }

            #[tokio::test]
            async fn a_consumer_transition_on_a_composite_key() {
                let Some(pool) = setup("('acme', 7, 'PAID'), ('globex', 7, 'CREATED')").await
                else {
                    return;
                };
                let inbox = Inbox::new("shipping").unwrap();
                let (a, b) = (
                    MessageKey::new("ship:acme:7").unwrap(),
                    MessageKey::new("ship:globex:7").unwrap(),
                );
                let delivery = ship_message(&pool, &inbox, &a, b"{}", "acme", 7)
                    .await
                    .unwrap();
                assert_eq!(delivery, Delivery::Processed("shipped acme:7".to_owned()));
                // globex's order 7 is not paid yet: refused, not acked, not recorded
                let early = ship_message(&pool, &inbox, &b, b"{}", "globex", 7)
                    .await
                    .unwrap();
                assert!(!early.should_ack(), "{early:?}");
                assert_eq!(status(&pool, "globex", 7).await, "CREATED");
                let again = ship_message(&pool, &inbox, &a, b"{}", "acme", 7)
                    .await
                    .unwrap();
                assert!(
                    matches!(&again, Delivery::Duplicate { first_result: Some(r) } if r == "shipped acme:7"),
                    "{again:?}"
                );
            }

            /// 4 tenants × 8 racing duplicates of one order number: one application per
            /// tenant, every duplicate replays its own tenant's winner.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_duplicates_apply_once_per_tenant() {
                const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
                let rows = TENANTS
                    .iter()
                    .map(|t| format!("('{t}', 1, 'CREATED')"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let Some(pool) = setup(&rows).await else {
                    return;
                };
                let mut tasks = Vec::new();
                for attempt in 0..8i64 {
                    for tenant in TENANTS {
                        let pool = pool.clone();
                        tasks.push(tokio::spawn(async move {
                            let outcome = pay(&pool, tenant, 1, attempt, None).await.unwrap();
                            (tenant, outcome)
                        }));
                    }
                }
                let mut applied = std::collections::HashMap::new();
                let mut replays = Vec::new();
                for task in tasks {
                    match task.await.unwrap() {
                        (tenant, Outcome::Applied(result)) => {
                            assert!(applied.insert(tenant, result).is_none(), "{tenant} twice");
                        }
                        (
                            tenant,
                            Outcome::AlreadyDone {
                                current: TenantOrder::Paid,
                                first_result: Some(result),
                            },
                        ) => replays.push((tenant, result)),
                        (tenant, other) => panic!("{tenant}: unexpected {other:?}"),
                    }
                }
                assert_eq!(applied.len(), TENANTS.len());
                assert_eq!(replays.len(), 28);
                for (tenant, result) in replays {
                    assert_eq!(result, applied[tenant], "{tenant} replayed another result");
                    assert!(result.starts_with(&format!("{tenant}:1:")));
                }
                assert_eq!(effects(&pool).await, 4);
            }
        }
    };
}

composite_key_tests!(
    sqlite_file,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    Some(common::sqlite_file(&format!("composite-{}", common::next_id()), 4).await)
);
composite_key_tests!(
    postgres,
    sqlx::Postgres,
    sqlx::PgPool,
    common::postgres(&format!("composite_{}", common::next_id()), 8).await
);
composite_key_tests!(
    mysql,
    sqlx::MySql,
    sqlx::MySqlPool,
    common::mysql(&format!("composite_{}", common::next_id()), 8).await,
    positional = true
);
