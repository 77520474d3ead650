//! A webhook receiver on a loopback port for the process tests: it answers every POST 200
//! and keeps each one's headers and event id, in the order they came.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::Value;

#[derive(Clone, Default)]
pub struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, String)>>>,
    /// How long it takes to answer each request.
    delay: Duration,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: Arc<(AtomicUsize, AtomicUsize)>,
}

impl Receiver {
    /// Starts one; answers it and the URL to subscribe.
    pub async fn start() -> (Receiver, String) {
        Receiver::start_slow(Duration::ZERO).await
    }

    /// Starts one that takes `delay` to answer each request (noting it as it arrives).
    pub async fn start_slow(delay: Duration) -> (Receiver, String) {
        let receiver = Receiver {
            delay,
            ..Receiver::default()
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    /// The headers of every request, in order.
    pub fn headers(&self) -> Vec<HeaderMap> {
        let got = self.got.lock().unwrap();
        got.iter().map(|(headers, _)| headers.clone()).collect()
    }

    /// The event id of every request, in the order they came.
    pub fn events(&self) -> Vec<String> {
        let got = self.got.lock().unwrap();
        got.iter().map(|(_, id)| id.clone()).collect()
    }

    /// The most requests it was answering at once.
    pub fn most_at_once(&self) -> usize {
        self.in_flight.1.load(Ordering::SeqCst)
    }

    /// Each event id received, with how many times it came.
    pub fn by_event(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, id) in self.got.lock().unwrap().iter() {
            *counts.entry(id.clone()).or_default() += 1;
        }
        counts
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> &'static str {
    let event: Value = serde_json::from_slice(&body).expect("event JSON");
    let id = event["event_id"].as_str().expect("event id").to_string();
    receiver.got.lock().unwrap().push((headers, id));
    let (now, most) = &*receiver.in_flight;
    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
    tokio::time::sleep(receiver.delay).await;
    now.fetch_sub(1, Ordering::SeqCst);
    "ok"
}
