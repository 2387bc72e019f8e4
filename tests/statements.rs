//! What idem sends to the database, read from sqlx's own statement log: the exact text
//! of the generated constants, and how many statements each path takes. A regression in
//! either fails here, not in production.
//!
//! One test in its own binary: the log is process-wide.

mod common;

use idem::{Outcome, StateMachine};
use std::sync::Mutex;
use tracing::field::{Field, Visit};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(to(Paid))]
    Created,
    Paid,
}

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records the SQL text of every `sqlx::query` event.
struct StatementLog;

impl tracing::Subscriber for StatementLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        #[derive(Default)]
        struct Sql {
            summary: String,
            statement: String,
        }
        impl Visit for Sql {
            fn record_str(&mut self, field: &Field, value: &str) {
                match field.name() {
                    "summary" => self.summary = value.to_owned(),
                    "db.statement" => self.statement = value.to_owned(),
                    _ => {}
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "summary" || field.name() == "db.statement" {
                    self.record_str(field, format!("{value:?}").trim_matches('"'));
                }
            }
        }
        let mut sql = Sql::default();
        event.record(&mut sql);
        // sqlx logs short statements as a summary only, long ones framed by newlines.
        let text = if sql.statement.trim().is_empty() {
            sql.summary
        } else {
            sql.statement.trim_matches('\n').to_owned()
        };
        LOG.lock().unwrap().push(text);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn take_log() -> Vec<String> {
    std::mem::take(&mut *LOG.lock().unwrap())
}

/// The statements between BEGIN and COMMIT/ROLLBACK, without those.
fn inside_transaction(log: &[String]) -> Vec<&str> {
    log.iter()
        .map(String::as_str)
        .filter(|s| {
            !matches!(
                s.split_whitespace().next(),
                Some("BEGIN" | "COMMIT" | "ROLLBACK")
            )
        })
        .collect()
}

const BODY: &str = "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)";

macro_rules! handler {
    ($name:ident, $db:ty) => {
        #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
        async fn $name(
            tx: &mut sqlx::Transaction<'_, $db>,
            order_id: i64,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query(BODY).bind(order_id).execute(&mut **tx).await?;
            Ok(order_id)
        }
    };
}
handler!(pay_sqlite, sqlx::Sqlite);
handler!(pay_postgres, sqlx::Postgres);

#[tokio::test(flavor = "current_thread")]
async fn generated_sql_is_what_runs_and_round_trips_do_not_grow() {
    tracing::subscriber::set_global_default(StatementLog).unwrap();
    let sql = Order::IDEM_SQL;

    // SQLite: BEGIN IMMEDIATE; UPDATE … RETURNING; body; store result; COMMIT.
    let pool = common::sqlite_file("statements", 1).await;
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    take_log();
    assert_eq!(pay_sqlite(&pool, 1).await.unwrap(), Outcome::Applied(1));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [sql.sqlite.transition, BODY, sql.sqlite.store_result],
        "full log: {log:#?}"
    );
    // A duplicate on SQLite: the UPDATE matched nothing, one classifying SELECT.
    assert!(!pay_sqlite(&pool, 1).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [sql.sqlite.transition, sql.sqlite.classify],
        "full log: {log:#?}"
    );

    // PostgreSQL: one statement for the transition, and one for a duplicate, too.
    let Some(pool) = common::postgres("statements", 1).await else {
        return;
    };
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    take_log();
    assert_eq!(pay_postgres(&pool, 1).await.unwrap(), Outcome::Applied(1));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [sql.postgres.transition, BODY, sql.postgres.store_result],
        "full log: {log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("COMMIT"), "{log:#?}");
    assert!(!pay_postgres(&pool, 1).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [sql.postgres.transition],
        "full log: {log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("ROLLBACK"), "{log:#?}");
}
