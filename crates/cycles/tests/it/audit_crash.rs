//! The audit log across kill -9 (the test): admin writes under load, SIGKILL,
//! restart — every acknowledged write has exactly one audit entry, every entry belongs to a
//! request that was sent, and an entry exists exactly when its change does (also for the
//! requests whose answer the kill cut off).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::process::{client, Server, ADMIN_KEY};

const CLIENTS: usize = 6;
const LOAD: Duration = Duration::from_millis(1_500);
const KILL_CYCLES: usize = 3;

/// One admin write a client sent.
#[derive(Debug, Clone)]
struct Sent {
    /// The tenant it creates (`None`: a refused write, which changes nothing).
    creates: Option<String>,
    /// The answer's request id and status, when the answer arrived.
    answer: Option<(String, u16)>,
}

/// Sends admin writes until `until` or the first transport failure: creates of fresh
/// tenants (201), renames (200) and updates of a tenant that does not exist (404).
async fn writes(base: String, client_id: usize, cycle: usize, until: Instant) -> Vec<Sent> {
    let http = client();
    let mut sent = Vec::new();
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let (method, path, body, creates) = match n % 3 {
            0 => (
                Method::PATCH,
                "/v1/admin/tenants/ghost".to_string(),
                json!({"name": "nobody"}),
                None,
            ),
            1 => {
                let id = format!("t-{cycle}-{client_id}-{n}");
                let body = json!({"tenant_id": id, "name": id});
                (Method::POST, "/v1/admin/tenants".into(), body, Some(id))
            }
            _ => (
                Method::PATCH,
                "/v1/admin/tenants/base".into(),
                json!({"name": format!("base {cycle}-{client_id}-{n}")}),
                None,
            ),
        };
        let request = http
            .request(method, format!("{base}{path}"))
            .header("X-Admin-API-Key", ADMIN_KEY)
            .json(&body)
            .send();
        let answer = match request.await {
            Ok(r) => {
                let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
                Some((id, r.status().as_u16()))
            }
            Err(_) => None,
        };
        let stop = answer.is_none();
        sent.push(Sent { creates, answer });
        if stop {
            break;
        }
    }
    sent
}

/// Every entry of the audit log: request id → the entries' (operation, status, resource).
async fn all_entries(base: &str) -> BTreeMap<String, Vec<(String, u16, String)>> {
    let http = client();
    let mut entries: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/admin/audit/logs?limit=100&sort_dir=asc");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = http
            .get(url)
            .header("X-Admin-API-Key", ADMIN_KEY)
            .send()
            .await
            .expect("audit page")
            .json()
            .await
            .expect("audit json");
        for e in page["logs"].as_array().expect("logs") {
            let request_id = e["request_id"].as_str().expect("request id").to_string();
            let resource = e["resource_id"].as_str().unwrap_or_default().to_string();
            let operation = e["operation"].as_str().expect("operation").to_string();
            let status = e["status"].as_u64().expect("status") as u16;
            entries
                .entry(request_id)
                .or_default()
                .push((operation, status, resource));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return entries,
        }
    }
}

async fn tenant_exists(base: &str, id: &str) -> bool {
    let r = client()
        .get(format!("{base}/v1/admin/tenants/{id}"))
        .header("X-Admin-API-Key", ADMIN_KEY)
        .send()
        .await
        .expect("get tenant");
    match r.status().as_u16() {
        200 => true,
        404 => false,
        other => panic!("GET tenant {id}: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_admin_write_has_one_entry_after_kill_9() {
    let dir = TempDir::new().expect("temp dir");
    let data = dir.path().join("data");
    let mut server = Server::start(&data, dir.path()).await;
    let base_tenant = json!({"tenant_id": "base", "name": "base"});
    let r = client()
        .post(format!("{}/v1/admin/tenants", server.base))
        .header("X-Admin-API-Key", ADMIN_KEY)
        .json(&base_tenant)
        .send()
        .await
        .expect("create base");
    assert_eq!(r.status(), 201);
    let mut sent_all: Vec<Sent> = Vec::new();
    for cycle in 0..KILL_CYCLES {
        let until = Instant::now() + LOAD * 4;
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| tokio::spawn(writes(server.base.clone(), c, cycle, until)))
            .collect();
        tokio::time::sleep(LOAD).await;
        // Killed under load: the writers are mid-request.
        server.kill();
        for task in tasks {
            sent_all.extend(task.await.expect("writer"));
        }
        server = Server::start(&data, dir.path()).await;
    }
    let entries = all_entries(&server.base).await;
    let acknowledged: Vec<_> = sent_all.iter().filter(|s| s.answer.is_some()).collect();
    assert!(
        acknowledged.len() > 100,
        "load too light: {} writes",
        acknowledged.len()
    );
    assert!(
        sent_all.iter().any(|s| s.answer.is_none()),
        "the kills cut requests off"
    );
    // Every acknowledged write: exactly one entry, with the status it was answered.
    for s in &acknowledged {
        let (id, status) = s.answer.as_ref().unwrap();
        let found = entries.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(found.len(), 1, "request {id} ({status}): {found:?}");
        assert_eq!(found[0].1, *status, "request {id}");
    }
    // No entry of a request never sent: at most one per write sent (and the first create).
    assert!(
        entries.len() <= sent_all.len() + 1,
        "{} entries",
        entries.len()
    );
    // Every entry: one per request, and each create's entry exactly when its tenant exists.
    let answered: BTreeSet<&str> = acknowledged
        .iter()
        .map(|s| s.answer.as_ref().unwrap().0.as_str())
        .collect();
    let mut unanswered_creates = 0;
    for (request_id, found) in &entries {
        assert_eq!(found.len(), 1, "request {request_id}: {found:?}");
        let (operation, status, resource) = &found[0];
        if operation == "createTenant" && *status == 201 {
            assert!(tenant_exists(&server.base, resource).await, "{resource}");
            if !answered.contains(request_id.as_str()) {
                unanswered_creates += 1;
            }
        }
    }
    let created_with_entry: BTreeSet<&str> = entries
        .values()
        .filter(|f| f[0].0 == "createTenant" && f[0].1 == 201)
        .map(|f| f[0].2.as_str())
        .collect();
    for s in &sent_all {
        if let Some(id) = &s.creates {
            let exists = tenant_exists(&server.base, id).await;
            assert_eq!(
                exists,
                created_with_entry.contains(id.as_str()),
                "tenant {id}: a change without its entry, or an entry without its change"
            );
        }
    }
    eprintln!(
        "{} writes acknowledged, {} cut off by the kills ({} of those took effect), {} entries",
        acknowledged.len(),
        sent_all.len() - acknowledged.len(),
        unanswered_creates,
        entries.len()
    );
    server.terminate().await;
}
