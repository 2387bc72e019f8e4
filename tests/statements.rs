//! What idem sends to the database, read from sqlx's own statement log: the exact text
//! of the generated constants, and how many statements each path takes. A regression in
//! either fails here, not in production.
//!
//! One test in its own binary: the log is process-wide.

mod common;
#[path = "common/http_client.rs"]
mod http_client;
#[path = "common/statement_log.rs"]
mod statement_log;

use idem::{Outcome, StateMachine};
use statement_log::{StatementLog, inside_transaction, take_log};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(to(Paid))]
    Created,
    Paid,
}

const BODY: &str = "INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)";

macro_rules! handler {
    ($name:ident, $db:ty) => {
        handler!($name, $db, false);
    };
    ($name:ident, $db:ty, $positional:expr) => {
        #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
        async fn $name(
            tx: &mut sqlx::Transaction<'_, $db>,
            order_id: i64,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query(common::placed($positional, BODY))
                .bind(order_id)
                .execute(&mut **tx)
                .await?;
            Ok(order_id)
        }
    };
}
handler!(pay_sqlite, sqlx::Sqlite);
handler!(pay_postgres, sqlx::Postgres);
handler!(pay_mysql, sqlx::MySql, true);

/// A creation without a transaction on MySQL: the INSERT and the result's, in one.
#[idem::idempotent(machine = Order, key = "order_id", create = "CREATED")]
async fn open_mysql(
    pool: &sqlx::MySqlPool,
    order_id: i64,
) -> Result<i64, std::convert::Infallible> {
    Ok(order_id)
}

macro_rules! statement_handlers {
    ($stored:ident, $nothing:ident, $db:ty) => {
        /// The one-statement form, with a result to store.
        #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
        async fn $stored(
            pool: &sqlx::Pool<$db>,
            order_id: i64,
        ) -> Result<i64, std::convert::Infallible> {
            Ok(order_id)
        }

        /// The one-statement form, with nothing to store.
        #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
        async fn $nothing(
            pool: &sqlx::Pool<$db>,
            order_id: i64,
        ) -> Result<(), std::convert::Infallible> {
            Ok(())
        }
    };
}
/// A creation without a transaction (PostgreSQL: one statement creates and stores).
#[idem::idempotent(machine = Order, key = "order_id", create = "CREATED")]
async fn open_postgres(
    pool: &sqlx::PgPool,
    order_id: i64,
) -> Result<i64, std::convert::Infallible> {
    Ok(order_id)
}

statement_handlers!(pay_stored_sqlite, pay_nothing_sqlite, sqlx::Sqlite);
statement_handlers!(pay_stored_postgres, pay_nothing_postgres, sqlx::Postgres);
statement_handlers!(pay_stored_mysql, pay_nothing_mysql, sqlx::MySql);

/// A composite key: the same statements, with the key's columns first.
#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "tenant_orders", key = ("tenant_id", "order_id"), state = "status")]
enum TenantOrder {
    #[state(to(Paid))]
    Created,
    Paid,
}

const TENANT_TABLE: &str = "CREATE TABLE tenant_orders (tenant_id TEXT NOT NULL, \
    order_id BIGINT NOT NULL, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0, \
    PRIMARY KEY (tenant_id, order_id))";

