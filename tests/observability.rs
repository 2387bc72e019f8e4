//! Every call in a `tracing` span with its machine, transition, group and outcome (the key
//! only when allowed), the body's events inside it; counters through the `metrics` facade;
//! records stuck past their lease. A real subscriber and a real recorder, written here,
//! receive them from a real SQLite database.

mod common;
#[path = "common/redis.rs"]
mod redis_server;

use idem::inbox::{Claimed, Delivery, Inbox, ManualClock, MessageKey};
use idem::{Outcome, StateMachine};
use sqlx::{Sqlite, Transaction};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

#[derive(StateMachine, Debug, Clone, Copy, PartialEq, Eq)]
#[machine(table = "orders", key = "order_id", state = "status")]
pub enum Order {
    #[state(name = "CREATED", to(Paid))]
    Created,
    #[state(name = "PAID", to(Shipped))]
    Paid,
    #[state(name = "SHIPPED")]
    Shipped,
}

#[idem::idempotent(machine = Order, key = "order_id", from = "CREATED", to = "PAID")]
async fn pay(tx: &mut Transaction<'_, Sqlite>, order_id: i64) -> Result<i64, sqlx::Error> {
    let _ = tx;
    tracing::info!(order_id, "paying");
    Ok(order_id)
}

#[idem::idempotent(inbox = "inbox", message = "key", payload = "payload",
    machine = Order, key = "order_id", from = "PAID", to = "SHIPPED")]
