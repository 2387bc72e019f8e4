//! Model-based test: random schedules of deliveries run against the real database and
//! against a small reference model of the state machine; both must agree on every outcome,
//! every final state and every effect.
//!
//! A schedule is a list of groups; the deliveries of a group run concurrently, on their own
//! tasks and connections. A delivery is a transition (pay, ship or cancel an order) called
//! directly, optionally with an expected version, or consumed as a message through the
//! inbox; its body may fail; it may crash (its task panics) at one of idem's fault points.
//! Messages repeat (there are only a dozen), so schedules are full of duplicates, arrive in
//! every order, and race each other.
//!
//! The model runs a group's deliveries one after another. Concurrency is correct when some
//! order of the group explains what the database did: each delivery's outcome, and the
//! state after the group. Every order is tried.
//!
//! SQLite (a file, four connections) always runs; PostgreSQL when configured, with each of
//! its classification forms (`idem::Classification`). Failing schedules are shrunk by
//! proptest and saved in `tests/model.regressions`, which is replayed first on every run;
//! cases worth keeping are also written out below as plain tests. `PROPTEST_CASES` sets
//! how many schedules run (48 by default).

mod common;
#[path = "common/harness.rs"]
mod harness;

use harness::{Harness, config, harness};
use idem::StateMachine;
use idem::fault::FaultPoint;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Once, OnceLock};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[machine(
    table = "orders",
    key = "order_id",
    state = "status",
    version = "version"
)]
pub enum Order {
    #[state(name = "CREATED", to(Paid, Cancelled))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
    #[state(name = "CANCELLED")]
    Cancelled,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Created => "CREATED",
            Order::Paid => "PAID",
            Order::Shipped => "SHIPPED",
            Order::Cancelled => "CANCELLED",
        }
    }

    /// The declared graph, written out again: the model does not ask idem.
    fn reaches(self, other: Order) -> bool {
        use Order::*;
        matches!(
            (self, other),
            (Created, Paid) | (Created, Shipped) | (Created, Cancelled) | (Paid, Shipped)
        )
    }
}

/// The orders that exist; [`MISSING`] does not.
const ORDERS: [i64; 3] = [1, 2, 3];
const MISSING: i64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Pay,
    Ship,
    Cancel,
}

impl Op {
    fn from(self) -> Order {
        match self {
            Op::Pay | Op::Cancel => Order::Created,
            Op::Ship => Order::Paid,
        }
    }

    fn to(self) -> Order {
        match self {
            Op::Pay => Order::Paid,
            Op::Ship => Order::Shipped,
            Op::Cancel => Order::Cancelled,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Pay => "pay",
            Op::Ship => "ship",
            Op::Cancel => "cancel",
        }
    }
}

/// One delivery of a schedule.
#[derive(Debug, Clone)]
pub struct Call {
    order: i64,
    op: Op,
    /// Consumed through the inbox (message `order:{order}:{op}`), or called directly.
    inbox: bool,
    /// A direct call's expected version.
    expected: Option<i64>,
    /// The body writes its effect, then returns an error.
    fails: bool,
    /// The task panics at this point, if the call passes it.
    crash: Option<FaultPoint>,
}

impl Call {
    fn message(&self) -> String {
        format!("order:{}:{}", self.order, self.op.name())
    }
}

type Schedule = Vec<Vec<Call>>;

fn call() -> impl Strategy<Value = Call> {
    let order = prop_oneof![6 => prop::sample::select(ORDERS.to_vec()), 1 => Just(MISSING)];
    let op = prop_oneof![Just(Op::Pay), Just(Op::Ship), Just(Op::Cancel)];
    let expected = prop_oneof![3 => Just(None), 1 => (0..=2i64).prop_map(Some)];
    let crash = prop_oneof![
        8 => Just(None),
        1 => Just(Some(FaultPoint::Recorded)),
        1 => Just(Some(FaultPoint::Transitioned)),
        1 => Just(Some(FaultPoint::BodyDone)),
        1 => Just(Some(FaultPoint::Committed)),
    ];
    (
        order,
        op,
        any::<bool>(),
        expected,
        prop::bool::weighted(0.15),
        crash,
    )
        .prop_map(|(order, op, inbox, expected, fails, crash)| Call {
            order,
            op,
            inbox,
            // The inbox form takes no version guard.
            expected: if inbox { None } else { expected },
            fails,
            crash,
        })
}

