//! `GET /metrics` in the Prometheus text format ([`crate::metrics`] renders it), and the
//! part of every request that feeds it and the load tracker.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use store::Store;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::metrics::{method_name, render};
use crate::reply::{Answer, Failure};

/// Runs the rest of the request, counted in flight, and records it by route and status.
pub async fn observe(app: &App, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_name(request.method());
    // A clone of the matched path shares its string: no allocation.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = {
        let _counted = app.load().enter(started);
        next.run(request).await
    };
    app.http_metrics().record(
        method,
        route.as_ref().map_or("unmatched", |p| p.as_str()),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
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
