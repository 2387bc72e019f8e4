//! An order workflow replayed the way production delivers it: payment callbacks the
//! provider retries, a late callback after shipping, a ship message that overtakes its
//! payment, cancels, an unknown order id, and retries racing each other on several tasks.
//!
//! One set of `#[idempotent]` handlers on `sqlx::Any` serves SQLite and PostgreSQL. At the
//! end the example counts every side effect in the database and exits non-zero if one
//! happened twice or never.
//!
//! ```text
//! cargo run --example orders                      # embedded SQLite, a fresh temp file
//! cargo run --example orders -- --database-url postgres://postgres@127.0.0.1:5432/test
//! ```
//!
//! On PostgreSQL everything lives in the schema `idem_orders_example`, dropped and
//! recreated at each run.

#[path = "support/database.rs"]
mod database;

use idem::{Machine, Outcome, OutcomeKind, StateMachine, idempotent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::{Any, AnyPool, Transaction};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::error::Error;
use std::fmt::Debug;
use std::ops::RangeInclusive;
use std::time::Duration;

const SCHEMA: &str = "idem_orders_example";
const ORDERS: i64 = 50;
/// Orders whose payment callback is delivered by several consumers at the same moment.
const RACED: RangeInclusive<i64> = 31..=40;
/// How many consumers race on each of those callbacks.
const RACERS: usize = 5;
/// An id no order has: a callback meant for another environment, say.
const UNKNOWN_ORDER: i64 = 9_999;

/// The workflow, declared once; the derive checks it and every handler against it at
/// compile time (a handler `from = "SHIPPED", to = "PAID"` would not build).
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

/// What `pay` returns. idem stores it with the transition, so a duplicate callback gets
/// this very receipt back (the same payment id), not a second payment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
    amount: i64,
}

// The bodies below run only in the call that moves the row, inside the transaction that
// moves it: the effect row and the state change commit together or not at all. Every
// other call (a duplicate, a message in the wrong state) runs no body and writes nothing.

// The handlers are associated functions of the machine: in `impl Order` the attribute
// needs no `machine = …` (`Self` is the machine), and they are called `Order::pay(…)`.
impl Order {
    /// The payment provider's callback: CREATED → PAID, records the payment.
    #[idempotent(key = "order_id", from = "CREATED", to = "PAID")]
    async fn pay(
        tx: &mut Transaction<'_, Any>,
        order_id: i64,
        amount: i64,
    ) -> Result<Receipt, sqlx::Error> {
        let payment_id = sqlx::query_scalar(
            "INSERT INTO payments (order_id, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(order_id)
        .bind(amount)
        .fetch_one(&mut **tx)
        .await?;
        Ok(Receipt { payment_id, amount })
    }

    /// The warehouse's "handed to the carrier": PAID → SHIPPED, returns the shipment id.
    #[idempotent(key = "order_id", from = "PAID", to = "SHIPPED")]
    async fn ship(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("INSERT INTO shipments (order_id) VALUES ($1) RETURNING id")
            .bind(order_id)
            .fetch_one(&mut **tx)
            .await
    }

    /// The customer cancels: CREATED → CANCELLED, returns the cancellation id. A paid order
    /// cannot be cancelled here (refunds are another workflow), so that comes out
    /// IllegalState.
    #[idempotent(key = "order_id", from = "CREATED", to = "CANCELLED")]
    async fn cancel(tx: &mut Transaction<'_, Any>, order_id: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("INSERT INTO cancellations (order_id) VALUES ($1) RETURNING id")
            .bind(order_id)
            .fetch_one(&mut **tx)
            .await
    }
}

/// A message from the outside world, as a consumer receives it.
#[derive(Debug, Clone, Copy)]
enum Event {
    Pay { order_id: i64, amount: i64 },
    Ship { order_id: i64 },
    Cancel { order_id: i64 },
}

/// What a delivery came out as, for which order: one variant per handler, since each
/// handler has its own result type.
enum Delivered {
    Pay(i64, Outcome<Receipt, Order>),
    Ship(i64, Outcome<i64, Order>),
    Cancel(i64, Outcome<i64, Order>),
}

/// Delivers one event as a consumer would: call the handler, and retry only the errors a
/// retry can cure (a busy database, a serialization failure, a dropped connection).
/// Retrying blindly is safe precisely because the handlers are idempotent.
async fn deliver(pool: &AnyPool, event: Event) -> Result<Delivered, idem::Error<sqlx::Error>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let delivered = match event {
            Event::Pay { order_id, amount } => Order::pay(pool, order_id, amount)
                .await
                .map(|outcome| Delivered::Pay(order_id, outcome)),
            Event::Ship { order_id } => Order::ship(pool, order_id)
                .await
                .map(|outcome| Delivered::Ship(order_id, outcome)),
            Event::Cancel { order_id } => Order::cancel(pool, order_id)
                .await
                .map(|outcome| Delivered::Cancel(order_id, outcome)),
        };
        match delivered {
            Err(e) if e.is_transient() && attempt < 5 => {
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            other => return other,
        }
    }
}