macro_rules! tenant_handler {
    ($name:ident, $db:ty) => {
        #[idem::idempotent(machine = TenantOrder, key = ("tenant", "order_id"), from = "CREATED", to = "PAID")]
        async fn $name(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenant: &str,
            order_id: i64,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query(BODY).bind(order_id).execute(&mut **tx).await?;
            Ok(order_id)
        }
    };
}
tenant_handler!(pay_tenant_sqlite, sqlx::Sqlite);
tenant_handler!(pay_tenant_postgres, sqlx::Postgres);

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
        [
            sql.of(idem::Dialect::Sqlite).transition,
            BODY,
            sql.of(idem::Dialect::Sqlite).store_result
        ],
        "full log: {log:#?}"
    );
    // A duplicate on SQLite: the UPDATE matched nothing, one classifying SELECT.
    assert!(!pay_sqlite(&pool, 1).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [
            sql.of(idem::Dialect::Sqlite).transition,
            sql.of(idem::Dialect::Sqlite).classify
        ],
        "full log: {log:#?}"
    );

    // A composite key: the same round trips.
    let tenant_sql = TenantOrder::IDEM_SQL;
    idem::create_results_table::<TenantOrder, _>(&pool)
        .await
        .unwrap();
    sqlx::query(TENANT_TABLE).execute(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO tenant_orders (tenant_id, order_id, status) VALUES ('acme', 1, 'CREATED')",
    )
    .execute(&pool)
    .await
    .unwrap();
    take_log();
    assert!(
        pay_tenant_sqlite(&pool, "acme", 1)
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        !pay_tenant_sqlite(&pool, "acme", 1)
            .await
            .unwrap()
            .is_applied()
    );
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [
            tenant_sql.of(idem::Dialect::Sqlite).transition,
            BODY,
            tenant_sql.of(idem::Dialect::Sqlite).store_result,
            tenant_sql.of(idem::Dialect::Sqlite).transition,
            tenant_sql.of(idem::Dialect::Sqlite).classify
        ],
        "full log: {log:#?}"
    );

    // PostgreSQL, pinned to the one-statement form: one statement for the transition, and
    // one for a duplicate, too.
    let Some(pool) = common::postgres("statements", 1).await else {
        return;
    };
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (order_id, status) SELECT g, 'CREATED' FROM generate_series(1, 100) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    idem::set_postgres_classification(idem::Classification::Inline);
    take_log();
    assert_eq!(pay_postgres(&pool, 1).await.unwrap(), Outcome::Applied(1));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [
            sql.of(idem::Dialect::Postgres).transition,
            BODY,
            sql.of(idem::Dialect::Postgres).store_result
        ],
        "full log: {log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("COMMIT"), "{log:#?}");
    assert!(!pay_postgres(&pool, 1).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [sql.of(idem::Dialect::Postgres).transition],
        "full log: {log:#?}"
    );
    assert_eq!(log.last().map(String::as_str), Some("ROLLBACK"), "{log:#?}");

    // Pinned to the plain UPDATE: what a hand-writer sends, a classifying SELECT on a miss.
    idem::set_postgres_classification(idem::Classification::OnMiss);
    assert_eq!(pay_postgres(&pool, 2).await.unwrap(), Outcome::Applied(2));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [
            sql.of(idem::Dialect::Postgres).update,
            BODY,
            sql.of(idem::Dialect::Postgres).store_result
        ],
        "full log: {log:#?}"
    );
    assert!(!pay_postgres(&pool, 2).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [
            sql.of(idem::Dialect::Postgres).update,
            sql.of(idem::Dialect::Postgres).classify
        ],
        "full log: {log:#?}"
    );

    // Adaptive (the default): a run of duplicates switches to the one-statement form, a
    // run of first deliveries back to the plain UPDATE, each within 16 calls.
    idem::set_postgres_classification(idem::Classification::Adaptive);
    let first_statement = |log: &[String]| inside_transaction(log)[0].to_owned();
    let mut duplicates = 0;
    loop {
        assert!(!pay_postgres(&pool, 1).await.unwrap().is_applied());
        duplicates += 1;
        if first_statement(&take_log()) == sql.of(idem::Dialect::Postgres).transition {
            break;
        }
        assert!(
            duplicates < 16,
            "still the plain UPDATE after {duplicates} duplicates"
        );
    }
    let mut applied = 0;
    loop {
        applied += 1;
        assert!(pay_postgres(&pool, 2 + applied).await.unwrap().is_applied());
        if first_statement(&take_log()) == sql.of(idem::Dialect::Postgres).update {
            break;
        }
        assert!(
            applied < 16,
            "still the one-statement form after {applied} applications"
        );
    }
    eprintln!("switched after {duplicates} duplicates and back after {applied} applications");

    // A composite key on PostgreSQL, in both forms.
    let tenant_sql = TenantOrder::IDEM_SQL;
    sqlx::query(TENANT_TABLE).execute(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO tenant_orders (tenant_id, order_id, status) \
         VALUES ('acme', 1, 'CREATED'), ('acme', 2, 'CREATED')",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (classification, order_id, attempt) in [
        (
            idem::Classification::Inline,
            1,
            tenant_sql.of(idem::Dialect::Postgres).transition,
        ),
        (
            idem::Classification::OnMiss,
            2,
            tenant_sql.of(idem::Dialect::Postgres).update,
        ),
    ] {
        idem::set_postgres_classification(classification);
        take_log();
        assert!(
            pay_tenant_postgres(&pool, "acme", order_id)
                .await
                .unwrap()
                .is_applied()
        );
        assert!(
            !pay_tenant_postgres(&pool, "acme", order_id)
                .await
                .unwrap()
                .is_applied()
        );
        let log = take_log();
        let mut expected = vec![
            attempt,
            BODY,
            tenant_sql.of(idem::Dialect::Postgres).store_result,
            attempt,
        ];
        if classification == idem::Classification::OnMiss {
            expected.push(tenant_sql.of(idem::Dialect::Postgres).classify);
        }
        assert_eq!(inside_transaction(&log), expected, "full log: {log:#?}");
    }
    idem::set_postgres_classification(idem::Classification::Adaptive);

    // The one-statement form on PostgreSQL: one autocommit statement that moves the row
    // and stores the result, and the same one for a duplicate; nothing else, not even
    // BEGIN. With nothing to store, the transition alone, in either form.
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (201, 'CREATED'), (202, 'CREATED'), (203, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    take_log();
    assert_eq!(
        pay_stored_postgres(&pool, 201).await.unwrap(),
        Outcome::Applied(201)
    );
    assert_eq!(
        take_log(),
        [sql.of(idem::Dialect::Postgres).transition_storing]
    );
    assert!(!pay_stored_postgres(&pool, 201).await.unwrap().is_applied());
    assert_eq!(
        take_log(),
        [sql.of(idem::Dialect::Postgres).transition_storing]
    );
    idem::set_postgres_classification(idem::Classification::Inline);
    assert!(pay_nothing_postgres(&pool, 202).await.unwrap().is_applied());
    assert_eq!(take_log(), [sql.of(idem::Dialect::Postgres).transition]);
    idem::set_postgres_classification(idem::Classification::OnMiss);
    assert!(pay_nothing_postgres(&pool, 203).await.unwrap().is_applied());
    assert_eq!(take_log(), [sql.of(idem::Dialect::Postgres).update]);
    assert!(!pay_nothing_postgres(&pool, 203).await.unwrap().is_applied());
    assert_eq!(
        take_log(),
        [
            sql.of(idem::Dialect::Postgres).update,
            sql.of(idem::Dialect::Postgres).classify
        ]
    );
    idem::set_postgres_classification(idem::Classification::Adaptive);
    assert!(open_postgres(&pool, 301).await.unwrap().is_created());
    assert_eq!(take_log(), [sql.of(idem::Dialect::Postgres).create_storing]);
    assert!(matches!(
        open_postgres(&pool, 301).await.unwrap(),
        idem::Creation::Duplicate {
            first_result: Some(301),
            ..
        }
    ));
    assert_eq!(take_log(), [sql.of(idem::Dialect::Postgres).create_storing]);

    // On SQLite: nothing to store, the UPDATE alone in autocommit; a result to store, one
    // transaction with its INSERT.
    let lite = common::sqlite_file("statements-one", 1).await;
    idem::create_results_table::<Order, _>(&lite).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED')")
        .execute(&lite)
        .await
        .unwrap();
    take_log();
    assert!(pay_nothing_sqlite(&lite, 1).await.unwrap().is_applied());
    assert_eq!(take_log(), [sql.of(idem::Dialect::Sqlite).update]);
    assert!(!pay_nothing_sqlite(&lite, 1).await.unwrap().is_applied());
    assert_eq!(
        take_log(),
        [
            sql.of(idem::Dialect::Sqlite).update,
            sql.of(idem::Dialect::Sqlite).classify
        ]
    );
    // (sqlx does not log SQLite's BEGIN and COMMIT; tests/crashes.rs proves the two
    // statements commit together.)
    assert!(pay_stored_sqlite(&lite, 2).await.unwrap().is_applied());
    assert_eq!(
        take_log(),
        [
            sql.of(idem::Dialect::Sqlite).update,
            sql.of(idem::Dialect::Sqlite).store_result
        ]
    );

    // MySQL (MariaDB): the statements SQLite runs, each `$n` sent as a `?`; a miss's
    // classifying read is a locking one. A creation that finds its key taken is refused
    // by the unique key (a failed INSERT) and read.
    mysql_statements().await;

    // An idempotent HTTP request: its key record, the handler's statement, the stored
    // response, in one transaction, as a hand-written key table would take; a repeat reads
    // the record and ends.
    let sqlite = common::sqlite_file("statements-http", 2).await;
    idem::migrate(&sqlite).await.unwrap();
    let addr = http_server(
        sqlite.clone(),
        axum::routing::post(async |mut tx: idem::http::Tx<sqlx::Sqlite>| {
            sqlx::query(BODY)
                .bind(1i64)
                .execute(&mut **tx)
                .await
                .unwrap();
            tx.commit("done")
        }),
    )
    .await;
    http_statements(addr).await;
    idem::migrate(&pool).await.unwrap();

    // Staging on PostgreSQL: the INSERT that notifies, or (notifications off) the plain one.
    let mut tx = pool.begin().await.unwrap();
    take_log();
    for (id, notify) in [("s-1", true), ("s-2", false)] {
        idem::outbox::set_notify(notify);
        let message = idem::outbox::Message::json("m", &1).id(id);
        idem::outbox::stage(&mut tx, message).await.unwrap();
    }
    idem::outbox::set_notify(true);
    tx.rollback().await.unwrap();
    let outbox = idem::Dialect::Postgres.outbox();
    assert_eq!(
        inside_transaction(&take_log()),
        [outbox.insert.as_str(), outbox.insert_quiet.as_str()]
    );

    let addr = http_server(
        pool.clone(),
        axum::routing::post(async |mut tx: idem::http::Tx<sqlx::Postgres>| {
            sqlx::query(BODY)
                .bind(1i64)
                .execute(&mut **tx)
                .await
                .unwrap();
            tx.commit("done")
        }),
    )
    .await;
    http_statements(addr).await;
}

