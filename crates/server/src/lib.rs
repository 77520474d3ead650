//! The Cycles HTTP application: the runtime and admin planes over a [`store::Store`].
//!
//! Handlers parse and validate with `protocol`, turn requests into `ledger` commands,
//! execute them on the store, and render the outcome. Every response carries
//! `X-Request-Id` and `X-Cycles-Trace-Id`; every error body is the protocol's
//! `{error, message, request_id, trace_id, details?}` (see [`correlation`]).
//!
//! # Modules
//!
//! Each layer uses only the layers below it, so the modules form no cycle:
//!
//! 1. `routes`: the route table, the handlers (`/metrics` among them) and the middleware.
//! 2. `app`: the state every handler shares. It owns the store, the `auth::AdminKey`, the
//!    `load::LoadTracker` that decides the [`store::Load`] of each command, the request
//!    counters, the sweep's, the limits' and the anomaly detector's.
//! 3. `conn` (the accept loop, under the limits), `metrics` (the request counters and the
//!    rendering of `/metrics`), `ratelimit`, `correlation`, `audit` (the audit scope of a
//!    request and the entries made from it), `origin` (what a request's events carry),
//!    `forward` (on the Redis engine, requests handed to the instance holding the lease).
//! 4. What knows nothing of the application: `auth` (credentials), `limits` (the bounds on
//!    connections, headers, bodies and requests in flight), `load` (requests in flight),
//!    `jobs` (the expiry sweep: the store and its counters), `detector` (the anomaly
//!    detector), `task` (a background task and its stop), `reply`, `ids`, `openapi`,
//!    `dashboard` (the operator dashboard's files), `alloc_count`, `webhooks` (sealing, the
//!    SSRF guard, the outbound client and the dispatcher).
//!
//! This root wires them together. A test checks what it can of the rule: only `routes` uses
//! `app`, nothing uses `routes`, and there is no cycle.

#[cfg(feature = "alloc-count")]
pub mod alloc_count;
mod app;
mod audit;
pub mod auth;
mod conn;
pub mod correlation;
mod dashboard;
mod detector;
mod forward;
mod ids;
mod jobs;
mod limits;
mod load;
mod metrics;
mod openapi;
mod origin;
mod ratelimit;
mod reply;
mod routes;
mod task;
mod webhooks;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use store::{Engine, Store};
use tokio::net::TcpListener;

pub use app::App;
pub use dashboard::Dashboard;
pub use detector::DetectorOptions;
pub use ids::new_key_secret;
pub use limits::Limits;
pub use ratelimit::RateLimit;
pub use webhooks::new_key as new_webhook_key;

/// What the HTTP layer needs to know.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub listen: SocketAddr,
    /// The operator's admin key (`X-Admin-API-Key`).
    pub admin_api_key: String,
    /// How often the maintenance job expires lapsed reservations and evicts old records.
    pub sweep_interval: Duration,
    /// How long a settled reservation stays in memory before the maintenance job archives
    /// it to the history store.
    pub archive_after: Duration,
    /// Per-credential request rate limit; `None` disables it.
    pub rate_limit: Option<RateLimit>,
    /// Serve `/metrics` without the admin key.
    pub public_metrics: bool,
    /// A dashboard build to serve on the same listener; `None` serves only the API.
    pub dashboard: Option<Dashboard>,
    /// Audit entries of unauthenticated refusals one client address may leave per minute
    /// (0: every one).
    pub audit_unauthenticated_per_minute: u32,
    /// The keys webhook secrets are sealed with at rest: the first seals, all open. Empty:
    /// a key for this process only (secrets stored now cannot be opened after a restart).
    pub webhook_keys: Vec<[u8; 32]>,
    /// Bounds on connections, headers, bodies and requests in flight.
    pub limits: Limits,
    /// The anomaly detector's tick and latency threshold.
    pub detector: DetectorOptions,
}

/// A server bound to its address, ready to run.
pub struct BoundServer {
    listener: TcpListener,
    app: Arc<App>,
    sweep_interval: Duration,
    archive_after: Duration,
    rate_limit: Option<RateLimit>,
    dashboard: Option<Dashboard>,
}

