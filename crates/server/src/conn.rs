//! The accept loop: every connection served by hyper under the server's [`Limits`], and
//! closed gracefully at shutdown.
//!
//! A connection over [`Limits::max_connections`] is not left waiting in the kernel's
//! backlog: it is answered `503` with `Retry-After` and closed, given at most
//! [`REFUSAL_GRACE`] to send its request. Refusals in progress are themselves bounded
//! ([`MAX_REFUSING`]); past that, a connection is closed at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, Response};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use protocol::ApiError;
use tokio::net::{TcpListener, TcpStream};
use tower_service::Service;

use crate::correlation::{self, Correlation};
use crate::limits::{Bounds, DeadlineBody, LimitCounters, Limits};
use crate::reply::Failure;

/// The time a connection over the limit has to send the request it is refused.
const REFUSAL_GRACE: Duration = Duration::from_secs(1);
/// Refusals being answered at once, at most.
const MAX_REFUSING: usize = 1_024;
/// How long to wait before accepting again after the process ran out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and waits
/// for the connections to finish their requests (idle ones are closed).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Arc<Bounds>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let graceful = GracefulShutdown::new();
    let refusing = Arc::new(AtomicUsize::new(0));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted: wait
                    // a moment rather than spin, and go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Replies are small and latency-bound: do not wait to coalesce them.
        let _ = tcp.set_nodelay(true);
        let counters = &bounds.counters;
        if LimitCounters::read(&counters.connections_open) >= bounds.limits.max_connections as u64 {
            LimitCounters::count(&counters.connections_refused);
            refuse(tcp, refusing.clone());
            continue;
        }
        let guard = OpenConnection::new(counters.clone());
        let connection = builder(&bounds.limits).serve_connection(
            TokioIo::new(tcp),
            service(router.clone(), peer, &bounds.limits),
        );
        let watched = graceful.watch(connection);
        let counters = counters.clone();
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = watched.await {
                count_error(&counters, &e);
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An HTTP/1 connection builder with the limits that hyper enforces.
fn builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(Limits::MIN_HEADER_BYTES));
    // hyper keeps up to 100 headers on the stack and moves them to the heap, for every
    // request, once any other number is set: only set it when it differs.
    if limits.max_headers != Limits::DEFAULT.max_headers {
        builder.max_headers(limits.max_headers);
    }
    builder
}

/// The router as a hyper service for one connection: each request carries the peer's
/// address (as `ConnectInfo`) and a body with its deadline.
fn service(
    router: Router,
    peer: SocketAddr,
    limits: &Limits,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    let body_timeout = limits.body_read_timeout;
    service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(|body| DeadlineBody::new(body, body_timeout));
        request.extensions_mut().insert(ConnectInfo(peer));
        router.clone().call(request)
    })
}

/// Counts what a connection ended with, when it is a bound biting.
fn count_error(counters: &LimitCounters, error: &hyper::Error) {
    if error.is_timeout() {
        LimitCounters::count(&counters.header_timeouts);
    } else if error.is_parse_too_large() {
        LimitCounters::count(&counters.headers_too_large);
    }
}

/// Answers a connection over the limit `503` with `Retry-After` and closes it.
fn refuse(tcp: TcpStream, refusing: Arc<AtomicUsize>) {
    if refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::Relaxed);
        return; // dropped: closed at once
    }
    tokio::spawn(async move {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(REFUSAL_GRACE)
            .keep_alive(false);
        let connection = builder.serve_connection(
            TokioIo::new(tcp),
            service_fn(|request: Request<Incoming>| async move {
                Ok::<_, Infallible>(over_capacity(&request))
            }),
        );
        let _ = tokio::time::timeout(REFUSAL_GRACE * 2, connection).await;
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

/// The answer of a request on a connection over the limit.
fn over_capacity<B>(request: &Request<B>) -> Response<Body> {
    let error = ApiError::unavailable("The server has too many open connections: retry shortly");
    let mut response = correlation::finish(
        Failure::from(error).into_response(),
        Correlation::of(request.headers()),
    );
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Counts a connection open until it is dropped.
struct OpenConnection(Arc<LimitCounters>);

impl OpenConnection {
    fn new(counters: Arc<LimitCounters>) -> Self {
        counters.connections_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(counters)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}
