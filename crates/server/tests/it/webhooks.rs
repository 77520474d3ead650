//! Events and webhooks over HTTP (admin spec §2.5–2.7, §3.6–3.7, §4.1): events emitted by
//! the operations that cause them and listed from the event log; subscriptions and their
//! invariants; the SSRF guard; deliveries to a real receiver, signed, retried, recorded;
//! auto-disable; replay.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::common::{As, Engine, TestServer};

engine_tests!(
    governance_operations_emit_events,
    event_lists_filter_and_page,
    tenant_keys_see_only_their_own_events,
    subscriptions_keep_the_invariants,
    the_ssrf_guard_refuses_private_addresses,
    deliveries_are_signed_and_recorded,
    failed_deliveries_retry_then_disable,
    paused_subscriptions_receive_nothing,
    replay_queues_past_events,
    test_probe_reaches_the_receiver,
    bulk_actions_pause_resume_and_delete,
    a_hanging_or_redirecting_receiver_holds_up_only_itself,
    an_endless_response_body_is_never_read,
    threshold_crossings_reach_the_levels_subscribed,
    expired_keys_are_announced_once,
    a_delivery_a_day_late_is_failed_not_sent,
    a_pause_stops_the_deliveries_already_taken,
    webhook_and_event_lists_ignore_parameters_they_do_not_declare,
    a_closed_tenants_webhook_is_neither_tested_nor_replayed,
    an_update_clears_the_fields_sent_as_null,
    a_key_without_write_permission_learns_nothing_of_a_url,
);

const USD: &str = "USD_MICROCENTS";

/// A webhook receiver on a loopback port: records every request, answers `status`.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    status: Arc<AtomicU16>,
}

impl Receiver {
    pub(crate) async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        receiver.status.store(200, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    pub(crate) fn received(&self) -> Vec<(HeaderMap, Value)> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(h, b)| (h.clone(), serde_json::from_slice(b).expect("JSON body")))
            .collect()
    }

    /// Waits until `n` requests came in (the dispatcher polls every 50 ms).
    pub(crate) async fn wait_for(&self, n: usize) -> Vec<(HeaderMap, Value)> {
        for _ in 0..200 {
            if self.got.lock().unwrap().len() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let got = self.received();
        assert!(got.len() >= n, "expected {n} deliveries, got {}", got.len());
        got
    }

    /// Checks every request's signature against `secret`.
    fn assert_signed(&self, secret: &str) {
        for (headers, body) in self.got.lock().unwrap().iter() {
            let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
            mac.update(body);
            let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
            assert_eq!(headers["x-cycles-signature"], want.as_str());
        }
    }
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    r.got.lock().unwrap().push((headers, body));
    StatusCode::from_u16(r.status.load(Ordering::SeqCst)).unwrap()
}

/// Lets the tests' loopback receiver through the SSRF guard, as an operator's development
/// setup would: by the configuration endpoint, nothing hidden.
pub(crate) async fn allow_loopback(s: &TestServer) {
    let r = s
        .send(
            Method::PUT,
            "/v1/admin/config/webhook-security",
            As::Admin,
            Some(&json!({"blocked_cidr_ranges": [], "allow_http": true})),
        )
        .await;
    r.expect(200, None);
}

/// Events of the admin event log matching `query`, oldest first.
pub(crate) async fn events(s: &TestServer, query: &str) -> Vec<Value> {
    let r = s
        .get(&format!("/v1/admin/events?sort_dir=asc&{query}"), As::Admin)
        .await;
    r.expect(200, None)["events"].as_array().unwrap().clone()
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect()
}

pub(crate) async fn create_webhook(s: &TestServer, tenant: Option<&str>, body: Value) -> Value {
    let path = match tenant {
        Some(t) => format!("/v1/admin/webhooks?tenant_id={t}"),
        None => "/v1/admin/webhooks".into(),
    };
    s.post(&path, As::Admin, body)
        .await
        .expect(201, None)
        .clone()
}

/// A server with tenant acme and one subscription of acme's, `body` with a receiver of the
/// test's as its URL: the server, the receiver and what the create answered.
async fn acme_subscribed(engine: Engine, mut body: Value) -> (TestServer, Receiver, Value) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let (receiver, url) = Receiver::start().await;
    s.tenant("acme").await;
    body["url"] = json!(url);
    let created = create_webhook(&s, Some("acme"), body).await;
    (s, receiver, created)
}

/// The id of the subscription a create answered.
fn subscription_id(created: &Value) -> String {
    created["subscription"]["subscription_id"]
        .as_str()
        .expect("subscription_id")
        .to_string()
}

pub(crate) async fn deliveries(s: &TestServer, id: &str) -> Vec<Value> {
    let r = s
        .get(&format!("/v1/admin/webhooks/{id}/deliveries"), As::Admin)
        .await;
    r.expect(200, None)["deliveries"]
        .as_array()
        .unwrap()
        .clone()
}

/// Waits until the subscription's deliveries satisfy `done`.
async fn wait_deliveries(s: &TestServer, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    for _ in 0..200 {
        let d = deliveries(s, id).await;
        if done(&d) {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "deliveries of {id} never settled: {:?}",
        deliveries(s, id).await
    );
}

async fn fund(s: &TestServer, scope: &str, amount: i64, key: &str) {
    let tenant = scope.trim_start_matches("tenant:");
    let r = s
        .post(
            &format!("/v1/admin/budgets/fund?scope={scope}&unit={USD}&tenant_id={tenant}"),
            As::Admin,
            json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": amount},
                   "idempotency_key": key}),
        )
        .await;
    r.expect(200, None);
}

