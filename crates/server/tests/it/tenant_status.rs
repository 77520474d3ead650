//! The tenant status guard: closing a tenant revokes its keys (401 from then on) and the
//! admin key, which still reads its objects, is refused every mutation (409 TENANT_CLOSED);
//! a SUSPENDED tenant takes no new reservations but settles the ones it has. Also rate
//! limiting.

use crate::common::{amount, reserve_body, As, Engine, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    closed_tenant_matrix,
    suspended_tenant_settles_but_does_not_reserve,
    a_suspended_tenant_is_read_only_to_its_keys_not_to_the_operator,
    closing_twice_and_reopening,
    rate_limit_answers_429_with_retry_after,
);

async fn set_status(s: &TestServer, tenant: &str, status: &str) -> Value {
    s.send(
        Method::PATCH,
        &format!("/v1/admin/tenants/{tenant}"),
        As::Admin,
        Some(&json!({"status": status})),
    )
    .await
    .expect(200, None)
    .clone()
}

fn subject() -> Value {
    json!({"tenant": "acme", "agent": "bot"})
}

async fn closed_tenant_matrix(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    // Before the close: a reservation that stays open, one committed, an event, a decide.
    let open = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("open", subject(), 100),
        )
        .await;
    let open_body = open.expect(200, None).clone();
    let open_id = open_body["reservation_id"].as_str().unwrap().to_string();
    let done = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("done", subject(), 50),
        )
        .await;
    let done_id = done.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let commit_body =
        json!({"idempotency_key": "c1", "actual": {"unit": "USD_MICROCENTS", "amount": 40}});
    s.post(
        &format!("/v1/reservations/{done_id}/commit"),
        As::Key(&key),
        commit_body.clone(),
    )
    .await
    .expect(200, None);
    let event = json!({
        "idempotency_key": "e1", "subject": subject(),
        "action": {"kind": "k", "name": "n"}, "actual": {"unit": "USD_MICROCENTS", "amount": 5}
    });
    s.post("/v1/events", As::Key(&key), event.clone())
        .await
        .expect(201, None);

    let closed = set_status(&s, "acme", "CLOSED").await;
    assert_eq!(closed["status"], "CLOSED");
    assert!(closed["closed_at"].is_string());
    // The cascade released the open hold and closed the budget.
    let budget = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(
        (budget["status"].as_str(), amount(&budget, "reserved")),
        (Some("CLOSED"), 0)
    );
    // The close revoked the tenant's keys in the same step: every request with one is 401,
    // fresh or a replay of a pre-close success, mutation, evaluation or read.
    let revoked = |r: &crate::common::Resp| {
        r.expect(401, Some("UNAUTHORIZED"));
        assert!(
            r.body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("revoked"),
            "{}",
            r.body
        );
    };
    revoked(
        &s.post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("new", subject(), 1),
        )
        .await,
    );
    revoked(
        &s.post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("open", subject(), 100),
        )
        .await,
    );
    revoked(
        &s.post(
            &format!("/v1/reservations/{done_id}/commit"),
            As::Key(&key),
            commit_body,
        )
        .await,
    );
    revoked(&s.post("/v1/events", As::Key(&key), event).await);
    let mut dry = reserve_body("dry", subject(), 1);
    dry["dry_run"] = json!(true);
    revoked(&s.post("/v1/reservations", As::Key(&key), dry).await);
    revoked(
        &s.get(&format!("/v1/reservations/{open_id}"), As::Key(&key))
            .await,
    );
    revoked(&s.get("/v1/balances?tenant=acme", As::Key(&key)).await);
    // The admin key still reads the closed tenant's objects (post-mortem), and the guard
    // refuses its mutations with TENANT_CLOSED, beating the reservation's own state.
    let got = s
        .get(&format!("/v1/reservations/{open_id}"), As::Admin)
        .await;
    assert_eq!(got.expect(200, None)["status"], "RELEASED");
    s.get("/v1/reservations?tenant=acme", As::Admin)
        .await
        .expect(200, None);
    for id in [&open_id, &done_id] {
        s.post(
            &format!("/v1/reservations/{id}/release"),
            As::Admin,
            json!({"idempotency_key": "admin-r"}),
        )
        .await
        .expect(409, Some("TENANT_CLOSED"));
    }
    s.stop().await;
}

async fn suspended_tenant_settles_but_does_not_reserve(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("a", subject(), 100),
        )
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let t = set_status(&s, "acme", "SUSPENDED").await;
    assert!(t["suspended_at"].is_string());
    s.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("b", subject(), 1),
    )
    .await
    .expect(403, Some("FORBIDDEN"));
    let mut dry = reserve_body("c", subject(), 1);
    dry["dry_run"] = json!(true);
    let d = s.post("/v1/reservations", As::Key(&key), dry).await;
    assert_eq!(d.expect(200, None)["reason_code"], "TENANT_SUSPENDED");
    s.post(
        &format!("/v1/reservations/{id}/commit"),
        As::Key(&key),
        json!({"idempotency_key": "c", "actual": {"unit": "USD_MICROCENTS", "amount": 60}}),
    )
    .await
    .expect(200, None);
    set_status(&s, "acme", "ACTIVE").await;
    s.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("b", subject(), 1),
    )
    .await
    .expect(200, None);
    s.stop().await;
}