fn schedule() -> impl Strategy<Value = Schedule> {
    prop::collection::vec(prop::collection::vec(call(), 1..=3), 1..=14)
}

// ---------------------------------------------------------------------------------------
// What a delivery saw, in terms both sides can produce.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The body ran and committed; its result is the delivery's id.
    Applied(usize),
    AlreadyDone {
        current: Order,
        first: Option<usize>,
    },
    NotYet {
        current: Order,
    },
    IllegalState {
        current: Order,
    },
    NotFound,
    StaleVersion {
        expected: i64,
        actual: i64,
    },
    /// Through the inbox: this delivery moved the row and ran the body.
    Processed(usize),
    /// Through the inbox: the message, or its transition, was done before; the first
    /// result, replayed.
    Duplicate(Option<usize>),
    /// Through the inbox: the transition refused the message (not yet, illegal, not
    /// found); nothing recorded.
    Refused(Box<Seen>),
    /// The body's error.
    Failed,
    /// The task panicked at its fault point; the caller saw nothing.
    Crashed,
}

/// The state both sides end a group in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// order → (state, version)
    orders: BTreeMap<i64, (String, i64)>,
    /// (order, op) → the ids of the deliveries whose effect committed
    effects: BTreeMap<(i64, String), Vec<i64>>,
    /// inbox records: message key → the first result it replays
    records: BTreeMap<String, Option<usize>>,
}

// ---------------------------------------------------------------------------------------
// The reference model.

#[derive(Debug, Clone)]
struct Model {
    orders: BTreeMap<i64, (Order, i64)>,
    /// The first result of each transition of each order: the id of the delivery.
    results: BTreeMap<(i64, Op), usize>,
    /// The inbox's records: message → the first result it replays.
    records: BTreeMap<String, Option<usize>>,
    effects: BTreeMap<(i64, String), Vec<i64>>,
}

impl Model {
    fn new() -> Model {
        Model {
            orders: ORDERS.iter().map(|&o| (o, (Order::Created, 0))).collect(),
            results: BTreeMap::new(),
            records: BTreeMap::new(),
            effects: BTreeMap::new(),
        }
    }

    /// The outcome of the transition alone, `None` if the row would move.
    fn refusal(&self, call: &Call) -> Option<Seen> {
        let Some(&(current, version)) = self.orders.get(&call.order) else {
            return Some(Seen::NotFound);
        };
        let (from, to) = (call.op.from(), call.op.to());
        if current == to || to.reaches(current) {
            let first = self.results.get(&(call.order, call.op)).copied();
            return Some(Seen::AlreadyDone { current, first });
        }
        if current != from {
            return Some(if current.reaches(from) {
                Seen::NotYet { current }
            } else {
                Seen::IllegalState { current }
            });
        }
        match call.expected {
            Some(expected) if expected != version => Some(Seen::StaleVersion {
                expected,
                actual: version,
            }),
            _ => None,
        }
    }

    /// Runs one delivery to its end, as idem promises to.
    fn deliver(&mut self, id: usize, call: &Call) -> Seen {
        let crashes_at = |point| call.crash == Some(point);
        let message = call.message();
        if call.inbox {
            if let Some(&recorded) = self.records.get(&message) {
                return Seen::Duplicate(recorded);
            }
            if crashes_at(FaultPoint::Recorded) {
                return Seen::Crashed;
            }
        }
        match self.refusal(call) {
            None => {}
            Some(Seen::AlreadyDone { first, .. }) if call.inbox => {
                // Done before, by another message or call: the record keeps the
                // transition's first result, and this delivery replays it.
                self.records.insert(message, first);
                return Seen::Duplicate(first);
            }
            Some(refused) if call.inbox => return Seen::Refused(Box::new(refused)),
            Some(refused) => return refused,
        }
        if crashes_at(FaultPoint::Transitioned) {
            return Seen::Crashed;
        }
        if call.fails {
            return Seen::Failed;
        }
        if crashes_at(FaultPoint::BodyDone) {
            return Seen::Crashed;
        }
        let row = self.orders.get_mut(&call.order).unwrap();
        *row = (call.op.to(), row.1 + 1);
        self.results.insert((call.order, call.op), id);
        let kind = call.op.name().to_owned();
        self.effects
            .entry((call.order, kind))
            .or_default()
            .push(id as i64);
        if call.inbox {
            self.records.insert(message, Some(id));
        }
        if crashes_at(FaultPoint::Committed) {
            return Seen::Crashed;
        }
        if call.inbox {
            Seen::Processed(id)
        } else {
            Seen::Applied(id)
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            orders: self
                .orders
                .iter()
                .map(|(&o, &(state, version))| (o, (state.name().to_owned(), version)))
                .collect(),
            effects: self.effects.clone(),
            records: self.records.clone(),
        }
    }
}

