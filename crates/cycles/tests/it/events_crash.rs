//! Events and webhooks across kill -9 (the test): funding under load with a real
//! receiver running, SIGKILL, restart. Afterwards every acknowledged funding has its event,
//! delivered at least once (the receiver dedupes by event id); every event belongs to a
//! request that was sent; and the events are exactly the changes the budget shows, so a
//! crash neither lost one nor invented one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::process::{client, Server, ADMIN_KEY};

const CLIENTS: usize = 4;
const LOAD: Duration = Duration::from_millis(1_200);
const KILL_CYCLES: usize = 2;
const UNIT: &str = "USD_MICROCENTS";

/// Event ids received, with how many times each came.
type Received = Arc<Mutex<BTreeMap<String, usize>>>;

async fn start_receiver() -> (Received, String) {
    let got: Received = Arc::default();
    async fn receive(State(got): State<Received>, _: HeaderMap, body: Bytes) -> &'static str {
        let event: Value = serde_json::from_slice(&body).expect("event JSON");
        let id = event["event_id"].as_str().expect("event id").to_string();
        *got.lock().unwrap().entry(id).or_default() += 1;
        "ok"
    }
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (got, format!("http://{addr}/hook"))
}

async fn admin(method: reqwest::Method, url: String, body: Value) -> reqwest::Response {
    client()
        .request(method, url)
        .header("X-Admin-API-Key", ADMIN_KEY)
        .json(&body)
        .send()
        .await
        .expect("admin request")
}

/// Funds until `until` or the first transport failure; answers `(request id, status)` of
/// each answered request, and how many were sent.
async fn funding(
    base: String,
    client_id: usize,
    cycle: usize,
    until: Instant,
) -> (Vec<(String, u16)>, usize) {
    let http = client();
    let mut answered = Vec::new();
    let mut sent = 0;
    while Instant::now() < until {
        sent += 1;
        let body = json!({"operation": "CREDIT", "amount": {"unit": UNIT, "amount": 1},
                          "idempotency_key": format!("f-{cycle}-{client_id}-{sent}")});
        let r = http
            .post(format!(
                "{base}/v1/admin/budgets/fund?scope=tenant:acme&unit={UNIT}&tenant_id=acme"
            ))
            .header("X-Admin-API-Key", ADMIN_KEY)
            .json(&body)
            .send()
            .await;
        match r {
            Ok(r) => {
                let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
                answered.push((id, r.status().as_u16()));
            }
            Err(_) => break,
        }
    }
    (answered, sent)
}

/// Every `budget.funded` event: request id → event ids.
async fn funded_events(base: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let url = format!("{base}/v1/admin/events?event_type=budget.funded&limit=100{cursor}");
        let page: Value = admin(reqwest::Method::GET, url, json!(null))
            .await
            .json()
            .await
            .unwrap();
        for e in page["events"].as_array().unwrap() {
            let request = e["request_id"].as_str().expect("request id").to_string();
            out.entry(request)
                .or_default()
                .push(e["event_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_change_has_its_event_delivered_after_kill_9() {
    let dir = TempDir::new().expect("temp dir");
    let data = dir.path().join("data");
    let (received, url) = start_receiver().await;
    let mut server = Server::start(&data, dir.path()).await;
    let base = server.base.clone();
    // The loopback receiver is let through the SSRF guard by its configuration.
    let r = admin(
        reqwest::Method::PUT,
        format!("{base}/v1/admin/config/webhook-security"),
        json!({"blocked_cidr_ranges": [], "allow_http": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = admin(
        reqwest::Method::POST,
        format!("{base}/v1/admin/tenants"),
        json!({"tenant_id": "acme", "name": "acme"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = admin(
        reqwest::Method::POST,
        format!("{base}/v1/admin/webhooks?tenant_id=acme"),
        json!({"url": url, "event_types": ["budget.funded"],
               "retry_policy": {"max_retries": 10, "initial_delay_ms": 100, "max_delay_ms": 1000}}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = admin(
        reqwest::Method::POST,
        format!("{base}/v1/admin/budgets"),
        json!({"tenant_id": "acme", "scope": "tenant:acme", "unit": UNIT,
               "allocated": {"unit": UNIT, "amount": 0}}),
    )
    .await;
    assert_eq!(r.status(), 201);

    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    let mut answered_all: BTreeSet<String> = BTreeSet::new();
    let mut sent_total = 0;
    for cycle in 0..KILL_CYCLES {
        let until = Instant::now() + LOAD * 4;
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| tokio::spawn(funding(server.base.clone(), c, cycle, until)))
            .collect();
        tokio::time::sleep(LOAD).await;
        server.kill();
        for task in tasks {
            let (answered, sent) = task.await.expect("writer");
            sent_total += sent;
            for (id, status) in answered {
                assert_eq!(status, 200, "a funding was refused");
                acknowledged.insert(id.clone());
                answered_all.insert(id);
            }
        }
        server = Server::start(&data, dir.path()).await;
    }
    let base = server.base.clone();
    assert!(
        acknowledged.len() > 20,
        "too little load: {}",
        acknowledged.len()
    );

    let events = funded_events(&base).await;
    // Exactly the changes the budget shows: one event per credit of 1.
    let lookup = admin(
        reqwest::Method::GET,
        format!("{base}/v1/admin/budgets/lookup?scope=tenant:acme&unit={UNIT}"),
        json!(null),
    )
    .await;
    let budget: Value = lookup.json().await.unwrap();
    let allocated = budget["allocated"]["amount"].as_i64().unwrap();
    let event_count: usize = events.values().map(Vec::len).sum();
    assert_eq!(event_count as i64, allocated, "events = changes");
    assert!(
        events.values().all(|ids| ids.len() == 1),
        "one event per request"
    );
    for id in &acknowledged {
        assert!(events.contains_key(id), "acknowledged {id} has no event");
    }
    // A request whose answer the kill cut off may have been made durable or not: either
    // way its event exists exactly when its change does (counted above). None is made up.
    assert!(events.len() <= sent_total);
    // Delivered at least once, every one, after the restarts.
    let want: BTreeSet<String> = events.values().flatten().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeSet<String> = received.lock().unwrap().keys().cloned().collect();
        let missing: Vec<_> = want.difference(&got).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} events never delivered, e.g. {:?}",
            missing.len(),
            want.len(),
            missing.first()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let delivered: Vec<String> = received.lock().unwrap().keys().cloned().collect();
    assert!(
        delivered.iter().all(|id| want.contains(id)),
        "a delivered event is not in the log"
    );
    eprintln!(
        "kill -9 x{KILL_CYCLES}: {} fundings acknowledged of {sent_total} sent, {event_count} \
         events, every one delivered",
        acknowledged.len()
    );
    server.terminate().await;
}
