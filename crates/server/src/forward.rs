//! Handing a request to the instance that holds the Redis engine's writer's lease
//! (`--redis-advertise-url`).
//!
//! An instance without the lease sends a request meant to write, as it came, to the holder
//! its writer read a moment ago, before the request's handler runs, and answers with the
//! holder's response ([`run`]). Otherwise the request runs here, and an operation it may
//! hand on is answered `StoreError::Forward` (the holder's address) once a round finds a
//! peer holding the lease, instead of waiting for it; the handler's response then carries
//! [`ForwardTo`], and the request is sent on the same way. The holder knows the request is a
//! peer's by the ledger's secret in [`PEER`] (read from Redis by every instance): it takes
//! the client's address and the request id from the peer, runs it without handing it on
//! again (so a request never travels twice), and counts it against its rate limit (the
//! first instance gives its token back: `crate::ratelimit`).
//!
//! A holder that cannot be reached (nothing was sent) suspends forwarding on this instance
//! for [`SUSPEND`], and the request runs here, waiting for the lease as without forwarding.
//! A request sent whose answer is lost is answered 503 "outcome unknown", as a write whose
//! append to Redis went unanswered: its retry with the same idempotency key answers it
//! either way, once.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use protocol::{ApiError, MAX_BODY_BYTES};
use store::forwarding::Handing;
use store::Engine;
use subtle::ConstantTimeEq;

use crate::correlation::{Correlation, TRACE_ID_HEADER};
use crate::limits;
use crate::reply::{Failure, ForwardTo};

/// The ledger's secret: the request comes from one of its instances.
pub const PEER: HeaderName = HeaderName::from_static("x-cycles-peer");
/// The address of the client the peer served.
const PEER_CLIENT: HeaderName = HeaderName::from_static("x-cycles-peer-client");
/// The request id the peer gave the request (and answers it with).
const PEER_REQUEST_ID: HeaderName = HeaderName::from_static("x-cycles-peer-request-id");

/// How long connecting to the holder may take: instances of one ledger are near each other.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the holder may take to answer: longer than it may wait for anything itself.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long forwarding stays off after the holder could not be reached.
const SUSPEND: Duration = Duration::from_secs(1);

/// On a request: a peer sent it (with the ledger's secret). It is never handed on again.
#[derive(Debug, Clone, Copy)]
pub struct FromPeer;

/// The client to the lease's holder, and what forwarding did.
pub struct Forwarder {
    client: reqwest::Client,
    store: Arc<Engine>,
    started: Instant,
    /// Until when (milliseconds after `started`) requests run here: the holder could not
    /// be reached.
    suspended_until: AtomicU64,
    pub counters: ForwardCounters,
}

/// What forwarding did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ForwardCounters {
    /// Requests sent to the holder and answered by it.
    pub sent: AtomicU64,
    /// Requests the holder could not be reached for (they ran here).
    pub unreachable: AtomicU64,
    /// Requests sent whose answer was lost (answered 503 "outcome unknown").
    pub lost: AtomicU64,
}

/// Why a request could not be handed on.
enum Failed {
    /// Nothing reached the holder.
    NotSent(reqwest::Error),
    /// The request may have reached it; its answer did not come back.
    Lost(reqwest::Error),
}

impl Forwarder {
    /// A forwarder for the instances of `store`'s ledger, if it hands writes on.
    pub fn new(store: Arc<Engine>) -> Option<Forwarder> {
        if !store.forwards() {
            return None;
        }
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .expect("the forwarding client's configuration is valid");
        Some(Forwarder {
            client,
            store,
            started: Instant::now(),
            suspended_until: AtomicU64::new(0),
            counters: ForwardCounters::default(),
        })
    }

    /// Takes every peer header out of `request` (a client's are never believed, nor sent
    /// on); if they carry the ledger's secret, the request is a peer's, and keeps the
    /// client's address and request id it was given.
    pub fn accept(&self, request: &mut Request, correlation: &mut Correlation) {
        let headers = request.headers_mut();
        let presented = headers.remove(PEER);
        let client = headers.remove(PEER_CLIENT);
        let request_id = headers.remove(PEER_REQUEST_ID);
        let (Some(presented), Some(secret)) = (presented, self.store.peer_secret()) else {
            return;
        };
        if !bool::from(presented.as_bytes().ct_eq(secret.as_bytes())) {
            return;
        }
        let client = client
            .and_then(|v| v.to_str().ok()?.parse::<IpAddr>().ok())
            .map(|ip| ConnectInfo(SocketAddr::new(ip, 0)));
        if let Some(client) = client {
            request.extensions_mut().insert(client);
        }
        if let Some(id) = request_id.filter(|id| id.len() <= 128) {
            correlation.request_id = id;
        }
        request.extensions_mut().insert(FromPeer);
    }

    fn suspended(&self) -> bool {
        (self.started.elapsed().as_millis() as u64) < self.suspended_until.load(Ordering::Relaxed)
    }

