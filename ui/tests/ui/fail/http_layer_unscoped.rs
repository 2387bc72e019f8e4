use axum::Router;
use axum::routing::post;
use idem::http::{IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use sqlx::{Sqlite, SqlitePool};

async fn create_order(_tx: Tx<Sqlite>) -> &'static str {
    "created"
}

// A layer that says neither `.principal(…)` nor `.unscoped()` would put every caller's keys
// in one scope, by omission.
fn app(pool: SqlitePool) -> Router {
    let keys = IdempotencyLayer::new(pool, Inbox::new("orders-api").unwrap());
    Router::new().route("/orders", post(create_order).layer(keys))
}

fn main() {
    let _ = app;
}
