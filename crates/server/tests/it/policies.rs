//! Policies: caps (ALLOW_WITH_CAPS), overage and TTL rules matched by scope pattern.

use crate::common::{amount, reserve_body, As, Engine, TestServer, T0};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    caps_come_from_the_governing_policy,
    priority_status_and_window_choose_the_policy,
    policy_sets_overage_and_ttl_limits,
    policy_crud_and_validation,
    rate_limits_count_each_clock_minute,
    a_pattern_that_could_never_match_is_refused,
    an_update_that_changes_nothing_is_not_announced,
    null_removes_an_optional_setting,
);

async fn policy(s: &TestServer, who: As<'_>, body: Value) -> Value {
    s.post("/v1/admin/policies", who, body)
        .await
        .expect(201, None)
        .clone()
}

fn agent() -> Value {
    json!({"tenant": "acme", "agent": "bot"})
}

async fn caps_come_from_the_governing_policy(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let caps = json!({"max_tokens": 512, "tool_denylist": ["shell"]});
    policy(
        &s,
        As::Key(&key),
        json!({"name": "agents", "scope_pattern": "tenant:acme/agent:*", "caps": caps}),
    )
    .await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r1", agent(), 10),
        )
        .await;
    let b = r.expect(200, None);
    assert_eq!(b["decision"], "ALLOW_WITH_CAPS");
    assert_eq!(b["caps"], caps);
    assert!(b["reservation_id"].is_string());
    // The tenant scope itself is not matched by tenant:acme/agent:*.
    let t = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r2", json!({"tenant": "acme"}), 10),
        )
        .await;
    let tb = t.expect(200, None);
    assert_eq!(tb["decision"], "ALLOW");
    assert!(tb.get("caps").is_none());
    // Dry run and decide carry the same caps; a DENY never does.
    let mut dry = reserve_body("r3", agent(), 10);
    dry["dry_run"] = json!(true);
    let d = s.post("/v1/reservations", As::Key(&key), dry).await;
    assert_eq!(d.expect(200, None)["caps"], caps);
    let decide = |k: &str, amount: i64| {
        json!({"idempotency_key": k, "subject": agent(), "action": {"kind": "k", "name": "n"},
               "estimate": {"unit": "USD_MICROCENTS", "amount": amount}})
    };
    let ok = s.post("/v1/decide", As::Key(&key), decide("d1", 10)).await;
    let okb = ok.expect(200, None);
    assert_eq!(
        (okb["decision"].as_str(), &okb["caps"]),
        (Some("ALLOW_WITH_CAPS"), &caps)
    );
    let deny = s
        .post("/v1/decide", As::Key(&key), decide("d2", 10_000_000))
        .await;
    let db = deny.expect(200, None);
    assert_eq!(db["decision"], "DENY");
    assert!(db.get("caps").is_none());
    s.stop().await;
}

async fn priority_status_and_window_choose_the_policy(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let low = policy(
        &s,
        As::Admin,
        json!({"tenant_id": "acme", "name": "low", "scope_pattern": "tenant:acme/*", "priority": 1,
               "caps": {"max_tokens": 1}}),
    )
    .await;
    let high = policy(
        &s,
        As::Admin,
        json!({"tenant_id": "acme", "name": "high", "scope_pattern": "tenant:acme/agent:bot",
               "priority": 5, "caps": {"max_tokens": 5}}),
    )
    .await;
    let caps_now = |k: &'static str| {
        let s = &s;
        let key = key.clone();
        async move {
            let r = s
                .post(
                    "/v1/reservations",
                    As::Key(&key),
                    reserve_body(k, agent(), 1),
                )
                .await;
            r.expect(200, None)["caps"]["max_tokens"].clone()
        }
    };
    assert_eq!(caps_now("a").await, 5);
    let id = high["policy_id"].as_str().unwrap();
    s.send(
        Method::PATCH,
        &format!("/v1/admin/policies/{id}"),
        As::Admin,
        Some(&json!({"status": "DISABLED"})),
    )
    .await
    .expect(200, None);
    assert_eq!(caps_now("b").await, 1);
    // A window that has not started yet does not apply.
    let later = protocol::format_rfc3339(T0 + 3_600_000);
    let low_id = low["policy_id"].as_str().unwrap();
    s.send(
        Method::PATCH,
        &format!("/v1/admin/policies/{low_id}"),
        As::Admin,
        Some(&json!({"effective_from": later})),
    )
    .await
    .expect(200, None);
    assert_eq!(caps_now("c").await, Value::Null);
    s.advance(3_600_000);
    assert_eq!(caps_now("d").await, 1);
    s.stop().await;
}

