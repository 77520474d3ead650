//! The governance plane over HTTP (admin spec §2.1, §2.4, §3.8): credentials
//! (`/v1/auth/introspect`, `/v1/auth/validate`), tenant and API key lists with their filters,
//! orders and cursors, key updates, and the tenant close that revokes keys.

use std::collections::BTreeSet;

use crate::common::{reserve_body, As, Engine, Resp, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    introspect_describes_each_credential,
    validate_reports_why_a_key_is_unusable,
    tenants_are_listed_filtered_sorted_and_paged,
    tenant_list_refuses_bad_parameters,
    api_keys_are_listed_filtered_and_sorted,
    api_keys_are_updated_while_active,
    closing_a_tenant_revokes_its_keys,
    budgets_are_filtered_and_sorted,
    budget_list_refuses_bad_parameters,
    overview_counts_follow_every_change,
    tenant_bulk_actions_row_by_row,
    tenant_bulk_action_safety,
    budget_bulk_actions_row_by_row,
    extension_fields_are_ignored_or_refused_safely,
    default_key_expiry_is_what_the_document_says,
    balances_in_the_admin_form_are_whole_ledgers,
    scope_filters_limit_what_a_key_reaches,
    a_scope_prefix_covers_its_scope_and_what_lies_under_it,
);

const DAY_MS: i64 = 86_400_000;

async fn patch(s: &TestServer, path: &str, body: Value) -> Resp {
    s.send(Method::PATCH, path, As::Admin, Some(&body)).await
}

fn ids(body: &Value, list: &str, field: &str) -> Vec<String> {
    body[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} in {body}"))
        .iter()
        .map(|row| row[field].as_str().expect("id").to_string())
        .collect()
}

