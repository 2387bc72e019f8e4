//! A web console for the people on call (feature `console`): an axum [`Router`] you mount in
//! your own service, with a page per concern — an overview (the backlog, stuck and parked
//! records, and each consumer group's last hour: its signals and a chart of five-minute
//! bars, drawn as inline SVG from [`inbox::activity_series`](crate::inbox::activity_series)),
//! the outbox (its backlog in all and per destination, its dead messages
//! grouped by error, requeue or discard with one click), the inbox (each consumer group's
//! records, the stuck, failed and parked ones, release or revive with one click; the HTTP
//! layer's keys are the records of its group) and idem's tables (their migrations, their
//! problems). Pages are rendered on the server, without JavaScript.
//!
//! **Safe by default.**
//! - There is no console without an authorization function: [`Console::new`] takes one. It
//!   sees each request's head (its headers, and the extensions your own authentication
//!   layer put there) and returns who is acting, or `None`: the request is refused with 401
//!   before anything is read.
//! - Every action is a POST carrying a token bound to the person acting (HMAC-SHA256 under
//!   the console's secret): a forged POST from another site has none and is refused with
//!   403, as is a POST whose `Origin` is not the console's host or that the browser marks
//!   `Sec-Fetch-Site: cross-site`. Pages cannot be framed (`frame-ancestors 'none'`), and
//!   are not cached.
//! - [`Console::read_only`] shows everything and refuses every action.
//! - No page shows a message's payload or a record's result: they may hold personal data.
//! - Who acted is written where the table has room (a requeued message's last error, a
//!   released or revived record's error) and logged (`tracing`, INFO).
//!
//! ```
//! use axum::Router;
//! use axum::http::request::Parts;
//! use idem::console::Console;
//!
//! # fn demo(pool: sqlx::SqlitePool) {
//! // Your own authentication decides who may see the console, and who acts.
//! let console = Console::new(pool, |head: &Parts| {
//!     let user = head.headers.get("x-authenticated-user")?.to_str().ok()?;
//!     (user == "alice" || user == "bob").then(|| user.to_owned())
//! });
//! let app: Router = Router::new().nest("/ops/idem", console.router());
//! # let _ = app; }
//! ```

mod actions;
mod chart;
mod guard;
mod html;
mod pages;

use crate::backend::Backend;
use crate::inbox::Inbox;
use axum::Router;
use axum::routing::get;
use sqlx::Pool;
use std::sync::Arc;

/// Who may use the console, and who is acting: `Some(name)` or `None` (refused with 401).
pub type Authorize = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// The console's settings; [`router`](Self::router) makes its axum [`Router`].
pub struct Console<DB: Backend> {
    pool: Pool<DB>,
    authorize: Arc<Authorize>,
    read_only: bool,
    secret: Arc<[u8]>,
    limit: u32,
    watched: Vec<Inbox>,
}

impl<DB: Backend> std::fmt::Debug for Console<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("read_only", &self.read_only)
            .field("limit", &self.limit)
            .field(
                "watched",
                &self.watched.iter().map(Inbox::group).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Console<DB> {
    /// A console on `pool`'s database; `authorize` names who is acting, or refuses the
    /// request (`None`). Its forms' tokens are signed with a secret drawn at random: give
    /// several instances behind one address the same one ([`secret`](Self::secret)).
    pub fn new(
        pool: Pool<DB>,
        authorize: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Console<DB> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("the operating system's random generator failed");
        Console {
            pool,
            authorize: Arc::new(authorize),
            read_only: false,
            secret: Arc::new(secret),
            limit: 100,
            watched: Vec::new(),
        }
    }

    /// Shows everything and changes nothing: no buttons, and every POST refused with 403.
    pub fn read_only(mut self) -> Console<DB> {
        self.read_only = true;
        self
    }

    /// The secret the forms' tokens (and the notes an action leaves) are signed with: the
    /// same on every instance behind one address, so a form rendered by one is accepted by
    /// another. Refused when shorter than [`MIN_SECRET_LEN`](crate::http::MIN_SECRET_LEN)
    /// bytes: anyone who guesses it forges the tokens.
    pub fn secret(mut self, secret: &[u8]) -> Result<Console<DB>, crate::http::WeakSecret> {
        if secret.len() < crate::http::MIN_SECRET_LEN {
            return Err(crate::http::WeakSecret { len: secret.len() });
        }
        self.secret = Arc::from(secret);
        Ok(self)
    }

    /// How many records or messages a list shows (100 by default).
    pub fn limit(mut self, limit: u32) -> Console<DB> {
        self.limit = limit.max(1);
        self
    }

    /// Shows this instance's counters of `inbox` (shared by its clones) on the overview:
    /// the signals the tables do not hold — duplicates answered and their share of the
    /// deliveries, keys that came back with another body, deliveries turned away while
    /// another held their key, leases taken over, transitions refused and how many of those
    /// were illegal. Watch the inbox your HTTP layer or consumer was built with (pass a
    /// clone of it); call once per inbox. The counts are this process's since it started;
    /// the metrics add up every instance.
    pub fn watch(mut self, inbox: &Inbox) -> Console<DB> {
        self.watched.push(inbox.clone());
        self
    }

    /// The console's routes, to [`nest`](Router::nest) under a path of yours: `/` (an
    /// overview), `/outbox`, `/inbox` and `/tables`, each refused without authorization.
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            pool: self.pool,
            read_only: self.read_only,
            secret: self.secret,
            limit: self.limit,
            watched: self.watched,
        });
        let authorize = self.authorize;
        Router::new()
            .route("/", get(pages::overview::<DB>))
            .route(
                "/outbox",
                get(pages::outbox::<DB>).post(actions::outbox::<DB>),
            )
            .route("/inbox", get(pages::inbox::<DB>).post(actions::inbox::<DB>))
            .route("/tables", get(pages::tables::<DB>))
            .layer(axum::middleware::from_fn(move |request, next| {
                guard::admit(authorize.clone(), request, next)
            }))
            .with_state(shared)
    }
}

/// What every page and action shares.
pub(crate) struct Shared<DB: Backend> {
    pool: Pool<DB>,
    read_only: bool,
    secret: Arc<[u8]>,
    limit: u32,
    watched: Vec<Inbox>,
}
