//! The admin plane's provisioning slice over HTTP (admin spec §2.1, §2.2, §2.4, §3.1–§3.4):
//! tenants, API keys, budget creation/listing/lookup, funding and its idempotency.

use std::collections::BTreeSet;

use crate::common::{amount, assert_invariant, reserve_body, As, Engine, Resp, TestServer, T0};
use reqwest::Method;
use serde_json::{json, Value};

const UNIT: &str = "USD_MICROCENTS";

engine_tests!(
    tenants_are_created_once_and_validated,
    tenant_status_transitions,
    api_keys_are_minted_and_revoked,
    key_permissions_are_enforced,
    budget_creation_rules,
    budgets_are_listed_per_tenant_and_paginated,
    funding_operations_move_the_ledger_exactly,
    funding_is_idempotent_per_key,
    frozen_budget_cannot_be_funded,
    tenant_close_cascade_releases_and_closes,
    closed_tenant_guards_admin_mutations,
    cross_tenant_budgets_are_invisible,
);

// ---------------------------------------------------------------------------------------------
// Helpers

fn usd(v: i64) -> Value {
    json!({"unit": UNIT, "amount": v})
}

async fn patch_tenant(s: &TestServer, id: &str, body: Value) -> Resp {
    let path = format!("/v1/admin/tenants/{id}");
    s.send(Method::PATCH, &path, As::Admin, Some(&body)).await
}

async fn new_tenant(s: &TestServer, id: &str, name: &str) -> Resp {
    let body = json!({"tenant_id": id, "name": name});
    s.post("/v1/admin/tenants", As::Admin, body).await
}

async fn new_key(s: &TestServer, body: Value) -> Resp {
    s.post("/v1/admin/api-keys", As::Admin, body).await
}

async fn revoke(s: &TestServer, key_id: &str) -> Resp {
    let path = format!("/v1/admin/api-keys/{key_id}?reason=rotated");
    s.send(Method::DELETE, &path, As::Admin, None).await
}

/// `POST /v1/admin/budgets` as `who` for `scope` with `extra` fields merged in.
async fn create_budget(s: &TestServer, who: As<'_>, scope: &str, extra: Value) -> Resp {
    let mut body = json!({"scope": scope, "unit": UNIT, "allocated": usd(1_000)});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            body[k] = v;
        }
    }
    s.post("/v1/admin/budgets", who, body).await
}

/// `POST /v1/admin/budgets/fund` on `tenant:acme` as `who`; the admin names the tenant.
async fn fund_as(s: &TestServer, who: As<'_>, scope: &str, body: Value) -> Resp {
    let tenant = match who {
        As::Admin => "&tenant_id=acme",
        _ => "",
    };
    let path = format!("/v1/admin/budgets/fund?scope={scope}&unit={UNIT}{tenant}");
    s.post(&path, who, body).await
}

fn funding(operation: &str, value: i64) -> Value {
    json!({"operation": operation, "amount": usd(value)})
}

/// The `(previous, new)` pairs of a funding response, in the order
/// allocated, remaining, debt, spent.
fn transitions(b: &Value) -> [(i64, i64); 4] {
    ["allocated", "remaining", "debt", "spent"].map(|f| {
        (
            amount(b, &format!("previous_{f}")),
            amount(b, &format!("new_{f}")),
        )
    })
}

/// `(allocated, spent, reserved, debt, remaining)` of `tenant:acme`.
async fn acme_ledger(s: &TestServer) -> [i64; 5] {
    let b = s.ledger("tenant:acme", UNIT).await;
    ["allocated", "spent", "reserved", "debt", "remaining"].map(|f| amount(&b, f))
}

/// Funds `tenant:acme` as the admin, checks the response transitions and that the ledger now
/// holds the `new_*` values.
async fn funded(s: &TestServer, body: Value, expected: [(i64, i64); 4]) {
    let op = body["operation"].clone();
    let r = fund_as(s, As::Admin, "tenant:acme", body).await;
    let b = r.expect(200, None);
    assert_eq!(b["operation"], op);
    assert_eq!(transitions(b), expected, "{op}");
    let [alloc, spent, _, debt, remaining] = acme_ledger(s).await;
    let [(_, a), (_, rem), (_, d), (_, sp)] = expected;
    assert_eq!((alloc, remaining, debt, spent), (a, rem, d, sp), "{op}");
}