async fn governance_operations_emit_events(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    s.budget("tenant:acme", USD, 1_000, json!({})).await;
    let r = s
        .post(
            &format!("/v1/admin/budgets/fund?scope=tenant:acme&unit={USD}&tenant_id=acme"),
            As::Admin,
            json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": 500},
                   "reason": "top-up INV-42"}),
        )
        .await;
    r.expect(200, None);
    let r = s
        .post(
            &format!("/v1/admin/budgets/freeze?scope=tenant:acme&unit={USD}"),
            As::Admin,
            json!({"reason": "[EMERGENCY_FREEZE] drill"}),
        )
        .await;
    r.expect(200, None);
    let key_resp = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "k"}),
        )
        .await;
    let key_id = key_resp.expect(201, None)["key_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s
        .send(
            Method::PATCH,
            "/v1/admin/tenants/acme",
            As::Admin,
            Some(&json!({"status": "CLOSED"})),
        )
        .await;
    r.expect(200, None);
    let all = events(&s, "tenant_id=acme").await;
    assert_eq!(
        types(&all),
        [
            "tenant.created",
            "budget.created",
            "budget.funded",
            "budget.frozen",
            "api_key.created",
            "tenant.closed",
            "api_key.revoked_via_tenant_cascade",
            "budget.closed_via_tenant_cascade",
        ]
    );
    let funded = &all[2];
    assert_eq!(funded["category"], "budget");
    assert_eq!(funded["scope"], "tenant:acme");
    assert_eq!(funded["source"], "cycles-admin");
    assert_eq!(funded["actor"]["type"], "admin_on_behalf_of");
    assert_eq!(funded["data"]["operation"], "CREDIT");
    assert_eq!(funded["data"]["previous_state"]["allocated"], 1_000);
    assert_eq!(funded["data"]["new_state"]["allocated"], 1_500);
    assert_eq!(funded["data"]["reason"], "top-up INV-42");
    assert!(funded["event_id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(funded["trace_id"].as_str().unwrap().len(), 32);
    assert_eq!(all[3]["data"]["reason"], "[EMERGENCY_FREEZE] drill");
    assert_eq!(all[4]["data"]["key_id"], key_id.as_str());
    assert_eq!(all[4]["actor"]["type"], "admin");
    // The close and its cascade share one correlation id, made from the request's id.
    let correlation = all[5]["correlation_id"].as_str().unwrap();
    assert!(
        correlation.starts_with("tenant_close_cascade:acme:req_")
            || correlation.starts_with("tenant_close_cascade:acme:")
    );
    assert!(all[5..].iter().all(|e| e["correlation_id"] == correlation));
    assert_eq!(
        events(&s, &format!("correlation_id={correlation}"))
            .await
            .len(),
        3
    );
    // One event by id; an unknown id is 404 EVENT_NOT_FOUND.
    let id = funded["event_id"].as_str().unwrap();
    let one = s.get(&format!("/v1/admin/events/{id}"), As::Admin).await;
    assert_eq!(one.expect(200, None), funded);
    s.get("/v1/admin/events/evt_0000000000000000", As::Admin)
        .await
        .expect(404, Some("EVENT_NOT_FOUND"));
    // A refused change emits nothing.
    let before = events(&s, "").await.len();
    let r = s
        .post(
            &format!("/v1/admin/budgets/fund?scope=tenant:acme&unit={USD}&tenant_id=acme"),
            As::Admin,
            json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": 1}, "idempotency_key": "f2"}),
        )
        .await;
    r.expect(409, Some("TENANT_CLOSED"));
    assert_eq!(events(&s, "").await.len(), before);
    s.stop().await;
}

async fn event_lists_filter_and_page(engine: Engine) {
    let s = TestServer::start(engine).await;
    for t in ["aaa", "bbb"] {
        s.tenant(t).await;
        s.budget(&format!("tenant:{t}"), USD, 100, json!({})).await;
    }
    for i in 0..5 {
        fund(&s, "tenant:aaa", 1, &format!("a{i}")).await;
    }
    assert_eq!(
        events(&s, "tenant_id=aaa&event_type=budget.funded")
            .await
            .len(),
        5
    );
    assert_eq!(events(&s, "category=tenant").await.len(), 2);
    assert_eq!(events(&s, "scope=tenant:bbb").await.len(), 1);
    assert_eq!(events(&s, "search=TENANT:AAA").await.len(), 6);
    // Pages of two, newest first, cover everything once.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = s
            .get(
                &format!("/v1/admin/events?tenant_id=aaa&limit=2{cursor}"),
                As::Admin,
            )
            .await;
        let body = r.expect(200, None).clone();
        seen.extend(
            body["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event_id"].clone()),
        );
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 7);
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.as_str().cmp(&a.as_str()));
    assert_eq!(seen, sorted, "newest first");
    for bad in [
        "event_type=budget.nope",
        "category=money",
        "trace_id=XYZ",
        "from=yesterday",
        "sort_by=amount",
        "cursor=zz",
    ] {
        s.get(&format!("/v1/admin/events?{bad}"), As::Admin)
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    s.get("/v1/admin/events", As::Nobody)
        .await
        .expect(401, None);
    s.stop().await;
}

async fn tenant_keys_see_only_their_own_events(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("aaa").await;
    s.tenant("bbb").await;
    let reader = s
        .key_with("aaa", json!({"permissions": ["events:read"]}))
        .await
        .0;
    let plain = s.key("aaa").await;
    s.budget("tenant:aaa", USD, 100, json!({})).await;
    s.budget("tenant:bbb", USD, 100, json!({})).await;
    let r = s.get("/v1/events", As::Key(&reader)).await;
    let got = r.expect(200, None)["events"].as_array().unwrap().clone();
    // Its tenant's budget and tenant events; never api_key.* (admin-only), never b's.
    assert_eq!(types(&got), ["budget.created", "tenant.created"]);
    assert!(got.iter().all(|e| e["tenant_id"] == "aaa"));
    s.get("/v1/events", As::Key(&plain))
        .await
        .expect(403, Some("INSUFFICIENT_PERMISSIONS"));
    // `tenant_id` is no parameter of this list: ignored, it reaches no other tenant.
    let r = s.get("/v1/events?tenant_id=bbb", As::Key(&reader)).await;
    assert_eq!(r.expect(200, None)["events"], json!(got));
    s.stop().await;
}