/// Every page of `path` (which has a query already), following `next_cursor`.
async fn walk(s: &TestServer, path: &str, list: &str, field: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_string(),
        };
        let r = s.get(&url, As::Admin).await;
        let body = r.expect(200, None);
        seen.extend(ids(body, list, field));
        if body["has_more"] != json!(true) {
            assert!(body.get("next_cursor").is_none(), "{body}");
            return seen;
        }
        cursor = Some(
            body["next_cursor"]
                .as_str()
                .expect("next_cursor")
                .to_string(),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Credentials

/// The admin key: `admin`, `["*"]`, every capability, no tenant. A tenant key: its
/// permissions, tenant, scope filter (only when set) and the capabilities the spec's table
/// derives, never the operator-only ones. No key, a wrong admin key or a revoked key: 401,
/// and a wrong admin key's message does not point at the tenant-key header (the dashboard
/// reads that as "wrong endpoint" and keeps a dead session).
async fn introspect_describes_each_credential(engine: Engine) {
    let s = TestServer::start(engine).await;
    let r = s.get("/v1/auth/introspect", As::Admin).await;
    let admin = r.expect(200, None);
    assert_eq!(admin["authenticated"], true);
    assert_eq!(admin["auth_type"], "admin");
    assert_eq!(admin["permissions"], json!(["*"]));
    assert!(admin.get("tenant_id").is_none() && admin.get("scope_filter").is_none());
    let caps = admin["capabilities"].as_object().expect("capabilities");
    assert_eq!(caps.len(), 15, "{caps:?}");
    assert!(caps.values().all(|v| v == true), "{caps:?}");

    s.tenant("acme").await;
    let (secret, key_id) = s.key_with("acme", json!({})).await;
    let r = s.get("/v1/auth/introspect", As::Key(&secret)).await;
    let tenant = r.expect(200, None);
    assert_eq!(tenant["auth_type"], "tenant");
    assert_eq!(tenant["tenant_id"], "acme");
    assert!(tenant.get("scope_filter").is_none(), "{tenant}");
    assert_eq!(
        tenant["permissions"].as_array().expect("permissions").len(),
        10
    );
    let c = &tenant["capabilities"];
    for (flag, expected) in [
        ("view_budgets", true),
        ("manage_budgets", true),
        ("view_policies", true),
        ("manage_policies", true),
        ("view_reservations", true),
        ("manage_reservations", true),
        ("view_events", false),
        ("view_webhooks", false),
        ("manage_webhooks", false),
        ("view_overview", false),
        ("view_tenants", false),
        ("view_api_keys", false),
        ("view_audit", false),
        ("manage_tenants", false),
        ("manage_api_keys", false),
    ] {
        assert_eq!(c[flag], expected, "{flag}: {c}");
    }

    let (narrow, _) = s
        .key_with(
            "acme",
            json!({"permissions": ["admin:read", "admin:tenants:write"],
               "scope_filter": ["workspace:eng"]}),
        )
        .await;
    let r = s.get("/v1/auth/introspect", As::Key(&narrow)).await;
    let n = r.expect(200, None);
    assert_eq!(n["scope_filter"], json!(["workspace:eng"]));
    let c = &n["capabilities"];
    assert_eq!(
        (
            &c["view_budgets"],
            &c["view_events"],
            &c["manage_budgets"],
            &c["manage_tenants"]
        ),
        (&json!(true), &json!(true), &json!(false), &json!(false)),
        "{c}"
    );

    s.get("/v1/auth/introspect", As::Nobody)
        .await
        .expect(401, Some("UNAUTHORIZED"));
    let wrong = s
        .http_get_with(
            "/v1/auth/introspect",
            "X-Admin-API-Key",
            "not-the-admin-key",
        )
        .await;
    wrong.expect(401, Some("UNAUTHORIZED"));
    let text = format!("{}", wrong.body).to_lowercase();
    assert!(!text.contains("cycles-api-key"), "{text}");
    s.send(
        Method::DELETE,
        &format!("/v1/admin/api-keys/{key_id}"),
        As::Admin,
        None,
    )
    .await
    .expect(200, None);
    s.get("/v1/auth/introspect", As::Key(&secret))
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.stop().await;
}

/// `POST /v1/auth/validate` answers 200 for every well-formed request: valid with the key's
/// tenant, id, permissions and expiry; otherwise the reason, in the spec's order of checks.
/// Admin only; a malformed body is 400.
async fn validate_reports_why_a_key_is_unusable(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let validate = |secret: &str| json!({"key_secret": secret});
    let (good, good_id) = s
        .key_with("acme", json!({"scope_filter": ["agent:*"]}))
        .await;
    let r = s
        .post("/v1/auth/validate", As::Admin, validate(&good))
        .await;
    let v = r.expect(200, None);
    assert_eq!(
        (&v["valid"], &v["tenant_id"]),
        (&json!(true), &json!("acme"))
    );
    assert_eq!(v["key_id"], json!(good_id));
    assert_eq!(v["scope_filter"], json!(["agent:*"]));
    assert!(
        v["expires_at"].is_string() && v.get("reason").is_none(),
        "{v}"
    );

    let r = s
        .post("/v1/auth/validate", As::Admin, validate("cyc_live_nope"))
        .await;
    let v = r.expect(200, None);
    assert_eq!(
        (&v["valid"], &v["tenant_id"], &v["reason"]),
        (&json!(false), &json!(""), &json!("KEY_NOT_FOUND"))
    );

    let (revoked, revoked_id) = s.key_with("acme", json!({})).await;
    let path = format!("/v1/admin/api-keys/{revoked_id}");
    s.send(Method::DELETE, &path, As::Admin, None)
        .await
        .expect(200, None);
    let r = s
        .post("/v1/auth/validate", As::Admin, validate(&revoked))
        .await;
    assert_eq!(r.expect(200, None)["reason"], "KEY_REVOKED");

    let soon = "2030-01-01T00:00:01Z";
    let (short, _) = s.key_with("acme", json!({"expires_at": soon})).await;
    patch(&s, "/v1/admin/tenants/acme", json!({"status": "SUSPENDED"}))
        .await
        .expect(200, None);
    let r = s
        .post("/v1/auth/validate", As::Admin, validate(&good))
        .await;
    let v = r.expect(200, None);
    assert_eq!(
        (&v["valid"], &v["reason"]),
        (&json!(false), &json!("TENANT_SUSPENDED"))
    );
    assert_eq!(v["tenant_id"], "acme");
    s.advance(10 * 365 * DAY_MS);
    let r = s
        .post("/v1/auth/validate", As::Admin, validate(&short))
        .await;
    assert_eq!(r.expect(200, None)["reason"], "KEY_EXPIRED");

    s.post("/v1/auth/validate", As::Key(&good), validate(&good))
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.post("/v1/auth/validate", As::Admin, json!({}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    s.post(
        "/v1/auth/validate",
        As::Admin,
        json!({"key_secret": good, "x": 1}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.post("/v1/auth/validate", As::Admin, json!({"key_secret": ""}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Tenants

/// Seven tenants created a second apart: two children of `acme`, one suspended, one closed.
async fn seven_tenants(s: &TestServer) {
    for (id, name, parent) in [
        ("acme", "Acme Corp", None),
        ("beta", "beta labs", None),
        ("acme-eu", "Acme Europe", Some("acme")),
        ("gamma", "Gamma", None),
        ("acme-us", "ACME US", Some("acme")),
        ("delta", "Delta", None),
        ("omega", "Omega", None),
    ] {
        let mut body = json!({"tenant_id": id, "name": name});
        if let Some(p) = parent {
            body["parent_tenant_id"] = json!(p);
        }
        s.tenant_with(body).await;
        s.advance(1_000);
    }
    patch(s, "/v1/admin/tenants/gamma", json!({"status": "SUSPENDED"}))
        .await
        .expect(200, None);
    patch(s, "/v1/admin/tenants/delta", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
}

/// listTenants: newest first by default; each filter (status, parent, search over id and name,
/// case-insensitive) and sort field in both directions; every page walk visits each matching
/// tenant once, in order, at any page size; `limit` above 100 is clamped, not refused.
async fn tenants_are_listed_filtered_sorted_and_paged(engine: Engine) {
    let s = TestServer::start(engine).await;
    seven_tenants(&s).await;
    let all = |q: &str| format!("/v1/admin/tenants?{q}");
    let newest_first = [
        "omega", "delta", "acme-us", "gamma", "acme-eu", "beta", "acme",
    ];
    let r = s.get("/v1/admin/tenants", As::Admin).await;
    let body = r.expect(200, None);
    assert_eq!(ids(body, "tenants", "tenant_id"), newest_first);
    assert_eq!(body["has_more"], false);
    assert!(body["tenants"][0]["name"].is_string() && body["tenants"][0]["created_at"].is_string());

    for limit in [1, 2, 3, 7] {
        let walked = walk(&s, &all(&format!("limit={limit}")), "tenants", "tenant_id").await;
        assert_eq!(walked, newest_first, "limit={limit}");
    }
    let by_name = walk(
        &s,
        &all("sort_by=name&sort_dir=asc&limit=2"),
        "tenants",
        "tenant_id",
    )
    .await;
    assert_eq!(
        by_name,
        ["acme-us", "acme", "acme-eu", "delta", "gamma", "omega", "beta"],
        "names in byte order: upper case first"
    );
    let by_id_desc = walk(
        &s,
        &all("sort_by=tenant_id&limit=3"),
        "tenants",
        "tenant_id",
    )
    .await;
    let mut expected: Vec<&str> = newest_first.to_vec();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(by_id_desc, expected);
    let by_status = walk(
        &s,
        &all("sort_by=status&sort_dir=asc&limit=2"),
        "tenants",
        "tenant_id",
    )
    .await;
    assert_eq!(
        by_status,
        ["acme", "acme-eu", "acme-us", "beta", "omega", "gamma", "delta"]
    );

    let get = |q: String| {
        let s = &s;
        async move {
            ids(
                s.get(&all(&q), As::Admin).await.expect(200, None),
                "tenants",
                "tenant_id",
            )
        }
    };
    assert_eq!(get("status=SUSPENDED".into()).await, ["gamma"]);
    assert_eq!(get("status=CLOSED".into()).await, ["delta"]);
    assert_eq!(
        get("parent_tenant_id=acme".into()).await,
        ["acme-us", "acme-eu"]
    );
    assert_eq!(
        get("search=ACME".into()).await,
        ["acme-us", "acme-eu", "acme"]
    );
    assert_eq!(
        get("search=labs".into()).await,
        ["beta"],
        "the name is searched"
    );
    assert_eq!(
        get("search=%20eu%20".into()).await,
        ["acme-eu"],
        "the term is trimmed"
    );
    assert_eq!(
        get("search=".into()).await,
        newest_first,
        "empty search is no search"
    );
    assert_eq!(
        get("search=acme&status=ACTIVE&parent_tenant_id=acme".into()).await,
        ["acme-us", "acme-eu"]
    );
    assert_eq!(get("search=zzz".into()).await, Vec::<String>::new());
    assert_eq!(
        get("limit=1000".into()).await,
        newest_first,
        "clamped, not refused"
    );
    assert_eq!(
        get(format!("limit={}", i64::MAX)).await,
        newest_first,
        "any int64 is clamped, as documented"
    );
    s.stop().await;
}

/// Bad parameters are 400 naming the parameter and change nothing; a tenant key is 401.
async fn tenant_list_refuses_bad_parameters(engine: Engine) {
    let s = TestServer::start(engine).await;
    seven_tenants(&s).await;
    let first = s.get("/v1/admin/tenants?limit=2", As::Admin).await;
    let cursor = first.expect(200, None)["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_string();
    for (query, names) in [
        ("status=active", "status"),
        ("sort_by=updated_at", "sort_by"),
        ("sort_dir=up", "sort_dir"),
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("limit=9223372036854775808", "limit"),
        ("limit=1&limit=2", "limit"),
        ("parent_tenant_id=", "parent_tenant_id"),
        ("cursor=zz", "cursor"),
        ("cursor=", "cursor"),
    ] {
        let r = s
            .get(&format!("/v1/admin/tenants?{query}"), As::Admin)
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{query}: {message}");
    }
    let long = "x".repeat(129);
    let r = s
        .get(&format!("/v1/admin/tenants?search={long}"), As::Admin)
        .await;
    r.expect(400, Some("INVALID_REQUEST"));
    for other in [
        "limit=2&sort_by=name",
        "limit=2&sort_dir=asc",
        "limit=2&status=ACTIVE",
    ] {
        let r = s
            .get(
                &format!("/v1/admin/tenants?{other}&cursor={cursor}"),
                As::Admin,
            )
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
        assert!(
            r.body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("cursor"),
            "{}",
            r.body
        );
    }
    let r = s
        .get(
            &format!("/v1/admin/tenants?limit=2&cursor={cursor}"),
            As::Admin,
        )
        .await;
    assert_eq!(
        ids(r.expect(200, None), "tenants", "tenant_id"),
        ["acme-us", "gamma"]
    );

    let key = s.key("acme").await;
    s.get("/v1/admin/tenants", As::Key(&key))
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.get("/v1/admin/tenants?limit=zero", As::Nobody)
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// API keys

/// listApiKeys: every tenant's keys or one tenant's; status as of now (EXPIRED once past
/// `expires_at`), search over key id and name, each sort; never a secret.
async fn api_keys_are_listed_filtered_and_sorted(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    s.tenant("beta").await;
    let mut made = Vec::new();
    for (tenant, name, expires) in [
        ("acme", "deploy bot", None),
        ("beta", "Billing", None),
        ("acme", "CI runner", Some("2027-02-01T00:00:00Z")),
        ("beta", "analytics", None),
    ] {
        let mut extra = json!({"name": name});
        if let Some(at) = expires {
            extra["expires_at"] = json!(at);
        }
        made.push(s.key_with(tenant, extra).await.1);
        s.advance(1_000);
    }
    let path = format!("/v1/admin/api-keys/{}", made[1]);
    s.send(Method::DELETE, &path, As::Admin, None)
        .await
        .expect(200, None);

    let list = |q: &str| format!("/v1/admin/api-keys?{q}");
    let r = s.get("/v1/admin/api-keys", As::Admin).await;
    let body = r.expect(200, None).clone();
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    assert_eq!(ids(&body, "keys", "key_id"), newest_first);
    for key in body["keys"].as_array().expect("keys") {
        assert!(
            key.get("key_secret").is_none() && key.get("digest").is_none(),
            "{key}"
        );
        assert!(
            key["permissions"].is_array() && key["key_prefix"].is_string(),
            "{key}"
        );
    }
    let acme = walk(&s, &list("tenant_id=acme&limit=1"), "keys", "key_id").await;
    assert_eq!(acme, [made[2].clone(), made[0].clone()]);
    let get = |q: String| {
        let s = &s;
        async move {
            ids(
                s.get(&list(&q), As::Admin).await.expect(200, None),
                "keys",
                "key_id",
            )
        }
    };
    assert_eq!(get("status=REVOKED".into()).await, [made[1].clone()]);
    assert_eq!(get("search=BILL".into()).await, [made[1].clone()]);
    assert_eq!(
        get("search=KEY_".into()).await.len(),
        4,
        "every key id starts key_"
    );
    assert_eq!(get(format!("search={}", made[3])).await, [made[3].clone()]);
    let by_name = walk(
        &s,
        &list("sort_by=name&sort_dir=asc&limit=3"),
        "keys",
        "key_id",
    )
    .await;
    assert_eq!(
        by_name,
        [
            made[1].clone(),
            made[2].clone(),
            made[3].clone(),
            made[0].clone()
        ]
    );
    let by_tenant = get("sort_by=tenant_id&sort_dir=asc".into()).await;
    let mut expected = vec![made[0].clone(), made[2].clone()];
    expected.sort();
    let mut beta = vec![made[1].clone(), made[3].clone()];
    beta.sort();
    expected.extend(beta);
    assert_eq!(by_tenant, expected, "tenant, then key id");
    let by_expiry = get("sort_by=expires_at&sort_dir=asc".into()).await;
    assert_eq!(by_expiry[0], made[2], "the February key expires first");

    s.advance(10 * 365 * DAY_MS);
    assert_eq!(
        get("status=EXPIRED".into()).await.len(),
        3,
        "every unrevoked key lapsed"
    );
    let r = s.get(&list("status=EXPIRED&limit=1"), As::Admin).await;
    assert_eq!(r.expect(200, None)["keys"][0]["status"], "EXPIRED");
    for bad in ["status=LIVE", "sort_by=secret", "limit=0", "tenant_id="] {
        s.get(&list(bad), As::Admin)
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    s.stop().await;
}

/// updateApiKey changes only the fields present, replaces permissions and the scope filter
/// whole, and the new permissions are what the key is then checked against. Unknown fields,
/// unknown permissions and immutable fields are 400; an unknown key 404; a revoked key 409;
/// a closed tenant's key 409 TENANT_CLOSED; none of them changes the key.
async fn api_keys_are_updated_while_active(engine: Engine) {
    let s = TestServer::start(engine).await;
    let secret = s.setup("acme", 1_000).await;
    let list = s.get("/v1/admin/api-keys?tenant_id=acme", As::Admin).await;
    let key_id = list.expect(200, None)["keys"][0]["key_id"]
        .as_str()
        .expect("id")
        .to_string();
    let path = format!("/v1/admin/api-keys/{key_id}");
    let budgets = "/v1/admin/budgets";
    s.get(budgets, As::Key(&secret)).await.expect(200, None);

    let r = patch(
        &s,
        &path,
        json!({"name": "renamed", "permissions": ["balances:read", "balances:read"],
               "scope_filter": ["agent:*"], "metadata": {"team": "infra"}}),
    )
    .await;
    let k = r.expect(200, None).clone();
    assert_eq!(k["name"], "renamed");
    assert_eq!(k["permissions"], json!(["balances:read"]));
    assert_eq!(k["scope_filter"], json!(["agent:*"]));
    assert_eq!(k["metadata"], json!({"team": "infra"}));
    assert_eq!(k["status"], "ACTIVE");
    s.get(budgets, As::Key(&secret))
        .await
        .expect(403, Some("INSUFFICIENT_PERMISSIONS"));
    let r = patch(&s, &path, json!({"description": "for dashboards"})).await;
    let k2 = r.expect(200, None);
    assert_eq!(
        (&k2["name"], &k2["description"]),
        (&json!("renamed"), &json!("for dashboards"))
    );
    assert_eq!(
        k2["permissions"],
        json!(["balances:read"]),
        "absent fields stay"
    );

    for body in [
        json!({"permissions": ["root"]}),
        json!({"tenant_id": "beta"}),
        json!({"expires_at": "2031-01-01T00:00:00Z"}),
        json!({"status": "REVOKED"}),
        json!({"name": ""}),
        json!({"name": 5}),
        json!({"scope_filter": "agent:*"}),
        // Entries that could never match a scope segment.
        json!({"scope_filter": [""]}),
        json!({"scope_filter": ["garbage"]}),
        json!({"scope_filter": ["team:eng"]}),
        json!({"scope_filter": ["workspace:"]}),
        json!({"scope_filter": ["agent:a/b"]}),
    ] {
        patch(&s, &path, body.clone())
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let minted = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "k", "scope_filter": ["workspace:eng", "nope"]}),
        )
        .await;
    minted.expect(400, Some("INVALID_REQUEST"));
    let unchanged = s.get("/v1/admin/api-keys?tenant_id=acme", As::Admin).await;
    let u = &unchanged.expect(200, None)["keys"][0];
    assert_eq!(
        (&u["name"], &u["permissions"]),
        (&json!("renamed"), &json!(["balances:read"]))
    );
    patch(&s, "/v1/admin/api-keys/key_unknown", json!({"name": "x"}))
        .await
        .expect(404, Some("NOT_FOUND"));
    let (_, other) = s.key_with("acme", json!({})).await;
    let other_path = format!("/v1/admin/api-keys/{other}");
    s.send(Method::DELETE, &other_path, As::Admin, None)
        .await
        .expect(200, None);
    patch(&s, &other_path, json!({"name": "x"}))
        .await
        .expect(409, Some("KEY_REVOKED"));
    s.send(
        Method::PATCH,
        &path,
        As::Key(&secret),
        Some(&json!({"name": "x"})),
    )
    .await
    .expect(401, Some("UNAUTHORIZED"));
    patch(&s, "/v1/admin/tenants/acme", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    patch(&s, &path, json!({"name": "after close"}))
        .await
        .expect(409, Some("TENANT_CLOSED"));
    s.stop().await;
}

/// Closing a tenant revokes each of its ACTIVE keys in the same step (reason
/// `tenant_closed`); the keys stop authenticating at once; other tenants' keys are untouched;
/// an expired key keeps its EXPIRED record.
async fn closing_a_tenant_revokes_its_keys(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000).await;
    let (second, _) = s.key_with("acme", json!({})).await;
    let (lapsing, lapsing_id) = s
        .key_with("acme", json!({"expires_at": "2027-01-20T00:00:00Z"}))
        .await;
    let beta = s.setup("beta", 1_000).await;
    s.get("/v1/balances?tenant=acme", As::Key(&acme))
        .await
        .expect(200, None);
    s.advance(10 * DAY_MS);
    s.get("/v1/balances?tenant=acme", As::Key(&lapsing))
        .await
        .expect(401, Some("UNAUTHORIZED"));

    patch(&s, "/v1/admin/tenants/acme", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    let r = s.get("/v1/admin/api-keys?tenant_id=acme", As::Admin).await;
    let keys = r.expect(200, None)["keys"]
        .as_array()
        .expect("keys")
        .clone();
    assert_eq!(keys.len(), 3);
    for k in &keys {
        if k["key_id"] == json!(lapsing_id) {
            assert_eq!(k["status"], "EXPIRED", "{k}");
            assert!(k.get("revoked_at").is_none(), "{k}");
        } else {
            assert_eq!(
                (&k["status"], &k["revoked_reason"]),
                (&json!("REVOKED"), &json!("tenant_closed")),
                "{k}"
            );
            assert!(k["revoked_at"].is_string(), "{k}");
        }
    }
    for secret in [&acme, &second] {
        s.get("/v1/balances?tenant=acme", As::Key(secret))
            .await
            .expect(401, Some("UNAUTHORIZED"));
    }
    s.get("/v1/balances?tenant=beta", As::Key(&beta))
        .await
        .expect(200, None);
    let r = s
        .get("/v1/admin/api-keys?tenant_id=beta&status=ACTIVE", As::Admin)
        .await;
    assert_eq!(
        r.expect(200, None)["keys"].as_array().map(Vec::len),
        Some(1)
    );
    let statuses: BTreeSet<String> = keys
        .iter()
        .map(|k| k["status"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        statuses,
        ["EXPIRED", "REVOKED"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Budgets

const USD: &str = "USD_MICROCENTS";

/// Sets a budget's allocation and spent amount (RESET_SPENT), so utilization is `spent /
/// allocated`.
async fn set_spent(s: &TestServer, tenant: &str, scope: &str, allocated: i64, spent: i64) {
    let path = format!("/v1/admin/budgets/fund?tenant_id={tenant}&scope={scope}&unit={USD}");
    let body = json!({"operation": "RESET_SPENT", "amount": {"unit": USD, "amount": allocated},
                      "spent": {"unit": USD, "amount": spent}});
    s.post(&path, As::Admin, body).await.expect(200, None);
}

/// Six budgets over three tenants with known utilization, status, debt and over-limit:
/// acme 0.95; acme/workspace:eng 0.5, FROZEN; acme/workspace:ops (TOKENS, nothing
/// allocated) 0; beta 0; beta/app:x 0; gamma 3.0 with debt 200 over a 100 overdraft limit.
async fn six_budgets(s: &TestServer) -> String {
    let acme = s.setup("acme", 1_000).await;
    set_spent(s, "acme", "tenant:acme", 1_000, 950).await;
    s.budget("tenant:acme/workspace:eng", USD, 1_000, json!({}))
        .await;
    set_spent(s, "acme", "tenant:acme/workspace:eng", 1_000, 500).await;
    let freeze = format!("/v1/admin/budgets/freeze?scope=tenant:acme/workspace:eng&unit={USD}");
    s.post(&freeze, As::Admin, json!({}))
        .await
        .expect(200, None);
    s.budget("tenant:acme/workspace:ops", "TOKENS", 0, json!({}))
        .await;
    s.setup("beta", 100).await;
    s.budget("tenant:beta/app:x", USD, 1_000, json!({})).await;
    let gamma = s.setup("gamma", 100).await;
    let overdraft = json!({"overdraft_limit": {"unit": USD, "amount": 500},
                           "commit_overage_policy": "ALLOW_WITH_OVERDRAFT"});
    let path = format!("/v1/admin/budgets?scope=tenant:gamma&unit={USD}");
    patch(s, &path, overdraft).await.expect(200, None);
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&gamma),
            reserve_body("g", json!({"tenant": "gamma"}), 100),
        )
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .expect("id")
        .to_string();
    let commit = json!({"idempotency_key": "gc", "actual": {"unit": USD, "amount": 300}});
    s.post(
        &format!("/v1/reservations/{id}/commit"),
        As::Key(&gamma),
        commit,
    )
    .await
    .expect(200, None);
    patch(
        s,
        &path,
        json!({"overdraft_limit": {"unit": USD, "amount": 100}}),
    )
    .await
    .expect(200, None);
    let g = s.ledger("tenant:gamma", USD).await;
    assert_eq!(
        (&g["debt"]["amount"], &g["is_over_limit"]),
        (&json!(200), &json!(true)),
        "{g}"
    );
    acme
}

fn scopes(body: &Value) -> Vec<String> {
    ids(body, "ledgers", "scope")
}

/// listBudgets: every filter of the spec (status, over_limit, has_debt, utilization bounds,
/// search, with unit, scope prefix and tenant), alone and together; `sort_by` on each field
/// in both directions with a page walk that matches the single page; without `sort_by` the
/// (scope, unit) order of before; a tenant key's list is its own tenant's.
async fn budgets_are_filtered_and_sorted(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme_key = six_budgets(&s).await;
    let list = |q: &str| format!("/v1/admin/budgets?{q}");
    let get = |q: &'static str| {
        let s = &s;
        async move { scopes(s.get(&list(q), As::Admin).await.expect(200, None)) }
    };
    let acme = "tenant:acme";
    let eng = "tenant:acme/workspace:eng";
    let ops = "tenant:acme/workspace:ops";
    let (beta, beta_x, gamma) = ("tenant:beta", "tenant:beta/app:x", "tenant:gamma");
    assert_eq!(
        get("").await,
        [acme, eng, ops, beta, beta_x, gamma],
        "(scope, unit) order"
    );
    assert_eq!(get("status=FROZEN").await, [eng]);
    assert_eq!(get("utilization_min=0.9").await, [acme, gamma]);
    assert_eq!(
        get("utilization_min=0.4&utilization_max=0.96").await,
        [acme, eng]
    );
    assert_eq!(get("utilization_max=0").await, [ops, beta, beta_x]);
    assert_eq!(
        get("utilization_min=0.5&utilization_max=0.5").await,
        [eng],
        "bounds are inclusive"
    );
    assert_eq!(get("has_debt=true").await, [gamma]);
    assert_eq!(get("has_debt=false").await.len(), 5);
    assert_eq!(get("over_limit=true").await, [gamma]);
    assert_eq!(
        get("over_limit=false&has_debt=true").await,
        Vec::<String>::new()
    );
    assert_eq!(get("search=WORKSPACE").await, [eng, ops]);
    assert_eq!(
        get("search=beta").await,
        [beta, beta_x],
        "the tenant id is searched"
    );
    assert_eq!(
        get("search=beta&unit=USD_MICROCENTS&scope_prefix=tenant:beta/").await,
        [beta_x]
    );
    assert_eq!(get("tenant_id=acme&utilization_max=0.6").await, [eng, ops]);
    assert_eq!(
        get("limit=2000&status=ACTIVE").await.len(),
        5,
        "clamped, not refused"
    );

    let by_utilization = get("sort_by=utilization").await;
    assert_eq!(&by_utilization[..3], [gamma, acme, eng]);
    let mut zeros = by_utilization[3..].to_vec();
    zeros.sort();
    assert_eq!(zeros, [ops, beta, beta_x]);
    for (q, single) in [
        ("sort_by=utilization", "sort_by=utilization&limit=100"),
        (
            "sort_by=utilization&sort_dir=asc",
            "sort_by=utilization&sort_dir=asc&limit=100",
        ),
        (
            "sort_by=scope&sort_dir=asc",
            "sort_by=scope&sort_dir=asc&limit=100",
        ),
        ("sort_by=tenant_id", "sort_by=tenant_id&limit=100"),
        ("sort_by=debt", "sort_by=debt&limit=100"),
        (
            "sort_by=status&sort_dir=asc",
            "sort_by=status&sort_dir=asc&limit=100",
        ),
        ("sort_by=unit", "sort_by=unit&limit=100"),
        (
            "sort_by=commit_overage_policy",
            "sort_by=commit_overage_policy&limit=100",
        ),
    ] {
        let walked = walk(&s, &list(&format!("{q}&limit=2")), "ledgers", "scope").await;
        let whole = scopes(s.get(&list(single), As::Admin).await.expect(200, None));
        assert_eq!(walked, whole, "{q}");
        assert_eq!(walked.len(), 6, "{q}");
    }
    assert_eq!(
        get("sort_by=scope&sort_dir=asc").await,
        [acme, eng, ops, beta, beta_x, gamma]
    );
    assert_eq!(get("sort_by=debt").await[0], gamma);
    assert_eq!(
        get("sort_by=status").await[0],
        eng,
        "FROZEN after ACTIVE, descending"
    );
    assert_eq!(
        get("sort_by=commit_overage_policy").await[0],
        gamma,
        "REJECT < ALLOW_WITH_OVERDRAFT, descending: gamma sorts first"
    );
    assert_eq!(
        get("sort_by=utilization&utilization_min=0.1&sort_dir=asc").await,
        [eng, acme, gamma]
    );

    let r = s
        .get(
            "/v1/admin/budgets?utilization_min=0.9&tenant_id=gamma",
            As::Key(&acme_key),
        )
        .await;
    assert_eq!(
        scopes(r.expect(200, None)),
        [acme],
        "a tenant key lists its own tenant's"
    );
    s.stop().await;
}

/// Bad filter values, bound violations and foreign cursors are 400 naming the parameter.
async fn budget_list_refuses_bad_parameters(engine: Engine) {
    let s = TestServer::start(engine).await;
    six_budgets(&s).await;
    let sorted = s
        .get("/v1/admin/budgets?sort_by=utilization&limit=2", As::Admin)
        .await;
    let sorted_cursor = sorted.expect(200, None)["next_cursor"]
        .as_str()
        .expect("c")
        .to_string();
    let plain = s.get("/v1/admin/budgets?limit=2", As::Admin).await;
    let plain_cursor = plain.expect(200, None)["next_cursor"]
        .as_str()
        .expect("c")
        .to_string();
    for (query, names) in [
        ("utilization_min=2".to_string(), "utilization_min"),
        ("utilization_max=-0.1".to_string(), "utilization_max"),
        ("utilization_min=high".to_string(), "utilization_min"),
        (
            "utilization_min=0.9&utilization_max=0.1".to_string(),
            "utilization_min",
        ),
        ("over_limit=yes".to_string(), "over_limit"),
        ("has_debt=1".to_string(), "has_debt"),
        ("sort_by=remaining".to_string(), "sort_by"),
        ("sort_by=debt&sort_dir=sideways".to_string(), "sort_dir"),
        ("status=OPEN".to_string(), "status"),
        ("limit=0".to_string(), "limit"),
        ("search=".to_string() + &"y".repeat(129), "search"),
        (
            format!("sort_by=utilization&limit=2&has_debt=false&cursor={sorted_cursor}"),
            "cursor",
        ),
        (
            format!("sort_by=debt&limit=2&cursor={sorted_cursor}"),
            "cursor",
        ),
        (format!("limit=2&cursor={sorted_cursor}"), "cursor"),
        (
            format!("sort_by=utilization&limit=2&cursor={plain_cursor}"),
            "cursor",
        ),
    ] {
        let r = s
            .get(&format!("/v1/admin/budgets?{query}"), As::Admin)
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{query}: {message}");
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Overview

/// getAdminOverview: tenant and budget counts by state and unit, the over-limit and in-debt
/// budgets largest debt first, each moving with the writes that change them (funding, a
/// tenant's close); the event and webhook figures are present, zero and empty. Admin only.
async fn overview_counts_follow_every_change(engine: Engine) {
    let s = TestServer::start(engine).await;
    six_budgets(&s).await;
    let overview = || async {
        s.get("/v1/admin/overview", As::Admin)
            .await
            .expect(200, None)
            .clone()
    };
    let o = overview().await;
    assert_eq!(
        o["tenant_counts"],
        json!({"total": 3, "active": 3, "suspended": 0, "closed": 0})
    );
    assert_eq!(
        o["budget_counts"],
        json!({"total": 6, "active": 5, "frozen": 1, "closed": 0, "over_limit": 1, "with_debt": 1,
               "by_unit": {"USD_MICROCENTS": 5, "TOKENS": 1, "CREDITS": 0, "RISK_POINTS": 0}})
    );
    assert_eq!(
        o["over_limit_scopes"],
        json!([{"scope": "tenant:gamma", "unit": USD, "allocated": 100, "remaining": -200, "debt": 200}])
    );
    assert_eq!(
        o["debt_scopes"],
        json!([{"scope": "tenant:gamma", "unit": USD, "debt": 200, "overdraft_limit": 100}])
    );
    assert_eq!(
        o["webhook_counts"],
        json!({"total": 0, "active": 0, "disabled": 0, "with_failures": 0})
    );
    // The events of everything above, all within the hour (the reservation's: its commit
    // over its estimate; 5 of the budget ones are utilization threshold crossings).
    let crossings = s
        .get(
            "/v1/admin/events?event_type=budget.threshold_crossed",
            As::Admin,
        )
        .await;
    let crossings = crossings.expect(200, None)["events"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(crossings, 5);
    assert_eq!(
        o["event_counts"],
        json!({"total_recent": 26,
               "by_category": {"api_key": 3, "budget": 19, "reservation": 1, "tenant": 3}})
    );
    for list in ["failing_webhooks", "recent_denials", "recent_expiries"] {
        assert_eq!(o[list], json!([]), "{list}");
    }
    assert_eq!(o["event_window_seconds"], 3600);
    assert!(o["as_of"].is_string());

    let repay = "/v1/admin/budgets/fund?tenant_id=gamma&scope=tenant:gamma&unit=USD_MICROCENTS";
    s.post(
        repay,
        As::Admin,
        json!({"operation": "REPAY_DEBT", "amount": {"unit": USD, "amount": 150}}),
    )
    .await
    .expect(200, None);
    let o = overview().await;
    assert_eq!(
        (
            &o["budget_counts"]["with_debt"],
            &o["budget_counts"]["over_limit"]
        ),
        (&json!(1), &json!(0))
    );
    assert_eq!(o["over_limit_scopes"], json!([]));
    assert_eq!(o["debt_scopes"][0]["debt"], 50);

    patch(&s, "/v1/admin/tenants/acme", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    let o = overview().await;
    assert_eq!(
        o["tenant_counts"],
        json!({"total": 3, "active": 2, "suspended": 0, "closed": 1})
    );
    let b = &o["budget_counts"];
    assert_eq!(
        (&b["active"], &b["frozen"], &b["closed"], &b["total"]),
        (&json!(3), &json!(0), &json!(3), &json!(6))
    );

    let key = s.key("beta").await;
    s.get("/v1/admin/overview", As::Key(&key))
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Bulk actions

fn bulk_ids(body: &Value, list: &str) -> Vec<String> {
    ids(body, list, "id")
}

fn tenant_status(body: &Value, id: &str) -> String {
    body["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["tenant_id"] == json!(id))
        .and_then(|t| t["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// bulkActionTenants: each action on the rows its filter matches, already-there rows
/// skipped, CLOSED rows failing INVALID_TRANSITION, CLOSE with the cascade; the key replays
/// the same envelope without re-applying, and refuses another body.
async fn tenant_bulk_actions_row_by_row(engine: Engine) {
    let s = TestServer::start(engine).await;
    seven_tenants(&s).await;
    let omega_key = s.key("omega").await;
    let bulk = |body: Value| {
        let s = &s;
        async move {
            s.post("/v1/admin/tenants/bulk-action", As::Admin, body)
                .await
        }
    };
    let suspend = json!({"filter": {"parent_tenant_id": "acme"}, "action": "SUSPEND",
                         "expected_count": 2, "idempotency_key": "b1"});
    let r = bulk(suspend.clone()).await;
    let first = r.expect(200, None).clone();
    assert_eq!(
        (
            &first["action"],
            &first["total_matched"],
            &first["idempotency_key"]
        ),
        (&json!("SUSPEND"), &json!(2), &json!("b1"))
    );
    assert_eq!(bulk_ids(&first, "succeeded"), ["acme-eu", "acme-us"]);
    assert_eq!(
        (
            first["failed"].as_array().map(Vec::len),
            first["skipped"].as_array().map(Vec::len)
        ),
        (Some(0), Some(0))
    );
    patch(&s, "/v1/admin/tenants/acme-eu", json!({"status": "ACTIVE"}))
        .await
        .expect(200, None);
    let again = bulk(suspend.clone()).await;
    assert_eq!(
        again.expect(200, None),
        &first,
        "a replay, not a second run"
    );
    let list = s
        .get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None)
        .clone();
    assert_eq!(
        tenant_status(&list, "acme-eu"),
        "ACTIVE",
        "the replay changed nothing"
    );
    let mut other = suspend.clone();
    other["action"] = json!("CLOSE");
    bulk(other).await.expect(409, Some("IDEMPOTENCY_MISMATCH"));

    let r =
        bulk(json!({"filter": {"search": "ACME"}, "action": "SUSPEND", "idempotency_key": "b2"}))
            .await;
    let b = r.expect(200, None);
    assert_eq!(bulk_ids(b, "succeeded"), ["acme", "acme-eu"]);
    assert_eq!(bulk_ids(b, "skipped"), ["acme-us"]);
    assert_eq!(b["skipped"][0]["reason"], "ALREADY_IN_TARGET_STATE");

    let r = bulk(
        json!({"filter": {"status": "SUSPENDED"}, "action": "REACTIVATE", "idempotency_key": "b3"}),
    )
    .await;
    assert_eq!(
        bulk_ids(r.expect(200, None), "succeeded"),
        ["acme", "acme-eu", "acme-us", "gamma"]
    );
    let r = bulk(
        json!({"filter": {"status": "CLOSED"}, "action": "REACTIVATE", "idempotency_key": "b4"}),
    )
    .await;
    let b = r.expect(200, None);
    assert_eq!(bulk_ids(b, "failed"), ["delta"]);
    assert_eq!(b["failed"][0]["error_code"], "INVALID_TRANSITION");
    assert!(
        b["failed"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("CLOSED")),
        "{b}"
    );

    let r =
        bulk(json!({"filter": {"search": "omega"}, "action": "CLOSE", "idempotency_key": "b5"}))
            .await;
    assert_eq!(bulk_ids(r.expect(200, None), "succeeded"), ["omega"]);
    s.get("/v1/balances?tenant=omega", As::Key(&omega_key))
        .await
        .expect(401, Some("UNAUTHORIZED"));
    let r =
        bulk(json!({"filter": {"status": "CLOSED"}, "action": "CLOSE", "idempotency_key": "b6"}))
            .await;
    assert_eq!(
        bulk_ids(r.expect(200, None), "skipped"),
        ["delta", "omega"],
        "nothing left to cascade"
    );
    let list = s
        .get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None)
        .clone();
    for (id, status) in [
        ("acme", "ACTIVE"),
        ("gamma", "ACTIVE"),
        ("omega", "CLOSED"),
        ("delta", "CLOSED"),
        ("beta", "ACTIVE"),
    ] {
        assert_eq!(tenant_status(&list, id), status, "{id}");
    }
    s.stop().await;
}

/// The safety rails: more than 500 matches is 400 LIMIT_EXCEEDED and a wrong
/// `expected_count` 409 COUNT_MISMATCH, both with `details.total_matched` and no change; an
/// empty filter (or one of only ignored fields), a bad action, key or field is 400; a
/// tenant key is 401.
async fn tenant_bulk_action_safety(engine: Engine) {
    let s = TestServer::start(engine).await;
    for i in 0..501 {
        s.tenant(&format!("t-{i:03}")).await;
    }
    let bulk = |body: Value| {
        let s = &s;
        async move {
            s.post("/v1/admin/tenants/bulk-action", As::Admin, body)
                .await
        }
    };
    let r =
        bulk(json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": "k"}))
            .await;
    r.expect(400, Some("LIMIT_EXCEEDED"));
    assert_eq!(r.body["details"]["total_matched"], 501);
    let r = bulk(json!({"filter": {"search": "t-00"}, "action": "SUSPEND", "expected_count": 9, "idempotency_key": "k"})).await;
    r.expect(409, Some("COUNT_MISMATCH"));
    assert_eq!(r.body["details"]["total_matched"], 10);
    let r = s.get("/v1/admin/tenants?status=SUSPENDED", As::Admin).await;
    assert_eq!(r.expect(200, None)["tenants"], json!([]), "nothing changed");
    let r = bulk(json!({"filter": {"search": "t-00"}, "action": "SUSPEND", "expected_count": 10, "idempotency_key": "k"})).await;
    assert_eq!(
        r.expect(200, None)["succeeded"].as_array().map(Vec::len),
        Some(10),
        "the same key, now right"
    );

    for body in [
        json!({"filter": {}, "action": "SUSPEND", "idempotency_key": "x"}),
        json!({"filter": {"observe_mode": "OBSERVE"}, "action": "SUSPEND", "idempotency_key": "x"}),
        json!({"filter": {"search": "  "}, "action": "SUSPEND", "idempotency_key": "x"}),
        json!({"filter": {"status": "GONE"}, "action": "SUSPEND", "idempotency_key": "x"}),
        json!({"filter": {"status": "ACTIVE"}, "action": "DELETE", "idempotency_key": "x"}),
        json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND"}),
        json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": ""}),
        json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": "x".repeat(129)}),
        json!({"filter": {"status": "ACTIVE", "tenant": "x"}, "action": "SUSPEND", "idempotency_key": "x"}),
        json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": "x", "force": true}),
        json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": "x", "expected_count": -1}),
    ] {
        bulk(body.clone())
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    let key = s.key("t-100").await;
    let body = json!({"filter": {"status": "ACTIVE"}, "action": "SUSPEND", "idempotency_key": "y"});
    s.post("/v1/admin/tenants/bulk-action", As::Key(&key), body)
        .await
        .expect(401, Some("UNAUTHORIZED"));
    s.stop().await;
}

/// bulkActionBudgets: the funding action on each matching budget of one tenant, as
/// fundBudget would; frozen budgets and budgets in another unit fail INVALID_TRANSITION, a
/// DEBIT past the remaining BUDGET_EXCEEDED, a REPAY_DEBT without debt is skipped, a closed
/// tenant's rows fail TENANT_CLOSED; the key replays without re-applying.
async fn budget_bulk_actions_row_by_row(engine: Engine) {
    let s = TestServer::start(engine).await;
    six_budgets(&s).await;
    let ledger_id = |scope: &'static str, unit: &'static str| {
        let s = &s;
        async move {
            s.ledger(scope, unit).await["ledger_id"]
                .as_str()
                .expect("id")
                .to_string()
        }
    };
    let (acme, eng, ops) = (
        ledger_id("tenant:acme", USD).await,
        ledger_id("tenant:acme/workspace:eng", USD).await,
        ledger_id("tenant:acme/workspace:ops", "TOKENS").await,
    );
    let usd = |v: i64| json!({"unit": USD, "amount": v});
    let bulk = |body: Value| {
        let s = &s;
        async move {
            s.post("/v1/admin/budgets/bulk-action", As::Admin, body)
                .await
        }
    };
    let credit = json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "amount": usd(100),
                        "reason": "top-up", "idempotency_key": "c1"});
    let r = bulk(credit.clone()).await;
    let b = r.expect(200, None).clone();
    assert_eq!(b["total_matched"], 3);
    assert_eq!(bulk_ids(&b, "succeeded"), [acme.as_str()]);
    let mut failed = bulk_ids(&b, "failed");
    failed.sort();
    let mut expected = vec![eng.clone(), ops.clone()];
    expected.sort();
    assert_eq!(failed, expected, "frozen, and another unit");
    for f in b["failed"].as_array().expect("failed") {
        assert_eq!(f["error_code"], "INVALID_TRANSITION", "{f}");
    }
    assert_eq!(
        s.ledger("tenant:acme", USD).await["allocated"]["amount"],
        1_100
    );
    assert_eq!(bulk(credit).await.expect(200, None), &b, "replayed");
    assert_eq!(
        s.ledger("tenant:acme", USD).await["allocated"]["amount"],
        1_100,
        "not re-applied"
    );

    let r = bulk(json!({"filter": {"tenant_id": "beta"}, "action": "DEBIT", "amount": usd(500), "idempotency_key": "d1"})).await;
    let b = r.expect(200, None);
    assert_eq!(b["failed"][0]["error_code"], "BUDGET_EXCEEDED", "{b}");
    assert_eq!(b["succeeded"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        s.ledger("tenant:beta/app:x", USD).await["allocated"]["amount"],
        500
    );
    assert_eq!(
        s.ledger("tenant:beta", USD).await["allocated"]["amount"],
        100,
        "the failed row is untouched"
    );

    let r = bulk(json!({"filter": {"tenant_id": "beta", "scope_prefix": "tenant:beta/"}, "action": "REPAY_DEBT", "amount": usd(5), "idempotency_key": "r1"})).await;
    assert_eq!(
        r.expect(200, None)["skipped"][0]["reason"],
        "ALREADY_IN_TARGET_STATE"
    );
    let r = bulk(json!({"filter": {"tenant_id": "gamma", "has_debt": true}, "action": "REPAY_DEBT", "amount": usd(200), "idempotency_key": "r2"})).await;
    assert_eq!(
        r.expect(200, None)["succeeded"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(s.ledger("tenant:gamma", USD).await["debt"]["amount"], 0);
    let r = bulk(json!({"filter": {"tenant_id": "acme", "utilization_min": 0.5, "status": "ACTIVE"},
                        "action": "RESET_SPENT", "amount": usd(2_000), "spent": usd(0), "idempotency_key": "rs"})).await;
    assert_eq!(
        bulk_ids(r.expect(200, None), "succeeded"),
        [acme.as_str()],
        "0.95 → only tenant:acme"
    );
    assert_eq!(s.ledger("tenant:acme", USD).await["spent"]["amount"], 0);

    patch(&s, "/v1/admin/tenants/beta", json!({"status": "CLOSED"}))
        .await
        .expect(200, None);
    let r = bulk(json!({"filter": {"tenant_id": "beta"}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "c9"})).await;
    let b = r.expect(200, None);
    assert_eq!(b["failed"].as_array().map(Vec::len), Some(2));
    assert!(
        b["failed"]
            .as_array()
            .expect("failed")
            .iter()
            .all(|f| f["error_code"] == "TENANT_CLOSED"),
        "{b}"
    );

    bulk(json!({"filter": {"tenant_id": "nobody"}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "n"}))
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));
    for body in [
        json!({"filter": {}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme"}, "action": "GIFT", "amount": usd(1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "amount": usd(-1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "amount": usd(1), "spent": usd(0), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme", "utilization_min": 0.9, "utilization_max": 0.1}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme", "utilization_min": 1.5}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme", "status": "OPEN"}, "action": "CREDIT", "amount": usd(1), "idempotency_key": "x"}),
        json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "amount": usd(1)}),
    ] {
        bulk(body.clone())
            .await
            .expect(400, Some("INVALID_REQUEST"));
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// v0.1.26 fields

/// `action.policy_keys` is accepted and ignored (not even part of the fingerprint);
/// `observe_mode` is accepted as ENFORCE or DISABLED and refused as OBSERVE, on reserves and
/// tenants; policy quota and access lists are accepted empty and refused non-empty; the
/// tenant list ignores its `observe_mode` filter. A refused request reserves nothing.
async fn extension_fields_are_ignored_or_refused_safely(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let subject = json!({"tenant": "acme"});
    let mut body = reserve_body("p1", subject.clone(), 100);
    body["action"]["policy_keys"] = json!({"host": "api.openai.com", "custom": {"team": "x"}});
    let first = s
        .post("/v1/reservations", As::Key(&key), body.clone())
        .await;
    let id = first.expect(200, None)["reservation_id"].clone();
    body["action"]["policy_keys"] = json!({"host": "other.example"});
    let replay = s
        .post("/v1/reservations", As::Key(&key), body.clone())
        .await;
    assert_eq!(
        replay.expect(200, None)["reservation_id"],
        id,
        "ignored: the same request"
    );
    body["action"]["policy_keys"] = json!("api.openai.com");
    s.post("/v1/reservations", As::Key(&key), body)
        .await
        .expect(400, Some("INVALID_REQUEST"));

    let mut enforce = reserve_body("o1", subject.clone(), 100);
    enforce["observe_mode"] = json!("ENFORCE");
    s.post("/v1/reservations", As::Key(&key), enforce)
        .await
        .expect(200, None);
    let mut observe = reserve_body("o2", subject.clone(), 100);
    observe["observe_mode"] = json!("OBSERVE");
    let r = s.post("/v1/reservations", As::Key(&key), observe).await;
    r.expect(400, Some("INVALID_REQUEST"));
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("observe_mode"),
        "{}",
        r.body
    );
    assert_eq!(
        s.ledger("tenant:acme", USD).await["reserved"]["amount"],
        200,
        "OBSERVE reserved nothing"
    );
    let decide = json!({"idempotency_key": "d1", "subject": subject,
        "action": {"kind": "llm.completion", "name": "m", "policy_keys": {"host": "h"}},
        "estimate": {"unit": USD, "amount": 1}});
    s.post("/v1/decide", As::Key(&key), decide)
        .await
        .expect(200, None);

    let tenant = |observe_mode: &str| json!({"tenant_id": format!("t-{}", observe_mode.to_lowercase()), "name": "x", "observe_mode": observe_mode});
    s.post("/v1/admin/tenants", As::Admin, tenant("ENFORCE"))
        .await
        .expect(201, None);
    s.post("/v1/admin/tenants", As::Admin, tenant("OBSERVE"))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    patch(
        &s,
        "/v1/admin/tenants/t-enforce",
        json!({"observe_mode": "DISABLED"}),
    )
    .await
    .expect(200, None);
    patch(
        &s,
        "/v1/admin/tenants/t-enforce",
        json!({"observe_mode": "OBSERVE"}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    patch(
        &s,
        "/v1/admin/tenants/t-enforce",
        json!({"observe_mode": "SOMETIMES"}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    let r = s
        .get("/v1/admin/tenants?observe_mode=OBSERVE", As::Admin)
        .await;
    assert_eq!(
        r.expect(200, None)["tenants"].as_array().map(Vec::len),
        Some(2),
        "the filter is ignored"
    );

    let policy = |extra: Value| {
        let mut p = json!({"tenant_id": "acme", "name": "p", "scope_pattern": "tenant:acme/*"});
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                p[k] = v;
            }
        }
        p
    };
    let r = s
        .post(
            "/v1/admin/policies",
            As::Admin,
            policy(json!({"action_quotas": [], "risk_class_quotas": [],
        "allowed_action_kinds": [], "denied_action_kinds": []})),
        )
        .await;
    let policy_id = r.expect(201, None)["policy_id"]
        .as_str()
        .expect("id")
        .to_string();
    for field in ["action_quotas", "risk_class_quotas"] {
        let body = policy(
            json!({field: [{"action_kind": "http.post", "max_calls": 5, "window": "per_minute_tumbling"}]}),
        );
        let r = s.post("/v1/admin/policies", As::Admin, body).await;
        r.expect(400, Some("INVALID_REQUEST"));
        assert!(
            r.body["message"]
                .as_str()
                .unwrap_or_default()
                .contains(field),
            "{}",
            r.body
        );
    }
    let path = format!("/v1/admin/policies/{policy_id}");
    patch(&s, &path, json!({"denied_action_kinds": []}))
        .await
        .expect(200, None);
    patch(&s, &path, json!({"allowed_action_kinds": ["http.get"]}))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}

/// A key created without `expires_at` expires 90 days after its creation, and the served
/// document says so.
async fn default_key_expiry_is_what_the_document_says(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let r = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "k"}),
        )
        .await;
    let k = r.expect(201, None);
    let at = |field: &str| protocol::parse_rfc3339(k[field].as_str().expect(field)).expect(field);
    assert_eq!(at("expires_at") - at("created_at"), 90 * DAY_MS);
    let doc = s.get("/openapi.json", As::Nobody).await;
    let schema = &doc.expect(200, None)["components"]["schemas"]["ApiKeyCreateRequest"];
    let said = schema["properties"]["expires_at"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains("90 days"), "{said}");
    s.stop().await;
}

/// `GET /v1/balances` with the admin spec's parameters (`tenant_id`, `scope_prefix`,
/// `unit`) answers whole ledgers of the key's tenant; with the runtime's, balances; the two
/// forms do not mix; another tenant's `tenant_id` is 403.
async fn balances_in_the_admin_form_are_whole_ledgers(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    s.budget("tenant:acme/workspace:eng", "TOKENS", 50, json!({}))
        .await;
    s.setup("beta", 1_000).await;
    let get = |q: &str| {
        let (s, key, q) = (&s, key.clone(), q.to_string());
        async move { s.get(&format!("/v1/balances?{q}"), As::Key(&key)).await }
    };
    let r = get("scope_prefix=tenant:acme/").await;
    let b = r.expect(200, None);
    assert_eq!(scopes_of(b), ["tenant:acme/workspace:eng"]);
    let ledger = &b["balances"][0];
    assert!(
        ledger["ledger_id"].is_string() && ledger["overdraft_limit"].is_object(),
        "{ledger}"
    );
    assert_eq!(ledger["allocated"]["amount"], 50);
    let r = get("tenant_id=acme&unit=USD_MICROCENTS").await;
    assert_eq!(scopes_of(r.expect(200, None)), ["tenant:acme"]);
    let r = get("tenant_id=acme&limit=1").await;
    let first = r.expect(200, None).clone();
    assert_eq!(first["has_more"], true);
    let cursor = first["next_cursor"].as_str().expect("cursor");
    let r = get(&format!("tenant_id=acme&limit=1&cursor={cursor}")).await;
    assert_eq!(
        scopes_of(r.expect(200, None)),
        ["tenant:acme/workspace:eng"]
    );
    get("tenant_id=beta").await.expect(403, Some("FORBIDDEN"));
    get("tenant=acme&unit=TOKENS")
        .await
        .expect(400, Some("INVALID_REQUEST"));
    get("unit=GOLD").await.expect(400, Some("INVALID_REQUEST"));
    let r = get("tenant=acme").await;
    let runtime = &r.expect(200, None)["balances"][0];
    assert!(
        runtime.get("ledger_id").is_none() && runtime["scope"].is_string(),
        "{runtime}"
    );
    s.stop().await;
}

fn scopes_of(body: &Value) -> Vec<String> {
    ids(body, "balances", "scope")
}

/// A key's `scope_filter` limits its budget, policy and balance operations (admin spec
/// §1.1): scopes without a matching segment are 403 when named and left out of lists; a
/// `kind:*` entry reaches every id of that kind; a key without a filter reaches all.
async fn scope_filters_limit_what_a_key_reaches(engine: Engine) {
    let s = TestServer::start(engine).await;
    let open = s.setup("acme", 1_000).await;
    for scope in [
        "tenant:acme/workspace:eng",
        "tenant:acme/workspace:ops",
        "tenant:acme/workspace:ops/agent:bot",
    ] {
        s.budget(scope, USD, 100, json!({})).await;
    }
    let (eng, _) = s
        .key_with("acme", json!({"scope_filter": ["workspace:eng"]}))
        .await;
    let (agents, _) = s
        .key_with("acme", json!({"scope_filter": ["agent:*"]}))
        .await;
    let as_key = |key: &str, path: &str| {
        let (s, key, path) = (&s, key.to_string(), path.to_string());
        async move { s.get(&path, As::Key(&key)).await }
    };
    let listed = |r: Resp| scopes(r.expect(200, None));
    assert_eq!(
        listed(as_key(&eng, "/v1/admin/budgets").await),
        ["tenant:acme/workspace:eng"]
    );
    assert_eq!(
        listed(as_key(&agents, "/v1/admin/budgets").await),
        ["tenant:acme/workspace:ops/agent:bot"]
    );
    assert_eq!(
        listed(as_key(&open, "/v1/admin/budgets").await).len(),
        4,
        "no filter, no limit"
    );
    let lookup = |scope: &str| format!("/v1/admin/budgets/lookup?scope={scope}&unit={USD}");
    as_key(&eng, &lookup("tenant:acme/workspace:eng"))
        .await
        .expect(200, None);
    let r = as_key(&eng, &lookup("tenant:acme")).await;
    r.expect(403, Some("FORBIDDEN"));
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("scope_filter"),
        "{}",
        r.body
    );
    as_key(
        &eng,
        "/v1/admin/budgets?scope_prefix=tenant:acme/workspace:ops",
    )
    .await
    .expect(403, Some("FORBIDDEN"));
    let r = as_key(&eng, "/v1/balances?tenant_id=acme").await;
    assert_eq!(
        scopes_of(r.expect(200, None)),
        ["tenant:acme/workspace:eng"]
    );

    let fund = |scope: &str| format!("/v1/admin/budgets/fund?scope={scope}&unit={USD}");
    let credit = json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": 5}});
    s.post(
        &fund("tenant:acme/workspace:eng"),
        As::Key(&eng),
        credit.clone(),
    )
    .await
    .expect(200, None);
    s.post(&fund("tenant:acme/workspace:ops"), As::Key(&eng), credit)
        .await
        .expect(403, Some("FORBIDDEN"));
    assert_eq!(
        s.ledger("tenant:acme/workspace:ops", USD).await["allocated"]["amount"],
        100,
        "refused, unchanged"
    );
    let budget = |scope: &str| json!({"scope": scope, "unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1}});
    s.post(
        "/v1/admin/budgets",
        As::Key(&eng),
        budget("tenant:acme/workspace:eng/agent:x"),
    )
    .await
    .expect(201, None);
    s.post(
        "/v1/admin/budgets",
        As::Key(&eng),
        budget("tenant:acme/app:x"),
    )
    .await
    .expect(403, Some("FORBIDDEN"));
    let policy = |pattern: &str| json!({"name": "p", "scope_pattern": pattern});
    s.post(
        "/v1/admin/policies",
        As::Key(&eng),
        policy("tenant:acme/workspace:eng/*"),
    )
    .await
    .expect(201, None);
    s.post("/v1/admin/policies", As::Key(&eng), policy("tenant:acme/*"))
        .await
        .expect(403, Some("FORBIDDEN"));
    s.stop().await;
}

/// `scope_prefix` (listBudgets, the budget bulk filter, balances in the admin form) covers
/// the scope it names and the scopes under it, segment by segment: `workspace:w1` is not a
/// prefix of `workspace:w10`, so a bulk action on `w1` leaves `w10` alone.
async fn a_scope_prefix_covers_its_scope_and_what_lies_under_it(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    for scope in [
        "tenant:acme/workspace:w1",
        "tenant:acme/workspace:w1/app:a",
        "tenant:acme/workspace:w10",
    ] {
        s.budget(scope, USD, 100, json!({})).await;
    }
    let w1 = ["tenant:acme/workspace:w1", "tenant:acme/workspace:w1/app:a"];
    let r = s
        .get(
            "/v1/admin/budgets?tenant_id=acme&scope_prefix=tenant:acme/workspace:w1",
            As::Admin,
        )
        .await;
    assert_eq!(scopes(r.expect(200, None)), w1);
    let r = s
        .get(
            "/v1/balances?scope_prefix=tenant:acme/workspace:w1",
            As::Key(&key),
        )
        .await;
    assert_eq!(scopes_of(r.expect(200, None)), w1);
    // The ledger form's pages are the admin spec's, at most 100 rows; the runtime form's 200.
    let prefix = "/v1/balances?scope_prefix=tenant:acme/workspace:w1";
    for (limit, status) in [(100, 200), (101, 400)] {
        let r = s
            .get(&format!("{prefix}&limit={limit}"), As::Key(&key))
            .await;
        r.expect(status, None);
    }
    let runtime = s
        .get("/v1/balances?tenant=acme&limit=200", As::Key(&key))
        .await;
    runtime.expect(200, None);
    let r = s
        .get(
            "/v1/admin/budgets?tenant_id=acme&scope_prefix=tenant:acme/",
            As::Admin,
        )
        .await;
    assert_eq!(
        scopes(r.expect(200, None)).len(),
        3,
        "a trailing / covers all under it"
    );

    let credit = |expected: usize, key: &str| {
        json!({"filter": {"tenant_id": "acme", "scope_prefix": "tenant:acme/workspace:w1"},
               "action": "CREDIT", "amount": {"unit": USD, "amount": 5},
               "expected_count": expected, "idempotency_key": key})
    };
    let r = s
        .post("/v1/admin/budgets/bulk-action", As::Admin, credit(3, "c3"))
        .await;
    r.expect(409, Some("COUNT_MISMATCH"));
    let r = s
        .post("/v1/admin/budgets/bulk-action", As::Admin, credit(2, "c2"))
        .await;
    assert_eq!(
        r.expect(200, None)["succeeded"].as_array().map(Vec::len),
        Some(2)
    );
    let mut with_reason = credit(2, "c4");
    with_reason["reason"] = json!("Q3 top-up");
    s.post("/v1/admin/budgets/bulk-action", As::Admin, with_reason)
        .await
        .expect(200, None);
    let funded = s
        .get(
            "/v1/admin/events?event_type=budget.funded&tenant_id=acme",
            As::Admin,
        )
        .await;
    let reasons: Vec<Value> = funded.expect(200, None)["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"]["reason"].clone())
        .collect();
    let q3 = reasons.iter().filter(|r| **r == json!("Q3 top-up")).count();
    assert_eq!((reasons.len(), q3), (4, 2), "{reasons:?}");
    for (scope, allocated) in [
        ("tenant:acme/workspace:w1", 110),
        ("tenant:acme/workspace:w1/app:a", 110),
        ("tenant:acme/workspace:w10", 100),
    ] {
        assert_eq!(
            s.ledger(scope, USD).await["allocated"]["amount"],
            allocated,
            "{scope}"
        );
    }
    s.stop().await;
}