async fn http_server<DB: idem::Backend>(
    pool: sqlx::Pool<DB>,
    route: axum::routing::MethodRouter,
) -> std::net::SocketAddr {
    let layer =
        idem::http::IdempotencyLayer::new(pool, idem::inbox::Inbox::new("api").unwrap()).unscoped();
    let app = axum::Router::new()
        .route("/orders", route.clone().layer(layer.clone()))
        .route("/optimistic", route.layer(layer.optimistic()));
    http_client::serve(app).await
}

async fn http_statements(addr: std::net::SocketAddr) {
    take_log();
    let first = http_client::post(addr, "/orders", "k", "{}").await;
    assert_eq!((first.status, first.body.as_str()), (200, "done"));
    let log = take_log();
    let inside = inside_transaction(&log);
    assert_eq!(inside.len(), 3, "full log: {log:#?}");
    assert!(inside[0].starts_with("INSERT INTO idem_inbox"), "{log:#?}");
    assert_eq!(inside[1], BODY);
    assert!(
        inside[2].starts_with("UPDATE idem_inbox SET result"),
        "{log:#?}"
    );
    let again = http_client::post(addr, "/orders", "k", "{}").await;
    assert!(again.replayed());
    let log = take_log();
    let inside = inside_transaction(&log);
    assert_eq!(
        inside.len(),
        2,
        "the insert, and the record's read: {log:#?}"
    );
    assert!(
        inside[1].starts_with("SELECT status, fingerprint"),
        "{log:#?}"
    );
    // A finished record is read, not locked: on PostgreSQL a row lock is a write.
    assert!(!inside[1].contains("FOR UPDATE"), "{log:#?}");

    // The optimistic form: the handler's statement, then the record with its response.
    let first = http_client::post(addr, "/optimistic", "k-2", "{}").await;
    assert_eq!((first.status, first.body.as_str()), (200, "done"));
    let log = take_log();
    let inside = inside_transaction(&log);
    assert_eq!(inside.len(), 2, "full log: {log:#?}");
    assert_eq!(inside[0], BODY);
    assert!(
        inside[1].starts_with("INSERT INTO idem_inbox") && inside[1].contains("result"),
        "{log:#?}"
    );
    // A repeat runs its handler, loses the key at the insert and reads the first's record
    // (then rolls back).
    let again = http_client::post(addr, "/optimistic", "k-2", "{}").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, "done");
    let log = take_log();
    let inside = inside_transaction(&log);
    assert_eq!(inside.len(), 3, "full log: {log:#?}");
    assert!(
        inside[2].starts_with("SELECT status, fingerprint"),
        "{log:#?}"
    );
}

