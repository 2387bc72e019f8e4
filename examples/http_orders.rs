//! An order service over HTTP whose POSTs are idempotent: `POST /orders` creates an order
//! once per `Idempotency-Key`, `POST /orders/{id}/pay` pays it once (an `#[idempotent]`
//! transition run in the request's transaction), and `GET /orders/{id}` reads it. The key
//! record, the handler's writes and the stored response commit in one transaction.
//! `GET /orders/new` serves an HTML form with a one-time token; its submit
//! (`POST /orders/form`) creates the order once, however often it is sent.
//!
//! ```text
//! cargo run -p idem --example http_orders                  # embedded SQLite, a fresh temp file
//! cargo run -p idem --example http_orders -- --database-url postgres://postgres@127.0.0.1:5432/test
//! cargo run -p idem --example http_orders -- --listen 127.0.0.1:8080
//! ```
//!
//! Then, from another terminal (the guide's HTTP page, `idem::guide::http`, shows these with
//! their answers):
//!
//! ```text
//! curl -i -X POST localhost:3000/orders -H 'Idempotency-Key: "order-1"' \
//!      -H 'Content-Type: application/json' -d '{"amount":1000}'
//! ```
//!
//! `?delay_ms=N` on `POST /orders` makes the handler take N ms (at most 10 s), to see the
//! 409 a repeat gets while the first request runs.
//!
//! On PostgreSQL everything lives in the schema `idem_http_example`, dropped and recreated
//! at each start.

#[path = "support/database.rs"]
mod database;

use axum::extract::{Form, Path, Query};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{FormTokens, IdempotencyLayer, Tx};
use idem::inbox::Inbox;
use idem::{Outcome, StateMachine, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{Any, AnyPool, Transaction};
use std::error::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SCHEMA: &str = "idem_http_example";

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

#[derive(Deserialize)]
struct NewOrder {
    amount: i64,
}

#[derive(Deserialize)]
struct Demo {
    delay_ms: Option<u64>,
}

#[derive(Serialize)]
struct OrderView {
    order_id: i64,
    amount: i64,
    status: String,
}

/// What paying returns; stored with the transition, so a second payment of the order (under
/// another key) gets this same receipt.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    order_id: i64,
    payment_id: String,
}

/// An error as `application/problem+json`.
fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Problem {
        r#type: &'static str,
        title: &'static str,
        status: u16,
        detail: String,
    }
    let body = serde_json::to_string(&Problem {
        r#type: "about:blank",
        title: status.canonical_reason().unwrap_or_default(),
        status: status.as_u16(),
        detail: detail.into(),
    })
    .unwrap_or_default();
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body,
    )
        .into_response()
}

fn database(e: sqlx::Error) -> Response {
    problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// `POST /orders`: one order per key.
async fn create_order(
    mut tx: Tx<Any>,
    Query(demo): Query<Demo>,
    Json(new): Json<NewOrder>,
) -> Response {
    if let Some(ms) = demo.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
    }
    if new.amount <= 0 {
        // Not stored: the handler answered without `tx.commit`, so a corrected request may
        // reuse the key.
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "amount must be positive");
    }
    let created = sqlx::query_scalar::<_, i64>(
        "INSERT INTO orders (amount, status, version) VALUES ($1, 'CREATED', 0) RETURNING order_id",
    )
    .bind(new.amount)
    .fetch_one(&mut **tx)
    .await;
    match created {
        // The response, and the order's insert to commit with it.
        Ok(order_id) => tx
            .commit((
                StatusCode::CREATED,
                [(header::LOCATION, format!("/orders/{order_id}"))],
                Json(OrderView {
                    order_id,
                    amount: new.amount,
                    status: "CREATED".to_owned(),
                }),
            ))
            .into_response(),
        Err(e) => database(e),
    }
}

/// `GET /orders/new`: a form whose token makes its submit run once.
async fn new_order_form(
    axum::extract::State(tokens): axum::extract::State<FormTokens>,
) -> Response {
    let token = tokens.issue();
    axum::response::Html(format!(
        "<form method=\"post\" action=\"/orders/form\">\n\
         <input name=\"amount\" value=\"1000\">\n\
         <input type=\"hidden\" name=\"{field}\" value=\"{token}\">\n\
         <button>Order</button>\n\
         </form>\n",
        field = tokens.field_name()
    ))
    .into_response()
}

/// `POST /orders/form`: the form's submit.
async fn submit_order_form(mut tx: Tx<Any>, Form(new): Form<NewOrder>) -> Response {
    let created = sqlx::query_scalar::<_, i64>(
        "INSERT INTO orders (amount, status, version) VALUES ($1, 'CREATED', 0) RETURNING order_id",
    )
    .bind(new.amount)
    .fetch_one(&mut **tx)
    .await;
    match created {
        Ok(order_id) => tx
            .commit((
                StatusCode::CREATED,
                axum::response::Html(format!("<p>Order {order_id} created.</p>\n")),
            ))
            .into_response(),
        Err(e) => database(e),
    }
}