async fn reserve(s: &TestServer, key: &str, idem: &str, estimate: i64) -> String {
    let body = reserve_body(idem, json!({"tenant": "acme"}), estimate);
    let r = s.post("/v1/reservations", As::Key(key), body).await;
    r.expect(200, None)["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Tenants

/// createTenant: 201, then 200 for the same id and name, 409 DUPLICATE_RESOURCE for the same
/// id with another name; ids must be 3–64 characters of `[a-z0-9-]`; getTenant 200/404.
async fn tenants_are_created_once_and_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let created = new_tenant(&s, "acme", "Acme Corp").await;
    let t = created.expect(201, None);
    assert_eq!(
        (&t["tenant_id"], &t["name"], &t["status"]),
        (&json!("acme"), &json!("Acme Corp"), &json!("ACTIVE"))
    );
    assert_eq!(t["default_commit_overage_policy"], "ALLOW_IF_AVAILABLE");
    assert_eq!(t["default_reservation_ttl_ms"], 60_000);
    assert_eq!(t["max_reservation_ttl_ms"], 3_600_000);
    assert_eq!(t["max_reservation_extensions"], 10);

    let again = new_tenant(&s, "acme", "Acme Corp").await;
    assert_eq!(again.expect(200, None)["created_at"], t["created_at"]);
    new_tenant(&s, "acme", "Someone Else")
        .await
        .expect(409, Some("DUPLICATE_RESOURCE"));

    let long = "a".repeat(65);
    for bad in ["ACME", "ab", "acme_corp", "acme corp", long.as_str()] {
        new_tenant(&s, bad, "x")
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let max = "a".repeat(64);
    new_tenant(&s, &max, "x").await.expect(201, None);
    new_tenant(&s, "a-1", "x").await.expect(201, None);

    let got = s.get("/v1/admin/tenants/acme", As::Admin).await;
    assert_eq!(got.expect(200, None)["name"], "Acme Corp");
    s.get("/v1/admin/tenants/nobody", As::Admin)
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));
    s.get("/v1/admin/tenants/acme", As::Nobody)
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.stop().await;
}