async fn subscriptions_keep_the_invariants(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    s.tenant("other").await;
    let url = "http://127.0.0.1:9/hook";
    // INVARIANT 2: a tenant's subscription carries no admin-only selector, under any key.
    for body in [
        json!({"url": url, "event_types": ["api_key.created"]}),
        json!({"url": url, "event_types": ["budget.funded"], "event_categories": ["system"]}),
    ] {
        let r = s
            .post("/v1/admin/webhooks?tenant_id=acme", As::Admin, body)
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
    }
    for (body, field) in [
        (json!({"url": url, "event_types": []}), "event_types"),
        (
            json!({"url": url, "event_types": ["budget.nope"]}),
            "event_types",
        ),
        (
            json!({"url": url, "event_types": ["budget.funded"], "retry_policy": {"max_retries": 11}}),
            "retry_policy.max_retries",
        ),
        (
            json!({"url": url, "event_types": ["budget.funded"], "retry_policy": {"backoff_multiplier": 0.5}}),
            "retry_policy.backoff_multiplier",
        ),
        (
            json!({"url": url, "event_types": ["budget.funded"], "disable_after_failures": 0}),
            "disable_after_failures",
        ),
        (
            json!({"url": url, "event_types": ["budget.funded"], "status": "ACTIVE"}),
            "status",
        ),
        (
            json!({"url": "ftp://x/", "event_types": ["budget.funded"]}),
            "scheme",
        ),
    ] {
        let r = s
            .post("/v1/admin/webhooks?tenant_id=acme", As::Admin, body)
            .await;
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        assert!(
            r.body["message"].as_str().unwrap().contains(field),
            "{field}: {}",
            r.body
        );
    }
    s.post(
        "/v1/admin/webhooks?tenant_id=nobody",
        As::Admin,
        json!({"url": url, "event_types": ["budget.funded"]}),
    )
    .await
    .expect(404, None);
    let r = s.get("/v1/admin/webhooks", As::Admin).await;
    assert_eq!(
        r.expect(200, None)["subscriptions"],
        json!([]),
        "nothing was stored"
    );
    // A system-wide subscription may listen to admin-only events.
    let system = create_webhook(
        &s,
        None,
        json!({"url": url, "event_types": ["api_key.created"]}),
    )
    .await;
    assert_eq!(system["subscription"]["tenant_id"], "__system__");
    let secret = system["signing_secret"].as_str().unwrap();
    assert!(secret.len() >= 32);
    // The tenant plane: its own tenant only; another tenant's is 404.
    let key = s
        .key_with(
            "acme",
            json!({"permissions": ["webhooks:read", "webhooks:write"]}),
        )
        .await
        .0;
    let mine = s
        .post(
            "/v1/webhooks",
            As::Key(&key),
            json!({"url": url, "event_categories": ["budget"], "event_types": ["tenant.updated"],
            "headers": {"Authorization": "Bearer s3cret"}}),
        )
        .await;
    let mine = mine.expect(201, None)["subscription"].clone();
    assert_eq!(mine["tenant_id"], "acme");
    assert_eq!(
        mine["headers"]["Authorization"], "********",
        "header values are masked"
    );
    let id = mine["subscription_id"].as_str().unwrap();
    let theirs = create_webhook(
        &s,
        Some("other"),
        json!({"url": url, "event_types": ["budget.funded"]}),
    )
    .await;
    let theirs = subscription_id(&theirs);
    s.get(&format!("/v1/webhooks/{theirs}"), As::Key(&key))
        .await
        .expect(404, None);
    let listed = s.get("/v1/webhooks", As::Key(&key)).await;
    let listed = listed.expect(200, None)["subscriptions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].get("signing_secret").is_none());
    s.post(
        "/v1/webhooks",
        As::Key(&key),
        json!({"url": url, "event_types": ["policy.created"]}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    // PATCH: the effective selectors must keep a selector; categories alone are fine.
    let patch = |body: Value| {
        let path = format!("/v1/webhooks/{id}");
        let key = key.clone();
        let s = &s;
        async move {
            s.send(Method::PATCH, &path, As::Key(&key), Some(&body))
                .await
        }
    };
    patch(json!({"event_types": []})).await.expect(200, None);
    patch(json!({"event_categories": []}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    patch(json!({"status": "DISABLED"}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    // A window is whole seconds (the spec's integer), within 60 s to a day.
    for window in [
        json!(60.5),
        json!(120.0),
        json!(59),
        json!(86_401),
        json!("120"),
    ] {
        patch(json!({"thresholds": {"rate_window_seconds": window}}))
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    patch(json!({"thresholds": {"burn_rate_window_seconds": 120}}))
        .await
        .expect(200, None);
    let r = s
        .get("/v1/admin/events?event_type=webhook.created", As::Admin)
        .await;
    assert_eq!(
        r.expect(200, None)["events"].as_array().unwrap().len(),
        2,
        "the admin plane's creates only"
    );
    s.send(
        Method::DELETE,
        &format!("/v1/webhooks/{id}"),
        As::Key(&key),
        None,
    )
    .await
    .expect(204, None);
    s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin)
        .await
        .expect(404, Some("WEBHOOK_NOT_FOUND"));
    s.stop().await;
}

async fn the_ssrf_guard_refuses_private_addresses(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    for url in [
        "https://127.0.0.1/hook",
        "https://10.0.0.8/hook",
        "https://[::1]/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://localhost/hook",
        "http://93.184.216.34/hook",
    ] {
        let r = s
            .post(
                "/v1/admin/webhooks?tenant_id=acme",
                As::Admin,
                json!({"url": url, "event_types": ["budget.funded"]}),
            )
            .await;
        r.expect(400, Some("WEBHOOK_URL_INVALID"));
        assert!(
            r.body["message"].as_str().unwrap().contains(url),
            "{}",
            r.body
        );
    }
    let config = s.get("/v1/admin/config/webhook-security", As::Admin).await;
    let config = config.expect(200, None).clone();
    assert_eq!(config["allow_http"], false);
    assert!(config["blocked_cidr_ranges"]
        .as_array()
        .unwrap()
        .contains(&json!("127.0.0.0/8")));
    for bad in [
        json!({"blocked_cidr_ranges": ["not-a-range"]}),
        json!({"allow_http": "yes"}),
        json!({"surprise": true}),
    ] {
        s.send(
            Method::PUT,
            "/v1/admin/config/webhook-security",
            As::Admin,
            Some(&bad),
        )
        .await
        .expect(400, Some("INVALID_REQUEST"));
    }
    // A subscription made while loopback was allowed is refused at delivery once it is not.
    let (receiver, url) = Receiver::start().await;
    allow_loopback(&s).await;
    let w = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.created"]}),
    )
    .await;
    let id = w["subscription"]["subscription_id"].as_str().unwrap();
    s.send(
        Method::PUT,
        "/v1/admin/config/webhook-security",
        As::Admin,
        Some(&json!({"allow_http": true})),
    )
    .await
    .expect(200, None);
    s.budget("tenant:acme", USD, 10, json!({})).await;
    let d = wait_deliveries(&s, id, |d| {
        d.first().is_some_and(|d| d["attempts"].as_u64() >= Some(1))
    })
    .await;
    assert!(
        d[0]["error_message"].as_str().unwrap().contains("blocked"),
        "{:?}",
        d[0]
    );
    assert!(
        receiver.received().is_empty(),
        "nothing reached the receiver"
    );
    s.stop().await;
}

async fn deliveries_are_signed_and_recorded(engine: Engine) {
    let (s, receiver, created) = acme_subscribed(
        engine,
        json!({"event_types": ["budget.funded", "budget.exhausted"],
               "headers": {"Authorization": "Bearer t0ken"}}),
    )
    .await;
    let secret = created["signing_secret"].as_str().unwrap().to_string();
    let id = subscription_id(&created);
    // A subscription of another tenant hears nothing of this one.
    let (elsewhere, other_url) = Receiver::start().await;
    s.tenant("other").await;
    create_webhook(
        &s,
        Some("other"),
        json!({"url": other_url, "event_types": ["budget.funded"]}),
    )
    .await;
    let key = s.key("acme").await;
    s.budget("tenant:acme", USD, 100, json!({})).await;
    fund(&s, "tenant:acme", 50, "f1").await;
    // Spending all of it: budget.exhausted from the runtime.
    let r = s
        .post(
            "/v1/events",
            As::Key(&key),
            json!({"idempotency_key": "e1", "subject": {"tenant": "acme"},
                   "action": {"kind": "llm.completion", "name": "gpt"},
                   "actual": {"unit": USD, "amount": 150}}),
        )
        .await;
    r.expect(201, None);
    let got = receiver.wait_for(2).await;
    receiver.assert_signed(&secret);
    let (headers, body) = &got[0];
    assert_eq!(body["event_type"], "budget.funded");
    assert_eq!(headers["x-cycles-event-type"], "budget.funded");
    assert_eq!(
        headers["x-cycles-event-id"],
        body["event_id"].as_str().unwrap()
    );
    assert_eq!(
        headers["x-cycles-trace-id"],
        body["trace_id"].as_str().unwrap()
    );
    assert_eq!(
        headers["authorization"], "Bearer t0ken",
        "custom headers, opened"
    );
    assert_eq!(headers["content-type"], "application/json");
    let traceparent = headers["traceparent"].to_str().unwrap();
    assert!(traceparent.starts_with(&format!("00-{}-", body["trace_id"].as_str().unwrap())));
    assert_eq!(got[1].1["event_type"], "budget.exhausted");
    assert_eq!(got[1].1["actor"]["type"], "api_key");
    assert_eq!(got[1].1["source"], "cycles-server");
    assert_eq!(got[1].1["data"]["remaining"], 0);
    let d = wait_deliveries(&s, &id, |d| {
        d.len() == 2 && d.iter().all(|d| d["status"] == "SUCCESS")
    })
    .await;
    assert_eq!(d[0]["attempts"], 1);
    assert_eq!(d[0]["response_status"], 200);
    assert_eq!(d[0]["event_type"], "budget.exhausted", "newest first");
    let w = s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin).await;
    let w = w.expect(200, None).clone();
    assert_eq!(w["consecutive_failures"], 0);
    assert!(w["last_success_at"].as_str().is_some());
    assert!(
        elsewhere.received().is_empty(),
        "another tenant's subscription heard nothing"
    );
    s.get(
        &format!("/v1/admin/webhooks/{id}/deliveries?status=BOGUS"),
        As::Admin,
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.get("/v1/admin/webhooks/whsub_none/deliveries", As::Admin)
        .await
        .expect(404, Some("WEBHOOK_NOT_FOUND"));
    s.stop().await;
}

async fn failed_deliveries_retry_then_disable(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let (receiver, url) = Receiver::start().await;
    receiver.status.store(503, Ordering::SeqCst);
    s.tenant("acme").await;
    // A system subscription hears the dispatcher's own events.
    let (watcher, watcher_url) = Receiver::start().await;
    create_webhook(
        &s,
        None,
        json!({"url": watcher_url, "event_types": ["webhook.disabled", "system.webhook_delivery_failed"]}),
    )
    .await;
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.created"], "disable_after_failures": 1,
               "retry_policy": {"max_retries": 2, "initial_delay_ms": 1000, "backoff_multiplier": 2.0}}),
    )
    .await;
    let id = subscription_id(&created);
    s.budget("tenant:acme", USD, 100, json!({})).await;
    receiver.wait_for(1).await;
    let d = wait_deliveries(&s, &id, |d| {
        d.first().is_some_and(|d| d["status"] == "RETRYING")
    })
    .await;
    assert_eq!(d[0]["response_status"], 503);
    assert!(d[0]["next_retry_at"].as_str().is_some());
    // Not due until its delay (1 s ± 10 %) has passed on the server's clock.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.received().len(), 1);
    s.advance(1_200);
    receiver.wait_for(2).await;
    // The second attempt's next retry is set from the clock when its answer is recorded:
    // advancing before that would move the retry along with it.
    wait_deliveries(&s, &id, |d| {
        d.first()
            .is_some_and(|d| d["attempts"] == 2 && d["status"] == "RETRYING")
    })
    .await;
    s.advance(2_400);
    receiver.wait_for(3).await;
    let d = wait_deliveries(&s, &id, |d| {
        d.first().is_some_and(|d| d["status"] == "FAILED")
    })
    .await;
    assert_eq!(d[0]["attempts"], 3, "the first try and two retries");
    let w = s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin).await;
    let w = w.expect(200, None).clone();
    assert_eq!(w["status"], "DISABLED");
    assert_eq!(w["consecutive_failures"], 1);
    let disabled = events(&s, "event_type=webhook.disabled").await;
    assert_eq!(disabled.len(), 1, "exactly one webhook.disabled");
    assert_eq!(disabled[0]["data"]["previous_status"], "ACTIVE");
    assert_eq!(
        disabled[0]["data"]["disable_reason"],
        "consecutive_failures_exceeded_threshold"
    );
    assert_eq!(disabled[0]["actor"]["type"], "system");
    let watched = watcher.wait_for(2).await;
    let mut watched_types: Vec<_> = watched
        .iter()
        .map(|(_, b)| b["event_type"].as_str().unwrap().to_string())
        .collect();
    watched_types.sort();
    assert_eq!(
        watched_types,
        ["system.webhook_delivery_failed", "webhook.disabled"]
    );
    // The overview counts it, and lists it among the failing.
    let overview = s.get("/v1/admin/overview", As::Admin).await;
    let overview = overview.expect(200, None).clone();
    assert_eq!(overview["webhook_counts"]["disabled"], 1);
    assert_eq!(overview["webhook_counts"]["with_failures"], 1);
    assert_eq!(
        overview["failing_webhooks"][0]["subscription_id"],
        id.as_str()
    );
    assert_eq!(
        overview["event_counts"]["by_category"]["webhook"], 3,
        "created twice, disabled once: {overview}"
    );
    // Disabled, it receives nothing more; re-enabled, its count starts again.
    s.budget("tenant:acme/workspace:w", USD, 1, json!({})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.received().len(), 3);
    let r = s
        .send(
            Method::PATCH,
            &format!("/v1/admin/webhooks/{id}"),
            As::Admin,
            Some(&json!({"status": "ACTIVE"})),
        )
        .await;
    assert_eq!(r.expect(200, None)["consecutive_failures"], 0);
    assert_eq!(events(&s, "event_type=webhook.resumed").await.len(), 1);
    s.stop().await;
}

async fn paused_subscriptions_receive_nothing(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let (receiver, url) = Receiver::start().await;
    s.tenant("acme").await;
    // A create needs an event type; an update may then leave the category alone.
    s.post(
        "/v1/admin/webhooks?tenant_id=acme",
        As::Admin,
        json!({"url": url, "event_categories": ["budget"], "event_types": []}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_categories": ["budget"], "event_types": ["tenant.updated"]}),
    )
    .await;
    let id = subscription_id(&created);
    let path = format!("/v1/admin/webhooks/{id}");
    let r = s
        .send(
            Method::PATCH,
            &path,
            As::Admin,
            Some(&json!({"event_types": []})),
        )
        .await;
    assert_eq!(r.expect(200, None)["event_categories"], json!(["budget"]));
    s.send(
        Method::PATCH,
        &path,
        As::Admin,
        Some(&json!({"status": "PAUSED"})),
    )
    .await
    .expect(200, None);
    // A no-op PATCH emits nothing.
    s.send(
        Method::PATCH,
        &path,
        As::Admin,
        Some(&json!({"status": "PAUSED"})),
    )
    .await
    .expect(200, None);
    assert_eq!(
        types(&events(&s, "category=webhook").await),
        ["webhook.created", "webhook.updated", "webhook.paused"]
    );
    s.budget("tenant:acme", USD, 10, json!({})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.received().is_empty());
    assert!(
        deliveries(&s, &id).await.is_empty(),
        "nothing was queued while paused"
    );
    s.send(
        Method::PATCH,
        &path,
        As::Admin,
        Some(&json!({"status": "ACTIVE", "name": "back"})),
    )
    .await
    .expect(200, None);
    let resumed = events(&s, "event_type=webhook.resumed").await;
    assert_eq!(resumed[0]["data"]["changed_fields"], json!(["name"]));
    fund(&s, "tenant:acme", 1, "f").await;
    let got = receiver.wait_for(1).await;
    assert_eq!(
        got[0].1["event_type"], "budget.funded",
        "future events only"
    );
    s.stop().await;
}

async fn replay_queues_past_events(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    s.budget("tenant:acme", USD, 10, json!({})).await;
    for i in 0..3 {
        fund(&s, "tenant:acme", 1, &format!("f{i}")).await;
    }
    let (receiver, url) = Receiver::start().await;
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.funded"]}),
    )
    .await;
    let id = subscription_id(&created);
    let replay = |body: Value| {
        let path = format!("/v1/admin/webhooks/{id}/replay");
        let s = &s;
        async move { s.post(&path, As::Admin, body).await }
    };
    replay(json!({"max_events": 2}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    replay(json!({"max_events": 0}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    replay(json!({"event_types": ["nope"]}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let r = replay(json!({})).await;
    let body = r.expect(202, None).clone();
    assert_eq!(body["events_queued"], 3);
    assert_eq!(body["estimated_completion_seconds"], 1);
    let got = receiver.wait_for(3).await;
    let amounts: Vec<_> = got
        .iter()
        .map(|(_, b)| b["data"]["new_state"]["allocated"].clone())
        .collect();
    assert_eq!(
        amounts,
        [json!(11), json!(12), json!(13)],
        "in order, oldest first"
    );
    s.post("/v1/admin/webhooks/whsub_none/replay", As::Admin, json!({}))
        .await
        .expect(404, Some("WEBHOOK_NOT_FOUND"));
    s.stop().await;
}

async fn test_probe_reaches_the_receiver(engine: Engine) {
    let (s, receiver, created) =
        acme_subscribed(engine, json!({"event_types": ["budget.funded"]})).await;
    let id = subscription_id(&created);
    let secret = created["signing_secret"].as_str().unwrap().to_string();
    let r = s
        .post(
            &format!("/v1/admin/webhooks/{id}/test"),
            As::Admin,
            json!({}),
        )
        .await;
    let body = r.expect(200, None).clone();
    assert_eq!(body["success"], true);
    assert_eq!(body["response_status"], 200);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1["event_type"], "system.webhook_test");
    assert_eq!(got[0].1["data"]["test"], true);
    // The probe carries the request's trace and request ids, in its headers and its body.
    let (trace_id, request_id) = (&r.headers["x-cycles-trace-id"], &r.headers["x-request-id"]);
    assert_eq!(&got[0].0["x-cycles-trace-id"], trace_id);
    assert_eq!(&got[0].0["x-request-id"], request_id);
    assert_eq!(got[0].1["trace_id"], trace_id.to_str().unwrap());
    assert_eq!(got[0].1["request_id"], request_id.to_str().unwrap());
    receiver.assert_signed(&secret);
    receiver.status.store(500, Ordering::SeqCst);
    let r = s
        .post(
            &format!("/v1/admin/webhooks/{id}/test"),
            As::Admin,
            json!({}),
        )
        .await;
    assert_eq!(r.expect(200, None)["success"], false);
    let w = s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin).await;
    assert_eq!(
        w.expect(200, None)["consecutive_failures"],
        0,
        "a probe counts for nothing"
    );
    s.stop().await;
}

async fn bulk_actions_pause_resume_and_delete(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    let url = "http://127.0.0.1:9/hook";
    let mut ids = Vec::new();
    for _ in 0..3 {
        let w = create_webhook(
            &s,
            Some("acme"),
            json!({"url": url, "event_types": ["budget.funded"]}),
        )
        .await;
        ids.push(
            w["subscription"]["subscription_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let bulk = |action: &str, filter: Value, key: &str| {
        let body = json!({"filter": filter, "action": action, "idempotency_key": key});
        let s = &s;
        async move {
            s.post("/v1/admin/webhooks/bulk-action", As::Admin, body)
                .await
        }
    };
    bulk("PAUSE", json!({}), "k0")
        .await
        .expect(400, Some("INVALID_REQUEST"));
    bulk("STOP", json!({"tenant_id": "acme"}), "k0")
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let r = bulk("PAUSE", json!({"tenant_id": "acme"}), "k1").await;
    let body = r.expect(200, None).clone();
    assert_eq!(body["total_matched"], 3);
    assert_eq!(body["succeeded"].as_array().unwrap().len(), 3);
    // The same key replays the first answer; pausing again skips every row.
    assert_eq!(
        bulk("PAUSE", json!({"tenant_id": "acme"}), "k1")
            .await
            .expect(200, None),
        &body
    );
    let again = bulk("PAUSE", json!({"tenant_id": "acme"}), "k2").await;
    assert_eq!(
        again.expect(200, None)["skipped"].as_array().unwrap().len(),
        3
    );
    let paused = events(&s, "event_type=webhook.paused").await;
    assert_eq!(paused.len(), 3);
    let correlation = paused[0]["correlation_id"].as_str().unwrap();
    assert!(
        correlation.starts_with("webhook_bulk_action:pause:"),
        "{correlation}"
    );
    let r = bulk("RESUME", json!({"search": ids[0].clone()}), "k3").await;
    assert_eq!(r.expect(200, None)["succeeded"][0]["id"], ids[0].as_str());
    let r = bulk("DELETE", json!({"status": "PAUSED"}), "k4").await;
    assert_eq!(
        r.expect(200, None)["succeeded"].as_array().unwrap().len(),
        2
    );
    let left = s.get("/v1/admin/webhooks", As::Admin).await;
    let left = left.expect(200, None)["subscriptions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["status"], "ACTIVE");
    assert_eq!(events(&s, "event_type=webhook.deleted").await.len(), 2);
    let metrics = s.get("/metrics", As::Admin).await;
    let text = metrics.body.as_str().unwrap_or_default().to_string();
    assert!(text.contains("cycles_events "), "{text}");
    assert!(text.contains("cycles_webhook_deliveries_due "), "{text}");
    s.stop().await;
}

/// A receiver that never answers, and one that redirects: neither holds up another
/// subscription's deliveries, and a redirect is a failed attempt (it is not followed).
async fn a_hanging_or_redirecting_receiver_holds_up_only_itself(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    let hang = axum::Router::new().route(
        "/hook",
        axum::routing::post(std::future::pending::<&'static str>),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, hang).await });
    let redirect = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async {
            (
                StatusCode::FOUND,
                [("location", "http://169.254.169.254/")],
                "",
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirect_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, redirect).await });
    let (receiver, url) = Receiver::start().await;
    for u in [&hang_url, &redirect_url] {
        create_webhook(
            &s,
            Some("acme"),
            json!({"url": u, "event_types": ["budget.created"]}),
        )
        .await;
    }
    let ok = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.created"]}),
    )
    .await;
    let ok_id = subscription_id(&ok);
    let redirected = s.get("/v1/admin/webhooks?sort_by=url", As::Admin).await;
    let redirected: Vec<String> = redirected.expect(200, None)["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["url"] == redirect_url.as_str())
        .map(|w| w["subscription_id"].as_str().unwrap().to_string())
        .collect();
    s.budget("tenant:acme", USD, 10, json!({})).await;
    let started = std::time::Instant::now();
    receiver.wait_for(1).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "held up by the hanging receiver"
    );
    wait_deliveries(&s, &ok_id, |d| {
        d.first().is_some_and(|d| d["status"] == "SUCCESS")
    })
    .await;
    let d = wait_deliveries(&s, &redirected[0], |d| {
        d.first().is_some_and(|d| d["attempts"] == 1)
    })
    .await;
    assert_eq!(d[0]["response_status"], 302);
    assert_eq!(d[0]["status"], "RETRYING");
    s.stop().await;
}

/// A receiver that answers 200 and then sends a body without end: the delivery is a
/// success at once, and the server closes the connection having read a few socket buffers
/// of it, not the body (memory does not grow with what a receiver sends).
async fn an_endless_response_body_is_never_read(engine: Engine) {
    use std::sync::atomic::AtomicU64;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 64 * 1024];
        let _ = tcp.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n";
        tcp.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        // Until the server hangs up (or ten seconds have passed, when the test has failed).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline && tcp.write_all(&chunk).await.is_ok() {
            counted.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
    });
    let hook = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.created"]}),
    )
    .await;
    let id = hook["subscription"]["subscription_id"].as_str().unwrap();
    s.budget("tenant:acme", USD, 10, json!({})).await;
    let d = wait_deliveries(&s, id, |d| {
        d.first().is_some_and(|d| d["status"] == "SUCCESS")
    })
    .await;
    assert_eq!(d[0]["response_status"], 200);
    assert_eq!(d[0]["attempts"], 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = sent.load(Ordering::SeqCst);
    assert!(sent < 64 << 20, "the server read {sent} bytes of the body");
    s.stop().await;
}

/// The data of the `budget.threshold_crossed` requests a receiver got, as
/// `(threshold, direction)`.
fn crossings(got: &[(HeaderMap, Value)]) -> Vec<(f64, String)> {
    got.iter()
        .map(|(_, body)| body)
        .filter(|body| body["event_type"] == "budget.threshold_crossed")
        .map(|body| {
            let data = &body["data"];
            let direction = data["direction"].as_str().unwrap().to_string();
            (data["threshold"].as_f64().unwrap(), direction)
        })
        .collect()
}

async fn threshold_crossings_reach_the_levels_subscribed(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    // The tenant's subscription names its own level; the system-wide one takes the
    // defaults (0.80, 0.95, 1.0).
    let (tenant_receiver, tenant_url) = Receiver::start().await;
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": tenant_url, "event_types": ["budget.threshold_crossed"],
               "thresholds": {"budget_utilization": [0.5]}}),
    )
    .await;
    let secret = created["signing_secret"].as_str().unwrap().to_string();
    let (system_receiver, system_url) = Receiver::start().await;
    create_webhook(
        &s,
        None,
        json!({"url": system_url, "event_types": ["budget.threshold_crossed"]}),
    )
    .await;
    let key = s.key("acme").await;
    s.budget("tenant:acme", USD, 1_000, json!({})).await;
    // 60 % held: 0.5 crossed rising.
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            json!({"idempotency_key": "r1", "subject": {"tenant": "acme"},
                   "action": {"kind": "llm.completion", "name": "gpt"},
                   "estimate": {"unit": USD, "amount": 600}}),
        )
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Released: back under 0.5, falling.
    s.post(
        &format!("/v1/reservations/{id}/release"),
        As::Key(&key),
        json!({"idempotency_key": "rel1"}),
    )
    .await
    .expect(200, None);
    // 85 % spent at once: 0.5 and 0.8 crossed rising, in one request.
    s.post(
        "/v1/events",
        As::Key(&key),
        json!({"idempotency_key": "e1", "subject": {"tenant": "acme"},
               "action": {"kind": "llm.completion", "name": "gpt"},
               "actual": {"unit": USD, "amount": 850}}),
    )
    .await
    .expect(201, None);
    // A top-up brings it under 0.8 again: falling, by the admin.
    fund(&s, "tenant:acme", 500, "f1").await;
    let tenant_got = tenant_receiver.wait_for(3).await;
    tenant_receiver.assert_signed(&secret);
    assert_eq!(
        crossings(&tenant_got),
        [
            (0.5, "rising".to_string()),
            (0.5, "falling".to_string()),
            (0.5, "rising".to_string())
        ],
        "the tenant's own level only, once per crossing"
    );
    let system_got = system_receiver.wait_for(2).await;
    assert_eq!(
        crossings(&system_got),
        [(0.8, "rising".to_string()), (0.8, "falling".to_string())],
        "the default levels only"
    );
    let rising = &system_got[0].1;
    assert_eq!(rising["actor"]["type"], "api_key");
    assert_eq!(rising["source"], "cycles-server");
    assert_eq!(rising["scope"], "tenant:acme");
    let data = &rising["data"];
    assert_eq!(data["utilization"], 0.85);
    assert_eq!(data["allocated"], 1_000);
    assert_eq!(data["spent"], 850);
    assert_eq!(data["remaining"], 150);
    let falling = &system_got[1].1;
    assert_eq!(falling["source"], "cycles-admin");
    assert_eq!(falling["data"]["allocated"], 1_500);
    // The event log has every crossing once, whoever receives it.
    let logged = events(&s, "event_type=budget.threshold_crossed").await;
    assert_eq!(logged.len(), 5, "{logged:?}");
    // Nothing more arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(tenant_receiver.received().len(), 3);
    assert_eq!(system_receiver.received().len(), 2);
    s.stop().await;
}

async fn expired_keys_are_announced_once(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    let (receiver, url) = Receiver::start().await;
    create_webhook(
        &s,
        None,
        json!({"url": url, "event_types": ["api_key.expired"]}),
    )
    .await;
    let expires_at = ledger::format_rfc3339(crate::common::T0 + 60_000);
    let r = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "short", "expires_at": expires_at}),
        )
        .await;
    let key_id = r.expect(201, None)["key_id"].as_str().unwrap().to_string();
    // A key that outlives the test is not announced.
    s.key("acme").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(receiver.received().is_empty(), "not expired yet");
    s.advance(60_000);
    let got = receiver.wait_for(1).await;
    let (_, body) = &got[0];
    assert_eq!(body["event_type"], "api_key.expired");
    assert_eq!(body["tenant_id"], "acme");
    assert_eq!(body["actor"]["type"], "system");
    assert_eq!(body["data"]["key_id"], key_id.as_str());
    assert_eq!(body["data"]["previous_status"], "ACTIVE");
    assert_eq!(body["data"]["new_status"], "EXPIRED");
    let keys = s.get("/v1/admin/api-keys?tenant_id=acme", As::Admin).await;
    let keys = keys.expect(200, None)["keys"].as_array().unwrap().clone();
    let key = keys
        .iter()
        .find(|k| k["key_id"] == key_id.as_str())
        .unwrap();
    assert_eq!(key["status"], "EXPIRED");
    // Once: later sweeps find nothing more to expire.
    s.advance(60_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(events(&s, "event_type=api_key.expired").await.len(), 1);
    s.stop().await;
}