async fn policy_sets_overage_and_ttl_limits(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    policy(
        &s,
        As::Key(&key),
        json!({"name": "strict", "scope_pattern": "tenant:acme/*", "commit_overage_policy": "REJECT",
               "reservation_ttl_override": {"default_ttl_ms": 5000, "max_ttl_ms": 8000, "max_extensions": 1}}),
    )
    .await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r1", agent(), 100),
        )
        .await;
    let b = r.expect(200, None).clone();
    assert_eq!(b["expires_at_ms"], T0 + 5_000, "policy default TTL");
    let id = b["reservation_id"].as_str().unwrap();
    // The policy's REJECT governs the commit (the request named no overage policy).
    s.post(
        &format!("/v1/reservations/{id}/commit"),
        As::Key(&key),
        json!({"idempotency_key": "c", "actual": {"unit": "USD_MICROCENTS", "amount": 101}}),
    )
    .await
    .expect(409, Some("BUDGET_EXCEEDED"));
    let extend = |k: &str| json!({"idempotency_key": k, "extend_by_ms": 1000});
    s.post(
        &format!("/v1/reservations/{id}/extend"),
        As::Key(&key),
        extend("e1"),
    )
    .await
    .expect(200, None);
    s.post(
        &format!("/v1/reservations/{id}/extend"),
        As::Key(&key),
        extend("e2"),
    )
    .await
    .expect(409, Some("MAX_EXTENSIONS_EXCEEDED"));
    let mut long = reserve_body("r2", agent(), 1);
    long["ttl_ms"] = json!(60_000);
    let l = s.post("/v1/reservations", As::Key(&key), long).await;
    assert_eq!(
        l.expect(200, None)["expires_at_ms"],
        T0 + 8_000,
        "capped by max_ttl_ms"
    );
    assert_eq!(
        amount(&s.ledger("tenant:acme", "USD_MICROCENTS").await, "reserved"),
        101
    );
    // And an event's, as a commit's (the tenant's default would charge what is left).
    let event = |key: &str, overage: Option<&str>| {
        let mut body = json!({"idempotency_key": key, "subject": agent(),
                              "action": {"kind": "llm.completion", "name": "m"},
                              "actual": {"unit": "USD_MICROCENTS", "amount": 1_000}});
        if let Some(overage) = overage {
            body["overage_policy"] = json!(overage);
        }
        body
    };
    s.post("/v1/events", As::Key(&key), event("ev", None))
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    let ledger = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(
        amount(&ledger, "spent"),
        0,
        "the refused event charged nothing"
    );
    // The request's own overage policy still comes first.
    let capped = s
        .post(
            "/v1/events",
            As::Key(&key),
            event("ev2", Some("ALLOW_IF_AVAILABLE")),
        )
        .await;
    assert_eq!(capped.expect(201, None)["charged"]["amount"], 899);
    s.stop().await;
}

