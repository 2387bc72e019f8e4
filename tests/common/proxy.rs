//! A TCP proxy between a pool and its database server that cuts connections where a test
//! says: at a message the client sends (the bytes of a `COMMIT`, say), either before the
//! server gets it, or after the server answered it and before the answer reaches the client
//! (the ambiguous commit: the server committed, the client cannot know).
//!
//! Include it with `#[path = "common/proxy.rs"] mod proxy;`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to one message that matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Forwards it and its answer.
    Pass,
    /// Closes the connection instead of forwarding it: the server never gets it.
    Request,
    /// Forwards it, waits for the server's answer, drops it and closes the connection.
    Answer,
}

/// The bytes of a `COMMIT` as sqlx sends it on PostgreSQL: a simple-query message.
pub const POSTGRES_COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// The bytes of a `COMMIT` as sqlx sends it on MySQL: a `COM_QUERY` packet of 7 bytes,
/// the first of its exchange.
pub const MYSQL_COMMIT: &[u8] = b"\x07\0\0\0\x03COMMIT";

type Schedule = Box<dyn FnMut(usize) -> Cut + Send>;

struct Shared {
    upstream: SocketAddr,
    needle: Vec<u8>,
    /// Asked for each message that matched, with how many matched before it.
    schedule: Mutex<Schedule>,
    matched: AtomicUsize,
    cut_requests: AtomicUsize,
    cut_answers: AtomicUsize,
}

/// A proxy on a loopback port of its own, for as long as the test's runtime runs.
#[derive(Clone)]
pub struct CutProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl CutProxy {
    /// Listens on a free port and forwards every connection to `upstream`, cutting at the
    /// messages that hold `needle` as [`CutProxy::schedule`] says (nothing until then).
    pub async fn start(upstream: SocketAddr, needle: &[u8]) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            needle: needle.to_vec(),
            schedule: Mutex::new(Box::new(|_| Cut::Pass)),
            matched: AtomicUsize::new(0),
            cut_requests: AtomicUsize::new(0),
            cut_answers: AtomicUsize::new(0),
        });
        let accepting = shared.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accepting.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(shared.upstream).await {
                        relay(shared, client, server).await;
                    }
                });
            }
        });
        CutProxy { addr, shared }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Decides, for each message that matches from now on, what to do with it (called with
    /// the number of messages that matched before it).
    pub fn schedule(&self, schedule: impl FnMut(usize) -> Cut + Send + 'static) {
        *self.shared.schedule.lock().unwrap() = Box::new(schedule);
    }

    /// Cuts the next message that matches as `cut`, and passes the rest.
    pub fn cut_next(&self, cut: Cut) {
        let mut armed = true;
        self.schedule(move |_| {
            if std::mem::take(&mut armed) {
                cut
            } else {
                Cut::Pass
            }
        });
    }

    /// Messages that matched so far.
    pub fn matched(&self) -> usize {
        self.shared.matched.load(Ordering::SeqCst)
    }

    /// Connections closed before a message reached the server.
    pub fn cut_requests(&self) -> usize {
        self.shared.cut_requests.load(Ordering::SeqCst)
    }

    /// Connections closed after the server answered a message, its answer dropped.
    pub fn cut_answers(&self) -> usize {
        self.shared.cut_answers.load(Ordering::SeqCst)
    }
}

/// Copies both ways until either side closes or a cut ends the connection.
async fn relay(shared: Arc<Shared>, client: TcpStream, server: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set when the answer to the message just forwarded is to be dropped (the client
    // waits for each answer before it sends more, so the next bytes are that answer).
    let drop_answer = Arc::new(AtomicBool::new(false));
    let upward = {
        let shared = shared.clone();
        let drop_answer = drop_answer.clone();
        async move {
            let mut tail: Vec<u8> = Vec::new();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buffer[..n];
                // The needle may straddle two reads: look at the end of the last one too.
                let mut window = std::mem::take(&mut tail);
                window.extend_from_slice(chunk);
                let cut = if contains(&window, &shared.needle) {
                    let before = shared.matched.fetch_add(1, Ordering::SeqCst);
                    (shared.schedule.lock().unwrap())(before)
                } else {
                    Cut::Pass
                };
                let keep = shared.needle.len().saturating_sub(1).min(window.len());
                tail = window[window.len() - keep..].to_vec();
                match cut {
                    Cut::Pass => {}
                    Cut::Request => {
                        shared.cut_requests.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Cut::Answer => drop_answer.store(true, Ordering::SeqCst),
                }
                if server_write.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    let downward = {
        let shared = shared.clone();
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match server_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if drop_answer.load(Ordering::SeqCst) {
                    shared.cut_answers.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if client_write.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    // Whichever way ends first ends the connection: both halves drop, both sockets close.
    tokio::select! {
        () = upward => {}
        () = downward => {}
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
