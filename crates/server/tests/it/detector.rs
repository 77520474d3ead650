//! The anomaly detector: rate spikes, burn-rate anomalies and high latency, caused by real
//! requests, listed in the event log and delivered only to the subscriptions whose window
//! and threshold they reach. Time is the harness's manual clock; the detector ticks every
//! 20 ms of real time, and the tests wait for its ticks.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{reserve_body, As, Engine, TestServer, T0};
use crate::webhooks::{allow_loopback, create_webhook, deliveries, events, Receiver};

engine_tests!(
    denial_spikes_reach_the_subscriptions_whose_threshold_they_pass,
    expiry_and_authentication_failure_spikes,
    burn_rate_anomalies_compare_with_the_baseline,
);

const USD: &str = "USD_MICROCENTS";

/// A receiver's URL, let through the SSRF guard (these tests read the event log; the
/// deliveries' own behaviour is the webhook tests').
async fn receiver(s: &TestServer) -> String {
    allow_loopback(s).await;
    Receiver::start().await.1
}

/// The detector's ticks so far.
async fn ticks(s: &TestServer) -> u64 {
    let text = s.get("/metrics", As::Admin).await;
    let text = text.body.as_str().expect("metrics").to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("cycles_anomaly_ticks_total "))
        .expect("the tick counter")
        .trim()
        .parse()
        .expect("a number")
}

