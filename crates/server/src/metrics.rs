//! `/metrics` in the Prometheus text format: requests by route and status, their latency,
//! the store's counters, process memory and (with the `alloc-count` feature) heap
//! allocations.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::app::App;
use crate::auth;
use crate::reply::{Answer, Failure};

#[derive(Default)]
struct RouteStats {
    count: u64,
    seconds: f64,
}

/// Request counters, keyed by (method, route template, status).
#[derive(Default)]
pub struct HttpMetrics {
    routes: Mutex<BTreeMap<(String, String, u16), RouteStats>>,
}

impl HttpMetrics {
    fn record(&self, method: &str, route: &str, status: u16, seconds: f64) {
        if let Ok(mut routes) = self.routes.lock() {
            let s = routes
                .entry((method.to_string(), route.to_string(), status))
                .or_default();
            s.count += 1;
            s.seconds += seconds;
        }
    }
}

pub async fn layer(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let response = next.run(request).await;
    app.http_metrics().record(
        &method,
        &route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// Resident and peak resident memory in bytes, from `/proc/self/status` (Linux).
fn memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn gauge(out: &mut String, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// Renders every metric.
fn render(app: &App) -> String {
    let mut out = String::new();
    if let Ok(routes) = app.http_metrics().routes.lock() {
        out.push_str("# HELP cycles_http_requests_total HTTP requests answered.\n# TYPE cycles_http_requests_total counter\n");
        for ((m, r, s), v) in routes.iter() {
            let _ = writeln!(
                out,
                "cycles_http_requests_total{{method=\"{m}\",route=\"{r}\",status=\"{s}\"}} {}",
                v.count
            );
        }
        out.push_str("# HELP cycles_http_request_seconds_total Time spent answering, by route.\n# TYPE cycles_http_request_seconds_total counter\n");
        for ((m, r, s), v) in routes.iter() {
            let _ = writeln!(out, "cycles_http_request_seconds_total{{method=\"{m}\",route=\"{r}\",status=\"{s}\"}} {:.6}", v.seconds);
        }
    }
    for m in app.store().metrics() {
        let kind = if m.counter { "counter" } else { "gauge" };
        gauge(&mut out, m.name, m.help, kind, m.value);
    }
    if let Some((rss, peak)) = memory() {
        gauge(
            &mut out,
            "process_resident_memory_bytes",
            "Resident memory.",
            "gauge",
            rss,
        );
        gauge(
            &mut out,
            "process_peak_resident_memory_bytes",
            "Peak resident memory.",
            "gauge",
            peak,
        );
    }
    #[cfg(feature = "alloc-count")]
    gauge(
        &mut out,
        "cycles_heap_allocations_total",
        "Heap allocations made by the process (alloc-count build).",
        "counter",
        crate::alloc_count::allocations(),
    );
    out
}

/// `GET /metrics`: the admin key is required unless the operator made it public.
pub async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Answer {
    if !app.public_metrics() {
        auth::admin(&app, &headers).map_err(Failure::from)?;
    }
    let mut response = (StatusCode::OK, render(&app)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(response)
}