async fn a_delivery_a_day_late_is_failed_not_sent(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let (receiver, url) = Receiver::start().await;
    receiver.status.store(503, Ordering::SeqCst);
    s.tenant("acme").await;
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.created"]}),
    )
    .await;
    let id = subscription_id(&created);
    s.budget("tenant:acme", USD, 100, json!({})).await;
    receiver.wait_for(1).await;
    wait_deliveries(&s, &id, |d| {
        d.first().is_some_and(|d| d["status"] == "RETRYING")
    })
    .await;
    // The receiver recovers, but only after the delivery is a day old.
    receiver.status.store(200, Ordering::SeqCst);
    s.advance(24 * 3_600_000 + 1);
    let d = wait_deliveries(&s, &id, |d| {
        d.first().is_some_and(|d| d["status"] == "FAILED")
    })
    .await;
    assert_eq!(d[0]["attempts"], 1, "not attempted again");
    let why = d[0]["error_message"].as_str().unwrap();
    assert!(why.starts_with("Delivery expired: 24h old"), "{why}");
    assert_eq!(receiver.received().len(), 1);
    let w = s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin).await;
    let w = w.expect(200, None).clone();
    assert_eq!(
        w["status"], "ACTIVE",
        "a stale delivery does not count against it"
    );
    assert_eq!(w["consecutive_failures"], 0);
    s.stop().await;
}

