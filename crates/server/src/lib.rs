//! The Cycles HTTP application: the runtime and admin planes over a [`store::Store`].
//!
//! Handlers parse and validate with `protocol`, turn requests into `ledger` commands,
//! execute them on the store, and render the outcome. Every response carries
//! `X-Request-Id` and `X-Cycles-Trace-Id`; every error body is the protocol's
//! `{error, message, request_id, trace_id, details?}` (see [`correlation`]).

#[cfg(feature = "alloc-count")]
pub mod alloc_count;
mod app;
mod auth;
pub mod correlation;
mod ids;
mod jobs;
mod metrics;
mod openapi;
mod ratelimit;
mod reply;
mod routes;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use store::Store;
use tokio::net::TcpListener;

pub use app::App;
pub use ids::new_key_secret;
pub use ratelimit::RateLimit;

/// What the HTTP layer needs to know.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub listen: SocketAddr,
    /// The operator's admin key (`X-Admin-API-Key`).
    pub admin_api_key: String,
    /// How often the maintenance job expires lapsed reservations and evicts old records.
    pub sweep_interval: Duration,
    /// Per-credential request rate limit; `None` disables it.
    pub rate_limit: Option<RateLimit>,
    /// Serve `/metrics` without the admin key.
    pub public_metrics: bool,
}

/// A server bound to its address, ready to run.
pub struct BoundServer {
    listener: TcpListener,
    app: Arc<App>,
    sweep_interval: Duration,
    rate_limit: Option<RateLimit>,
}

impl BoundServer {
    pub async fn bind(store: Arc<dyn Store>, options: ServerOptions) -> io::Result<Self> {
        let listener = TcpListener::bind(options.listen).await?;
        Ok(BoundServer {
            listener,
            app: Arc::new(App::new(
                store,
                &options.admin_api_key,
                options.public_metrics,
            )),
            sweep_interval: options.sweep_interval,
            rate_limit: options.rate_limit,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then stops accepting, finishes in-flight requests,
    /// stops the background jobs and flushes the store.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
        let sweeper = jobs::spawn_sweeper(self.app.clone(), self.sweep_interval);
        let router = routes::router(self.app.clone(), self.rate_limit);
        let listener = self.listener.tap_io(|tcp| {
            // Replies are small and latency-bound: do not wait to coalesce them.
            let _ = tcp.set_nodelay(true);
        });
        let served = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await;
        sweeper.stop().await;
        self.app.store().shutdown().await;
        served
    }
}