/// The payment: at most once per order, whatever the keys.
#[idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay_order(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<Receipt, sqlx::Error> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let payment_id = format!("pay_{nanos:x}");
    sqlx::query("INSERT INTO payments (order_id, payment_id) VALUES ($1, $2)")
        .bind(order_id)
        .bind(&payment_id)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        order_id,
        payment_id,
    })
}

/// `POST /orders/{id}/pay`: an HTTP replay under the same key, an `AlreadyDone` under
/// another.
async fn pay(mut tx: Tx<Any>, Path(order_id): Path<i64>) -> Response {
    let answer = match pay_order(&mut *tx, order_id).await {
        Ok(Outcome::Applied(receipt)) => Json(receipt).into_response(),
        Ok(Outcome::AlreadyDone { first_result, .. }) => Json(first_result).into_response(),
        Ok(Outcome::NotFound) => problem(StatusCode::NOT_FOUND, format!("no order {order_id}")),
        Ok(refused) => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("order {order_id} cannot be paid: {refused:?}"),
        ),
        // Not committed: the payment's savepoint rolled back, and a retry runs again.
        Err(e) => return problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // Every answer of the transition is the request's to keep: a repeat replays it.
    tx.commit(answer).into_response()
}

/// `GET /orders/{id}`.
async fn show(
    axum::extract::State(pool): axum::extract::State<AnyPool>,
    Path(order_id): Path<i64>,
) -> Response {
    let row: Result<Option<(i64, String)>, _> =
        sqlx::query_as("SELECT amount, status FROM orders WHERE order_id = $1")
            .bind(order_id)
            .fetch_optional(&pool)
            .await;
    match row {
        Ok(Some((amount, status))) => Json(OrderView {
            order_id,
            amount,
            status,
        })
        .into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, format!("no order {order_id}")),
        Err(e) => database(e),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let (database_url, listen) = parse_args();
    let (pool, backend) = connect(database_url).await?;
    // Keys are scoped per caller: here the `X-Api-Key` header (callers without one share the
    // scope "anonymous"); a real service names the principal its authentication found.
    let keys = IdempotencyLayer::new(pool.clone(), Inbox::new("orders-api")?).principal(caller);
    keys.spawn_sweeper(Duration::from_secs(600))?;
    // One-time form tokens: signed, valid for an hour (within the 24 h retention). A real
    // service reads its secret from its configuration, the same on every instance.
    let tokens = FormTokens::new(
        b"example secret: read it from your configuration",
        Duration::from_secs(3600),
    )?;
    // A form token is the server's own unguessable key, so one scope for all is safe here.
    let forms = IdempotencyLayer::new(pool.clone(), Inbox::new("orders-forms")?)
        .unscoped()
        .form_tokens(tokens.clone())
        .wait(Duration::from_secs(10));
    let form_routes = Router::new()
        .route("/orders/new", get(new_order_form))
        .with_state(tokens);
    let app = Router::new()
        .route("/orders", post(create_order).layer(keys.clone()))
        .route("/orders/form", post(submit_order_form).layer(forms))
        .route("/orders/{id}/pay", post(pay).layer(keys))
        .route("/orders/{id}", get(show))
        .with_state(pool)
        .merge(form_routes);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!(
        "idem http_orders on {backend}: listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}

/// The caller whose keys a request's key is scoped to.
fn caller(parts: &axum::http::request::Parts) -> Result<String, StatusCode> {
    match parts.headers.get("x-api-key") {
        None => Ok("anonymous".to_owned()),
        Some(key) => key
            .to_str()
            .map(|key| format!("api-key:{key}"))
            .map_err(|_| StatusCode::UNAUTHORIZED),
    }
}

fn parse_args() -> (Option<String>, String) {
    let mut args = std::env::args().skip(1);
    let (mut url, mut listen) = (None, "127.0.0.1:3000".to_owned());
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--database-url" => url = Some(value("--database-url")),
            "--listen" => listen = value("--listen"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    (url, listen)
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage: cargo run -p idem --example http_orders [-- --database-url postgres://USER@HOST/DB] [--listen HOST:PORT]"
    );
    std::process::exit(2)
}

/// A pool on a fresh database holding the example's tables; and a line saying which.
async fn connect(database_url: Option<String>) -> Result<(AnyPool, String), Box<dyn Error>> {
    let fresh = database::connect(database_url, "idem-http-example.db", SCHEMA).await?;
    let id = fresh.identity();
    let database::Fresh { pool, backend, .. } = fresh;
    sqlx::raw_sql(&format!(
        "CREATE TABLE orders (order_id {id}, amount BIGINT NOT NULL, status TEXT NOT NULL,
                              version BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE payments (order_id BIGINT NOT NULL, payment_id TEXT NOT NULL);"
    ))
    .execute(&pool)
    .await?;
    idem::migrate(&pool).await?;
    Ok((pool, backend))
}