/// A subscription paused while a lane of its deliveries is being sent gets nothing more than
/// the send already under way: every delivery after a lane's first is looked at again just
/// before it goes.
async fn a_pause_stops_the_deliveries_already_taken(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    s.tenant("acme").await;
    let arrived = Arc::new(AtomicUsize::new(0));
    let slow = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let arrived = arrived.clone();
            move || {
                let arrived = arrived.clone();
                async move {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, slow).await });
    let created = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": ["budget.funded"]}),
    )
    .await;
    let id = subscription_id(&created);
    s.budget("tenant:acme", USD, 10, json!({})).await;
    const FUNDED: usize = 8;
    for i in 0..FUNDED {
        fund(&s, "tenant:acme", 1, &format!("f{i}")).await;
    }
    for _ in 0..200 {
        if arrived.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pause = json!({"status": "PAUSED"});
    let path = format!("/v1/admin/webhooks/{id}");
    s.send(Method::PATCH, &path, As::Admin, Some(&pause))
        .await
        .expect(200, None);
    let at_pause = arrived.load(Ordering::SeqCst);
    assert!(at_pause > 0, "the lane had started");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after = arrived.load(Ordering::SeqCst);
    assert!(
        after <= at_pause + 1 && after < FUNDED,
        "{after} arrived, {at_pause} of them before the pause"
    );
    s.stop().await;
}

