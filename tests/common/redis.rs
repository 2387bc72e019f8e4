//! A `redis-server` of the test's own, on a free port, so that a test can kill it, restart
//! it, flush it or put it to sleep without touching the machine's Redis.
//!
//! It needs the `redis-server` binary; without it the test is skipped, unless
//! `IDEM_TEST_REQUIRE_SERVERS=1` (as in CI), which makes that a failure.
//!
//! Include it with `#[path = "common/redis.rs"] mod redis_server;`.

#![allow(dead_code)]

use crate::common;
use idem::cache::redis;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct OwnRedis {
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    /// A fresh server (no persistence: a restart comes back empty), or `None` (skipped)
    /// without the binary.
    pub fn start() -> Option<OwnRedis> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            if common::require_servers() {
                panic!(
                    "redis-server is not installed, and IDEM_TEST_REQUIRE_SERVERS=1 forbids skipping"
                );
            }
            eprintln!("skipped: install redis-server to run the cache tests");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = OwnRedis { port, child: None };
        redis.restart();
        Some(redis)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        // From a folder of its own, where anything it writes lands (nothing, without
        // persistence), never beside the checkout.
        let dir = common::scratch_file(&format!("redis-{}", self.port));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .current_dir(&dir)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// A connection of the test's own, for what the test does to the server.
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Every key under `namespace`.
    pub async fn keys(&self, namespace: &str) -> Vec<String> {
        let mut conn = self.admin().await;
        redis::cmd("KEYS")
            .arg(format!("{namespace}:*"))
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// Runs `command` with `args` on it.
    pub async fn run(&self, command: &str, args: &[&str]) {
        let mut conn = self.admin().await;
        let mut cmd = redis::cmd(command);
        for arg in args {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