/// One order's story: what arrives about it, in the order it arrives, and where it ends.
struct Story {
    order_id: i64,
    events: Vec<Event>,
    ends: Order,
    told: &'static str,
}

fn amount(order_id: i64) -> i64 {
    1_000 + 10 * order_id
}

fn stories() -> Vec<Story> {
    use Order::*;
    (1..=ORDERS)
        .map(|order_id| {
            let pay = Event::Pay {
                order_id,
                amount: amount(order_id),
            };
            let ship = Event::Ship { order_id };
            let cancel = Event::Cancel { order_id };
            let (events, ends, told) = match order_id {
                // The warehouse's message overtakes the payment: not yet, since the order is
                // not PAID yet but can still be; the broker redelivers it after the payment
                // and it applies.
                5 | 15 | 25 => (
                    vec![ship, pay, ship],
                    Shipped,
                    "ship too early: not yet; pay; ship again",
                ),
                // Some retried callbacks arrive after shipping; some ships are redelivered.
                1..=30 if order_id % 6 == 0 => (
                    vec![pay, pay, ship, pay, ship],
                    Shipped,
                    "pay, pay, ship, late pay, ship again",
                ),
                // The provider retries every callback once.
                1..=30 => (
                    vec![pay, pay, ship],
                    Shipped,
                    "pay, pay (provider retry), ship",
                ),
                // Paid by RACERS concurrent deliveries (see `main`), then a cancel: refused.
                31..=35 => (vec![cancel], Paid, "5 racing pays; cancel: refused"),
                36..=40 => (vec![pay], Paid, "5 racing pays; one more, late"),
                41..=44 => (vec![cancel, pay], Cancelled, "cancel; a late pay: refused"),
                45..=48 => (
                    vec![cancel, cancel],
                    Cancelled,
                    "cancel, cancel (double click)",
                ),
                49 => (vec![], Created, "nothing arrived"),
                _ => (vec![ship], Created, "only a premature ship: not yet"),
            };
            Story {
                order_id,
                events,
                ends,
                told,
            }
        })
        .collect()
}

/// Mixes the stories as a broker would: orders interleaved at random (seeded, so every run
/// is the same), each order's own messages in its story's order.
fn interleave(stories: &[Story], rng: &mut StdRng) -> Vec<Event> {
    let unknown = [
        Event::Pay {
            order_id: UNKNOWN_ORDER,
            amount: 1,
        },
        Event::Ship {
            order_id: UNKNOWN_ORDER,
        },
    ];
    let mut queues: Vec<VecDeque<Event>> = stories
        .iter()
        .map(|story| story.events.iter().copied().collect())
        .chain([unknown.into_iter().collect()])
        .filter(|queue: &VecDeque<Event>| !queue.is_empty())
        .collect();
    let mut stream = Vec::new();
    while !queues.is_empty() {
        let i = rng.random_range(0..queues.len());
        stream.extend(queues[i].pop_front());
        if queues[i].is_empty() {
            queues.swap_remove(i);
        }
    }
    stream
}

/// What one handler's calls returned, kept to check the replays against the first result.
struct Results<T> {
    /// Per order, the result of every call that applied: there must be at most one.
    applied: HashMap<i64, Vec<T>>,
    /// Per order, what each duplicate got replayed.
    replayed: Vec<(i64, Option<T>)>,
    /// The IllegalState refusals: in production, each one is an alert (a bug or a
    /// workflow gap), never something to retry.
    refused: Vec<String>,
}

