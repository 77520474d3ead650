//! A data directory restored without its webhook key: the server says so at start, and a
//! subscription sealed with the lost key is never delivered unsigned. Each attempt fails
//! with the reason (so retries, auto-disable and the deliveries list tell the operator),
//! and the test probe answers it too.

use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::process::{client, logs_in, Server, ADMIN_KEY};
use crate::receiver::Receiver;

async fn admin(server: &Server, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut request = client()
        .request(method, format!("{}{path}", server.base))
        .header("X-Admin-API-Key", ADMIN_KEY);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("admin request");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.unwrap_or(Value::Null)
}

async fn create_budget(server: &Server, scope: &str) {
    let body = json!({"tenant_id": "acme", "scope": scope, "unit": "TOKENS",
                      "allocated": {"unit": "TOKENS", "amount": 10}});
    admin(
        server,
        reqwest::Method::POST,
        "/v1/admin/budgets",
        Some(body),
    )
    .await;
}

/// Polls until `done` holds of the subscription's deliveries.
async fn wait_deliveries(server: &Server, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let path = format!("/v1/admin/webhooks/{id}/deliveries");
    for _ in 0..400 {
        let listed = admin(server, reqwest::Method::GET, &path, None).await;
        let deliveries = listed["deliveries"].as_array().unwrap().clone();
        if done(&deliveries) {
            return deliveries;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the deliveries of {id} never got there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_webhook_key_fails_deliveries_and_never_sends_them_unsigned() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let (received, url) = Receiver::start().await;
    let server = Server::start(&data, dir.path()).await;
    let security = json!({"blocked_cidr_ranges": [], "allow_http": true});
    let put = reqwest::Method::PUT;
    admin(
        &server,
        put,
        "/v1/admin/config/webhook-security",
        Some(security),
    )
    .await;
    let post = reqwest::Method::POST;
    admin(
        &server,
        post.clone(),
        "/v1/admin/tenants",
        Some(json!({"tenant_id": "acme", "name": "Acme"})),
    )
    .await;
    let subscription = json!({"url": url, "event_types": ["budget.created"],
                              "headers": {"X-Team": "blue"}});
    let created = admin(
        &server,
        post.clone(),
        "/v1/admin/webhooks?tenant_id=acme",
        Some(subscription),
    )
    .await;
    let id = created["subscription"]["subscription_id"]
        .as_str()
        .unwrap()
        .to_string();
    create_budget(&server, "tenant:acme/workspace:before").await;
    wait_deliveries(&server, &id, |d| d.iter().any(|d| d["status"] == "SUCCESS")).await;
    {
        let got = received.headers();
        assert_eq!(got.len(), 1);
        assert!(got[0].contains_key("x-cycles-signature"));
        assert_eq!(got[0]["x-team"], "blue");
    }
    server.terminate().await;

    std::fs::remove_file(data.join("webhook.key")).expect("the data directory's webhook key");
    let server = Server::start(&data, dir.path()).await;
    let logs = logs_in(dir.path());
    assert!(
        logs.contains("no webhook key in a data directory that holds a ledger"),
        "the start says the key is new"
    );
    create_budget(&server, "tenant:acme/workspace:after").await;
    let failed = wait_deliveries(&server, &id, |d| {
        d.iter()
            .any(|d| d["attempts"].as_u64() >= Some(1) && d["status"] != "SUCCESS")
    })
    .await;
    let failed = failed.iter().find(|d| d["status"] != "SUCCESS").unwrap();
    let why = failed["error_message"].as_str().unwrap();
    assert!(why.contains("signing secret cannot be opened"), "{why}");
    assert!(failed["response_status"].is_null(), "nothing was sent");
    let probe = admin(
        &server,
        post,
        &format!("/v1/admin/webhooks/{id}/test"),
        None,
    )
    .await;
    assert_eq!(probe["success"], false);
    assert!(probe["error_message"]
        .as_str()
        .unwrap()
        .contains("cannot be opened"));
    assert_eq!(
        received.headers().len(),
        1,
        "nothing more reached the receiver"
    );
    server.terminate().await;
}
