use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{Committed, IdempotencyLayer, Shared, Tx};
use idem::inbox::Inbox;
use sqlx::{Sqlite, SqlitePool};

async fn create_order(tx: Tx<Sqlite>) -> Committed<&'static str> {
    tx.commit("created")
}

// Either choice compiles, and shows in the layer's type.
fn app(pool: SqlitePool) -> Router {
    let per_caller: IdempotencyLayer<Sqlite> =
        IdempotencyLayer::new(pool.clone(), Inbox::new("a").unwrap()).principal(|parts| {
            parts
                .headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or(StatusCode::UNAUTHORIZED)
        });
    let shared: IdempotencyLayer<Sqlite, Shared> =
        IdempotencyLayer::new(pool, Inbox::new("b").unwrap()).unscoped();
    Router::new()
        .route("/orders", post(create_order).layer(per_caller))
        .route("/internal", post(create_order).layer(shared))
}

fn main() {
    let _ = app;
}