/// Waits until the detector has ticked `n` more times: everything counted before the call
/// has been closed into its windows and checked.
async fn wait_ticks(s: &TestServer, n: u64) {
    let start = ticks(s).await;
    for _ in 0..400 {
        if ticks(s).await >= start + n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the detector did not tick");
}

/// Waits until the event log has `n` events of `event_type`; returns them.
async fn wait_events(s: &TestServer, event_type: &str, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let found = events(s, &format!("event_type={event_type}")).await;
        if found.len() >= n {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("fewer than {n} {event_type} events");
}

/// `n` reserves of 1 by `key`, keys prefixed by `tag`; answers their statuses.
async fn reserves(s: &TestServer, key: &str, tag: &str, n: usize, extra: Value) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 0..n {
        let mut body = reserve_body(&format!("{tag}-{i}"), json!({"tenant": "acme"}), 1);
        if let Value::Object(extra) = &extra {
            for (k, v) in extra {
                body[k] = v.clone();
            }
        }
        statuses.push(s.post("/v1/reservations", As::Key(key), body).await.status);
    }
    statuses
}

async fn denial_spikes_reach_the_subscriptions_whose_threshold_they_pass(engine: Engine) {
    let s = TestServer::start(engine).await;
    allow_loopback(&s).await;
    let key = s.setup("acme", 10).await;
    let (receiver, url) = Receiver::start().await;
    let spike = "reservation.denial_rate_spike";
    let at_half = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": [spike],
               "thresholds": {"denial_rate_threshold": 0.5, "rate_window_seconds": 60}}),
    )
    .await;
    let at_ninety = create_webhook(
        &s,
        Some("acme"),
        json!({"url": url, "event_types": [spike],
               "thresholds": {"denial_rate_threshold": 0.9, "rate_window_seconds": 60}}),
    )
    .await;
    wait_ticks(&s, 2).await;

    // 10 reserves fit the budget, 20 are denied: two thirds of 30 decisions.
    let statuses = reserves(&s, &key, "a", 30, json!({})).await;
    assert_eq!(statuses.iter().filter(|&&st| st == 200).count(), 10);
    assert_eq!(statuses.iter().filter(|&&st| st == 409).count(), 20);
    let logged = wait_events(&s, spike, 1).await;
    assert_eq!(logged.len(), 1, "{logged:?}");
    let event = &logged[0];
    assert_eq!(event["tenant_id"], "acme");
    assert_eq!(event["scope"], "tenant:acme");
    assert_eq!(event["source"], "anomaly-detector");
    assert_eq!(event["actor"]["type"], "system");
    // Emitted at the first tick that saw the rate at 0.5 or more over 20 decisions or
    // more: after the 10 allowed, `d` denials of `10 + d` decisions.
    let data = &event["data"];
    assert_eq!(data["metric"], "denial_rate");
    assert_eq!(data["window_seconds"], 60);
    assert_eq!(data["threshold_rate"], 0.5);
    let denials = data["sample_count"].as_u64().unwrap();
    assert!((10..=20).contains(&denials), "{data}");
    let rate = data["current_rate"].as_f64().unwrap();
    assert!(
        (rate - denials as f64 / (10 + denials) as f64).abs() < 1e-9,
        "{data}"
    );

    // Delivered to the subscription at 0.5, not to the one at 0.9.
    let got = receiver.wait_for(1).await;
    assert_eq!(got[0].1["event_id"], event["event_id"]);
    let id = |w: &Value| {
        w["subscription"]["subscription_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(deliveries(&s, &id(&at_half)).await.len(), 1);
    assert!(deliveries(&s, &id(&at_ninety)).await.is_empty());

    // While it lasts, the spike is not announced again.
    reserves(&s, &key, "b", 10, json!({})).await;
    wait_ticks(&s, 3).await;
    assert_eq!(events(&s, &format!("event_type={spike}")).await.len(), 1);

    // A minute later the window is empty and the spike over; the next one is a new event.
    s.advance(61_000);
    wait_ticks(&s, 3).await;
    reserves(&s, &key, "c", 25, json!({})).await;
    let logged = wait_events(&s, spike, 2).await;
    assert_eq!(logged.len(), 2);
    assert_eq!(logged[1]["data"]["current_rate"], 1.0);
    assert!(logged[1]["data"]["sample_count"].as_u64().unwrap() >= 20);
}

async fn expiry_and_authentication_failure_spikes(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let url = receiver(&s).await;
    let hook = json!({"url": url,
        "event_types": ["reservation.expiry_rate_spike", "api_key.auth_failure_rate_spike"]});
    create_webhook(&s, None, hook).await;
    wait_ticks(&s, 2).await;

    // 20 reservations abandoned: the sweep expires them all once their grace has passed.
    let statuses = reserves(&s, &key, "x", 20, json!({"ttl_ms": 1_000})).await;
    assert!(statuses.iter().all(|&st| st == 200));
    s.advance(10_000);
    let expired = wait_events(&s, "reservation.expired", 20).await;
    assert_eq!(expired.len(), 20);
    let spike = &wait_events(&s, "reservation.expiry_rate_spike", 1).await[0];
    assert_eq!(spike["tenant_id"], "acme");
    assert_eq!(spike["data"]["metric"], "expiry_rate");
    assert_eq!(spike["data"]["current_rate"], 1.0);
    assert_eq!(spike["data"]["sample_count"], 20);
    assert_eq!(spike["data"]["window_seconds"], 300);
    assert_eq!(spike["data"]["threshold_rate"], 0.05);

    // 25 requests with a key that does not exist, beside good ones (this test's own reads
    // of the event log and the metrics are among them).
    for _ in 0..25 {
        s.get("/v1/balances?tenant=acme", As::Key("cyc_live_nosuchkey"))
            .await
            .expect(401, None);
    }
    for _ in 0..3 {
        s.get("/v1/balances?tenant=acme", As::Key(&key))
            .await
            .expect(200, None);
    }
    let spike = &wait_events(&s, "api_key.auth_failure_rate_spike", 1).await[0];
    assert_eq!(spike["tenant_id"], "__system__");
    assert!(spike.get("scope").is_none(), "{spike}");
    assert_eq!(spike["data"]["metric"], "auth_failure_rate");
    let failures = spike["data"]["sample_count"].as_u64().unwrap();
    assert!((1..=25).contains(&failures), "{spike}");
    let rate = spike["data"]["current_rate"].as_f64().unwrap();
    assert!((0.1..1.0).contains(&rate), "{spike}");
}

/// Spends `amount` on acme's budget with a direct spend event.
async fn spend(s: &TestServer, key: &str, tag: &str, amount: i64) {
    let event = json!({
        "idempotency_key": tag, "subject": {"tenant": "acme"},
        "action": {"kind": "llm.completion", "name": "m"},
        "actual": {"unit": USD, "amount": amount},
    });
    s.post("/v1/events", As::Key(key), event)
        .await
        .expect(201, None);
}

async fn burn_rate_anomalies_compare_with_the_baseline(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let url = receiver(&s).await;
    let hook = json!({"url": url,
        "event_types": ["budget.burn_rate_anomaly"],
        "thresholds": {"burn_rate_multiplier": 3.0, "burn_rate_window_seconds": 60}});
    create_webhook(&s, Some("acme"), hook).await;
    wait_ticks(&s, 2).await;

    // Two minutes at 10 a minute make the baseline.
    for minute in 1..=2 {
        spend(&s, &key, &format!("steady-{minute}"), 10).await;
        s.advance(60_000);
        wait_ticks(&s, 2).await;
    }
    assert!(events(&s, "event_type=budget.burn_rate_anomaly")
        .await
        .is_empty());

    // Then 100 in the third: ten times the baseline.
    spend(&s, &key, "burst", 100).await;
    let anomaly = &wait_events(&s, "budget.burn_rate_anomaly", 1).await[0];
    assert_eq!(anomaly["tenant_id"], "acme");
    assert_eq!(anomaly["scope"], "tenant:acme");
    let data = &anomaly["data"];
    // Exactly the fields of the spec's `EventDataBurnRateAnomaly`, each of its type (the
    // anomaly needs minutes of history, too long for the Python suite's real-clock schema
    // check).
    let mut fields: Vec<&str> = data
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "baseline_rate",
            "current_rate",
            "multiplier",
            "projected_exhaustion_minutes",
            "scope",
            "unit",
            "window_seconds"
        ]
    );
    assert!(data["window_seconds"].is_u64());
    assert_eq!(data["scope"], "tenant:acme");
    assert_eq!(data["unit"], USD);
    assert_eq!(data["window_seconds"], 60);
    assert_eq!(data["baseline_rate"], 10.0);
    assert_eq!(data["current_rate"], 110.0);
    assert_eq!(data["multiplier"], 11.0);
    let minutes = data["projected_exhaustion_minutes"].as_f64().unwrap();
    assert!(
        (minutes - (1_000_000.0 - 120.0) / 110.0).abs() < 1e-6,
        "{minutes}"
    );
    assert_eq!(
        anomaly["timestamp"].as_str().unwrap(),
        ledger::format_rfc3339(T0 + 120_000)
    );

    // One event while it lasts.
    spend(&s, &key, "burst-2", 100).await;
    wait_ticks(&s, 3).await;
    assert_eq!(
        events(&s, "event_type=budget.burn_rate_anomaly")
            .await
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_latency_is_announced_once() {
    let s = TestServer::start_with(Engine::Embedded, |o| {
        o.detector.high_latency = Some(Duration::from_nanos(1));
    })
    .await;
    let url = receiver(&s).await;
    create_webhook(
        &s,
        None,
        json!({"url": url, "event_types": ["system.high_latency"]}),
    )
    .await;
    wait_ticks(&s, 2).await;
    for _ in 0..25 {
        s.get("/v1/admin/tenants", As::Admin)
            .await
            .expect(200, None);
    }
    let event = &wait_events(&s, "system.high_latency", 1).await[0];
    assert_eq!(event["tenant_id"], "__system__");
    assert_eq!(event["category"], "system");
    let data = &event["data"];
    assert_eq!(data["component"], "http");
    assert_eq!(data["severity"], "warning");
    assert_eq!(data["details"]["window_seconds"], 60);
    assert!(data["details"]["sample_count"].as_u64().unwrap() >= 20);
    for _ in 0..10 {
        s.get("/v1/admin/tenants", As::Admin)
            .await
            .expect(200, None);
    }
    wait_ticks(&s, 3).await;
    assert_eq!(events(&s, "event_type=system.high_latency").await.len(), 1);
}
