//! What the Redis engine's process tests share: a request to a server, a tenant set up on
//! it, the Redis they need, and `cycles verify` on a Redis ledger.

use serde_json::{json, Value};
use store::redis::{ScratchLedger, Topology};

use crate::process::{assert_verify_ok, client, ADMIN_KEY};

/// The Redis URL in `var`; `None` (saying so) where it is unset, which fails in CI (`CI`
/// set), where every test must run.
pub fn redis_url(var: &str) -> Option<String> {
    let url = std::env::var(var).ok();
    if url.is_none() {
        assert!(std::env::var_os("CI").is_none(), "{var} is not set in CI");
        eprintln!("skipped: this test needs {var}");
    }
    url
}

/// A request to `base` as the admin (`who` `None`) or as an API key, with a JSON body for a
/// POST; answers the status and the body (JSON, or its text). A transport failure fails
/// the test: these servers answer whatever their Redis does.
pub async fn call(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    who: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    try_call(http, base, path, who, body)
        .await
        .unwrap_or_else(|e| panic!("{path}: no answer: {e}"))
}

/// [`call`], with the error if no answer came (the server is gone, say).
pub async fn try_call(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    who: Option<&str>,
    body: Option<Value>,
) -> Result<(u16, Value), reqwest::Error> {
    let url = format!("{base}{path}");
    let mut req = match &body {
        Some(_) => http.post(url),
        None => http.get(url),
    };
    req = match who {
        None => req.header("X-Admin-API-Key", ADMIN_KEY),
        Some(key) => req.header("X-Cycles-API-Key", key),
    };
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// A tenant with an API key and the given budgets (scope, allocated); answers the key's
/// secret.
pub async fn provision(base: &str, tenant: &str, budgets: &[(String, i64)], unit: &str) -> String {
    let http = client();
    let body = json!({"tenant_id": tenant, "name": tenant});
    let (s, b) = call(&http, base, "/v1/admin/tenants", None, Some(body)).await;
    assert_eq!(s, 201, "{b}");
    let body = json!({"tenant_id": tenant, "name": "test"});
    let (s, key) = call(&http, base, "/v1/admin/api-keys", None, Some(body)).await;
    assert_eq!(s, 201, "{key}");
    for (scope, allocated) in budgets {
        let body = json!({
            "tenant_id": tenant,
            "scope": scope,
            "unit": unit,
            "allocated": {"unit": unit, "amount": allocated},
        });
        let (s, b) = call(&http, base, "/v1/admin/budgets", None, Some(body)).await;
        assert_eq!(s, 201, "{b}");
    }
    key["key_secret"].as_str().expect("secret").to_string()
}

/// How a test ledger's Redis is reached.
pub fn topology(cluster: bool) -> Topology {
    if cluster {
        Topology::Cluster
    } else {
        Topology::Single
    }
}

/// `cycles verify` on a test's ledger.
pub fn assert_ledger_ok(ledger: &ScratchLedger) {
    assert_redis_ledger_ok(&ledger.url, ledger.is_cluster(), &ledger.namespace);
}

/// `cycles verify` on a Redis engine's ledger.
pub fn assert_redis_ledger_ok(url: &str, cluster: bool, namespace: &str) {
    let mut args = vec![
        "--store",
        "redis",
        "--redis-url",
        url,
        "--redis-namespace",
        namespace,
    ];
    if cluster {
        args.push("--redis-cluster");
    }
    assert_verify_ok(&args);
}