/// ACTIVE → SUSPENDED → ACTIVE → CLOSED are allowed; CLOSED is terminal (400 on reopening).
async fn tenant_status_transitions(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let status = |r: Resp| r.expect(200, None).clone();
    let t = status(patch_tenant(&s, "acme", json!({"status": "SUSPENDED"})).await);
    assert_eq!(t["status"], "SUSPENDED");
    assert!(t["suspended_at"].is_string(), "{t}");
    let t = status(patch_tenant(&s, "acme", json!({"status": "ACTIVE"})).await);
    assert_eq!(t["status"], "ACTIVE");
    patch_tenant(&s, "acme", json!({"status": "PAUSED"}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let t = status(patch_tenant(&s, "acme", json!({"status": "CLOSED"})).await);
    assert_eq!(t["status"], "CLOSED");
    assert!(t["closed_at"].is_string(), "{t}");
    for reopen in ["ACTIVE", "SUSPENDED"] {
        patch_tenant(&s, "acme", json!({"status": reopen}))
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let got = s.get("/v1/admin/tenants/acme", As::Admin).await;
    assert_eq!(got.expect(200, None)["status"], "CLOSED");
    patch_tenant(&s, "nobody", json!({"status": "ACTIVE"}))
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));
    s.stop().await;
}

/// Admin spec §4.2 RULE 1: closing a tenant releases its ACTIVE reservations and closes its
/// budgets, draining `reserved` back into `remaining`; reads keep working.
async fn tenant_close_cascade_releases_and_closes(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    s.budget("tenant:acme/agent:bot", UNIT, 500, json!({}))
        .await;
    let id = reserve(&s, &key, "open", 300).await;
    assert_eq!(acme_ledger(&s).await, [1_000, 0, 300, 0, 700]);
    patch_tenant(&s, "acme", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    for scope in ["tenant:acme", "tenant:acme/agent:bot"] {
        assert_eq!(s.ledger(scope, UNIT).await["status"], "CLOSED", "{scope}");
    }
    assert_eq!(acme_ledger(&s).await, [1_000, 0, 0, 0, 1_000]);
    let r = s.get(&format!("/v1/reservations/{id}"), As::Admin).await;
    assert_eq!(r.expect(200, None)["status"], "RELEASED");
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// API keys

const DEFAULT_PERMISSIONS: [&str; 10] = [
    "reservations:create",
    "reservations:commit",
    "reservations:release",
    "reservations:extend",
    "reservations:list",
    "balances:read",
    "budgets:read",
    "budgets:write",
    "policies:read",
    "policies:write",
];

/// createApiKey: 201 with a `cyc_live_` + 32-character secret (shown once) and the ten default
/// permissions; revokeApiKey: 200 REVOKED, then 409 KEY_REVOKED; unknown key 404; a revoked
/// key no longer authenticates.
async fn api_keys_are_minted_and_revoked(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let r = new_key(&s, json!({"tenant_id": "acme", "name": "ci"})).await;
    let k = r.expect(201, None).clone();
    let secret = k["key_secret"].as_str().expect("key_secret");
    assert!(secret.starts_with("cyc_live_"), "{secret}");
    assert_eq!(secret.len(), 41);
    assert!(secret.starts_with(k["key_prefix"].as_str().expect("key_prefix")));
    assert_eq!(k["tenant_id"], "acme");
    assert!(k["created_at"].is_string() && k["expires_at"].is_string());
    let granted: BTreeSet<&str> = k["permissions"]
        .as_array()
        .expect("permissions")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(granted, DEFAULT_PERMISSIONS.into_iter().collect());

    let balances = "/v1/balances?tenant=acme";
    s.get(balances, As::Key(secret)).await.expect(200, None);
    let key_id = k["key_id"].as_str().expect("key_id");
    let revoked = revoke(&s, key_id).await;
    let rb = revoked.expect(200, None);
    assert_eq!(
        (&rb["status"], &rb["key_id"]),
        (&json!("REVOKED"), &k["key_id"])
    );
    assert!(rb.get("key_secret").is_none(), "{rb}");
    revoke(&s, key_id).await.expect(409, Some("KEY_REVOKED"));
    revoke(&s, "key_doesnotexist")
        .await
        .expect(404, Some("NOT_FOUND"));
    s.get(balances, As::Key(secret))
        .await
        .expect(401, Some("UNAUTHORIZED"));

    new_key(&s, json!({"tenant_id": "nobody", "name": "x"}))
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));
    new_key(
        &s,
        json!({"tenant_id": "acme", "name": "x", "permissions": ["root"]}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}

/// A key with explicit permissions gets exactly those; an operation outside them is 403.
async fn key_permissions_are_enforced(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let body = json!({"tenant_id": "acme", "name": "ro", "permissions": ["budgets:read"]});
    let r = new_key(&s, body).await;
    let k = r.expect(201, None);
    assert_eq!(k["permissions"], json!(["budgets:read"]));
    let ro = k["key_secret"].as_str().expect("key_secret");
    let lookup = format!("/v1/admin/budgets/lookup?scope=tenant:acme&unit={UNIT}");
    s.get(&lookup, As::Key(ro)).await.expect(200, None);
    create_budget(&s, As::Key(ro), "tenant:acme/agent:bot", json!({}))
        .await
        .expect(403, Some("INSUFFICIENT_PERMISSIONS"));
    let body = reserve_body("r", json!({"tenant": "acme"}), 1);
    let r = s.post("/v1/reservations", As::Key(ro), body).await;
    assert_eq!(r.status, 403, "{}", r.body);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Budgets

/// createBudget: `tenant_id` is required with the admin key and forbidden with a tenant key;
/// the scope must be canonical and belong to the acting tenant; (scope, unit) is unique; the
/// allocation must be in the budget's unit.
async fn budget_creation_rules(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    s.tenant("beta").await;
    let key = s.key("acme").await;
    let mine = As::Key(&key);

    create_budget(&s, As::Admin, "tenant:acme", json!({}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let r = create_budget(&s, As::Admin, "tenant:acme", json!({"tenant_id": "acme"})).await;
    let b = r.expect(201, None).clone();
    assert_invariant(&b);
    assert_eq!(
        (&b["tenant_id"], &b["scope"]),
        (&json!("acme"), &json!("tenant:acme"))
    );
    assert_eq!(b["status"], "ACTIVE");
    assert_eq!(b["is_over_limit"], false);
    let n = |f: &str| amount(&b, f);
    let fields = [
        "allocated",
        "remaining",
        "reserved",
        "spent",
        "debt",
        "overdraft_limit",
    ];
    assert_eq!(fields.map(n), [1_000, 1_000, 0, 0, 0, 0]);

    let r = create_budget(&s, mine, "tenant:acme/agent:bot", json!({})).await;
    assert_eq!(r.expect(201, None)["tenant_id"], "acme");
    create_budget(&s, mine, "tenant:acme/app:x", json!({"tenant_id": "acme"}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    create_budget(&s, mine, "tenant:beta", json!({}))
        .await
        .expect(403, Some("FORBIDDEN"));
    create_budget(
        &s,
        As::Admin,
        "tenant:beta/agent:x",
        json!({"tenant_id": "acme"}),
    )
    .await
    .expect(403, Some("FORBIDDEN"));
    create_budget(&s, As::Admin, "tenant:zzz", json!({"tenant_id": "zzz"}))
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));

    let bad_scopes = [
        "agent:bot",
        "tenant:acme/agent:a/app:b",
        "tenant:acme/agent:",
        "tenant:acme/team:x",
        "tenant:acme/agent:a b",
        "tenant:acme/",
        "tenant:acme/agent:*",
    ];
    for scope in bad_scopes {
        create_budget(&s, mine, scope, json!({}))
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }

    create_budget(&s, mine, "tenant:acme/agent:bot", json!({}))
        .await
        .expect(409, Some("DUPLICATE_RESOURCE"));
    // Scopes are stored lower-cased, so this is the same budget.
    create_budget(&s, mine, "tenant:ACME/agent:Bot", json!({}))
        .await
        .expect(409, Some("DUPLICATE_RESOURCE"));
    let tokens = json!({"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 5}});
    create_budget(&s, mine, "tenant:acme/agent:bot", tokens)
        .await
        .expect(201, None);
    let mismatch = json!({"allocated": {"unit": "TOKENS", "amount": 5}});
    create_budget(&s, mine, "tenant:acme/app:x", mismatch)
        .await
        .expect(400, Some("UNIT_MISMATCH"));
    s.stop().await;
}

/// Follows `next_cursor` from `first` with `who` and returns every `(scope, unit)` seen.
async fn walk(s: &TestServer, who: As<'_>, first: &str) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let mut path = first.to_string();
    loop {
        let r = s.get(&path, who).await;
        let page = r.expect(200, None);
        let ledgers = page["ledgers"].as_array().expect("ledgers");
        assert!(ledgers.len() <= 2, "page larger than limit: {page}");
        for l in ledgers {
            seen.push((l["scope"].to_string(), l["unit"].to_string()));
        }
        if page["has_more"] != true {
            assert!(page.get("next_cursor").is_none(), "{page}");
            return seen;
        }
        let cursor = page["next_cursor"].as_str().expect("next_cursor");
        path = format!("{first}&cursor={cursor}");
    }
}

/// listBudgets is tenant-scoped under a tenant key and cross-tenant (optionally filtered) under
/// the admin key; `limit` + `cursor` visit every budget exactly once. lookupBudget is exact.
async fn budgets_are_listed_per_tenant_and_paginated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000).await;
    let beta = s.setup("beta", 1_000).await;
    for scope in ["workspace:w/agent:a", "agent:a", "agent:b", "app:x"] {
        s.budget(&format!("tenant:acme/{scope}"), UNIT, 10, json!({}))
            .await;
    }
    s.budget("tenant:acme", "TOKENS", 10, json!({})).await;
    s.budget("tenant:beta/agent:a", UNIT, 10, json!({})).await;

    let listed = |b: &Value| {
        b["ledgers"]
            .as_array()
            .expect("ledgers")
            .iter()
            .map(|l| l["tenant_id"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let mine = s.get("/v1/admin/budgets", As::Key(&acme)).await;
    assert_eq!(listed(mine.expect(200, None)), vec!["acme"; 6]);
    let all = s.get("/v1/admin/budgets", As::Admin).await;
    assert_eq!(listed(all.expect(200, None)).len(), 8);
    let only_beta = s.get("/v1/admin/budgets?tenant_id=beta", As::Admin).await;
    assert_eq!(listed(only_beta.expect(200, None)), vec!["beta"; 2]);

    let pages = walk(&s, As::Key(&acme), "/v1/admin/budgets?limit=2").await;
    let unique: BTreeSet<_> = pages.iter().cloned().collect();
    assert_eq!((pages.len(), unique.len()), (6, 6), "{pages:?}");
    let admin_pages = walk(&s, As::Admin, "/v1/admin/budgets?limit=2").await;
    assert_eq!(admin_pages.len(), 8);
    assert_eq!(admin_pages.iter().collect::<BTreeSet<_>>().len(), 8);

    let lookup =
        |scope: &str, unit: &str| format!("/v1/admin/budgets/lookup?scope={scope}&unit={unit}");
    let found = s
        .get(&lookup("tenant:acme/agent:a", UNIT), As::Key(&acme))
        .await;
    assert_eq!(found.expect(200, None)["scope"], "tenant:acme/agent:a");
    s.get(&lookup("tenant:acme/agent:zz", UNIT), As::Admin)
        .await
        .expect(404, Some("BUDGET_NOT_FOUND"));
    s.get(&lookup("tenant:acme/agent:b", "TOKENS"), As::Admin)
        .await
        .expect(404, Some("BUDGET_NOT_FOUND"));
    // Another tenant's budget is invisible to a tenant key.
    s.get(&lookup("tenant:acme/agent:a", UNIT), As::Key(&beta))
        .await
        .expect(404, Some("BUDGET_NOT_FOUND"));
    s.stop().await;
}

/// Every funding operation with exact previous/new values (admin spec §3.2), on a ledger with
/// spent, reserved and debt; DEBIT beyond remaining is 409 BUDGET_EXCEEDED with no change.
async fn funding_operations_move_the_ledger_exactly(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let spent = reserve(&s, &key, "spend", 300).await;
    let commit = json!({"idempotency_key": "c", "actual": usd(300)});
    s.post(
        &format!("/v1/reservations/{spent}/commit"),
        As::Key(&key),
        commit,
    )
    .await
    .expect(200, None);
    reserve(&s, &key, "hold", 200).await;
    assert_eq!(acme_ledger(&s).await, [1_000, 300, 200, 0, 500]);

    // [(allocated), (remaining), (debt), (spent)] as (previous, new).
    funded(
        &s,
        funding("CREDIT", 500),
        [(1_000, 1_500), (500, 1_000), (0, 0), (300, 300)],
    )
    .await;
    funded(
        &s,
        funding("DEBIT", 200),
        [(1_500, 1_300), (1_000, 800), (0, 0), (300, 300)],
    )
    .await;
    fund_as(&s, As::Admin, "tenant:acme", funding("DEBIT", 801))
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    assert_eq!(acme_ledger(&s).await, [1_300, 300, 200, 0, 800]);
    funded(
        &s,
        funding("RESET", 400),
        [(1_300, 400), (800, -100), (0, 0), (300, 300)],
    )
    .await;
    let mut reset_spent = funding("RESET_SPENT", 2_000);
    reset_spent["spent"] = usd(100);
    funded(
        &s,
        reset_spent,
        [(400, 2_000), (-100, 1_700), (0, 0), (300, 100)],
    )
    .await;
    funded(
        &s,
        funding("RESET_SPENT", 2_000),
        [(2_000, 2_000), (1_700, 1_800), (0, 0), (100, 0)],
    )
    .await;

    // Debt: an overdraft event funded 1 800 and owed 200.
    let patch = json!({"overdraft_limit": usd(1_000)});
    let path = format!("/v1/admin/budgets?scope=tenant:acme&unit={UNIT}");
    s.send(Method::PATCH, &path, As::Admin, Some(&patch))
        .await
        .expect(200, None);
    let event = json!({
        "idempotency_key": "ev", "subject": {"tenant": "acme"},
        "action": {"kind": "llm.completion", "name": "m"},
        "actual": usd(2_000), "overage_policy": "ALLOW_WITH_OVERDRAFT",
    });
    s.post("/v1/events", As::Key(&key), event)
        .await
        .expect(201, None);
    assert_eq!(acme_ledger(&s).await, [2_000, 1_800, 200, 200, -200]);
    funded(
        &s,
        funding("REPAY_DEBT", 50),
        [(2_000, 2_000), (-200, -150), (200, 150), (1_800, 1_800)],
    )
    .await;
    // The excess over the debt is credited.
    funded(
        &s,
        funding("REPAY_DEBT", 500),
        [(2_000, 2_350), (-150, 350), (150, 0), (1_800, 1_800)],
    )
    .await;
    assert_eq!(acme_ledger(&s).await, [2_350, 1_800, 200, 0, 350]);

    // Funding validation: the admin must name the tenant; units must match; `spent` is only
    // for RESET_SPENT.
    let no_tenant = format!("/v1/admin/budgets/fund?scope=tenant:acme&unit={UNIT}");
    s.post(&no_tenant, As::Admin, funding("CREDIT", 1))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let tokens = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}});
    fund_as(&s, As::Admin, "tenant:acme", tokens)
        .await
        .expect(400, Some("UNIT_MISMATCH"));
    let mut credit_spent = funding("CREDIT", 1);
    credit_spent["spent"] = usd(1);
    fund_as(&s, As::Admin, "tenant:acme", credit_spent)
        .await
        .expect(400, Some("INVALID_REQUEST"));
    fund_as(
        &s,
        As::Admin,
        "tenant:acme/agent:none",
        funding("CREDIT", 1),
    )
    .await
    .expect(404, Some("BUDGET_NOT_FOUND"));
    // A tenant key funds its own budget without naming the tenant.
    let r = fund_as(&s, As::Key(&key), "tenant:acme", funding("CREDIT", 50)).await;
    assert_eq!(amount(r.expect(200, None), "new_allocated"), 2_400);
    assert_eq!(acme_ledger(&s).await, [2_400, 1_800, 200, 0, 400]);
    s.stop().await;
}

/// The same funding key replays the original response (applied once); a different payload
/// under the same key, even on another budget, is 409 IDEMPOTENCY_MISMATCH.
async fn funding_is_idempotent_per_key(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    s.budget("tenant:acme/agent:bot", UNIT, 1_000, json!({}))
        .await;
    let mut body = funding("CREDIT", 100);
    body["idempotency_key"] = json!("topup-1");
    let first = fund_as(&s, As::Admin, "tenant:acme", body.clone()).await;
    let first = first.expect(200, None).clone();
    assert_eq!(transitions(&first)[0], (1_000, 1_100));
    let again = fund_as(&s, As::Admin, "tenant:acme", body.clone()).await;
    assert_eq!(again.expect(200, None), &first);
    // The scope in other letters names the same budget: the same request, replayed.
    let shouted = fund_as(&s, As::Admin, "TENANT:ACME", body.clone()).await;
    assert_eq!(shouted.expect(200, None), &first);
    assert_eq!(acme_ledger(&s).await, [1_100, 0, 0, 0, 1_100]);

    let mut other = body.clone();
    other["amount"] = usd(200);
    fund_as(&s, As::Admin, "tenant:acme", other)
        .await
        .expect(409, Some("IDEMPOTENCY_MISMATCH"));
    fund_as(&s, As::Admin, "tenant:acme/agent:bot", body)
        .await
        .expect(409, Some("IDEMPOTENCY_MISMATCH"));
    assert_eq!(acme_ledger(&s).await, [1_100, 0, 0, 0, 1_100]);
    s.stop().await;
}

/// A FROZEN budget refuses every funding operation with 409 BUDGET_FROZEN; property updates
/// are still allowed; after unfreezing funding works again. Each change answers the budget
/// as changed, `updated_at` included.
async fn frozen_budget_cannot_be_funded(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let transition = |op: &str| format!("/v1/admin/budgets/{op}?scope=tenant:acme&unit={UNIT}");
    let updated_at =
        |b: &Value| ledger::parse_rfc3339(b["updated_at"].as_str().expect("updated_at"));
    s.advance(5_000);
    let r = s
        .send(Method::POST, &transition("freeze"), As::Admin, None)
        .await;
    assert_eq!(updated_at(r.expect(200, None)), Some(T0 + 5_000));
    for op in ["CREDIT", "DEBIT", "RESET", "RESET_SPENT", "REPAY_DEBT"] {
        fund_as(&s, As::Admin, "tenant:acme", funding(op, 1))
            .await
            .expect(409, Some("BUDGET_FROZEN"));
    }
    let patch = json!({"overdraft_limit": usd(10)});
    let path = format!("/v1/admin/budgets?scope=tenant:acme&unit={UNIT}");
    s.advance(5_000);
    let r = s.send(Method::PATCH, &path, As::Admin, Some(&patch)).await;
    let b = r.expect(200, None);
    assert_invariant(b);
    assert_eq!(
        (b["status"].as_str(), amount(b, "overdraft_limit")),
        (Some("FROZEN"), 10)
    );
    assert_eq!(updated_at(b), Some(T0 + 10_000));
    assert_eq!(acme_ledger(&s).await, [1_000, 0, 0, 0, 1_000]);

    s.advance(5_000);
    let r = s
        .send(Method::POST, &transition("unfreeze"), As::Admin, None)
        .await;
    assert_eq!(updated_at(r.expect(200, None)), Some(T0 + 15_000));
    funded(
        &s,
        funding("CREDIT", 1),
        [(1_000, 1_001), (1_000, 1_001), (0, 0), (0, 0)],
    )
    .await;
    s.stop().await;
}

/// Admin spec §4.2 RULE 2: every mutating admin op on an object owned by a CLOSED tenant is
/// 409 TENANT_CLOSED. Collects `(operation, status, code)` for all of them at once.
async fn closed_tenant_guards_admin_mutations(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000).await;
    let k = new_key(&s, json!({"tenant_id": "acme", "name": "second"})).await;
    let key_id = k.expect(201, None)["key_id"].as_str().unwrap().to_string();
    patch_tenant(&s, "acme", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    let budget = format!("?scope=tenant:acme&unit={UNIT}");
    let patch = json!({"overdraft_limit": usd(10)});
    let outcomes = [
        (
            "freeze",
            s.send(
                Method::POST,
                &format!("/v1/admin/budgets/freeze{budget}"),
                As::Admin,
                None,
            )
            .await,
        ),
        (
            "update budget",
            s.send(
                Method::PATCH,
                &format!("/v1/admin/budgets{budget}"),
                As::Admin,
                Some(&patch),
            )
            .await,
        ),
        ("revoke key", revoke(&s, &key_id).await),
        (
            "fund",
            fund_as(&s, As::Admin, "tenant:acme", funding("CREDIT", 1)).await,
        ),
        (
            "create key",
            new_key(&s, json!({"tenant_id": "acme", "name": "third"})).await,
        ),
        (
            "create budget",
            create_budget(
                &s,
                As::Admin,
                "tenant:acme/agent:x",
                json!({"tenant_id": "acme"}),
            )
            .await,
        ),
    ];
    let got: Vec<(&str, u16, String)> = outcomes
        .iter()
        .map(|(op, r)| (*op, r.status, r.code().to_string()))
        .collect();
    let want: Vec<(&str, u16, String)> = outcomes
        .iter()
        .map(|(op, _)| (*op, 409, "TENANT_CLOSED".to_string()))
        .collect();
    assert_eq!(got, want);
    s.stop().await;
}

/// Another tenant's budgets are invisible to a tenant key: funding one answers 404
/// BUDGET_NOT_FOUND (not the spec's 403), so a key cannot probe which scopes exist elsewhere.
async fn cross_tenant_budgets_are_invisible(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000).await;
    s.setup("beta", 1_000).await;
    let path = format!("/v1/admin/budgets/fund?scope=tenant:beta&unit={UNIT}");
    s.post(&path, As::Key(&acme), funding("CREDIT", 1))
        .await
        .expect(404, Some("BUDGET_NOT_FOUND"));
    s.stop().await;
}
