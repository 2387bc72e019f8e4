//! A `pgbouncer` of the test's own, in front of the PostgreSQL server of
//! `IDEM_TEST_POSTGRES_URL`, on a free loopback port, run as the user `postgres` (it refuses
//! root): killed when dropped.
//!
//! Include it with `#[path = "common/pgbouncer.rs"] mod pgbouncer;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How pgbouncer lends its server connections.
#[derive(Clone, Copy, Debug)]
pub enum Pooling {
    /// A server connection per client connection, for as long as it lasts.
    Session,
    /// A server connection per transaction.
    Transaction,
}

pub struct OwnPgbouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// A database of pgbouncer's: a name clients connect to, the server's database it stands
/// for, and the schema each of its server connections searches first (pgbouncer's
/// `connect_query`: a session's own `SET` does not outlive its transaction in transaction
/// pooling).
#[derive(Clone, Copy, Debug)]
pub struct Alias<'a> {
    pub name: &'a str,
    pub database: &'a str,
    pub search_path: &'a str,
}

impl OwnPgbouncer {
    /// Starts one in front of `upstream` (`host:port`), or `None` (test skipped) when the
    /// binary is missing and servers are optional.
    pub fn start(upstream: (&str, u16), pooling: Pooling) -> Option<OwnPgbouncer> {
        Self::start_with(upstream, pooling, 40, None)
    }

    /// [`start`](Self::start), with at most `pool_size` server connections a database and
    /// user, and `alias` among its databases.
    pub fn start_with(
        upstream: (&str, u16),
        pooling: Pooling,
        pool_size: u32,
        alias: Option<Alias<'_>>,
    ) -> Option<OwnPgbouncer> {
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists());
        let Some(binary) = binary else {
            if crate::common::require_servers() {
                panic!(
                    "pgbouncer is not installed, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
                );
            }
            eprintln!("skipped: install pgbouncer to run the pgbouncer tests");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("idem-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // In transaction pooling, the server connections are lent in turn (not the one
        // released last first): a client's next exchange meets another server connection
        // whenever one is idle, as it would under load.
        let (mode, round_robin) = match pooling {
            Pooling::Session => ("session", 0),
            Pooling::Transaction => ("transaction", 1),
        };
        let (host, upstream_port) = upstream;
        let alias = alias.map_or(String::new(), |a| {
            format!(
                "{} = host={host} port={upstream_port} dbname={} connect_query='SET search_path TO {}'\n",
                a.name, a.database, a.search_path
            )
        });
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n{alias}* = host={host} port={upstream_port}\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {auth}\n\
                 pool_mode = {mode}\nmax_client_conn = 500\ndefault_pool_size = {pool_size}\n\
                 server_round_robin = {round_robin}\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n",
                auth = dir.join("userlist.txt").display(),
                log = dir.join("pgbouncer.log").display(),
            ),
        )
        .unwrap();
        let owned = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(owned.success(), "chown of {}", dir.display());
        // From its own folder: the caller's (the checkout) may be closed to `postgres`.
        let child = Command::new("runuser")
            .current_dir(&dir)
            .args(["-u", "postgres", "--", binary])
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("runuser -u postgres -- pgbouncer");
        let bouncer = OwnPgbouncer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(bouncer)
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for OwnPgbouncer {
    fn drop(&mut self) {
        // runuser's child is pgbouncer; both go.
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(self.dir.join("pgbouncer.ini"))
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