/// The webhook and event lists ignore query parameters they do not declare (the spec's
/// additive-parameter rule, as every other list does); the tenant-plane list names the
/// parameter the admin key must give in the spec's words.
async fn webhook_and_event_lists_ignore_parameters_they_do_not_declare(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let (_receiver, url) = Receiver::start().await;
    s.tenant("acme").await;
    let key = s
        .key_with(
            "acme",
            json!({"permissions": ["events:read", "webhooks:read"]}),
        )
        .await
        .0;
    let r = s
        .post(
            "/v1/admin/webhooks?tenant_id=acme&observe_mode=x",
            As::Admin,
            json!({"url": url, "event_types": ["budget.funded"]}),
        )
        .await;
    let id = subscription_id(r.expect(201, None));
    for (path, who) in [
        (
            "/v1/events?sort_dir=desc&sort_by=timestamp&search=x",
            As::Key(&key),
        ),
        ("/v1/admin/webhooks?observe_mode=x&sort_dir=asc", As::Admin),
        (
            "/v1/webhooks?tenant=acme&sort_by=url&sort_dir=asc",
            As::Admin,
        ),
        ("/v1/webhooks?sort_by=url", As::Key(&key)),
    ] {
        s.get(path, who).await.expect(200, None);
    }
    let path = format!("/v1/admin/webhooks/{id}/deliveries?sort_by=status&sort_dir=asc");
    s.get(&path, As::Admin).await.expect(200, None);
    let r = s.get("/v1/webhooks", As::Admin).await;
    assert_eq!(
        r.expect(400, Some("INVALID_REQUEST"))["message"],
        "tenant query parameter is required when using admin key authentication"
    );
    s.stop().await;
}

