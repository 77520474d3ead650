//! Events and webhooks across kill -9: funding, reserves and commits under load with a real
//! receiver running, SIGKILL, restart. Afterwards every acknowledged operation has its event,
//! delivered at least once (the receiver dedupes by event id); every event belongs to a
//! request that was sent; and the events are exactly the changes the budgets show, so a
//! crash neither lost one nor invented one.
//!
//! The events: `budget.funded` for each credit of 1 to `tenant:acme`;
//! `reservation.commit_overage` for each commit of 2 against a reservation of 1 on
//! `tenant:beta`; `reservation.denied` for each dry-run reserve that asks for more than
//! `tenant:beta` holds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::process::{client, Server, ADMIN_KEY};
use crate::receiver::Receiver;

const CLIENTS: usize = 4;
const LOAD: Duration = Duration::from_millis(1_200);
const KILL_CYCLES: usize = 2;
const UNIT: &str = "USD_MICROCENTS";
/// What `tenant:beta` is allocated: more than the commits can spend, less than a dry run asks.
const BETA_ALLOCATED: i64 = 1_000_000_000;

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

/// What a runtime client had acknowledged: the request ids of its dry runs (each denied) and
/// commits, the reservation ids of its reserves, and how many rounds it began.
#[derive(Default)]
struct Runtime {
    dry_runs: Vec<String>,
    reserves: Vec<String>,
    commits: Vec<String>,
    sent: usize,
}

/// A denied dry run, then a reserve of 1 committed at 2, over and over, until `until` or the
/// first transport failure.
async fn runtime(
    base: String,
    key: String,
    client_id: usize,
    cycle: usize,
    until: Instant,
) -> Runtime {
    let http = client();
    let mut done = Runtime::default();
    // Answers the request id and body of a 200, `None` when the request got no answer.
    let call = |path: String, body: Value| {
        let request = http
            .post(format!("{base}{path}"))
            .header("X-Cycles-API-Key", &key)
            .json(&body)
            .send();
        async move {
            let r = request.await.ok()?;
            assert_eq!(r.status(), 200, "{path} was refused");
            let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
            Some((id, r.json::<Value>().await.ok()?))
        }
    };
    let subject = json!({"tenant": "beta"});
    let action = json!({"kind": "llm.completion", "name": "m"});
    while Instant::now() < until {
        done.sent += 1;
        let n = format!("{cycle}-{client_id}-{}", done.sent);
        let dry = json!({"idempotency_key": format!("d-{n}"), "subject": subject,
                         "action": action, "dry_run": true,
                         "estimate": {"unit": UNIT, "amount": 2 * BETA_ALLOCATED}});
        let Some((id, body)) = call("/v1/reservations".into(), dry).await else {
            break;
        };
        assert_eq!(body["decision"], "DENY");
        done.dry_runs.push(id);
        let reserve = json!({"idempotency_key": format!("r-{n}"), "subject": subject,
                             "action": action, "estimate": {"unit": UNIT, "amount": 1}});
        let Some((_, body)) = call("/v1/reservations".into(), reserve).await else {
            break;
        };
        let reservation = body["reservation_id"].as_str().unwrap().to_string();
        done.reserves.push(reservation.clone());
        let commit = json!({"idempotency_key": format!("c-{n}"),
                            "actual": {"unit": UNIT, "amount": 2}});
        let path = format!("/v1/reservations/{reservation}/commit");
        let Some((id, _)) = call(path, commit).await else {
            break;
        };
        done.commits.push(id);
    }
    done
}

