//! `idem::console` mounted in a user's router (`/ops/idem`), over real HTTP on a SQLite file:
//! no request is served without the user's authorization; an action without the person's
//! token, with another person's, from another origin or site, or on a read-only console is
//! refused and changes nothing; every value is escaped; a requeue and a release do what the
//! CLI's do, as the person acting. Then in a real browser (headless Chromium through
//! chromedriver, `IDEM_TEST_CHROMEDRIVER` or `chromedriver` on the `PATH`): the pages load, a
//! dead message is requeued with a click and the relay publishes it once, a request without
//! authorization is refused, and a form on another site that posts to the console is refused
//! with nothing requeued. With `IDEM_CONSOLE_SCREENSHOTS=1` it saves a screenshot of each
//! page to `docs/console/`.

use crate::common;
use crate::http_client::{Reply, send, serve};

use idem::console::Console;
use idem::inbox::{Claimed, Inbox, MessageKey};
use idem::outbox::{self, Message, Outgoing, PublishError, Published, Publisher, Relay};
use sqlx::SqlitePool;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Refuses `a`, `b` and the message whose id is markup; acknowledges the rest.
struct Failing;

impl Publisher for Failing {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        match message.id() {
            "a" | "b" => Err("broker refused".into()),
            _ => Err("<script>alert('x')</script>".into()),
        }
    }
}

/// Acknowledges everything, counting each id.
#[derive(Clone, Default)]
struct Counting(Arc<Mutex<BTreeMap<String, u32>>>);

impl Publisher for Counting {
    async fn publish(&self, message: &Outgoing) -> Result<Published, PublishError> {
        *self
            .0
            .lock()
            .unwrap()
            .entry(message.id().to_owned())
            .or_default() += 1;
        Ok(Published::Acked)
    }
}

/// Who the session cookie names: `alice` and `bob`; nobody else.
fn authorize(head: &axum::http::request::Parts) -> Option<String> {
    let cookies = head.headers.get("cookie")?.to_str().ok()?;
    cookies.split(';').find_map(|c| match c.trim() {
        "session=alice-secret" => Some("alice".to_owned()),
        "session=bob-secret" => Some("bob".to_owned()),
        _ => None,
    })
}

/// A pool on a fresh SQLite file with three dead messages (`a`, `b` refused, one whose id
/// and error are markup) and a record held under a long lease.
async fn setup(name: &str) -> SqlitePool {
    let pool = common::sqlite_file(&format!("{name}_{}", common::next_id()), 2).await;
    idem::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for (id, key) in [("a", "ka"), ("b", "kb"), ("<b>x</b>", "kx")] {
        let message = Message::json("orders", &id).id(id).ordering_key(key);
        outbox::stage(&mut tx, message).await.unwrap();
    }
    tx.commit().await.unwrap();
    let failing = Relay::new(pool.clone(), Failing).max_attempts(1);
    while failing.run_once().await.unwrap().claimed > 0 {}
    let inbox = Inbox::new("billing")
        .unwrap()
        .lease(Duration::from_secs(3600));
    let key = MessageKey::new("held").unwrap();
    match inbox.claim::<_, String>(&pool, &key, b"{}").await.unwrap() {
        Claimed::Work(lease) => std::mem::forget(lease),
        Claimed::Done(done) => panic!("{done:?}"),
    }
    // More groups, for the pages to show: an HTTP layer's keys (one done, one stuck), a
    // consumer's parked and failed records.
    let claim = |inbox: Inbox, key: &'static str| {
        let pool = pool.clone();
        async move {
            let key = MessageKey::new(key).unwrap();
            match inbox.claim::<_, String>(&pool, &key, b"{}").await.unwrap() {
                Claimed::Work(lease) => lease,
                Claimed::Done(done) => panic!("{done:?}"),
            }
        }
    };
    let api = Inbox::new("orders-api").unwrap();
    let done = claim(api.clone(), "key-7f3a").await;
    let _ = done
        .complete(&pool, Ok::<_, String>("201".to_owned()))
        .await;
    let stuck = claim(api.clone().lease(Duration::from_millis(1)), "key-91c2").await;
    std::mem::forget(stuck);
    let shipping = Inbox::new("shipping").unwrap().max_attempts(2);
    for key in ["order-1041", "order-1042"] {
        let lease = claim(shipping.clone(), key).await;
        let _ = lease
            .complete(&pool, Err::<String, _>("carrier API timed out"))
            .await;
    }
    let lease = claim(shipping.clone(), "order-1041").await;
    let _ = lease
        .complete(&pool, Err::<String, _>("no such address"))
        .await;
    // An hour of the HTTP layer's keys, for the charts: each done, then set back to its
    // own moment in the hour (the tables keep when a record was last touched).
    for n in 0..48i64 {
        let key: &'static str = format!("req-{n:02}").leak();
        let lease = claim(api.clone(), key).await;
        let _ = lease
            .complete(&pool, Ok::<_, String>("201".to_owned()))
            .await;
        let back = (n * n * 1_531 + n * 7_919) % 3_500_000 + 60_000;
        sqlx::query("UPDATE idem_inbox SET updated_at = updated_at - ? WHERE message_key = ?")
            .bind(back)
            .bind(key)
            .execute(&pool)
            .await
            .unwrap();
    }
    pool
}