/// A closed tenant's webhook refuses a test probe and a replay, as every other mutation of
/// it (409 TENANT_CLOSED, admin spec §4.2 RULE 2), and nothing reaches its receiver; it can
/// still be read.
async fn a_closed_tenants_webhook_is_neither_tested_nor_replayed(engine: Engine) {
    let (s, receiver, created) =
        acme_subscribed(engine, json!({"event_types": ["budget.funded"]})).await;
    let id = subscription_id(&created);
    let close = json!({"status": "CLOSED"});
    s.send(
        Method::PATCH,
        "/v1/admin/tenants/acme",
        As::Admin,
        Some(&close),
    )
    .await
    .expect(200, None);
    for action in ["test", "replay"] {
        let path = format!("/v1/admin/webhooks/{id}/{action}");
        s.post(&path, As::Admin, json!({}))
            .await
            .expect(409, Some("TENANT_CLOSED"));
    }
    s.get(&format!("/v1/admin/webhooks/{id}"), As::Admin)
        .await
        .expect(200, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.received().is_empty(), "nothing was sent");
    s.stop().await;
}

/// A PATCH clears `name`, `description`, `scope_filter` and `metadata` sent as `null`, as the
/// official dashboard sends them when an operator empties one; a `null` anywhere else is
/// still refused, and changes nothing.
async fn an_update_clears_the_fields_sent_as_null(engine: Engine) {
    let (s, _receiver, created) = acme_subscribed(
        engine,
        json!({"event_types": ["budget.funded"], "name": "n", "description": "d",
               "scope_filter": "tenant:acme/*", "metadata": {"team": "ops"}}),
    )
    .await;
    let id = subscription_id(&created);
    let path = format!("/v1/admin/webhooks/{id}");
    let patch = |body: Value| {
        let (s, path) = (&s, path.clone());
        async move { s.send(Method::PATCH, &path, As::Admin, Some(&body)).await }
    };
    for refused in [
        json!({"url": null}),
        json!({"name": null, "event_types": null}),
    ] {
        patch(refused).await.expect(400, Some("INVALID_REQUEST"));
    }
    let kept = s.get(&path, As::Admin).await.expect(200, None).clone();
    assert_eq!(kept["description"], "d", "a refused PATCH changes nothing");
    let r = patch(json!({"description": null, "scope_filter": null, "metadata": null})).await;
    let w = r.expect(200, None);
    for cleared in ["description", "scope_filter", "metadata"] {
        assert!(w.get(cleared).is_none(), "{cleared} in {w}");
    }
    assert_eq!(w["name"], "n", "what is not sent is kept");
    let w = patch(json!({"name": null})).await.expect(200, None).clone();
    assert!(w.get("name").is_none(), "{w}");
    assert_eq!(s.get(&path, As::Admin).await.expect(200, None), &w);
    s.stop().await;
}

