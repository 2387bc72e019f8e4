//! A real HTTP/1.1 client (hyper) over a fresh TCP connection per request, and an axum
//! server on a loopback port.

#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

/// What came back.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// Serves `app` on 127.0.0.1, on a port of the system's choosing.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends one request with the given headers (raw bytes allowed) and body.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &str,
) -> Reply {
    try_send(addr, method, path, headers, body).await.unwrap()
}

/// [`send`], or why no response came (the server went away).
pub async fn try_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &str,
) -> Result<Reply, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    let request = request
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `POST path` with `Idempotency-Key: key` and a JSON body.
pub async fn post(addr: SocketAddr, path: &str, key: &str, body: &str) -> Reply {
    try_post(addr, path, key, body).await.unwrap()
}

/// [`post`], or why no response came.
pub async fn try_post(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &str,
) -> Result<Reply, String> {
    try_send(
        addr,
        "POST",
        path,
        &[
            ("idempotency-key", key.as_bytes()),
            ("content-type", b"application/json"),
        ],
        body,
    )
    .await
}
