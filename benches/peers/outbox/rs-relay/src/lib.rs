//! ruststream-sqlx's relay, as its Relay guide (examples/guide/relay.rs) builds it: an inbox table
//! with a `partition_key`, written in the producer's transaction, and a `reply` subscription that
//! publishes each row to another broker (here NATS JetStream through ruststream-nats); the
//! acknowledgement deletes the row.

use std::error::Error;
use std::num::NonZeroUsize;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ruststream::runtime::RunningApp;
use ruststream_nats::{JetStreamPublish, NatsBroker};
use ruststream_sqlx::prelude::*;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub type BoxError = Box<dyn Error + Send + Sync>;

/// One row of `rs_events`: an event waiting for the relay, keyed by its ordering key.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "rs_events")]
pub struct RsEvent {
    #[field(id, generated)]
    id: i64,
    #[field(partition_key)]
    key: String,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// The message relayed (the same small JSON as the other crates').
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Outgoing)]
#[outgoing(name = "RS.m")]
pub struct Payload {
    pub n: u64,
    pub key: String,
}

#[subscriber(InboxQueue::<RsEvent>::new("rs-events").poll_interval(Duration::from_millis(10)), reply)]
async fn relay(event: &Payload) -> Payload {
    event.clone()
}

pub struct Rs {
    pub pool: PgPool,
}

impl Rs {
    pub async fn connect(url: &str, schema: &str, max_conns: u32) -> Result<Rs, BoxError> {
        let admin = PgPool::connect(url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}"
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        let options: PgConnectOptions = url.parse()?;
        let options = options.options([("search_path", schema)]);
        let pool = PgPoolOptions::new()
            .max_connections(max_conns)
            .connect_with(options)
            .await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS rs_events (
                id BIGSERIAL PRIMARY KEY,
                key TEXT NOT NULL,
                locked_until TIMESTAMPTZ,
                payload BYTEA NOT NULL
            );
            CREATE INDEX IF NOT EXISTS rs_events_key ON rs_events (key, id);",
        )
        .execute(&pool)
        .await?;
        Ok(Rs { pool })
    }

    pub async fn reset(&self) -> Result<(), BoxError> {
        sqlx::query("TRUNCATE rs_events")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Starts the relay service (broker connects, subscription opens) and hands back its handle.
    pub async fn start(
        &self,
        nats_url: &str,
        stream: &str,
        workers: usize,
    ) -> Result<RunningApp, BoxError> {
        let broker = SqlxBroker::new(self.pool.clone());
        let bus = NatsBroker::new(nats_url).bindable();
        let to_bus = bus.bind(JetStreamPublish::default().expect_stream(stream.to_owned()));
        let app = RustStream::new(AppInfo::new("peers-rs-relay", "0.1.0"))
            .with_broker(broker, |b| {
                b.include(relay.workers_by_key(NonZeroUsize::new(workers).expect("workers > 0")))
                    .out_reply(to_bus);
            })
            .with_broker(bus, |_b| {});
        Ok(app.start().await?)
    }

    /// Stages `n` events (ordering key `k{i % keys}`) in one transaction and commits it.
    pub async fn stage(&self, n: u64, keys: u64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        for i in 0..n {
            let key = format!("k{}", i % keys);
            let event = RsEvent {
                id: 0,
                key: key.clone(),
                locked_until: None,
                payload: serde_json::to_vec(&Payload { n: i, key })?,
            };
            event.insert(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn pending(&self) -> Result<i64, BoxError> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM rs_events")
            .fetch_one(&self.pool)
            .await?)
    }
}