/// A tenant key without `webhooks:write` is refused before its URL is looked up: where a
/// name resolves (or that it does not) is not for it to learn, on create or on update.
async fn a_key_without_write_permission_learns_nothing_of_a_url(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let mine = create_webhook(
        &s,
        Some("acme"),
        json!({"url": "https://93.184.216.34/hook", "event_types": ["budget.created"]}),
    )
    .await;
    let id = subscription_id(&mine);
    let (reader, _) = s
        .key_with("acme", json!({"permissions": ["webhooks:read"]}))
        .await;
    let probes = ["https://localhost/x", "https://no-such-host.invalid/x"];
    for probe in probes {
        let body = json!({"url": probe, "event_types": ["budget.created"]});
        let created = s.post("/v1/webhooks", As::Key(&reader), body).await;
        created.expect(403, Some("INSUFFICIENT_PERMISSIONS"));
        let path = format!("/v1/webhooks/{id}");
        let patch = json!({"url": probe});
        let updated = s
            .send(Method::PATCH, &path, As::Key(&reader), Some(&patch))
            .await;
        updated.expect(403, Some("INSUFFICIENT_PERMISSIONS"));
        for refused in [&created, &updated] {
            let message = refused.body["message"].as_str().unwrap();
            assert!(!message.contains("127.0.0.1") && !message.contains("resolve"));
        }
    }
    // With the permission, the same URLs get the guard's answers.
    let (writer, _) = s
        .key_with(
            "acme",
            json!({"permissions": ["webhooks:read", "webhooks:write"]}),
        )
        .await;
    for probe in probes {
        let body = json!({"url": probe, "event_types": ["budget.created"]});
        s.post("/v1/webhooks", As::Key(&writer), body)
            .await
            .expect(400, Some("WEBHOOK_URL_INVALID"));
    }
    s.stop().await;
}
