//! The origin of the request a task serves: what its operations' events carry (request and
//! trace ids, the caller's address). Kept as the request's own correlation headers and
//! turned into text only when an operation emits an event, which most requests do not.

use std::net::IpAddr;

use ledger::Origin;

use crate::correlation::Correlation;

/// A request's correlation ids and peer address.
#[derive(Debug)]
pub struct RequestOrigin {
    pub correlation: Correlation,
    pub peer: Option<IpAddr>,
}

tokio::task_local! {
    static ORIGIN: RequestOrigin;
}

/// The current request's origin (empty outside a request: the background jobs).
pub fn current() -> Origin {
    let text = |v: &axum::http::HeaderValue| v.to_str().ok().map(str::to_string);
    ORIGIN
        .try_with(|o| Origin {
            request_id: text(&o.correlation.request_id),
            trace_id: text(&o.correlation.trace_id),
            source_ip: o.peer.map(|ip| ip.to_string()),
        })
        .unwrap_or_default()
}

/// `read` of the current request's origin; `None` outside a request.
pub fn with_current<T>(read: impl FnOnce(&RequestOrigin) -> T) -> Option<T> {
    ORIGIN.try_with(read).ok()
}

/// Runs `future` (the rest of the request) with `origin`, and gives the correlation back
/// for the response (moved in and out: no copy, no allocation).
pub async fn within<F: std::future::Future>(
    origin: RequestOrigin,
    future: F,
) -> (F::Output, Correlation) {
    let mut scoped = std::pin::pin!(ORIGIN.scope(origin, future));
    let output = scoped.as_mut().await;
    let origin = scoped
        .take_value()
        .expect("a finished scope still holds its value");
    (output, origin.correlation)
}