async fn policy_crud_and_validation(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let other = s.setup("other", 1_000).await;
    let base = json!({"name": "p", "scope_pattern": "tenant:acme"});
    // Admin must name the tenant; a tenant key must not.
    s.post("/v1/admin/policies", As::Admin, base.clone())
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let mut with_tenant = base.clone();
    with_tenant["tenant_id"] = json!("acme");
    s.post("/v1/admin/policies", As::Key(&key), with_tenant.clone())
        .await
        .expect(400, Some("INVALID_REQUEST"));
    // Patterns are rooted at the owning tenant.
    s.post("/v1/admin/policies", As::Key(&other), base.clone())
        .await
        .expect(400, Some("INVALID_REQUEST"));
    for bad in [
        json!({"name": "p", "scope_pattern": "tenant:acme", "priority": -1}),
        json!({"name": "p", "scope_pattern": "tenant:acme", "caps": {"max_tokens": -5}}),
        json!({"name": "p", "scope_pattern": "tenant:acme", "caps": {"bogus": 1}}),
        json!({"name": "p", "scope_pattern": "tenant:acme", "reservation_ttl_override": {"max_ttl_ms": 10}}),
        json!({"name": "p", "scope_pattern": "tenant:acme", "effective_from": "2030-01-02T00:00:00Z", "effective_until": "2030-01-01T00:00:00Z"}),
    ] {
        s.post("/v1/admin/policies", As::Key(&key), bad)
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let created = policy(&s, As::Key(&key), base.clone()).await;
    assert_eq!(created["status"], "ACTIVE");
    assert!(created["policy_id"].as_str().unwrap().starts_with("pol_"));
    policy(
        &s,
        As::Key(&key),
        json!({"name": "q", "scope_pattern": "tenant:acme/*"}),
    )
    .await;
    // Lists are tenant-scoped and paginated.
    let page = s
        .get("/v1/admin/policies?limit=1", As::Key(&key))
        .await
        .expect(200, None)
        .clone();
    assert_eq!(page["policies"].as_array().unwrap().len(), 1);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = s
        .get(
            &format!("/v1/admin/policies?limit=1&cursor={cursor}"),
            As::Key(&key),
        )
        .await;
    assert_eq!(
        rest.expect(200, None)["policies"].as_array().unwrap().len(),
        1
    );
    for bad in ["zzzz", "garbage", "pol_0000000000000000"] {
        s.get(
            &format!("/v1/admin/policies?limit=1&cursor={bad}"),
            As::Key(&key),
        )
        .await
        .expect(400, Some("INVALID_REQUEST"));
    }
    let theirs = s.get("/v1/admin/policies", As::Key(&other)).await;
    assert_eq!(
        theirs.expect(200, None)["policies"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    s.get("/v1/admin/policies", As::Admin)
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let admin_list = s.get("/v1/admin/policies?tenant_id=acme", As::Admin).await;
    assert_eq!(
        admin_list.expect(200, None)["policies"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Another tenant cannot see or change the policy.
    let id = created["policy_id"].as_str().unwrap();
    s.send(
        Method::PATCH,
        &format!("/v1/admin/policies/{id}"),
        As::Key(&other),
        Some(&json!({"priority": 3})),
    )
    .await
    .expect(404, Some("NOT_FOUND"));
    let patched = s
        .send(
            Method::PATCH,
            &format!("/v1/admin/policies/{id}"),
            As::Key(&key),
            Some(&json!({"priority": 3})),
        )
        .await;
    assert_eq!(patched.expect(200, None)["priority"], 3);
    s.stop().await;
}

/// `rate_limits`: the reservations a policy admits and the commits it settles, across every
/// scope it governs, at most so many per clock minute; over it, 429 `LIMIT_EXCEEDED` with
/// `Retry-After` until the minute ends. A replay is not counted again, a refused request
/// not at all, and other policies' scopes are not affected.
async fn rate_limits_count_each_clock_minute(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let limits = json!({"max_reservations_per_minute": 3, "max_commits_per_minute": 2});
    let governing = policy(
        &s,
        As::Key(&key),
        json!({"name": "agents", "scope_pattern": "tenant:acme/agent:*", "rate_limits": limits}),
    )
    .await;
    // T0 starts a clock minute: all 60 s of it are left.
    assert_eq!(T0 % 60_000, 0);
    let reserve = |n: usize, agent: &str| {
        reserve_body(
            &format!("r{n}"),
            json!({"tenant": "acme", "agent": agent}),
            10,
        )
    };
    let mut ids = Vec::new();
    for n in 0..3 {
        let agent = if n == 0 { "a" } else { "b" };
        let r = s
            .post("/v1/reservations", As::Key(&key), reserve(n, agent))
            .await;
        ids.push(
            r.expect(200, None)["reservation_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // A replay answers as before and counts nothing.
    s.post("/v1/reservations", As::Key(&key), reserve(0, "a"))
        .await
        .expect(200, None);
    let before = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    let refused = s
        .post("/v1/reservations", As::Key(&key), reserve(3, "c"))
        .await;
    refused.expect(429, Some("LIMIT_EXCEEDED"));
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert!(refused.header("x-ratelimit-reset").is_some());
    let policy_id = governing["policy_id"].as_str().unwrap();
    assert_eq!(refused.body["details"]["policy_id"], policy_id);
    assert_eq!(refused.body["details"]["limit"], 3);
    assert_eq!(
        s.ledger("tenant:acme", "USD_MICROCENTS").await,
        before,
        "nothing held"
    );
    // A scope no rate-limited policy governs is not limited.
    s.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("other", json!({"tenant": "acme", "workspace": "w"}), 10),
    )
    .await
    .expect(200, None);

    // Commits: two, then 429; the refused commit leaves its reservation ACTIVE.
    let commit = |id: &str, n: usize| {
        let body = json!({"idempotency_key": format!("c{n}"),
                          "actual": {"unit": "USD_MICROCENTS", "amount": 5}});
        (format!("/v1/reservations/{id}/commit"), body)
    };
    for (n, id) in ids.iter().enumerate().take(2) {
        let (path, body) = commit(id, n);
        s.post(&path, As::Key(&key), body).await.expect(200, None);
    }
    let (path, body) = commit(&ids[2], 2);
    s.post(&path, As::Key(&key), body.clone())
        .await
        .expect(429, Some("LIMIT_EXCEEDED"));
    let third = s
        .get(&format!("/v1/reservations/{}", ids[2]), As::Key(&key))
        .await;
    assert_eq!(third.expect(200, None)["status"], "ACTIVE");

    // The next minute starts the counts afresh.
    s.advance(60_000);
    s.post(&path, As::Key(&key), body).await.expect(200, None);
    s.post("/v1/reservations", As::Key(&key), reserve(3, "c"))
        .await
        .expect(200, None);
}

/// A scope pattern is a scope's grammar with wildcards: levels in order, `level:*` for any
/// value, a bare `*` only last. One that could never match a scope is refused (it was
/// stored, and silently governed nothing), and a refusal creates nothing.
async fn a_pattern_that_could_never_match_is_refused(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    for pattern in [
        "tenant:acme/*/agent:x",
        "tenant:acme/foo:bar",
        "tenant:acme/garbage!!",
        "tenant:acme//",
        "tenant:acme/",
        "tenant:acme/agent:*/workspace:x",
        "tenant:acme/workspace:a/workspace:b",
        "tenant:acme/agent:",
        "tenant:acme/tenant:acme",
        "tenant:acme/toolset:x/*",
        "tenant:acme-corp/*",
        "workspace:eng",
    ] {
        let r = s
            .post(
                "/v1/admin/policies",
                As::Key(&key),
                json!({"name": "p", "scope_pattern": pattern}),
            )
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
        assert!(
            r.body["message"].as_str().unwrap().contains(pattern),
            "{pattern}"
        );
    }
    let listed = s.get("/v1/admin/policies", As::Key(&key)).await;
    assert_eq!(listed.expect(200, None)["policies"], json!([]));
    for pattern in [
        "tenant:acme",
        "tenant:acme/*",
        "tenant:acme/agent:*",
        "tenant:acme/workspace:*/agent:bot",
        "tenant:ACME/Workspace:Eng/*",
    ] {
        policy(
            &s,
            As::Key(&key),
            json!({"name": pattern, "scope_pattern": pattern}),
        )
        .await;
    }
    // A middle `level:*` governs what it says.
    let caps = json!({"max_tokens": 7});
    policy(
        &s,
        As::Key(&key),
        json!({"name": "capped", "priority": 5, "scope_pattern": "tenant:acme/workspace:*/agent:bot",
               "caps": caps}),
    )
    .await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body(
                "w",
                json!({"tenant": "acme", "workspace": "eng", "agent": "bot"}),
                1,
            ),
        )
        .await;
    let r = r.expect(200, None);
    assert_eq!(r["decision"], "ALLOW_WITH_CAPS");
    assert_eq!(r["caps"]["max_tokens"], 7);
    s.stop().await;
}

/// How many events of `event_type` the admin event log holds.
async fn count_events(s: &TestServer, event_type: &str) -> usize {
    let r = s
        .get(
            &format!("/v1/admin/events?event_type={event_type}"),
            As::Admin,
        )
        .await;
    r.expect(200, None)["events"].as_array().unwrap().len()
}

/// A PATCH that changes nothing (a policy's or a budget's) stamps, stores and announces
/// nothing (admin spec §4.3); and a policy PATCH may not leave its window empty, which
/// create refuses.
async fn an_update_that_changes_nothing_is_not_announced(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let created = policy(
        &s,
        As::Admin,
        json!({"tenant_id": "acme", "name": "p", "scope_pattern": "tenant:acme/*",
               "effective_until": "2030-01-01T00:00:00Z"}),
    )
    .await;
    let path = format!(
        "/v1/admin/policies/{}",
        created["policy_id"].as_str().unwrap()
    );
    for same in [json!({}), json!({"name": "p"})] {
        let r = s.send(Method::PATCH, &path, As::Admin, Some(&same)).await;
        assert_eq!(r.expect(200, None)["updated_at"], created["updated_at"]);
    }
    assert_eq!(count_events(&s, "policy.updated").await, 0);
    let empty_window = json!({"effective_from": "2031-01-01T00:00:00Z"});
    s.send(Method::PATCH, &path, As::Admin, Some(&empty_window))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let r = s.get("/v1/admin/policies?tenant_id=acme", As::Admin).await;
    assert!(r.expect(200, None)["policies"][0]["effective_from"].is_null());
    let renamed = json!({"name": "q"});
    s.send(Method::PATCH, &path, As::Admin, Some(&renamed))
        .await
        .expect(200, None);
    assert_eq!(count_events(&s, "policy.updated").await, 1);

    let budget = "/v1/admin/budgets?scope=tenant:acme&unit=USD_MICROCENTS";
    let before = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    let same = json!({"overdraft_limit": {"unit": "USD_MICROCENTS", "amount": 0}});
    for body in [json!({}), same] {
        let r = s.send(Method::PATCH, budget, As::Admin, Some(&body)).await;
        assert_eq!(r.expect(200, None)["updated_at"], before["updated_at"]);
    }
    assert_eq!(count_events(&s, "budget.updated").await, 0);
    let raised = json!({"overdraft_limit": {"unit": "USD_MICROCENTS", "amount": 10}});
    s.send(Method::PATCH, budget, As::Admin, Some(&raised))
        .await
        .expect(200, None);
    assert_eq!(count_events(&s, "budget.updated").await, 1);
    s.stop().await;
}

/// A PATCH's `null` removes a policy's optional setting (its caps then no longer apply)
/// or a budget's overage policy and metadata; a `null` for anything required is refused.
async fn null_removes_an_optional_setting(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let created = policy(
        &s,
        As::Key(&key),
        json!({"name": "capped", "scope_pattern": "tenant:acme/*", "description": "d",
               "caps": {"max_tokens": 5}, "effective_until": "2030-01-01T00:00:00Z"}),
    )
    .await;
    let path = format!(
        "/v1/admin/policies/{}",
        created["policy_id"].as_str().unwrap()
    );
    let reserve = |k: &str| reserve_body(k, agent(), 1);
    let r = s
        .post("/v1/reservations", As::Key(&key), reserve("r1"))
        .await;
    assert_eq!(r.expect(200, None)["decision"], "ALLOW_WITH_CAPS");
    for required in [
        json!({"name": null}),
        json!({"priority": null}),
        json!({"status": null}),
    ] {
        s.send(Method::PATCH, &path, As::Key(&key), Some(&required))
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let cleared = json!({"caps": null, "description": null, "effective_until": null});
    let r = s
        .send(Method::PATCH, &path, As::Key(&key), Some(&cleared))
        .await;
    let p = r.expect(200, None);
    for field in ["caps", "description", "effective_until"] {
        assert!(p.get(field).is_none(), "{field} removed: {p}");
    }
    assert_eq!(p["name"], "capped");
    let r = s
        .post("/v1/reservations", As::Key(&key), reserve("r2"))
        .await;
    let r = r.expect(200, None);
    assert_eq!(r["decision"], "ALLOW");
    assert!(r.get("caps").is_none());

    let budget = "/v1/admin/budgets?scope=tenant:acme&unit=USD_MICROCENTS";
    let set = json!({"commit_overage_policy": "REJECT", "metadata": {"team": "a"}});
    let b = s.send(Method::PATCH, budget, As::Admin, Some(&set)).await;
    assert_eq!(b.expect(200, None)["commit_overage_policy"], "REJECT");
    let unset = json!({"commit_overage_policy": null, "metadata": null});
    let b = s.send(Method::PATCH, budget, As::Admin, Some(&unset)).await;
    let b = b.expect(200, None);
    assert!(
        b.get("commit_overage_policy").is_none() && b.get("metadata").is_none(),
        "{b}"
    );
    s.send(
        Method::PATCH,
        budget,
        As::Admin,
        Some(&json!({"overdraft_limit": null})),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}
