//! The race PostgreSQL's single statement must survive, made deterministic: the loser's
//! UPDATE waits on the winner's row lock, the winner commits, and the loser's statement
//! still sees the row in `from` in its snapshot. The loser must come out as a duplicate
//! with the winner's result, never as an illegal state and never as a second application.

use crate::common;

use idem::{Outcome, StateMachine};
use std::time::Duration;

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID")]
    Paid,
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    order_id: i64,
) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES ($1, 'pay', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok("loser".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loser_blocked_by_the_winner_is_a_duplicate() {
    let Some(pool) = common::postgres("lost_race", 4).await else {
        return;
    };
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();

    // The winner: another instance running the same transition, not yet committed.
    let sql = Order::IDEM_SQL.of(idem::Dialect::Postgres);
    let mut winner = pool.begin().await.unwrap();
    let applied: Option<i64> = sqlx::query_scalar(sql.transition)
        .bind(1i64)
        .bind("CREATED")
        .bind("PAID")
        .bind(<Order as idem::Machine>::DEFINITION.id)
        .bind("1")
        .fetch_one(&mut *winner)
        .await
        .unwrap();
    assert_eq!(applied, Some(1));
    sqlx::query(sql.store_result)
        .bind(<Order as idem::Machine>::DEFINITION.id)
        .bind("1")
        .bind("CREATED")
        .bind("PAID")
        .bind("\"winner\"")
        .execute(&mut *winner)
        .await
        .unwrap();

    let loser = {
        let pool = pool.clone();
        tokio::spawn(async move { pay(&pool, 1).await })
    };
    // Commit only once the loser is blocked on the winner's row lock.
    let mut waited = Duration::ZERO;
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE application_name = 'idem_test_lost_race' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if blocked == 1 {
            break;
        }
        assert!(
            waited < Duration::from_secs(10),
            "the loser never blocked on the row lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    winner.commit().await.unwrap();

    let outcome = loser.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some("winner".to_owned())
        }
    );
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "the loser's body must not run");
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay_on_mysql(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    order_id: i64,
) -> Result<String, sqlx::Error> {
    sqlx::query("INSERT INTO effects (order_id, kind, amount) VALUES (?, 'pay', 0)")
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok("loser".to_owned())
}

/// InnoDB's version of the race: under REPEATABLE READ the loser's transaction read the
/// table before (its snapshot has the row in `from`), its UPDATE waits on the winner's row
/// lock, and, the winner committed, matches nothing: an UPDATE reads the latest committed
/// row. The classifying read must see that row too (it is a locking read), not the
/// snapshot's, or the loser would find the row still in `from` after its UPDATE missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loser_with_an_older_snapshot_is_a_duplicate_on_mysql() {
    lost_race_on_mysql("lost_race_snapshot", true).await;
}

/// The same race with the loser called from the pool: its UPDATE is the first statement of
/// the transaction idem began, so its classifying read takes no lock, and must still see the
/// winner's row and result (InnoDB's snapshot begins at that read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loser_blocked_by_the_winner_is_a_duplicate_on_mysql() {
    lost_race_on_mysql("lost_race_pool", false).await;
}

async fn lost_race_on_mysql(name: &str, older_snapshot: bool) {
    let Some(pool) = common::mysql(name, 4).await else {
        return;
    };
    idem::create_results_table::<Order, _>(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();

    // The winner: another instance, its transition and result written, not yet committed.
    let mut winner = pool.begin().await.unwrap();
    let moved = sqlx::query(
        "UPDATE orders SET status = 'PAID', version = version + 1 \
         WHERE order_id = 1 AND status = 'CREATED'",
    )
    .execute(&mut *winner)
    .await
    .unwrap();
    assert_eq!(moved.rows_affected(), 1);
    sqlx::query(
        "INSERT INTO idem_results (machine, entity_key, from_state, to_state, result) \
         VALUES (?, '1', 'CREATED', 'PAID', '\"winner\"')",
    )
    .bind(<Order as idem::Machine>::DEFINITION.id)
    .execute(&mut *winner)
    .await
    .unwrap();

    let loser = {
        let pool = pool.clone();
        tokio::spawn(async move {
            if !older_snapshot {
                return pay_on_mysql(&pool, 1).await;
            }
            let mut tx = pool.begin().await?;
            // The snapshot: the row is CREATED in it.
            let seen: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = 1")
                .fetch_one(&mut *tx)
                .await?;
            assert_eq!(seen, "CREATED");
            let outcome = pay_on_mysql(&mut tx, 1).await?;
            tx.commit().await?;
            Ok::<_, idem::Error<sqlx::Error>>(outcome)
        })
    };
    // Commit only once the loser's UPDATE runs, waiting for the winner's row lock (were it
    // to start just after the commit, it would still read the committed row, and the
    // snapshot would still be older).
    let mut waited = Duration::ZERO;
    loop {
        // (A transaction that has only read is not in `innodb_trx` on MariaDB: the
        // statement's own connection tells.)
        let blocked: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE db = DATABASE() AND info LIKE 'UPDATE `orders`%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if blocked == 1 {
            break;
        }
        assert!(
            waited < Duration::from_secs(10),
            "the loser never waited for the row lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    winner.commit().await.unwrap();

    let outcome = loser.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        Outcome::AlreadyDone {
            current: Order::Paid,
            first_result: Some("winner".to_owned())
        }
    );
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "the loser's body must not run");
}