async fn ship(
    tx: &mut Transaction<'_, Sqlite>,
    inbox: &Inbox,
    key: &MessageKey,
    payload: &[u8],
    order_id: i64,
) -> Result<(), sqlx::Error> {
    let _ = (tx, payload);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A subscriber that keeps every span's fields and every event's span.

#[derive(Default)]
struct Captured {
    spans: Vec<(String, BTreeMap<String, String>)>,
    /// (event message, the name of the span it happened in)
    events: Vec<(String, Option<String>)>,
    stack: Vec<u64>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut captured = self.0.lock().unwrap();
        let mut fields = BTreeMap::new();
        span.record(&mut Fields(&mut fields));
        captured
            .spans
            .push((span.metadata().name().to_owned(), fields));
        Id::from_u64(captured.spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut captured = self.0.lock().unwrap();
        let fields = &mut captured.spans[span.into_u64() as usize - 1].1;
        values.record(&mut Fields(fields));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut captured = self.0.lock().unwrap();
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let within = captured
            .stack
            .last()
            .map(|id| captured.spans[*id as usize - 1].0.clone());
        let message = fields.remove("message").unwrap_or_default();
        captured.events.push((message, within));
    }
    fn enter(&self, span: &Id) {
        self.0.lock().unwrap().stack.push(span.into_u64());
    }
    fn exit(&self, _: &Id) {
        self.0.lock().unwrap().stack.pop();
    }
}

impl Capture {
    /// The `idem` spans, by their fields.
    fn idem_spans(&self) -> Vec<BTreeMap<String, String>> {
        let captured = self.0.lock().unwrap();
        captured
            .spans
            .iter()
            .filter(|(name, _)| name == "idem")
            .map(|(_, fields)| fields.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// A recorder that keeps every counter, by name and labels.

#[derive(Clone, Default)]
struct Counters(Arc<Mutex<BTreeMap<String, Arc<AtomicU64>>>>);

struct Cell(Arc<AtomicU64>);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(Cell(self.cell(key))))
    }
    /// A gauge's value is kept as the bits of its `f64`; read with [`Counters::gauge`].
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(Cell(self.cell(key))))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

impl metrics::GaugeFn for Cell {
    fn increment(&self, value: f64) {
        let now = f64::from_bits(self.0.load(Ordering::Relaxed));
        self.0.store((now + value).to_bits(), Ordering::Relaxed);
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

impl Counters {
    /// The cell of the series `name{label=value,…}` (labels sorted).
    fn cell(&self, key: &metrics::Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        let cells = self.0.lock().unwrap();
        cells
            .get(name)
            .map(|cell| f64::from_bits(cell.load(Ordering::Relaxed)))
    }

    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |cell| cell.load(Ordering::Relaxed))
    }
}

/// Runs `test` on a current-thread runtime, with `capture` as the subscriber and `counters`
/// as the recorder of this thread (where every task of that runtime runs).
fn observed(capture: &Capture, counters: &Counters, test: impl AsyncFnOnce()) {
    // `idem::set_trace_keys` is process-wide: these tests take turns.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dispatch = tracing::Dispatch::new(capture.clone());
    tracing::dispatcher::with_default(&dispatch, || {
        metrics::with_local_recorder(counters, || runtime.block_on(test()))
    });
}

async fn setup(name: &str) -> sqlx::SqlitePool {
    let pool = common::sqlite_file(name, 2).await;
    idem::migrate(&pool).await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, status) VALUES (1, 'CREATED'), (2, 'CREATED')")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

#[test]
fn a_transition_runs_in_a_span_with_its_outcome_and_the_body_inside() {
    let (capture, counters) = (Capture::default(), Counters::default());
    observed(&capture, &counters, async || {
        let pool = setup("observe-transition").await;
        assert_eq!(pay(&pool, 1).await.unwrap(), Outcome::Applied(1));
        assert!(matches!(
            pay(&pool, 1).await.unwrap(),
            Outcome::AlreadyDone { .. }
        ));
        assert_eq!(pay(&pool, 9).await.unwrap(), Outcome::NotFound);
    });
    let spans = capture.idem_spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    for span in &spans {
        assert_eq!(span["idem.machine"], "orders");
        assert_eq!(span["idem.transition"], "CREATED->PAID");
        assert_eq!(span["db.system.name"], "sqlite");
        assert!(
            !span.contains_key("idem.key"),
            "keys are not traced by default: {span:?}"
        );
    }
    let outcomes: Vec<&str> = spans.iter().map(|s| s["idem.outcome"].as_str()).collect();
    assert_eq!(outcomes, ["applied", "already_done", "not_found"]);
    // The body's event happened inside the call's span.
    let events = capture.0.lock().unwrap().events.clone();
    assert!(
        events.contains(&("paying".to_owned(), Some("idem".to_owned()))),
        "{events:?}"
    );
    let label = |outcome: &str| {
        format!("idem_outcomes_total{{machine=orders,outcome={outcome},transition=CREATED->PAID}}")
    };
    assert_eq!(counters.get(&label("applied")), 1);
    assert_eq!(counters.get(&label("already_done")), 1);
    assert_eq!(counters.get(&label("not_found")), 1);
}

#[test]
fn a_consumer_transition_reports_its_group_and_why_it_was_refused() {
    let (capture, counters) = (Capture::default(), Counters::default());
    observed(&capture, &counters, async || {
        idem::set_trace_keys(true);
        let pool = setup("observe-consumer").await;
        let inbox = Inbox::new("shipping").unwrap();
        let key = MessageKey::business("order:2", "ship").unwrap();
        let early = ship(&pool, &inbox, &key, b"s", 2).await;
        idem::set_trace_keys(false);
        assert!(matches!(early, Ok(Delivery::Refused(_))), "{early:?}");
    });
    let spans = capture.idem_spans();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = &spans[0];
    assert_eq!(span["messaging.consumer.group.name"], "shipping");
    assert_eq!(span["idem.transition"], "PAID->SHIPPED");
    assert_eq!(span["idem.outcome"], "not_yet");
    assert_eq!(span["idem.key"], "2", "keys are traced once allowed");
    assert_eq!(
        counters.get(
            "idem_outcomes_total{consumer_group=shipping,machine=orders,outcome=not_yet,transition=PAID->SHIPPED}"
        ),
        1
    );
}

#[test]
fn expired_leases_are_counted_as_stuck_and_takeovers_reach_the_recorder() {
    let (capture, counters) = (Capture::default(), Counters::default());
    observed(&capture, &counters, async || {
        let pool = setup("observe-stuck").await;
        let clock = ManualClock::new(1_000_000);
        let inbox = Inbox::new("payouts")
            .unwrap()
            .lease(Duration::from_secs(30))
            .clock(clock.clone());
        for n in 0..3 {
            let key = MessageKey::new(format!("payout:{n}")).unwrap();
            let Claimed::Work(_lease) = inbox.claim::<_, i64>(&pool, &key, b"p").await.unwrap()
            else {
                panic!("a first claim works");
            };
            // The worker dies: the lease is dropped, never completed.
        }
        assert_eq!(
            inbox.stuck(&pool).await.unwrap().count,
            0,
            "leases still running"
        );
        assert_eq!(
            counters.gauge("idem_inbox_stuck{consumer_group=payouts}"),
            Some(0.0)
        );
        clock.advance(Duration::from_secs(31));
        let stuck = inbox.stuck(&pool).await.unwrap();
        assert_eq!(stuck.count, 3);
        assert_eq!(
            counters.gauge("idem_inbox_stuck{consumer_group=payouts}"),
            Some(3.0)
        );
        assert_eq!(stuck.oldest_lease_until_millis, Some(1_030_000));
        // A redelivery takes one over, and completes it.
        let key = MessageKey::new("payout:0").unwrap();
        let Claimed::Work(lease) = inbox.claim::<_, i64>(&pool, &key, b"p").await.unwrap() else {
            panic!("an expired lease is taken over");
        };
        assert_eq!(inbox.stuck(&pool).await.unwrap().count, 2);
        assert_eq!(
            counters.gauge("idem_inbox_stuck{consumer_group=payouts}"),
            Some(2.0)
        );
        let lease = lease;
        assert!(lease.extend(&pool, Duration::from_secs(60)).await.unwrap());
        let done = lease.complete(&pool, Ok::<_, String>(7)).await.unwrap();
        assert_eq!(done, Delivery::Processed(7));
        // A day later, the finished record is purged in one batch.
        clock.advance(Duration::from_secs(2 * 86_400));
        let purged = inbox.purge(&pool, Duration::from_secs(86_400), 100).await;
        assert_eq!(purged.unwrap(), 1);
    });
    // The leased mode's units of work, and retention's, have their spans too.
    let outcomes: Vec<String> = capture
        .idem_spans()
        .iter()
        .map(|span| span["idem.outcome"].clone())
        .collect();
    assert_eq!(
        outcomes,
        [
            "claimed",
            "claimed",
            "claimed",
            "claimed",
            "extended",
            "processed",
            "purged"
        ]
    );
    assert_eq!(
        counters.get("idem_inbox_events_total{consumer_group=payouts,event=lease_takeover}"),
        1
    );
    assert_eq!(
        counters.get("idem_inbox_events_total{consumer_group=payouts,event=purged}"),
        1
    );
}

/// Fails every message of ordering key `"bad"`.
struct FailingBad;

impl idem::outbox::Publisher for FailingBad {
    async fn publish(
        &self,
        message: &idem::outbox::Outgoing,
    ) -> Result<idem::outbox::Published, idem::outbox::PublishError> {
        if message.ordering_key() == "bad" {
            return Err("refused".into());
        }
        Ok(idem::outbox::Published::Acked)
    }
}

#[test]
fn a_relay_batch_has_its_span_and_its_counters() {
    use idem::outbox::{Message, Relay};
    let (capture, counters) = (Capture::default(), Counters::default());
    observed(&capture, &counters, async || {
        let pool = setup("observability-outbox").await;
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for (id, key) in [("a", "good"), ("b", "other"), ("c", "bad")] {
            let message = Message::json("m", &1).id(id).ordering_key(key);
            idem::outbox::stage(&mut tx, message).await.unwrap();
        }
        tx.commit().await.unwrap();
        let relay = Relay::new(pool.clone(), FailingBad)
            .max_attempts(1)
            .backoff(Duration::ZERO, Duration::ZERO);
        let relayed = relay.run_once().await.unwrap();
        assert_eq!((relayed.published, relayed.failed, relayed.dead), (2, 1, 1));
    });
    let captured = capture.0.lock().unwrap();
    let batch = captured
        .spans
        .iter()
        .find(|(name, _)| name == "idem.outbox.relay")
        .map(|(_, fields)| fields.clone())
        .expect("a span per batch");
    assert_eq!(batch["db.system.name"], "sqlite");
    assert_eq!(batch["messaging.batch.message_count"], "3");
    assert_eq!(
        (
            batch["idem.published"].as_str(),
            batch["idem.failed"].as_str(),
            batch["idem.dead"].as_str()
        ),
        ("2", "1", "1")
    );
    let dead = captured.events.iter().any(|(message, within)| {
        message.contains("dead after its last attempt") && within.is_some()
    });
    assert!(dead, "the dead message is logged: {:?}", captured.events);
    drop(captured);
    assert_eq!(counters.get("idem_outbox_published_total{}"), 2);
    assert_eq!(counters.get("idem_outbox_failed_total{}"), 1);
    assert_eq!(counters.get("idem_outbox_dead_total{}"), 1);
}

/// A call answered from the cache says so in its span (`idem.cache`), and the cache's
/// reads and writes are counted.
#[test]
fn the_cache_answers_in_the_span_and_the_counters() {
    let Some(redis) = crate::redis_server::OwnRedis::start() else {
        return;
    };
    let (capture, counters) = (Capture::default(), Counters::default());
    observed(&capture, &counters, async || {
        let pool = setup("observability-cache").await;
        let cache = idem::cache::Redis::open(&redis.url(), "observed")
            .unwrap()
            .read_timeout(Duration::from_millis(250));
        cache.attach(&pool).await.unwrap();
        assert_eq!(pay(&pool, 1).await.unwrap(), Outcome::Applied(1));
        while cache.stats().writes == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            pay(&pool, 1).await.unwrap(),
            Outcome::AlreadyDone {
                current: Order::Paid,
                first_result: Some(1)
            }
        );
    });
    let spans = capture.idem_spans();
    let fields: Vec<(&str, &str)> = spans
        .iter()
        .map(|s| (s["idem.outcome"].as_str(), s["idem.cache"].as_str()))
        .collect();
    assert_eq!(fields, [("applied", "miss"), ("already_done", "hit")]);
    assert!(
        !spans[1].contains_key("db.system.name"),
        "a hit opens no connection: {spans:#?}"
    );
    assert_eq!(counters.get("idem_cache_reads_total{result=miss}"), 1);
    assert_eq!(counters.get("idem_cache_reads_total{result=hit}"), 1);
    assert_eq!(counters.get("idem_cache_writes_total{result=ok}"), 1);
    assert_eq!(
        counters.get(
            "idem_outcomes_total{machine=orders,outcome=already_done,transition=CREATED->PAID}"
        ),
        1
    );
}
