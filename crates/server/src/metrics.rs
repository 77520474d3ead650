//! The request counters and the Prometheus text rendering of every metric: requests by
//! route and status, their latency, requests in flight, the sweep's and the store's counters,
//! process memory and (with the `alloc-count` feature) heap allocations. The `/metrics`
//! handler and the middleware that records each request are with the routes.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use axum::http::Method;
use store::Metric;

use crate::jobs::SweepCounters;

#[derive(Default)]
struct RouteStats {
    count: u64,
    seconds: f64,
}

/// Request counters: route template → (method, status) → stats. Recording a request that
/// was seen before allocates nothing.
#[derive(Default)]
pub struct HttpMetrics {
    routes: Mutex<HashMap<String, PerRoute>>,
}

/// One route's stats by (method, status).
type PerRoute = HashMap<(&'static str, u16), RouteStats>;

impl HttpMetrics {
    /// Counts one answered request (`method` from [`method_name`]).
    pub fn record(&self, method: &'static str, route: &str, status: u16, seconds: f64) {
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

/// The method's label: a static string, so recording a request allocates nothing for it.
pub fn method_name(m: &Method) -> &'static str {
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

/// Renders every metric: `in_flight` requests are being answered (the caller's included).
pub fn render(
    http: &HttpMetrics,
    in_flight: usize,
    sweep: &SweepCounters,
    store_metrics: &[Metric],
) -> String {
    let mut out = String::new();
    let series = http.series();
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
        in_flight,
    );
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
        "Idempotency records removed past their retention.",
        "counter",
        sweep.evicted.load(Ordering::Relaxed),
    );
    gauge(
        &mut out,
        "cycles_sweep_archived_total",
        "Settled reservations moved from memory to the history store.",
        "counter",
        sweep.archived.load(Ordering::Relaxed),
    );
    for m in store_metrics {
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
