//! `/metrics` in the Prometheus text format: requests by route and status, their latency,
//! the store's counters, process memory and (with the `alloc-count` feature) heap
//! allocations.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::app::App;
use crate::auth::{self, Headers};
use crate::reply::{Answer, Failure};

#[derive(Default)]
struct RouteStats {
    count: u64,
    seconds: f64,
}

/// Request counters: route template → (method, status) → stats. Recording a request that
/// was seen before allocates nothing.
pub struct HttpMetrics {
    routes: Mutex<HashMap<String, PerRoute>>,
    /// Requests being answered right now.
    in_flight: AtomicUsize,
    /// When a request last arrived while another was in flight, in microseconds since
    /// `epoch`.
    last_overlap_us: AtomicU64,
    epoch: Instant,
}

/// How long requests must have come one at a time before one counts as alone: long enough
/// that a steady stream from several clients never does (their requests overlap every few
/// hundred microseconds), short enough that a sequential client is alone from its second
/// request on.
const QUIET: Duration = Duration::from_millis(10);

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            routes: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            last_overlap_us: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

/// One route's stats by (method, status).
type PerRoute = HashMap<(&'static str, u16), RouteStats>;

impl HttpMetrics {
    /// Requests being answered right now, the caller's included.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the caller is the only request in flight and requests have come one at a
    /// time for a while (see [`QUIET`]).
    pub fn alone(&self) -> bool {
        // The counter first: under load the clock is never read.
        self.in_flight() <= 1 && self.alone_at(Instant::now())
    }

    fn alone_at(&self, now: Instant) -> bool {
        self.in_flight() <= 1
            && self.since_epoch_us(now)
                >= self.last_overlap_us.load(Ordering::Relaxed) + QUIET.as_micros() as u64
    }

    fn since_epoch_us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// Counts a request in until the returned guard drops, noting when it overlaps another.
    fn enter(&self, at: Instant) -> InFlight<'_> {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) > 0 {
            self.last_overlap_us
                .fetch_max(self.since_epoch_us(at), Ordering::Relaxed);
        }
        InFlight(&self.in_flight)
    }

    fn record(&self, method: &'static str, route: &str, status: u16, seconds: f64) {
        let Ok(mut routes) = self.routes.lock() else {
            return;
        };
        if !routes.contains_key(route) {
            routes.insert(route.to_string(), HashMap::new());
        }
        if let Some(per_route) = routes.get_mut(route) {
            let s = per_route.entry((method, status)).or_default();
            s.count += 1;
            s.seconds += seconds;
        }
    }

    /// Every series, sorted by (method, route, status) for a stable exposition.
    fn series(&self) -> BTreeMap<(&'static str, String, u16), (u64, f64)> {
        let Ok(routes) = self.routes.lock() else {
            return BTreeMap::new();
        };
        routes
            .iter()
            .flat_map(|(route, per_route)| {
                per_route.iter().map(move |((m, status), s)| {
                    ((*m, route.clone(), *status), (s.count, s.seconds))
                })
            })
            .collect()
    }
}

/// Counts a request in flight until it is answered or dropped (a client that hangs up).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn method_name(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// Runs the rest of the request, counted in flight, and records it by route and status.
pub async fn observe(app: &App, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_name(request.method());
    // A clone of the matched path shares its string: no allocation.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = {
        let _counted = app.http_metrics().enter(started);
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
    let series = app.http_metrics().series();
    out.push_str("# HELP cycles_http_requests_total HTTP requests answered.\n# TYPE cycles_http_requests_total counter\n");
    for ((m, r, s), (count, _)) in &series {
        let _ = writeln!(
            out,
            "cycles_http_requests_total{{method=\"{m}\",route=\"{r}\",status=\"{s}\"}} {count}"
        );
    }
    out.push_str("# HELP cycles_http_request_seconds_total Time spent answering, by route.\n# TYPE cycles_http_request_seconds_total counter\n");
    for ((m, r, s), (_, seconds)) in &series {
        let _ = writeln!(
            out,
            "cycles_http_request_seconds_total{{method=\"{m}\",route=\"{r}\",status=\"{s}\"}} {seconds:.6}"
        );
    }
    gauge(
        &mut out,
        "cycles_http_requests_in_flight",
        "Requests being answered (this one included).",
        "gauge",
        app.http_metrics().in_flight(),
    );
    let sweep = app.sweep_counters();
    gauge(
        &mut out,
        "cycles_sweep_expired_total",
        "Reservations the background sweep expired past their grace (holds returned).",
        "counter",
        sweep.expired.load(Ordering::Relaxed),
    );
    gauge(
        &mut out,
        "cycles_sweep_evicted_total",
        "Terminal reservations and idempotency records removed past their retention.",
        "counter",
        sweep.evicted.load(Ordering::Relaxed),
    );
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
        auth::admin(&app, &headers).map_err(Failure::from)?;
    }
    let mut response = (StatusCode::OK, render(&app)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_alone_only_after_a_quiet_period_without_overlaps() {
        let metrics = HttpMetrics::default();
        let t0 = metrics.epoch + QUIET;
        let first = metrics.enter(t0);
        assert_eq!(metrics.in_flight(), 1);
        assert!(metrics.alone_at(t0), "one request, nothing overlapped yet");

        let t1 = t0 + Duration::from_millis(1);
        let second = metrics.enter(t1);
        assert_eq!(metrics.in_flight(), 2);
        assert!(!metrics.alone_at(t1), "two in flight");
        drop(second);
        let t2 = t1 + QUIET / 2;
        assert!(
            !metrics.alone_at(t2),
            "one in flight, but requests overlapped just now"
        );
        assert!(
            metrics.alone_at(t1 + QUIET),
            "one in flight after a quiet period"
        );
        drop(first);
        assert_eq!(metrics.in_flight(), 0);
    }
}
