//! A webhook receiver for the webhooks phase: counts the deliveries it is sent and answers
//! each 200 at once, so what is measured is the server's side.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Receiver {
    addr: SocketAddr,
    count: Arc<AtomicU64>,
}

impl Receiver {
    /// Listens on a loopback port, in the background.
    pub async fn start() -> anyhow::Result<Receiver> {
        let count = Arc::new(AtomicU64::new(0));
        let counter = count.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                counter.fetch_add(1, Ordering::Relaxed);
                async { "ok" }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Receiver { addr, count })
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Deliveries received so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}
