//! The layer's own answers, as `application/problem+json` (RFC 9457): what went wrong and
//! what the client should do.

use axum_core::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use std::time::Duration;

/// The problem's JSON, in the RFC's order.
#[derive(serde::Serialize)]
struct Json<'a> {
    r#type: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// What the layer answers instead of running the handler.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    /// A short, stable summary (the problem's `title`).
    pub(crate) title: &'static str,
    /// What happened with this request (the problem's `detail`).
    pub(crate) detail: String,
    /// When to retry, for a 409 (`Retry-After`, whole seconds, at least 1).
    pub(crate) retry_after: Option<Duration>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A 503 with `Retry-After: 1`: the same request may be retried with its key.
    pub(crate) fn unavailable(title: &'static str, detail: impl Into<String>) -> Self {
        let mut problem = Problem::new(StatusCode::SERVICE_UNAVAILABLE, title, detail);
        problem.retry_after = Some(Duration::from_secs(1));
        problem
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let body = Json {
            r#type: "about:blank",
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = self.retry_after {
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        response
    }
}