/// The MySQL part of [`generated_sql_is_what_runs_and_round_trips_do_not_grow`].
async fn mysql_statements() {
    let Some(pool) = common::mysql("statements", 1).await else {
        return;
    };
    let sql = Order::IDEM_SQL.of(idem::Dialect::MySql);
    let runs = |statement: &str| {
        idem_sql::placeholder::positional(statement)
            .text
            .into_owned()
    };
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED'), (3, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    take_log();
    assert_eq!(pay_mysql(&pool, 1).await.unwrap(), Outcome::Applied(1));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [runs(sql.transition), runs(BODY), runs(sql.store_result)],
        "full log: {log:#?}"
    );
    assert!(
        log.first().is_some_and(|s| s.starts_with("BEGIN")),
        "{log:#?}"
    );
    // A duplicate in a transaction idem began: the UPDATE was its first statement, so the
    // classifying read needs no lock (InnoDB's snapshot begins there).
    assert!(!pay_mysql(&pool, 1).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [runs(sql.transition), runs(sql.classify_unlocked)],
        "full log: {log:#?}"
    );
    assert!(!runs(sql.classify_unlocked).contains("LOCK IN SHARE MODE"));
    // Inside the caller's transaction, which may have read before: the locking read.
    let mut tx = pool.begin().await.unwrap();
    take_log();
    assert!(!pay_mysql(&mut tx, 1).await.unwrap().is_applied());
    tx.rollback().await.unwrap();
    let log = take_log();
    assert!(log.contains(&runs(sql.classify)), "full log: {log:#?}");
    assert!(runs(sql.classify).ends_with("LOCK IN SHARE MODE"));
    // Nothing to store: the UPDATE alone, in autocommit; a result to store: a transaction.
    assert!(pay_nothing_mysql(&pool, 2).await.unwrap().is_applied());
    assert_eq!(take_log(), [runs(sql.update)]);
    assert!(pay_stored_mysql(&pool, 3).await.unwrap().is_applied());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [runs(sql.update), runs(sql.store_result)],
        "full log: {log:#?}"
    );
    assert!(
        log.first().is_some_and(|s| s.starts_with("BEGIN")),
        "{log:#?}"
    );
    // A creation: the INSERT and the result's; a duplicate: the refused INSERT, the read.
    assert!(open_mysql(&pool, 301).await.unwrap().is_created());
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [runs(sql.create), runs(sql.store_result)],
        "full log: {log:#?}"
    );
    assert!(matches!(
        open_mysql(&pool, 301).await.unwrap(),
        idem::Creation::Duplicate {
            first_result: Some(301),
            ..
        }
    ));
    let log = take_log();
    assert_eq!(
        inside_transaction(&log),
        [runs(sql.create), runs(sql.classify_created)],
        "full log: {log:#?}"
    );
    // On the other backends the two reads are one.
    for dialect in [idem::Dialect::Postgres, idem::Dialect::Sqlite] {
        let sql = Order::IDEM_SQL.of(dialect);
        assert_eq!(sql.classify_unlocked, sql.classify);
    }
}