    fn suspend(&self) {
        let until = (self.started.elapsed() + SUSPEND).as_millis() as u64;
        self.suspended_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Sends the request (`parts` and `body`, as it came) to the instance at `peer`, and
    /// answers its response.
    async fn send(
        &self,
        peer: &str,
        parts: &axum::http::request::Parts,
        body: Bytes,
    ) -> Result<Response, Failed> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // A client's peer headers are gone (`accept`): only this instance's are sent.
        let mut headers = end_to_end(&parts.headers);
        if let Some(secret) = self.store.peer_secret() {
            if let Ok(v) = HeaderValue::from_str(&secret) {
                headers.insert(PEER, v);
            }
        }
        crate::origin::with_current(|origin| {
            headers.insert(PEER_REQUEST_ID, origin.correlation.request_id.clone());
            headers.insert(TRACE_ID_HEADER, origin.correlation.trace_id.clone());
            if let Some(ip) = origin.peer {
                if let Ok(v) = HeaderValue::from_str(&ip.to_string()) {
                    headers.insert(PEER_CLIENT, v);
                }
            }
        });
        let sent = self
            .client
            .request(parts.method.clone(), format!("{peer}{path}"))
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| match e.is_connect() {
                true => Failed::NotSent(e),
                false => Failed::Lost(e),
            })?;
        let status = sent.status();
        let headers = end_to_end(sent.headers());
        let body = sent.bytes().await.map_err(Failed::Lost)?;
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

/// The headers of a message less those of one connection (and the length, which the
/// body's own sets): what crosses a hop unchanged.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut kept = headers.clone();
    for name in [
        header::CONNECTION,
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        kept.remove(name);
    }
    kept.remove("keep-alive");
    kept
}

/// Runs the request (`next`); if it was answered [`ForwardTo`] the lease's holder, sends it
/// there and answers the holder's response. A request meant to write goes to a holder read
/// a moment ago at once, without its handler running here: the holder runs it whole, as it
/// would once the first operation was handed on. Only a request whose whole body is known
/// to fit may be handed on (it is held to be sent again); any other runs here.
pub async fn run(forwarder: Option<&Forwarder>, request: Request, next: Next) -> Response {
    let Some(forwarder) = forwarder else {
        return next.run(request).await;
    };
    let fits = request
        .body()
        .size_hint()
        .upper()
        .is_some_and(|n| n <= MAX_BODY_BYTES as u64);
    if !fits || forwarder.suspended() || request.extensions().get::<FromPeer>().is_some() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        // The client stopped sending: no handler could have read it either.
        return Failure::from(ApiError::invalid("The request body could not be read"))
            .into_response();
    };
    // A request that means to change something is handed on as soon as a peer is known to
    // hold the lease; one that reads only if it turns out to write.
    let handing = match parts.method {
        Method::GET | Method::HEAD => Handing::IfItWrites,
        _ => Handing::Always,
    };
    let holder = match handing {
        Handing::Always => forwarder.store.holder_address(),
        Handing::IfItWrites => None,
    };
    let peer = match holder {
        Some(peer) => peer,
        None => {
            let here = Request::from_parts(parts.clone(), Body::from(body.clone()));
            let response = store::forwarding::allow(handing, next.clone().run(here)).await;
            match response.extensions().get::<ForwardTo>() {
                Some(ForwardTo(peer)) => peer.clone(),
                None => return response,
            }
        }
    };
    forwarder.hand_on(&peer, parts, body, next).await
}

impl Forwarder {
    /// Sends the request to `peer` and answers its response; if the peer cannot be
    /// reached, runs it here (`next`), waiting for the lease.
    async fn hand_on(
        &self,
        peer: &str,
        parts: axum::http::request::Parts,
        body: Bytes,
        next: Next,
    ) -> Response {
        let counters = &self.counters;
        match self.send(peer, &parts, body.clone()).await {
            Ok(response) => {
                counters.sent.fetch_add(1, Ordering::Relaxed);
                // The holder checked the request's key: a success took it.
                if response.status().is_success() {
                    limits::credential_accepted();
                }
                response
            }
            Err(Failed::NotSent(e)) => {
                counters.unreachable.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, error = %e, "the instance holding the writer's lease cannot be reached: requests wait for the lease here for a while");
                self.suspend();
                next.run(Request::from_parts(parts, Body::from(body))).await
            }
            Err(Failed::Lost(e)) => {
                counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, error = %e, "a request handed to the instance holding the writer's lease went unanswered");
                Failure::from(
                    ApiError::unavailable(format!(
                        "The instance writing the ledger did not answer, so whether this was \
                         recorded is unknown; retry with the same idempotency key, which answers \
                         it either way: {e}"
                    ))
                    .retry_after(1),
                )
                .into_response()
            }
        }
    }
}

/// What forwarding did, as `/metrics` shows it.
pub fn metrics(c: &ForwardCounters) -> Vec<store::Metric> {
    let metric = |name, help, value: &AtomicU64| store::Metric {
        name,
        help,
        counter: true,
        value: value.load(Ordering::Relaxed),
    };
    vec![
        metric(
            "cycles_forward_sent_total",
            "Requests handed to the instance holding the writer's lease and answered by it.",
            &c.sent,
        ),
        metric(
            "cycles_forward_unreachable_total",
            "Requests the instance holding the writer's lease could not be reached for: they ran here, waiting for the lease.",
            &c.unreachable,
        ),
        metric(
            "cycles_forward_lost_total",
            "Requests handed to the instance holding the writer's lease whose answer was lost (answered 503, outcome unknown).",
            &c.lost,
        ),
    ]
}