impl BoundServer {
    pub async fn bind(store: impl Into<Engine>, options: ServerOptions) -> io::Result<Self> {
        let listener = TcpListener::bind(options.listen).await?;
        Ok(BoundServer {
            listener,
            app: Arc::new(App::new(
                Arc::new(store.into()),
                &options.admin_api_key,
                options.public_metrics,
                options.audit_unauthenticated_per_minute,
                Arc::new(webhooks::Webhooks::new(&options.webhook_keys)),
                Arc::new(limits::Bounds::new(options.limits)),
                Arc::new(detector::Detector::new(options.detector)),
            )),
            sweep_interval: options.sweep_interval,
            archive_after: options.archive_after,
            rate_limit: options.rate_limit,
            dashboard: options.dashboard,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then stops accepting, finishes in-flight requests,
    /// stops the background jobs and flushes the store.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let sweeper = jobs::spawn_sweeper(
            self.app.store().clone(),
            self.app.sweep_counters().clone(),
            self.app.detector().clone(),
            self.sweep_interval,
            self.archive_after,
        );
        let detector =
            detector::spawn_detector(self.app.store().clone(), self.app.detector().clone());
        let dispatcher = webhooks::spawn_dispatcher(
            self.app.store().clone(),
            self.app.webhooks().clone(),
            self.app.dispatch_counters().clone(),
        );
        let router = routes::router(self.app.clone(), self.rate_limit, self.dashboard);
        let served = conn::serve(self.listener, router, self.app.bounds().clone(), shutdown).await;
        sweeper.stop().await;
        detector.stop().await;
        dispatcher.stop().await;
        self.app.store().shutdown().await;
        served
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs;
    use std::path::Path;

    /// Each module of this crate (a file under `src/`, or a folder and everything in it) →
    /// the modules it names as `crate::module` outside comments. The root is left out.
    fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut graph = BTreeMap::new();
        for entry in fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let module = path.file_stem().unwrap().to_string_lossy().into_owned();
            if module != "lib" {
                let mut named = BTreeSet::new();
                collect_names(&path, &mut named);
                named.remove(&module);
                graph.insert(module, named);
            }
        }
        graph
    }

    fn collect_names(path: &Path, named: &mut BTreeSet<String>) {
        if path.is_dir() {
            for entry in fs::read_dir(path).unwrap() {
                collect_names(&entry.unwrap().path(), named);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let source = fs::read_to_string(path).unwrap();
            let code: Vec<&str> = source
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect();
            let code = code.join("\n");
            for (at, _) in code.match_indices("crate::") {
                named.extend(first_segments(&code[at + "crate::".len()..]));
            }
        }
    }

    /// The first segment of the path that starts `rest`, or of each path in a `{...}` group.
    fn first_segments(rest: &str) -> Vec<String> {
        let segment = |path: &str| {
            path.trim_start()
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default()
                .to_string()
        };
        let Some(group) = rest.strip_prefix('{') else {
            return vec![segment(rest)];
        };
        let (mut depth, mut start, mut paths) = (0, 0, Vec::new());
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                ',' | '}' if depth == 0 => {
                    paths.push(segment(&group[start..i]));
                    start = i + 1;
                    if c == '}' {
                        break;
                    }
                }
                _ => {}
            }
        }
        paths.retain(|p| !p.is_empty());
        paths
    }

    /// Whether a path of modules, each naming the next, leads from `module` back to the
    /// first module of `path` (to `module` itself when `path` is empty); `path` then holds it.
    fn cycle_through(
        graph: &BTreeMap<String, BTreeSet<String>>,
        module: &str,
        path: &mut Vec<String>,
    ) -> bool {
        if path.first().is_some_and(|first| first == module) {
            return true;
        }
        if path.iter().any(|m| m == module) {
            return false;
        }
        path.push(module.to_string());
        if graph[module]
            .iter()
            .any(|next| cycle_through(graph, next, path))
        {
            return true;
        }
        path.pop();
        false
    }

    #[test]
    fn the_modules_form_layers() {
        let graph = module_graph();
        for (module, named) in &graph {
            for name in named {
                assert!(
                    graph.contains_key(name),
                    "{module} names crate::{name}, which is not a module: name the module \
                     that defines it"
                );
                assert!(
                    name != "app" || module == "routes",
                    "{module} uses app: only routes may"
                );
                assert_ne!(name, "routes", "{module} uses routes");
            }
        }
        for module in graph.keys() {
            let mut path = Vec::new();
            assert!(
                !cycle_through(&graph, module, &mut path),
                "the modules {path:?} form a cycle"
            );
        }
    }
}