impl<T> Default for Results<T> {
    fn default() -> Self {
        Results {
            applied: HashMap::new(),
            replayed: Vec::new(),
            refused: Vec::new(),
        }
    }
}

impl<T> Results<T> {
    fn record(&mut self, order_id: i64, outcome: Outcome<T, Order>) -> OutcomeKind {
        let kind = outcome.kind();
        match outcome {
            Outcome::Applied(result) => self.applied.entry(order_id).or_default().push(result),
            // A duplicate: ack it, with the first call's result.
            Outcome::AlreadyDone { first_result, .. } => {
                self.replayed.push((order_id, first_result))
            }
            // Came early (a ship before its pay): in production, nack with a delay and let
            // the broker redeliver it; the replay below delivers it again.
            Outcome::NotYet { .. } => {}
            Outcome::IllegalState { current, from, to } => self.refused.push(format!(
                "order {order_id}: {} → {} refused, the order is {}",
                from.as_db(),
                to.as_db(),
                current.as_db()
            )),
            // NotFound is the caller's business (here: park the message). StaleVersion needs
            // an expected version and Superseded a watermark, which these handlers do not
            // take.
            Outcome::NotFound | Outcome::StaleVersion { .. } | Outcome::Superseded { .. } => {}
        }
        kind
    }
}