/// The HTTP layer's inbox as this instance saw it: a request repeated (a duplicate
/// answered) and its key reused with another body (a conflict), neither leaving a row.
async fn answered(pool: &SqlitePool) -> Inbox {
    let api = Inbox::new("orders-api").unwrap();
    let key = MessageKey::new("key-7f3a").unwrap();
    for body in [&b"{}"[..], b"{\"total\":2}"] {
        match api.claim::<_, String>(pool, &key, body).await.unwrap() {
            Claimed::Done(_) => {}
            Claimed::Work(_) => panic!("key-7f3a is done"),
        }
    }
    api
}

/// Serves `console` nested at `/ops/idem`, with a page of the user's own at `/`.
async fn mount(console: Console<sqlx::Sqlite>) -> SocketAddr {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the shop" }))
        .nest("/ops/idem", console.router());
    serve(app).await
}

async fn get(addr: SocketAddr, path: &str, cookie: &str) -> Reply {
    send(addr, "GET", path, &[("cookie", cookie.as_bytes())], "").await
}

async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &[u8])], form: &str) -> Reply {
    let mut headers = headers.to_vec();
    headers.push(("content-type", b"application/x-www-form-urlencoded"));
    send(addr, "POST", path, &headers, form).await
}

/// The form token a page carries.
fn token_of(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a form token") + 19;
    page[start..start + 64].to_owned()
}