/// Every order of `items`.
fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for (i, &first) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first);
            all.push(tail);
        }
    }
    all
}

/// Finds every serial order of the group that explains what the database did, from every
/// model still consistent with the database, and keeps the models they lead to. Several
/// orders (and so several models) may explain one group equally; each is carried forward
/// until a later group tells them apart, so the check never bets on one of them.
fn explain(
    models: &mut Vec<Model>,
    group: &[(usize, Call)],
    seen: &[Seen],
    after: &Snapshot,
) -> Result<(), TestCaseError> {
    let mut tried = Vec::new();
    let mut consistent: Vec<Model> = Vec::new();
    for model in models.iter() {
        for order in permutations(&(0..group.len()).collect::<Vec<_>>()) {
            let mut candidate = model.clone();
            let mut expected = vec![Seen::Crashed; group.len()];
            for &i in &order {
                let (id, call) = &group[i];
                expected[i] = candidate.deliver(*id, call);
            }
            if expected == seen && candidate.snapshot() == *after {
                if !consistent.iter().any(|m| m.same_as(&candidate)) {
                    consistent.push(candidate);
                }
            } else {
                tried.push((order, expected, candidate.snapshot()));
            }
        }
    }
    if consistent.is_empty() {
        return Err(TestCaseError::fail(format!(
            "no order of the group explains the database\n\
             group: {group:#?}\nthe database said: {seen:#?}\nand holds: {after:#?}\n\
             the models, in every order: {tried:#?}"
        )));
    }
    *models = consistent;
    Ok(())
}

impl Model {
    /// Whether two models are in the same state (and so will agree on everything next).
    fn same_as(&self, other: &Model) -> bool {
        self.orders == other.orders
            && self.results == other.results
            && self.records == other.records
            && self.effects == other.effects
    }
}

// ---------------------------------------------------------------------------------------
// Crashes: the fault hook panics on the task of a delivery that asked for it.

tokio::task_local! {
    static CRASH_AT: Option<FaultPoint>;
}

/// The panic payload of a crash.
struct Crash;

fn crash_hook(point: FaultPoint) {
    if CRASH_AT.try_with(|at| *at == Some(point)).unwrap_or(false) {
        std::panic::panic_any(Crash);
    }
}

fn install_crash_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        idem::fault::set_hook(crash_hook);
        // A crash is expected: keep its panic out of the test output.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Crash>().is_none() {
                default(info);
            }
        }));
    });
}

/// A delivery's task ended: its outcome, or [`Seen::Crashed`] if it crashed.
fn joined(result: Result<Seen, tokio::task::JoinError>) -> Seen {
    match result {
        Ok(seen) => seen,
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            if payload.downcast_ref::<Crash>().is_some() {
                Seen::Crashed
            } else {
                std::panic::resume_unwind(payload)
            }
        }
        Err(e) => panic!("a delivery's task was cancelled: {e}"),
    }
}

/// The body's result: the id of the delivery that ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt(usize);