#[derive(Default)]
struct Tally {
    calls: BTreeMap<(&'static str, OutcomeKind), usize>,
    pay: Results<Receipt>,
    ship: Results<i64>,
    cancel: Results<i64>,
}

impl Tally {
    fn record(&mut self, delivered: Delivered) {
        let (handler, kind) = match delivered {
            Delivered::Pay(order_id, o) => ("pay", self.pay.record(order_id, o)),
            Delivered::Ship(order_id, o) => ("ship", self.ship.record(order_id, o)),
            Delivered::Cancel(order_id, o) => ("cancel", self.cancel.record(order_id, o)),
        };
        *self.calls.entry((handler, kind)).or_default() += 1;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let (pool, backend) = connect(parse_args()).await?;
    let stories = stories();
    let mut tally = Tally::default();

    // 1. The provider's retries of the same callback reach several consumers at once:
    //    RACERS tasks per order, all started together, each on its own connection.
    let mut racers = tokio::task::JoinSet::new();
    for order_id in RACED {
        for _ in 0..RACERS {
            let pool = pool.clone();
            let event = Event::Pay {
                order_id,
                amount: amount(order_id),
            };
            racers.spawn(async move { deliver(&pool, event).await });
        }
    }
    while let Some(joined) = racers.join_next().await {
        tally.record(joined??);
    }

    // 2. Everything else, from one broker, in a shuffled but per-order faithful sequence.
    let stream = interleave(&stories, &mut StdRng::seed_from_u64(7));
    for &event in &stream {
        tally.record(deliver(&pool, event).await?);
    }

    println!("idem `examples/orders.rs` on {backend}");
    println!(
        "{ORDERS} orders; {} racing pay calls, then {} events from one broker",
        RACED.count() * RACERS,
        stream.len()
    );
    report_calls(&tally);

    let db = Db::load(&pool).await?;
    report_orders(&db, &stories);
    let problems = check(&db, &stories, &tally);
    if !problems.is_empty() {
        eprintln!("FAILED: side effects duplicated or lost:");
        for problem in &problems {
            eprintln!("  {problem}");
        }
        std::process::exit(1);
    }
    println!(
        "\neffects: {} payments, {} shipments, {} cancellations, each exactly once: OK",
        db.payments.values().flatten().count(),
        db.shipments.values().flatten().count(),
        db.cancellations.values().flatten().count()
    );
    let replays =
        tally.pay.replayed.len() + tally.ship.replayed.len() + tally.cancel.replayed.len();
    println!("replays: {replays} duplicates, each answered with the first call's result: OK");
    Ok(())
}

fn report_calls(tally: &Tally) {
    use OutcomeKind::*;
    let kinds = [
        Applied,
        AlreadyDone,
        NotYet,
        IllegalState,
        NotFound,
        StaleVersion,
    ];
    print!("\n{:<8}", "calls");
    for kind in kinds {
        print!("{:>15}", kind.as_str());
    }
    println!();
    for handler in ["pay", "ship", "cancel"] {
        print!("{handler:<8}");
        for kind in kinds {
            print!("{:>15}", tally.calls.get(&(handler, kind)).unwrap_or(&0));
        }
        println!();
    }
    println!("\nrefused as illegal_state (nothing written), for instance:");
    for (handler, refused) in [
        ("pay", &tally.pay.refused),
        ("ship", &tally.ship.refused),
        ("cancel", &tally.cancel.refused),
    ] {
        if let Some(first) = refused.first() {
            println!("  {handler:<7}{first}");
        }
    }
}

/// What the database holds at the end: per order its state and version, and the ids of
/// its rows in each effect table.
struct Db {
    orders: BTreeMap<i64, (Order, i64)>,
    payments: HashMap<i64, Vec<i64>>,
    shipments: HashMap<i64, Vec<i64>>,
    cancellations: HashMap<i64, Vec<i64>>,
}

impl Db {
    async fn load(pool: &AnyPool) -> Result<Db, Box<dyn Error>> {
        let mut orders = BTreeMap::new();
        let rows: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT order_id, status, version FROM orders")
                .fetch_all(pool)
                .await?;
        for (order_id, status, version) in rows {
            let state =
                Order::from_db(&status).ok_or(format!("order {order_id}: state {status:?}"))?;
            orders.insert(order_id, (state, version));
        }
        Ok(Db {
            orders,
            payments: effect_rows(pool, "payments").await?,
            shipments: effect_rows(pool, "shipments").await?,
            cancellations: effect_rows(pool, "cancellations").await?,
        })
    }
}

async fn effect_rows(pool: &AnyPool, table: &str) -> Result<HashMap<i64, Vec<i64>>, sqlx::Error> {
    let sql = format!("SELECT order_id, id FROM {table} ORDER BY id");
    let mut by_order: HashMap<i64, Vec<i64>> = HashMap::new();
    for (order_id, id) in sqlx::query_as::<_, (i64, i64)>(&sql)
        .fetch_all(pool)
        .await?
    {
        by_order.entry(order_id).or_default().push(id);
    }
    Ok(by_order)
}

fn report_orders(db: &Db, stories: &[Story]) {
    let counts: Vec<String> = Order::DEFINITION
        .states
        .iter()
        .map(|name| {
            let n = db
                .orders
                .values()
                .filter(|(state, _)| state.as_db() == *name)
                .count();
            format!("{name} {n}")
        })
        .collect();
    println!("\nfinal states: {}", counts.join(", "));
    println!("order  state      version  payment  shipment  what arrived");
    let first = |rows: &HashMap<i64, Vec<i64>>, order_id| match rows.get(&order_id) {
        Some(ids) => format!("#{}", ids[0]),
        None => "-".to_owned(),
    };
    for story in stories
        .iter()
        .filter(|s| [1, 5, 6, 31, 36, 41, 45, 50].contains(&s.order_id))
    {
        let id = story.order_id;
        let (state, version) = db.orders[&id];
        println!(
            "{id:>5}  {:<9}  {version:>7}  {:>7}  {:>8}  {}",
            state.as_db(),
            first(&db.payments, id),
            first(&db.shipments, id),
            story.told
        );
    }
}

/// Every side effect exactly once: the effect tables agree with the final states, with
/// what the applied calls returned, and every duplicate was replayed the first result.
fn check(db: &Db, stories: &[Story], tally: &Tally) -> Vec<String> {
    let mut problems = Vec::new();
    for story in stories {
        let id = story.order_id;
        let Some(&(state, _)) = db.orders.get(&id) else {
            problems.push(format!("order {id} is gone"));
            continue;
        };
        if state != story.ends {
            problems.push(format!(
                "order {id} is {}, expected {}",
                state.as_db(),
                story.ends.as_db()
            ));
        }
        // What the final state says must have happened to this order, exactly once.
        let paid = matches!(state, Order::Paid | Order::Shipped);
        let shipped = state == Order::Shipped;
        let cancelled = state == Order::Cancelled;
        let effects = [
            ("payments", &db.payments, paid),
            ("shipments", &db.shipments, shipped),
            ("cancellations", &db.cancellations, cancelled),
        ];
        for (what, rows, should) in effects {
            let n = rows.get(&id).map_or(0, Vec::len);
            if n != usize::from(should) {
                problems.push(format!(
                    "order {id} is {}: {n} {what}, expected {}",
                    state.as_db(),
                    usize::from(should)
                ));
            }
        }
    }
    check_handler(
        "payment",
        &tally.pay,
        |r| r.payment_id,
        &db.payments,
        &mut problems,
    );
    check_handler(
        "shipment",
        &tally.ship,
        |&id| id,
        &db.shipments,
        &mut problems,
    );
    check_handler(
        "cancellation",
        &tally.cancel,
        |&id| id,
        &db.cancellations,
        &mut problems,
    );
    problems
}

/// One handler: applied at most once per order, its effect rows exactly the ones the
/// applied calls reported (`effect_id` reads the row id from a result), and each
/// duplicate replayed the applied call's result.
fn check_handler<T: PartialEq + Debug>(
    what: &str,
    results: &Results<T>,
    effect_id: fn(&T) -> i64,
    rows: &HashMap<i64, Vec<i64>>,
    problems: &mut Vec<String>,
) {
    let orders: BTreeSet<i64> = results.applied.keys().chain(rows.keys()).copied().collect();
    for order_id in orders {
        let returned: Vec<i64> = results
            .applied
            .get(&order_id)
            .into_iter()
            .flatten()
            .map(effect_id)
            .collect();
        let stored = rows.get(&order_id).cloned().unwrap_or_default();
        if returned.len() > 1 || returned != stored {
            problems.push(format!(
                "order {order_id}: {what} rows {stored:?}, applied calls returned {returned:?}"
            ));
        }
    }
    for (order_id, replayed) in &results.replayed {
        let first = results
            .applied
            .get(order_id)
            .and_then(|applied| applied.first());
        if replayed.as_ref() != first {
            problems.push(format!(
                "order {order_id}: a duplicate {what} replayed {replayed:?}, \
                 the first call returned {first:?}"
            ));
        }
    }
}

/// `--database-url URL`, or `None` for the default embedded SQLite file.
fn parse_args() -> Option<String> {
    let mut args = std::env::args().skip(1);
    let mut url = None;
    while let Some(arg) = args.next() {
        if arg == "--database-url" {
            url = Some(
                args.next()
                    .unwrap_or_else(|| usage("--database-url needs a value")),
            );
        } else if let Some(value) = arg.strip_prefix("--database-url=") {
            url = Some(value.to_owned());
        } else {
            usage(&format!("unexpected argument {arg:?}"));
        }
    }
    url
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage: cargo run --example orders [-- --database-url postgres://USER@HOST/DB]"
    );
    std::process::exit(2)
}

/// A pool on a fresh database holding the example's tables; and a line saying which.
async fn connect(database_url: Option<String>) -> Result<(AnyPool, String), Box<dyn Error>> {
    let fresh = database::connect(database_url, "idem-orders-example.db", SCHEMA).await?;
    let id = fresh.identity();
    let database::Fresh { pool, backend, .. } = fresh;

    // `orders` is the machine's table: key, state, and the version idem bumps on each
    // transition. The effect tables have no UNIQUE (order_id), on purpose: the check at the
    // end shows that idem alone keeps one payment per order. (In production, add it anyway.)
    sqlx::raw_sql(&format!(
        "CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT NOT NULL,
                              version BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE payments (id {id}, order_id BIGINT NOT NULL, amount BIGINT NOT NULL);
         CREATE TABLE shipments (id {id}, order_id BIGINT NOT NULL);
         CREATE TABLE cancellations (id {id}, order_id BIGINT NOT NULL);"
    ))
    .execute(&pool)
    .await?;
    // Where idem keeps each transition's first result, to replay it to duplicates.
    idem::create_results_table::<Order, _>(&pool).await?;

    let mut tx = pool.begin().await?;
    for order_id in 1..=ORDERS {
        sqlx::query("INSERT INTO orders (order_id, status) VALUES ($1, $2)")
            .bind(order_id)
            .bind(Order::Created.as_db())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    // Refuse to start on a database the handlers cannot work with: every problem at once
    // (a missing column, a state the machine does not declare, …), not the first failing
    // transition.
    idem::verify::<Order, _>(&pool).await?.into_result()?;
    // And let the database refuse any other writer's UPDATE along no declared transition.
    idem::enforce::<Order, _>(&pool).await?;
    Ok((pool, backend))
}