async fn dead_ids(pool: &SqlitePool) -> Vec<String> {
    let mut ids: Vec<String> = outbox::dead(pool, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_console_serves_only_whom_the_user_authorizes_and_refuses_forged_actions() {
    let pool = setup("console_guard").await;
    let api = answered(&pool).await;
    let addr = mount(Console::new(pool.clone(), authorize).watch(&api)).await;
    let alice = "session=alice-secret";

    // Nobody without the user's authorization: 401, before anything is read.
    for path in [
        "/ops/idem",
        "/ops/idem/outbox",
        "/ops/idem/inbox",
        "/ops/idem/tables",
    ] {
        let refused = get(addr, path, "session=mallory").await;
        assert_eq!(refused.status, 401, "{path}");
        assert_eq!(refused.body, "not authorized");
        assert!(refused.header("content-security-policy").is_some());
    }
    let refused = post(addr, "/ops/idem/outbox", &[], "action=requeue&id=a").await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        get(addr, "/", "").await.body,
        "the shop",
        "the user's own routes"
    );

    // The pages, with links under the mount point, framed by nobody, cached nowhere.
    let overview = get(addr, "/ops/idem", alice).await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    assert!(
        overview.body.contains("href=\"/ops/idem/outbox\""),
        "{}",
        overview.body
    );
    assert!(overview.body.contains("billing"));
    // What the watched inbox answered in this instance: one duplicate, one key reused
    // with another body (flagged).
    assert!(
        overview.body.contains(
            "<tr><td>orders-api</td><td class=\"n\">0</td><td class=\"n\">1</td>\
             <td class=\"n\">50%</td><td class=\"n\"><span class=\"bad\">1</span></td>"
        ),
        "{}",
        overview.body
    );
    // The last hour's charts: a bar per five minutes, each record in the bar of its last
    // touch; the HTTP keys' hour spread over the bars.
    assert_eq!(overview.body.matches("<svg class=\"chart\"").count(), 3);
    assert!(
        overview
            .body
            .contains("<title>5m ago–now: 1 failed, 1 parked</title>"),
        "{}",
        overview.body
    );
    let api = &overview.body[overview.body.find("<td>orders-api</td><td><svg").unwrap()..];
    let api = &api[..api.find("</svg>").unwrap()];
    let done: u64 = api
        .split("<title>")
        .skip(1)
        .filter_map(|t| {
            t.split(": ")
                .nth(1)?
                .split(" done")
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(done, 49, "{api}");
    assert!(
        api.matches(" done").count() > 6,
        "spread over the hour: {api}"
    );
    assert_eq!(overview.header("x-frame-options"), Some("DENY"));
    assert_eq!(overview.header("cache-control"), Some("no-store"));
    assert!(
        overview
            .header("content-security-policy")
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    let tables = get(addr, "/ops/idem/tables", alice).await;
    assert!(
        tables.body.contains("0004_idem_outbox_due_at.sql"),
        "{}",
        tables.body
    );
    let outbox_page = get(addr, "/ops/idem/outbox", alice).await;
    assert!(outbox_page.body.contains("broker refused"));
    // Per destination: `orders` has three pending, the three dead, none held.
    assert!(
        outbox_page.body.contains(
            "<tr><td>orders</td><td class=\"n\">3</td><td class=\"n\">3</td><td class=\"n\">0</td>"
        ),
        "{}",
        outbox_page.body
    );
    // Markup in an id or an error is shown as text, never run.
    assert!(
        !outbox_page.body.contains("<script>alert"),
        "{}",
        outbox_page.body
    );
    assert!(
        outbox_page
            .body
            .contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;")
    );
    assert!(outbox_page.body.contains("&lt;b&gt;x&lt;/b&gt;"));
    let token = token_of(&outbox_page.body);
    let bob_token = token_of(
        &get(addr, "/ops/idem/outbox", "session=bob-secret")
            .await
            .body,
    );
    assert_ne!(token, bob_token, "a token is the person's");

    // Forged actions: each refused with 403, and nothing requeued.
    let cookie: &[u8] = alice.as_bytes();
    let host = addr.to_string();
    for (headers, form, why) in [
        (
            vec![("cookie", cookie)],
            "action=requeue&id=a".to_owned(),
            "carries no token",
        ),
        (
            vec![("cookie", cookie)],
            format!("action=requeue&id=a&csrf={bob_token}"),
            "not yours",
        ),
        (
            vec![
                ("cookie", cookie),
                ("origin", b"http://evil.example".as_slice()),
            ],
            format!("action=requeue&id=a&csrf={token}"),
            "another origin",
        ),
        (
            vec![
                ("cookie", cookie),
                ("sec-fetch-site", b"cross-site".as_slice()),
            ],
            format!("action=requeue&id=a&csrf={token}"),
            "another site",
        ),
    ] {
        let refused = post(addr, "/ops/idem/outbox", &headers, &form).await;
        assert_eq!(refused.status, 403, "{why}: {}", refused.body);
        assert!(refused.body.contains(why), "{why}: {}", refused.body);
    }
    assert_eq!(dead_ids(&pool).await, ["<b>x</b>", "a", "b"]);

    // Alice's own form: requeued as her, and back to the page with a note.
    let origin = format!("http://{host}");
    let done = post(
        addr,
        "/ops/idem/outbox",
        &[("cookie", cookie), ("origin", origin.as_bytes())],
        &format!("action=requeue&id=a&csrf={token}"),
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let location = done.header("location").unwrap().to_owned();
    assert!(
        location.starts_with("/ops/idem/outbox?note=alice%20requeued%201"),
        "{location}"
    );
    assert_eq!(dead_ids(&pool).await, ["<b>x</b>", "b"]);
    let back = get(addr, &location, alice).await;
    assert!(
        back.body.contains("alice requeued 1 dead message(s)"),
        "{}",
        back.body
    );
    // A note without the console's signature (a link from elsewhere) is not shown.
    let forged_note = location.replace("requeued%201", "requeued%2099");
    let shown = get(addr, &forged_note, alice).await;
    assert_eq!(shown.status, 200);
    assert!(!shown.body.contains("requeued 99"), "{}", shown.body);
    assert!(!shown.body.contains("id=\"note\""), "{}", shown.body);
    // A group by its error: the markup one discarded by its (escaped, then decoded) text.
    let done = post(
        addr,
        "/ops/idem/outbox",
        &[("cookie", cookie)],
        &format!("action=discard&error=%3Cscript%3Ealert(%27x%27)%3C%2Fscript%3E&csrf={token}"),
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(dead_ids(&pool).await, ["b"]);

    // A release, as Alice: the record says who.
    let inbox_page = get(addr, "/ops/idem/inbox", alice).await;
    assert!(
        inbox_page.body.contains("Release lease"),
        "{}",
        inbox_page.body
    );
    let done = post(
        addr,
        "/ops/idem/inbox",
        &[("cookie", cookie)],
        &format!("action=release&group=billing&key=held&csrf={token}"),
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let record = Inbox::new("billing")
        .unwrap()
        .record(&pool, &MessageKey::new("held").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.error.as_deref(), Some("lease released by alice"));
    let again = post(
        addr,
        "/ops/idem/inbox",
        &[("cookie", cookie)],
        &format!("action=revive&group=billing&key=held&csrf={token}"),
    )
    .await;
    assert!(
        again
            .header("location")
            .unwrap()
            .contains("no%20longer%20DEAD"),
        "{again:?}"
    );
}

/// On a database without idem's tables, each page says what is missing.
#[tokio::test]
async fn a_database_without_idems_tables_is_shown_as_such() {
    let pool = common::sqlite_file(&format!("console_bare_{}", common::next_id()), 1).await;
    let addr = mount(Console::new(pool, authorize)).await;
    let alice = "session=alice-secret";
    let overview = get(addr, "/ops/idem", alice).await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    assert!(overview.body.contains("not migrated"), "{}", overview.body);
    let outbox_page = get(addr, "/ops/idem/outbox", alice).await;
    assert!(
        outbox_page.body.contains("no outbox"),
        "{}",
        outbox_page.body
    );
    let inbox_page = get(addr, "/ops/idem/inbox", alice).await;
    assert!(inbox_page.body.contains("no inbox"), "{}", inbox_page.body);
    let tables = get(addr, "/ops/idem/tables", alice).await;
    assert!(
        tables.body.contains("there is no table `idem_results`"),
        "{}",
        tables.body
    );
}

#[tokio::test]
async fn a_read_only_console_shows_and_changes_nothing() {
    let pool = setup("console_read_only").await;
    let console = Console::new(pool.clone(), authorize).read_only();
    let addr = mount(console).await;
    let alice = "session=alice-secret";
    let page = get(addr, "/ops/idem/outbox", alice).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Read-only"), "{}", page.body);
    assert!(page.body.contains("broker refused"));
    assert!(!page.body.contains("<form"), "no buttons: {}", page.body);
    // A token from a console that is not read-only, with the same secret: still refused.
    let secret = [7u8; 32];
    let writable = mount(
        Console::new(pool.clone(), authorize)
            .secret(&secret)
            .unwrap(),
    )
    .await;
    let token = token_of(&get(writable, "/ops/idem/outbox", alice).await.body);
    let read_only = mount(
        Console::new(pool.clone(), authorize)
            .secret(&secret)
            .unwrap()
            .read_only(),
    )
    .await;
    let weak = Console::new(pool.clone(), authorize).secret(b"short");
    assert_eq!(weak.unwrap_err().len, 5);
    let refused = post(
        read_only,
        "/ops/idem/outbox",
        &[("cookie", alice.as_bytes())],
        &format!("action=requeue&id=a&csrf={token}"),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert!(refused.body.contains("read-only"));
    assert_eq!(dead_ids(&pool).await, ["<b>x</b>", "a", "b"]);
}

/// chromedriver, on a port of its own, killed with this.
struct Driver {
    child: std::process::Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts chromedriver, or `None` (skipped) when there is none and servers are optional.
async fn driver() -> Option<Driver> {
    let program =
        std::env::var("IDEM_TEST_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = match std::process::Command::new(&program)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if common::require_servers() => {
            panic!("cannot start {program} ({e}), and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping")
        }
        Err(_) => {
            eprintln!("skipped: install chromium and chromedriver (or set IDEM_TEST_CHROMEDRIVER)");
            return None;
        }
    };
    let driver = Driver { child, port };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Some(driver);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen on {port}");
}

/// A headless Chromium session.
async fn browser(driver: &Driver) -> fantoccini::Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,860", "--force-device-scale-factor=1"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    fantoccini::ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap()
}

/// Saves the page's screenshot as `docs/console/<name>.png` when asked to.
async fn screenshot(client: &fantoccini::Client, name: &str) {
    if std::env::var("IDEM_CONSOLE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let png = client.screenshot().await.unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_browser_a_click_requeues_and_a_forged_form_does_not() {
    let Some(driver) = driver().await else {
        return;
    };
    let pool = setup("console_browser").await;
    let api = answered(&pool).await;
    let addr = mount(Console::new(pool.clone(), authorize).watch(&api)).await;
    // A page on another site (another port is another origin) with a form that posts to
    // the console, as an attacker's would.
    let target = format!("http://localhost:{}/ops/idem/outbox", addr.port());
    let evil = serve(axum::Router::new().route(
        "/",
        axum::routing::get(move || async move {
            axum::response::Html(format!(
                "<form id=\"forged\" method=\"post\" action=\"{target}\">\
                 <input type=\"hidden\" name=\"action\" value=\"requeue\">\
                 <input type=\"hidden\" name=\"error\" value=\"broker refused\">\
                 <button>win a prize</button></form>"
            ))
        }),
    ))
    .await;
    let client = browser(&driver).await;
    // The console on `localhost`, the attacker's page on `127.0.0.1`: another site.
    let console = format!("http://localhost:{}/ops/idem", addr.port());

    // Without the session: refused.
    client.goto(&console).await.unwrap();
    let source = client.source().await.unwrap();
    assert!(source.contains("not authorized"), "{source}");

    // Signed in (the user's own session cookie), the pages load.
    // (Set by script on the console's host: chromedriver refuses a cookie for `localhost`
    // given by WebDriver's own command.)
    client
        .execute("document.cookie = 'session=alice-secret; path=/'", vec![])
        .await
        .unwrap();
    client.goto(&console).await.unwrap();
    let tiles = client
        .find(fantoccini::Locator::Id("tiles"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(tiles.contains("outbox dead"), "{tiles}");
    screenshot(&client, "overview").await;
    client.goto(&format!("{console}/inbox")).await.unwrap();
    assert!(client.source().await.unwrap().contains("Release lease"));
    screenshot(&client, "inbox").await;
    client.goto(&format!("{console}/tables")).await.unwrap();
    assert!(client.source().await.unwrap().contains("On migration"));
    screenshot(&client, "tables").await;
    client.goto(&format!("{console}/outbox")).await.unwrap();
    screenshot(&client, "outbox").await;

    // A click requeues `a`; the relay publishes it, once.
    client
        .find(fantoccini::Locator::XPath(
            "//table[@id='dead']//tr[td[1]='a']//button[text()='Requeue']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let note = match client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Id("note"))
        .await
    {
        Ok(note) => note.text().await.unwrap(),
        Err(e) => panic!("{e}: {}", client.source().await.unwrap()),
    };
    assert_eq!(note, "alice requeued 1 dead message(s)");
    assert_eq!(dead_ids(&pool).await, ["<b>x</b>", "b"]);
    let published = Counting::default();
    let relay = Relay::new(pool.clone(), published.clone());
    while relay.run_once().await.unwrap().claimed > 0 {}
    assert_eq!(
        *published.0.lock().unwrap(),
        BTreeMap::from([("a".to_owned(), 1)])
    );

    // The attacker's form, submitted in the same browser: refused, nothing requeued.
    client.goto(&format!("http://{evil}/")).await.unwrap();
    client
        .find(fantoccini::Locator::Css("#forged button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let source = client.source().await.unwrap();
    assert!(
        source.contains("not authorized") || source.contains("refused"),
        "{source}"
    );
    assert_eq!(dead_ids(&pool).await, ["<b>x</b>", "b"]);
    client.close().await.unwrap();
}
