//! The three-node MariaDB Galera cluster of `scripts/galera`, for the tests that race on
//! its nodes and kill one.
//!
//! The tests run when `IDEM_TEST_GALERA_URLS` lists the nodes' URLs, comma-separated
//! (`scripts/galera urls` prints them); with `IDEM_TEST_REQUIRE_SERVERS=1` (as in CI) an
//! unset variable is a failure, never a silent skip. Every test gets a database of its
//! own, made on the first node (Galera replicates the DDL to the others).
//!
//! Include it with `#[path = "common/galera.rs"] mod galera_cluster;`.

#![allow(dead_code)]

use crate::common;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use std::time::{Duration, Instant};

/// The tests that use the cluster take turns: one of them kills a node.
pub static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The nodes' URLs, or `None` (test skipped) when they are not given and servers are
/// optional.
pub fn urls() -> Option<Vec<String>> {
    match std::env::var("IDEM_TEST_GALERA_URLS") {
        Ok(urls) if !urls.is_empty() => {
            let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
            assert_eq!(
                urls.len(),
                3,
                "IDEM_TEST_GALERA_URLS lists three nodes: {urls:?}"
            );
            Some(urls)
        }
        _ if common::require_servers() => panic!(
            "IDEM_TEST_GALERA_URLS is not set (scripts/galera start; scripts/galera urls), \
             and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
        ),
        _ => {
            eprintln!(
                "skipped: start scripts/galera and set IDEM_TEST_GALERA_URLS to run the Galera tests"
            );
            None
        }
    }
}

/// A fresh database `idem_test_{name}` holding `tables` (and idem's own tables), and a pool
/// of `max_connections` on it per node. Reads on each connection wait until the node has
/// applied what the cluster committed before them (`wsrep_sync_wait`), so that a test sees
/// on one node what it committed on another.
pub async fn pools(name: &str, tables: &str, max_connections: u32) -> Option<Vec<MySqlPool>> {
    let urls = urls()?;
    // A test that killed a node and failed before it restarted it left it down.
    script(&["heal"]).await;
    let database = format!("idem_test_{name}");
    let mut admin: sqlx::MySqlConnection = sqlx::Connection::connect(&urls[0])
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the Galera node {}: {e}", urls[0]));
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}; USE {database}; {tables}"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    drop(admin);
    let mut pools = Vec::new();
    for url in &urls {
        pools.push(pool(&common::on_database(url, &database), max_connections).await);
    }
    idem::migrate(&pools[0]).await.unwrap();
    Some(pools)
}

/// A pool on one node that gives up on a connection within 2 s (a node that is down is
/// an error soon, which a client takes to another node).
pub async fn pool(url: &str, max_connections: u32) -> MySqlPool {
    // The DDL that made the database reached this node in the cluster's order, perhaps a
    // moment after the first node answered: wait for it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let made = MySqlPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(2))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(conn, "SET SESSION wsrep_sync_wait = 1").await?;
                    Ok(())
                })
            })
            .connect(url)
            .await;
        match made {
            Ok(pool) => return pool,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect to the Galera node {url}: {e}"),
        }
    }
}

/// Runs `scripts/galera` with `args`, and fails the test if it fails.
pub async fn script(args: &[&str]) {
    common::script("galera", args).await;
}