fn seen_outcome(outcome: idem::Outcome<Receipt, Order>) -> Seen {
    match outcome {
        idem::Outcome::Applied(Receipt(id)) => Seen::Applied(id),
        idem::Outcome::AlreadyDone {
            current,
            first_result,
        } => Seen::AlreadyDone {
            current,
            first: first_result.map(|r| r.0),
        },
        idem::Outcome::NotYet { current, .. } => Seen::NotYet { current },
        idem::Outcome::IllegalState { current, .. } => Seen::IllegalState { current },
        idem::Outcome::NotFound => Seen::NotFound,
        idem::Outcome::StaleVersion { expected, actual } => Seen::StaleVersion { expected, actual },
        // No handler here has a watermark (tests/event_streams.rs models those).
        other @ idem::Outcome::Superseded { .. } => panic!("without a watermark: {other:?}"),
    }
}

fn seen_error(error: idem::Error<sqlx::Error>) -> Seen {
    match error {
        idem::Error::Handler(_) => Seen::Failed,
        other => panic!("unexpected error: {other}"),
    }
}

macro_rules! backend {
    ($module:ident, $db:ty) => {
        backend!($module, $db, positional = false);
    };
    ($module:ident, $db:ty, positional = $positional:expr) => {
        pub mod $module {
            use super::*;
            use idem::inbox::{Delivery, Inbox, MessageKey};
            use sqlx::{Pool, Transaction};

            type P = Pool<$db>;

            async fn body(
                tx: &mut Transaction<'_, $db>,
                order_id: i64,
                kind: &str,
                id: usize,
                fails: bool,
            ) -> Result<Receipt, sqlx::Error> {
                sqlx::query(common::placed($positional, "INSERT INTO effects (order_id, kind, amount) VALUES ($1, $2, $3)"))
                    .bind(order_id)
                    .bind(kind)
                    .bind(id as i64)
                    .execute(&mut **tx)
                    .await?;
                if fails {
                    return Err(sqlx::Error::Protocol("the body failed".into()));
                }
                Ok(Receipt(id))
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID", version = "expected")]
            async fn pay(tx: &mut Transaction<'_, $db>, order_id: i64, expected: Option<i64>, id: usize, fails: bool)
                -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "pay", id, fails).await
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "PAID", to = "SHIPPED", version = "expected")]
            async fn ship(tx: &mut Transaction<'_, $db>, order_id: i64, expected: Option<i64>, id: usize, fails: bool)
                -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "ship", id, fails).await
            }

            #[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED", version = "expected")]
            async fn cancel(tx: &mut Transaction<'_, $db>, order_id: i64, expected: Option<i64>, id: usize, fails: bool)
                -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "cancel", id, fails).await
            }

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload",
                machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
            async fn pay_message(tx: &mut Transaction<'_, $db>, inbox: &Inbox, key: &MessageKey, payload: &[u8],
                order_id: i64, id: usize, fails: bool) -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "pay", id, fails).await
            }

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload",
                machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
            async fn ship_message(tx: &mut Transaction<'_, $db>, inbox: &Inbox, key: &MessageKey, payload: &[u8],
                order_id: i64, id: usize, fails: bool) -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "ship", id, fails).await
            }

            #[idem::idempotent(inbox = "inbox", message = "key", payload = "payload",
                machine = Order, key = "order_id", from = "CREATED", to = "CANCELLED")]
            async fn cancel_message(tx: &mut Transaction<'_, $db>, inbox: &Inbox, key: &MessageKey, payload: &[u8],
                order_id: i64, id: usize, fails: bool) -> Result<Receipt, sqlx::Error> {
                body(tx, order_id, "cancel", id, fails).await
            }

            async fn deliver(pool: P, inbox: Inbox, id: usize, call: Call) -> Seen {
                let (order, fails) = (call.order, call.fails);
                if !call.inbox {
                    let handled = match call.op {
                        Op::Pay => pay(&pool, order, call.expected, id, fails).await,
                        Op::Ship => ship(&pool, order, call.expected, id, fails).await,
                        Op::Cancel => cancel(&pool, order, call.expected, id, fails).await,
                    };
                    return handled.map_or_else(seen_error, seen_outcome);
                }
                let key = MessageKey::new(call.message()).unwrap();
                let payload = call.op.name().as_bytes();
                let consumed = match call.op {
                    Op::Pay => pay_message(&pool, &inbox, &key, payload, order, id, fails).await,
                    Op::Ship => ship_message(&pool, &inbox, &key, payload, order, id, fails).await,
                    Op::Cancel => cancel_message(&pool, &inbox, &key, payload, order, id, fails).await,
                };
                match consumed {
                    Ok(Delivery::Processed(Receipt(id))) => Seen::Processed(id),
                    Ok(Delivery::Duplicate { first_result }) => {
                        Seen::Duplicate(first_result.map(|r| r.0))
                    }
                    Ok(Delivery::Refused(refusal)) => {
                        Seen::Refused(Box::new(seen_outcome(refusal.into_outcome())))
                    }
                    Ok(other) => panic!("unexpected delivery: {other:?}"),
                    Err(e) => seen_error(e),
                }
            }

            async fn snapshot(pool: &P) -> Snapshot {
                let orders: Vec<(i64, String, i64)> =
                    sqlx::query_as("SELECT order_id, status, version FROM orders")
                        .fetch_all(pool)
                        .await
                        .unwrap();
                let effects: Vec<(i64, String, i64)> =
                    sqlx::query_as("SELECT order_id, kind, amount FROM effects ORDER BY amount")
                        .fetch_all(pool)
                        .await
                        .unwrap();
                // Each record with what it replays: the first result (a delivery's id).
                let records: Vec<(String, Option<String>)> =
                    sqlx::query_as(if $positional {
                        // sqlx reads a `_bin` column as bytes.
                        "SELECT CAST(message_key AS CHAR), result FROM idem_inbox WHERE status = 'SUCCESS'"
                    } else {
                        "SELECT message_key, result FROM idem_inbox WHERE status = 'SUCCESS'"
                    })
                        .fetch_all(pool)
                        .await
                        .unwrap();
                let replayed = |json: Option<String>| {
                    json.map(|json| serde_json::from_str::<Receipt>(&json).unwrap().0)
                };
                let mut snapshot = Snapshot {
                    orders: orders.into_iter().map(|(o, s, v)| (o, (s, v))).collect(),
                    records: records.into_iter().map(|(key, json)| (key, replayed(json))).collect(),
                    ..Snapshot::default()
                };
                for (order, kind, id) in effects {
                    snapshot.effects.entry((order, kind)).or_default().push(id);
                }
                snapshot
            }

            async fn reset(pool: &P) {
                for statement in [
                    "DELETE FROM orders",
                    "DELETE FROM effects",
                    "DELETE FROM idem_inbox",
                    "DELETE FROM idem_results",
                    "INSERT INTO orders (order_id, status, version) VALUES \
                     (1, 'CREATED', 0), (2, 'CREATED', 0), (3, 'CREATED', 0)",
                ] {
                    sqlx::query(statement).execute(pool).await.unwrap();
                }
            }

            /// Runs `schedule` on the database and checks each group against the model.
            pub async fn run(pool: &P, schedule: &Schedule) -> Result<(), TestCaseError> {
                install_crash_hook();
                reset(pool).await;
                let inbox = Inbox::new("model").unwrap();
                let mut models = vec![Model::new()];
                let mut next_id = 0;
                for group in schedule {
                    let group: Vec<(usize, Call)> = group
                        .iter()
                        .map(|call| {
                            next_id += 1;
                            (next_id, call.clone())
                        })
                        .collect();
                    let tasks: Vec<_> = group
                        .iter()
                        .map(|(id, call)| {
                            let delivery = deliver(pool.clone(), inbox.clone(), *id, call.clone());
                            tokio::spawn(CRASH_AT.scope(call.crash, delivery))
                        })
                        .collect();
                    let mut seen = Vec::new();
                    for task in tasks {
                        seen.push(joined(task.await));
                    }
                    explain(&mut models, &group, &seen, &snapshot(pool).await)?;
                }
                Ok(())
            }
        }
    };
}