/// A SUSPENDED tenant's own keys may read but not change its budgets, policies or webhooks;
/// the operator may still fund it and update its policies (creating anything needs it
/// ACTIVE, for everyone).
async fn a_suspended_tenant_is_read_only_to_its_keys_not_to_the_operator(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let (key, _) = s
        .key_with(
            "acme",
            json!({"permissions": ["budgets:read", "budgets:write", "policies:read",
                   "policies:write", "webhooks:read", "webhooks:write", "balances:read"]}),
        )
        .await;
    let policy = s
        .post(
            "/v1/admin/policies",
            As::Key(&key),
            json!({"name": "cap", "scope_pattern": "tenant:acme"}),
        )
        .await;
    let policy_path = format!(
        "/v1/admin/policies/{}",
        policy.expect(201, None)["policy_id"].as_str().unwrap()
    );
    let webhook = s
        .post(
            "/v1/webhooks",
            As::Key(&key),
            json!({"url": "https://93.184.216.34/hook", "event_types": ["budget.funded"]}),
        )
        .await;
    let webhook_path = format!(
        "/v1/webhooks/{}",
        webhook.expect(201, None)["subscription"]["subscription_id"]
            .as_str()
            .unwrap()
    );
    set_status(&s, "acme", "SUSPENDED").await;
    let fund_path = "/v1/admin/budgets/fund?scope=tenant:acme&unit=USD_MICROCENTS";
    let credit = |key: &str| {
        json!({"operation": "CREDIT", "amount": {"unit": "USD_MICROCENTS", "amount": 5},
               "idempotency_key": key})
    };
    let rename = json!({"name": "renamed"});
    let refused = [
        s.post(fund_path, As::Key(&key), credit("k")).await,
        s.send(Method::PATCH, &policy_path, As::Key(&key), Some(&rename))
            .await,
        s.send(Method::PATCH, &webhook_path, As::Key(&key), Some(&rename))
            .await,
        s.send(Method::DELETE, &webhook_path, As::Key(&key), None)
            .await,
        s.post(&format!("{webhook_path}/test"), As::Key(&key), json!({}))
            .await,
        s.post(
            "/v1/webhooks",
            As::Key(&key),
            json!({"url": "https://93.184.216.34/two", "event_types": ["budget.funded"]}),
        )
        .await,
    ];
    for r in &refused {
        r.expect(400, Some("INVALID_REQUEST"));
        assert!(r.body["message"].as_str().unwrap().contains("SUSPENDED"));
    }
    // Reads still work for the key; nothing it tried changed anything.
    let ledger = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(amount(&ledger, "allocated"), 1_000);
    s.get(&webhook_path, As::Key(&key)).await.expect(200, None);
    // The operator funds it and updates its policy.
    let admin_fund = format!("{fund_path}&tenant_id=acme");
    let funded = s.post(&admin_fund, As::Admin, credit("a")).await;
    assert_eq!(amount(funded.expect(200, None), "new_allocated"), 1_005);
    let renamed = s
        .send(Method::PATCH, &policy_path, As::Admin, Some(&rename))
        .await;
    assert_eq!(renamed.expect(200, None)["name"], "renamed");
    // Creating still needs the tenant ACTIVE, for the operator too.
    s.post(
        "/v1/admin/policies",
        As::Admin,
        json!({"tenant_id": "acme", "name": "two", "scope_pattern": "tenant:acme"}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}

async fn closing_twice_and_reopening(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    set_status(&s, "acme", "CLOSED").await;
    set_status(&s, "acme", "CLOSED").await;
    let r = s
        .send(
            Method::PATCH,
            "/v1/admin/tenants/acme",
            As::Admin,
            Some(&json!({"status": "ACTIVE"})),
        )
        .await;
    r.expect(400, Some("INVALID_REQUEST"));
    s.send(
        Method::PATCH,
        "/v1/admin/tenants/acme",
        As::Admin,
        Some(&json!({"status": "GONE"})),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.send(
        Method::PATCH,
        "/v1/admin/tenants/nope",
        As::Admin,
        Some(&json!({"name": "x"})),
    )
    .await
    .expect(404, Some("TENANT_NOT_FOUND"));
    s.stop().await;
}

async fn rate_limit_answers_429_with_retry_after(engine: Engine) {
    let limit = server::RateLimit {
        per_second: 1.0,
        burst: 5.0,
    };
    let s = TestServer::start_with(engine, |o| o.rate_limit = Some(limit)).await;
    let key = s.setup("acme", 1_000).await;
    let other = s.key("acme").await;
    // The setup calls used the admin key's bucket (4 of 5); each tenant key starts full.
    for _ in 0..5 {
        let r = s.get("/v1/balances?tenant=acme", As::Key(&key)).await;
        r.expect(200, None);
        assert!(r.header("x-ratelimit-remaining").is_some());
    }
    let limited = s.get("/v1/balances?tenant=acme", As::Key(&key)).await;
    limited.expect(429, Some("LIMIT_EXCEEDED"));
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry));
    assert!(limited
        .header("x-ratelimit-reset")
        .unwrap()
        .parse::<u64>()
        .is_ok());
    assert!(limited.header("x-cycles-trace-id").is_some());
    // Buckets are per key; health probes are never limited.
    s.get("/v1/balances?tenant=acme", As::Key(&other))
        .await
        .expect(200, None);
    for _ in 0..5 {
        s.get("/actuator/health", As::Nobody)
            .await
            .expect(200, None);
    }
    s.stop().await;
}