/// Every event of `event_type`: request id → event ids.
async fn events_by_request(base: &str, event_type: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let url = format!("{base}/v1/admin/events?event_type={event_type}&limit=100{cursor}");
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

fn count(events: &BTreeMap<String, Vec<String>>) -> i64 {
    events.values().map(Vec::len).sum::<usize>() as i64
}

/// The budget of `tenant:<tenant>`.
async fn budget(base: &str, tenant: &str) -> Value {
    let url = format!("{base}/v1/admin/budgets/lookup?scope=tenant:{tenant}&unit={UNIT}");
    admin(reqwest::Method::GET, url, json!(null))
        .await
        .json()
        .await
        .unwrap()
}

/// Tenant `beta` with its budget and a subscription to the runtime's events; answers its
/// API key.
async fn runtime_tenant(base: &str, url: &str) -> String {
    let post =
        |path: &str, body: Value| admin(reqwest::Method::POST, format!("{base}{path}"), body);
    let r = post(
        "/v1/admin/tenants",
        json!({"tenant_id": "beta", "name": "beta"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = post(
        "/v1/admin/budgets",
        json!({"tenant_id": "beta", "scope": "tenant:beta", "unit": UNIT,
               "allocated": {"unit": UNIT, "amount": BETA_ALLOCATED}}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = post(
        "/v1/admin/webhooks?tenant_id=beta",
        json!({"url": url, "event_types": ["reservation.commit_overage", "reservation.denied"],
               "retry_policy": {"max_retries": 10, "initial_delay_ms": 100, "max_delay_ms": 1000}}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = post(
        "/v1/admin/api-keys",
        json!({"tenant_id": "beta", "name": "k"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let key: Value = r.json().await.unwrap();
    key["key_secret"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_change_has_its_event_delivered_after_kill_9() {
    let dir = TempDir::new().expect("temp dir");
    let data = dir.path().join("data");
    let (received, url) = Receiver::start().await;
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
    let beta_key = runtime_tenant(&base, &url).await;

    let mut funded: BTreeSet<String> = BTreeSet::new();
    let mut ran = Runtime::default();
    let mut sent_funding = 0;
    for cycle in 0..KILL_CYCLES {
        let until = Instant::now() + LOAD * 4;
        let fundings: Vec<_> = (0..CLIENTS)
            .map(|c| tokio::spawn(funding(server.base.clone(), c, cycle, until)))
            .collect();
        let runtimes: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (base, key) = (server.base.clone(), beta_key.clone());
                tokio::spawn(runtime(base, key, c, cycle, until))
            })
            .collect();
        tokio::time::sleep(LOAD).await;
        server.kill();
        for task in fundings {
            let (answered, sent) = task.await.expect("funding client");
            sent_funding += sent;
            for (id, status) in answered {
                assert_eq!(status, 200, "a funding was refused");
                funded.insert(id);
            }
        }
        for task in runtimes {
            let done = task.await.expect("runtime client");
            ran.sent += done.sent;
            ran.dry_runs.extend(done.dry_runs);
            ran.reserves.extend(done.reserves);
            ran.commits.extend(done.commits);
        }
        server = Server::start(&data, dir.path()).await;
    }
    let base = server.base.clone();
    assert!(funded.len() > 20, "too little funding: {}", funded.len());
    assert!(
        ran.commits.len() > 20,
        "too few commits: {}",
        ran.commits.len()
    );

    // Exactly the changes the budgets show: one `budget.funded` per credit of 1, one
    // `reservation.commit_overage` per commit of 2.
    let funded_events = events_by_request(&base, "budget.funded").await;
    let allocated = budget(&base, "acme").await["allocated"]["amount"]
        .as_i64()
        .unwrap();
    assert_eq!(count(&funded_events), allocated, "funding events = changes");
    let overages = events_by_request(&base, "reservation.commit_overage").await;
    let spent = budget(&base, "beta").await["spent"]["amount"]
        .as_i64()
        .unwrap();
    assert_eq!(2 * count(&overages), spent, "overage events = commits");
    let denials = events_by_request(&base, "reservation.denied").await;
    for (what, events, acknowledged) in [
        ("funding", &funded_events, funded.iter().collect::<Vec<_>>()),
        ("commit", &overages, ran.commits.iter().collect()),
        ("dry run", &denials, ran.dry_runs.iter().collect()),
    ] {
        assert!(
            events.values().all(|ids| ids.len() == 1),
            "one {what} event per request"
        );
        for id in acknowledged {
            assert!(
                events.contains_key(id),
                "acknowledged {what} {id} has no event"
            );
        }
    }
    // A request whose answer the kill cut off may have been made durable or not: either
    // way its event exists exactly when its change does (counted above). None is made up.
    assert!(funded_events.len() <= sent_funding);
    assert!(overages.len() <= ran.sent && denials.len() <= ran.sent);
    // Every acknowledged reserve is there after the restarts.
    for reservation in &ran.reserves {
        let r = client()
            .get(format!("{base}/v1/reservations/{reservation}"))
            .header("X-Cycles-API-Key", &beta_key)
            .send()
            .await
            .expect("get reservation");
        assert_eq!(
            r.status(),
            200,
            "acknowledged reservation {reservation} is gone"
        );
    }

    // Delivered at least once, every one, after the restarts.
    let want: BTreeSet<String> = [&funded_events, &overages, &denials]
        .into_iter()
        .flat_map(|events| events.values().flatten().cloned())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeSet<String> = received.by_event().into_keys().collect();
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
    let delivered: Vec<String> = received.by_event().into_keys().collect();
    assert!(
        delivered.iter().all(|id| want.contains(id)),
        "a delivered event is not in the log"
    );
    eprintln!(
        "kill -9 x{KILL_CYCLES}: acknowledged {} fundings, {} dry runs, {} reserves, {} \
         commits; {} events, every one delivered",
        funded.len(),
        ran.dry_runs.len(),
        ran.reserves.len(),
        ran.commits.len(),
        want.len()
    );
    server.terminate().await;
}