backend!(on_sqlite, sqlx::Sqlite);
backend!(on_postgres, sqlx::Postgres);
backend!(on_mysql, sqlx::MySql, positional = true);

fn sqlite() -> &'static Harness<sqlx::SqlitePool> {
    static HARNESS: OnceLock<Harness<sqlx::SqlitePool>> = OnceLock::new();
    HARNESS.get_or_init(|| {
        harness(async || {
            let pool = common::sqlite_file("model", 4).await;
            idem::migrate(&pool).await.unwrap();
            pool
        })
    })
}

fn postgres() -> Option<&'static Harness<sqlx::PgPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::PgPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::postgres_url()?;
            Some(harness(async || {
                let pool = common::postgres("model", 4).await.unwrap();
                idem::migrate(&pool).await.unwrap();
                pool
            }))
        })
        .as_ref()
}

fn mysql() -> Option<&'static Harness<sqlx::MySqlPool>> {
    static HARNESS: OnceLock<Option<Harness<sqlx::MySqlPool>>> = OnceLock::new();
    HARNESS
        .get_or_init(|| {
            common::mysql_url()?;
            Some(harness(async || {
                let pool = common::mysql("model", 4).await.unwrap();
                idem::migrate(&pool).await.unwrap();
                pool
            }))
        })
        .as_ref()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mysql_agrees_with_the_model(schedule in schedule()) {
        if let Some(h) = mysql() {
            h.runtime.block_on(on_mysql::run(&h.pool, &schedule))?;
        }
    }

    #[test]
    fn sqlite_agrees_with_the_model(schedule in schedule()) {
        let h = sqlite();
        h.runtime.block_on(on_sqlite::run(&h.pool, &schedule))?;
    }

    /// Each schedule runs with one of PostgreSQL's classification forms (the only test in
    /// this binary they affect): all three must give the model's outcomes.
    #[test]
    fn postgres_agrees_with_the_model(
        schedule in schedule(),
        classification in prop_oneof![
            Just(idem::Classification::Adaptive),
            Just(idem::Classification::Inline),
            Just(idem::Classification::OnMiss),
        ],
    ) {
        if let Some(h) = postgres() {
            idem::set_postgres_classification(classification);
            h.runtime.block_on(on_postgres::run(&h.pool, &schedule))?;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Schedules worth keeping, written out.

fn call_of(order: i64, op: Op) -> Call {
    Call {
        order,
        op,
        inbox: false,
        expected: None,
        fails: false,
        crash: None,
    }
}

/// The model itself: a crash after the commit applies; a duplicate through the inbox
/// replays the first result; a refused transition is not recorded; a message whose
/// transition was done by a direct call is recorded with that call's result.
#[test]
fn the_model_keeps_idems_promises() {
    let mut model = Model::new();
    let crashed = Call {
        crash: Some(FaultPoint::Committed),
        inbox: true,
        ..call_of(1, Op::Pay)
    };
    assert_eq!(model.deliver(1, &crashed), Seen::Crashed);
    assert_eq!(
        model.deliver(
            2,
            &Call {
                crash: None,
                ..crashed.clone()
            }
        ),
        Seen::Duplicate(Some(1))
    );
    assert_eq!(
        model.deliver(3, &call_of(1, Op::Pay)),
        Seen::AlreadyDone {
            current: Order::Paid,
            first: Some(1)
        }
    );
    let early_ship = Call {
        inbox: true,
        ..call_of(2, Op::Ship)
    };
    assert_eq!(
        model.deliver(4, &early_ship),
        Seen::Refused(Box::new(Seen::NotYet {
            current: Order::Created
        }))
    );
    assert!(!model.records.contains_key(&early_ship.message()));
    assert_eq!(model.deliver(5, &call_of(MISSING, Op::Pay)), Seen::NotFound);
    let cancel = Call {
        inbox: true,
        ..call_of(1, Op::Cancel)
    };
    assert_eq!(
        model.deliver(6, &cancel),
        Seen::Refused(Box::new(Seen::IllegalState {
            current: Order::Paid
        }))
    );
    assert_eq!(model.deliver(7, &call_of(3, Op::Pay)), Seen::Applied(7));
    let pay_message = Call {
        inbox: true,
        ..call_of(3, Op::Pay)
    };
    assert_eq!(model.deliver(8, &pay_message), Seen::Duplicate(Some(7)));
    assert_eq!(model.records[&pay_message.message()], Some(7));
    assert_eq!(model.effects.values().map(Vec::len).sum::<usize>(), 2);
}
