//! `GET /metrics` in the Prometheus text format ([`crate::metrics`] renders it), and the
//! part of every request that feeds it and the load tracker.

use std::sync::Arc;
use std::time::Instant;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use protocol::{ApiError, ErrorCode};
use store::Store;

use crate::app::App;
use crate::auth::{self, Headers, ADMIN_KEY_HEADER, API_KEY_HEADER};
use crate::limits::LimitCounters;
use crate::metrics::{method_name, render};
use crate::reply::{Answer, Failure};

/// Runs the rest of the request, counted in flight, and records it by route and status. A
/// request over the server's or its credential's share of requests in flight is refused at
/// once (see [`crate::limits`]); the health checks and `/metrics` never are, so an operator
/// can still see a server that is shedding load.
pub async fn observe(app: &App, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_name(request.method());
    // A clone of the matched path shares its string: no allocation.
    let route = request.extensions().get::<MatchedPath>().cloned();
    // Looked for only when authentication failures are watched (see `crate::detector`).
    let presented_credential = app.detector().watching_authentication() && {
        let headers = request.headers();
        headers.contains_key(API_KEY_HEADER) || headers.contains_key(ADMIN_KEY_HEADER)
    };
    let response = {
        let counted = app.load().enter(started);
        let bounds = app.bounds();
        let exempt = route.as_ref().is_some_and(|r| is_operations(r.as_str()));
        if exempt {
            next.run(request).await
        } else if counted.position() > bounds.limits.max_in_flight {
            LimitCounters::count(&bounds.counters.shed);
            shed(bounds.limits.max_in_flight)
        } else {
            let peer = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(peer)| peer.ip());
            match bounds
                .shares
                .enter(request.headers(), peer, app.admin_key())
            {
                Some(share) => {
                    share
                        .run(crate::forward::run(app.forwarder(), request, next))
                        .await
                }
                None => {
                    LimitCounters::count(&bounds.counters.shed_per_key);
                    over_share(bounds.limits.max_in_flight_per_key)
                }
            }
        }
    };
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    app.http_metrics().record(
        method,
        route.as_ref().map_or("unmatched", |p| p.as_str()),
        status,
        elapsed.as_secs_f64(),
    );
    let detector = app.detector();
    detector.answered(elapsed);
    if presented_credential {
        detector.authenticated(status == 401);
    }
    response
}

/// How often each bound of [`crate::limits`] bit, and the connections open.
fn limit_metrics(c: &LimitCounters) -> [store::Metric; 7] {
    let metric = |name, help, counter, value: &std::sync::atomic::AtomicU64| store::Metric {
        name,
        help,
        counter,
        value: LimitCounters::read(value),
    };
    [
        metric(
            "cycles_connections_open",
            "HTTP connections open.",
            false,
            &c.connections_open,
        ),
        metric(
            "cycles_connections_refused_total",
            "Connections answered 503 and closed: the server had its maximum open.",
            true,
            &c.connections_refused,
        ),
        metric(
            "cycles_header_read_timeouts_total",
            "Connections closed because a request's headers (or an idle connection's next request) did not arrive in time.",
            true,
            &c.header_timeouts,
        ),
        metric(
            "cycles_headers_too_large_total",
            "Requests answered 431: their headers were over the size or count limit.",
            true,
            &c.headers_too_large,
        ),
        metric(
            "cycles_body_read_timeouts_total",
            "Requests answered 408: their body did not arrive in time.",
            true,
            &c.body_timeouts,
        ),
        metric(
            "cycles_requests_shed_total",
            "Requests answered 503 at once: the server had its maximum in flight.",
            true,
            &c.shed,
        ),
        metric(
            "cycles_requests_over_key_share_total",
            "Requests answered 429 at once: their credential had its share in flight.",
            true,
            &c.shed_per_key,
        ),
    ]
}

/// The health checks and `/metrics`.
fn is_operations(route: &str) -> bool {
    route == "/metrics" || route.starts_with("/actuator/health")
}

/// The answer of a request over the server's limit of requests in flight.
fn shed(limit: usize) -> Response {
    let error = ApiError::unavailable(format!(
        "The server is answering its limit of {limit} requests: retry shortly"
    ));
    Failure::from(error.retry_after(1)).into_response()
}

/// The answer of a request over its credential's share of requests in flight.
fn over_share(limit: usize) -> Response {
    let error = ApiError::new(
        429,
        ErrorCode::LimitExceeded,
        format!("This key already has {limit} requests in flight: retry shortly"),
    );
    Failure::from(error.retry_after(1)).into_response()
}

/// `GET /metrics`: the admin key is required unless the operator made it public.
#[utoipa::path(
    get, path = "/metrics", tag = "Operations", operation_id = "metrics",
    summary = "Prometheus metrics",
    description = "Requests by route and status with their latency, the store's counters \
        and process memory. Requires the admin key unless the operator made metrics public.",
    responses(
        (status = 200, description = "The Prometheus text exposition format",
            body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, response = crate::openapi::Unauthorized),
    ),
    security(("AdminKeyAuth" = []), ()),
)]
pub async fn metrics(State(app): State<Arc<App>>, Headers(headers): Headers) -> Answer {
    if !app.public_metrics() {
        auth::admin(app.admin_key(), &headers).map_err(Failure::from)?;
    }
    let mut counters = app.store().metrics();
    counters.push(store::Metric {
        name: "cycles_audit_unauthenticated_skipped_total",
        help: "Refusals of unknown callers not audited: over their address's budget per minute.",
        counter: true,
        value: app.unauthenticated().skipped(),
    });
    let dispatch = app.dispatch_counters();
    counters.push(store::Metric {
        name: "cycles_webhook_deliveries_succeeded_total",
        help: "Webhook delivery attempts answered 2xx.",
        counter: true,
        value: dispatch
            .delivered
            .load(std::sync::atomic::Ordering::Relaxed),
    });
    counters.push(store::Metric {
        name: "cycles_webhook_attempts_failed_total",
        help: "Webhook delivery attempts that failed (a non-2xx answer, a timeout, a refused address).",
        counter: true,
        value: dispatch.failed_attempts.load(std::sync::atomic::Ordering::Relaxed),
    });
    counters.extend(limit_metrics(&app.bounds().counters));
    if let Some(forwarder) = app.forwarder() {
        counters.extend(crate::forward::metrics(&forwarder.counters));
    }
    let detector = app.detector();
    counters.push(store::Metric {
        name: "cycles_anomaly_ticks_total",
        help: "Times the anomaly detector closed its windows and looked for anomalies.",
        counter: true,
        value: detector.ticks.load(std::sync::atomic::Ordering::Relaxed),
    });
    counters.push(store::Metric {
        name: "cycles_anomalies_emitted_total",
        help: "Burn-rate anomalies, rate spikes and high-latency events the detector emitted.",
        counter: true,
        value: detector.emitted.load(std::sync::atomic::Ordering::Relaxed),
    });
    let body = render(
        app.http_metrics(),
        app.load().in_flight(),
        app.sweep_counters(),
        &counters,
    );
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(response)
}
