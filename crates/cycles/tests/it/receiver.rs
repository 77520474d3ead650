//! A webhook receiver on a loopback port for the process tests: it answers every POST 200
//! and keeps each one's headers and event id, in the order they came.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::Value;

#[derive(Clone, Default)]
pub struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, String)>>>,
}

impl Receiver {
    /// Starts one; answers it and the URL to subscribe.
    pub async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
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
    "ok"
}
