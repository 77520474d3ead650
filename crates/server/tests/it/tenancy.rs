//! Authentication and tenancy over HTTP: who may call what, and on whose data.

use crate::common::{self, reserve_body, As, Engine, Resp, TestServer, ADMIN_KEY};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    missing_or_invalid_key_is_unauthorized,
    revoked_key_stops_working_at_once,
    subject_tenant_must_be_the_keys_tenant,
    another_tenants_reservation_is_forbidden,
    unknown_reservation_is_not_found,
    admin_key_may_only_read_and_release,
    wrong_admin_key_is_unauthorized,
    balances_are_tenant_scoped,
    missing_permission_is_forbidden,
    admin_only_endpoints_refuse_tenant_keys,
    unknown_permission_is_rejected,
    health_endpoints_are_public,
);

const USD: &str = "USD_MICROCENTS";

/// The reservation operations that name a reservation in their path.
const RESERVATION_OPS: [&str; 4] = ["get", "commit", "release", "extend"];

/// Every runtime operation, named as in [`call`].
const RUNTIME_OPS: [&str; 8] = [
    "reserve", "decide", "event", "balances", "get", "commit", "release", "extend",
];

/// Performs one runtime operation as `who`, for `tenant`'s subject or on reservation `id`.
/// Each call uses a fresh idempotency key so that no call is a replay of another.
async fn call(s: &TestServer, who: As<'_>, op: &str, tenant: &str, id: &str) -> Resp {
    let idem = format!("{op}-{}", next_suffix());
    let subject = json!({"tenant": tenant});
    let action = json!({"kind": "llm.completion", "name": "gpt-4o-mini"});
    let amount = json!({"unit": USD, "amount": 10});
    match op {
        "reserve" | "decide" => {
            let path = if op == "reserve" {
                "/v1/reservations"
            } else {
                "/v1/decide"
            };
            s.post(path, who, reserve_body(&idem, subject, 10)).await
        }
        "event" => {
            let body = json!({"idempotency_key": idem, "subject": subject, "action": action, "actual": amount});
            s.post("/v1/events", who, body).await
        }
        "balances" => s.get(&format!("/v1/balances?tenant={tenant}"), who).await,
        "get" => s.get(&format!("/v1/reservations/{id}"), who).await,
        "commit" => {
            let body = json!({"idempotency_key": idem, "actual": amount});
            s.post(&format!("/v1/reservations/{id}/commit"), who, body)
                .await
        }
        "release" => {
            let body = json!({"idempotency_key": idem, "reason": "test"});
            s.post(&format!("/v1/reservations/{id}/release"), who, body)
                .await
        }
        "extend" => {
            let body = json!({"idempotency_key": idem, "extend_by_ms": 1_000});
            s.post(&format!("/v1/reservations/{id}/extend"), who, body)
                .await
        }
        other => panic!("unknown op {other}"),
    }
}

/// A process-unique suffix for idempotency keys.
fn next_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Asserts status and code, and that the error body carries the correlation ids.
fn assert_refused(r: &Resp, status: u16, code: &str, what: &str) {
    assert_eq!(
        (r.status, r.code()),
        (status, code),
        "{what}: body {}",
        r.body
    );
    for k in ["message", "request_id", "trace_id"] {
        assert!(r.body[k].is_string(), "{what}: {k} missing in {}", r.body);
    }
}

/// Sends a request carrying a wrong `X-Admin-API-Key` (the harness only sends the right one).
async fn with_wrong_admin_key(
    s: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Resp {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", s.base))
        .header("X-Admin-API-Key", "not-the-admin-key");
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("request");
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let body = resp.json().await.unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        body,
    }
}

/// A live reservation of 10 on `tenant`'s root; returns its id.
async fn reserve(s: &TestServer, key: &str, tenant: &str) -> String {
    let r = call(s, As::Key(key), "reserve", tenant, "").await;
    r.expect(200, None)["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

async fn status_of(s: &TestServer, id: &str) -> String {
    let r = s.get(&format!("/v1/reservations/{id}"), As::Admin).await;
    r.expect(200, None)["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn root_ledger(s: &TestServer, tenant: &str) -> Value {
    s.ledger(&format!("tenant:{tenant}"), USD).await
}

async fn missing_or_invalid_key_is_unauthorized(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let id = reserve(&s, &key, "acme").await;
    let before = root_ledger(&s, "acme").await;
    for who in [
        As::Nobody,
        As::Key(""),
        As::Key("cyc_live_not-a-real-key"),
        As::Key(ADMIN_KEY),
    ] {
        for op in RUNTIME_OPS {
            let r = call(&s, who, op, "acme", &id).await;
            assert_refused(&r, 401, "UNAUTHORIZED", op);
        }
        // Credentials are checked before the body: a bad body without a key is still 401.
        let r = s
            .post_raw("/v1/reservations", who, b"{not json".to_vec())
            .await;
        assert_refused(&r, 401, "UNAUTHORIZED", "bad body");
    }
    assert_eq!(root_ledger(&s, "acme").await, before);
    assert_eq!(status_of(&s, &id).await, "ACTIVE");
    s.stop().await;
}

async fn revoked_key_stops_working_at_once(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.setup("acme", 1_000_000).await;
    let (old, old_id) = s.key_with("acme", json!({})).await;
    let (new, _) = s.key_with("acme", json!({})).await;
    let id = reserve(&s, &old, "acme").await;

    let revoke = format!("/v1/admin/api-keys/{old_id}?reason=rotated");
    let r = s.send(Method::DELETE, &revoke, As::Admin, None).await;
    assert_eq!(r.expect(200, None)["status"], "REVOKED");

    for op in RUNTIME_OPS {
        let r = call(&s, As::Key(&old), op, "acme", &id).await;
        assert_refused(&r, 401, "UNAUTHORIZED", op);
    }
    // The other key is unaffected, and the reservation made with the revoked key can still
    // be settled by it.
    reserve(&s, &new, "acme").await;
    call(&s, As::Key(&new), "commit", "acme", &id)
        .await
        .expect(200, None);
    // Revoking twice is a conflict, not a success.
    let again = s.send(Method::DELETE, &revoke, As::Admin, None).await;
    assert_eq!(again.status, 409, "{}", again.body);
    s.stop().await;
}

async fn subject_tenant_must_be_the_keys_tenant(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000_000).await;
    s.setup("globex", 1_000_000).await;
    let before = (
        root_ledger(&s, "acme").await,
        root_ledger(&s, "globex").await,
    );
    for op in ["reserve", "decide", "event"] {
        let r = call(&s, As::Key(&acme), op, "globex", "").await;
        assert_refused(&r, 403, "FORBIDDEN", op);
    }
    let mut dry = reserve_body("dry", json!({"tenant": "globex"}), 10);
    dry["dry_run"] = json!(true);
    let r = s.post("/v1/reservations", As::Key(&acme), dry).await;
    assert_refused(&r, 403, "FORBIDDEN", "dry run");
    let after = (
        root_ledger(&s, "acme").await,
        root_ledger(&s, "globex").await,
    );
    assert_eq!(after, before);
    s.stop().await;
}

async fn another_tenants_reservation_is_forbidden(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000_000).await;
    let globex = s.setup("globex", 1_000_000).await;
    let id = reserve(&s, &acme, "acme").await;
    let before = (
        root_ledger(&s, "acme").await,
        root_ledger(&s, "globex").await,
    );
    for op in RESERVATION_OPS {
        let r = call(&s, As::Key(&globex), op, "globex", &id).await;
        assert_refused(&r, 403, "FORBIDDEN", op);
    }
    let after = (
        root_ledger(&s, "acme").await,
        root_ledger(&s, "globex").await,
    );
    assert_eq!(after, before);
    let mine = s
        .get(&format!("/v1/reservations/{id}"), As::Key(&acme))
        .await;
    let mine = mine.expect(200, None);
    assert_eq!(
        (&mine["status"], &mine["expires_at_ms"]),
        (&json!("ACTIVE"), &json!(common::T0 + 60_000))
    );
    call(&s, As::Key(&acme), "commit", "acme", &id)
        .await
        .expect(200, None);
    s.stop().await;
}

async fn unknown_reservation_is_not_found(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000_000).await;
    for op in RESERVATION_OPS {
        let r = call(&s, As::Key(&acme), op, "acme", "rsv_never_existed").await;
        assert_refused(&r, 404, "NOT_FOUND", op);
    }
    for op in ["get", "release"] {
        let r = call(&s, As::Admin, op, "acme", "rsv_never_existed").await;
        assert_refused(&r, 404, "NOT_FOUND", op);
    }
    s.stop().await;
}

async fn admin_key_may_only_read_and_release(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000_000).await;
    let globex = s.setup("globex", 1_000_000).await;
    let a = reserve(&s, &acme, "acme").await;
    let g = reserve(&s, &globex, "globex").await;
    let before = root_ledger(&s, "acme").await;
    // Acting as a tenant is refused to the admin key.
    for op in ["reserve", "decide", "event", "commit", "extend", "balances"] {
        let r = call(&s, As::Admin, op, "acme", &a).await;
        assert_refused(&r, 401, "UNAUTHORIZED", op);
    }
    assert_eq!(root_ledger(&s, "acme").await, before);
    // Reading and force-releasing any tenant's reservation is allowed.
    for (id, tenant) in [(&a, "acme"), (&g, "globex")] {
        let r = call(&s, As::Admin, "get", tenant, id).await;
        let detail = r.expect(200, None);
        assert_eq!(detail["status"], "ACTIVE");
        assert_eq!(detail["subject"]["tenant"], tenant);
        let r = call(&s, As::Admin, "release", tenant, id).await;
        assert_eq!(r.expect(200, None)["status"], "RELEASED");
        assert_eq!(status_of(&s, id).await, "RELEASED");
        let ledger = root_ledger(&s, tenant).await;
        assert_eq!(common::amount(&ledger, "reserved"), 0, "{tenant}");
    }
    s.stop().await;
}

async fn wrong_admin_key_is_unauthorized(engine: Engine) {
    let s = TestServer::start(engine).await;
    let acme = s.setup("acme", 1_000_000).await;
    let id = reserve(&s, &acme, "acme").await;
    let release = json!({"idempotency_key": "force", "reason": "incident"});
    let requests = [
        (Method::GET, format!("/v1/reservations/{id}"), None),
        (
            Method::POST,
            format!("/v1/reservations/{id}/release"),
            Some(release),
        ),
        (
            Method::POST,
            "/v1/admin/tenants".to_string(),
            Some(json!({"tenant_id": "evil", "name": "evil"})),
        ),
        (
            Method::GET,
            "/v1/admin/budgets/lookup?scope=tenant:acme&unit=USD_MICROCENTS".to_string(),
            None,
        ),
    ];
    for (method, path, body) in requests {
        let r = with_wrong_admin_key(&s, method, &path, body).await;
        assert_refused(&r, 401, "UNAUTHORIZED", &path);
    }
    assert_eq!(status_of(&s, &id).await, "ACTIVE");
    s.get("/v1/admin/tenants/evil", As::Admin)
        .await
        .expect(404, None);
    s.stop().await;
}

/// Every balance `acme`'s key can see with `query`, following cursors page by page.
async fn visible_scopes(s: &TestServer, key: &str, query: &str) -> Vec<String> {
    let mut scopes = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = s
            .get(&format!("/v1/balances?{query}{cursor}"), As::Key(key))
            .await;
        let body = r.expect(200, None).clone();
        for b in body["balances"].as_array().expect("balances") {
            scopes.push(b["scope_path"].as_str().expect("scope_path").to_string());
        }
        match body["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    scopes.sort();
    scopes
}

async fn balances_are_tenant_scoped(engine: Engine) {
    let s = TestServer::start(engine).await;
    let mut keys = Vec::new();
    for tenant in ["acme", "acme-corp", "globex"] {
        keys.push(s.setup(tenant, 1_000).await);
        s.budget(
            &format!("tenant:{tenant}/workspace:prod"),
            USD,
            500,
            json!({}),
        )
        .await;
        s.budget(&format!("tenant:{tenant}"), "TOKENS", 70, json!({}))
            .await;
    }
    let [acme, acme_corp, globex] = [&keys[0], &keys[1], &keys[2]];
    let own = |t: &str| {
        vec![
            format!("tenant:{t}"),
            format!("tenant:{t}"),
            format!("tenant:{t}/workspace:prod"),
        ]
    };
    for (key, tenant) in [(acme, "acme"), (acme_corp, "acme-corp"), (globex, "globex")] {
        for query in [
            format!("tenant={tenant}"),
            format!("tenant={tenant}&limit=1"),
        ] {
            assert_eq!(
                visible_scopes(&s, key, &query).await,
                own(tenant),
                "{query}"
            );
        }
        assert_eq!(
            visible_scopes(&s, key, "workspace=prod").await,
            [format!("tenant:{tenant}/workspace:prod")],
            "{tenant}"
        );
        let r = s
            .get(&format!("/v1/balances?tenant={tenant}"), As::Key(key))
            .await;
        assert_eq!(r.header("x-cycles-tenant"), Some(tenant));
    }
    for (key, other) in [(acme, "globex"), (acme, "acme-corp"), (globex, "acme")] {
        let r = s
            .get(&format!("/v1/balances?tenant={other}"), As::Key(key))
            .await;
        assert_refused(&r, 403, "FORBIDDEN", other);
        let r = s
            .get(
                &format!("/v1/balances?tenant={other}&workspace=prod"),
                As::Key(key),
            )
            .await;
        assert_refused(&r, 403, "FORBIDDEN", other);
    }
    s.stop().await;
}

async fn missing_permission_is_forbidden(engine: Engine) {
    let s = TestServer::start(engine).await;
    let full = s.setup("acme", 1_000_000).await;
    let (reader, _) = s
        .key_with("acme", json!({"permissions": ["balances:read"]}))
        .await;
    let id = reserve(&s, &full, "acme").await;
    let before = root_ledger(&s, "acme").await;
    for op in RUNTIME_OPS {
        let r = call(&s, As::Key(&reader), op, "acme", &id).await;
        if op == "balances" {
            r.expect(200, None);
        } else {
            assert_refused(&r, 403, "FORBIDDEN", op);
        }
    }
    assert_eq!(root_ledger(&s, "acme").await, before);
    assert_eq!(status_of(&s, &id).await, "ACTIVE");
    // A key that may only create reservations cannot settle them or read balances.
    let (creator, _) = s
        .key_with("acme", json!({"permissions": ["reservations:create"]}))
        .await;
    let mine = reserve(&s, &creator, "acme").await;
    for op in ["commit", "release", "extend", "balances"] {
        let r = call(&s, As::Key(&creator), op, "acme", &mine).await;
        assert_refused(&r, 403, "FORBIDDEN", op);
    }
    s.stop().await;
}

async fn admin_only_endpoints_refuse_tenant_keys(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let (_, key_id) = s.key_with("acme", json!({})).await;
    let requests = [
        (
            Method::POST,
            "/v1/admin/tenants".to_string(),
            Some(json!({"tenant_id": "evil", "name": "evil"})),
        ),
        (
            Method::POST,
            "/v1/admin/api-keys".to_string(),
            Some(json!({"tenant_id": "acme", "name": "mine"})),
        ),
        (Method::DELETE, format!("/v1/admin/api-keys/{key_id}"), None),
        (Method::GET, "/v1/admin/tenants/acme".to_string(), None),
        (
            Method::PATCH,
            "/v1/admin/tenants/acme".to_string(),
            Some(json!({"max_reservation_extensions": 99})),
        ),
    ];
    for (method, path, body) in requests {
        let r = s
            .send(method.clone(), &path, As::Key(&key), body.as_ref())
            .await;
        assert_refused(&r, 401, "UNAUTHORIZED", &format!("{method} {path}"));
    }
    s.get("/v1/admin/tenants/evil", As::Admin)
        .await
        .expect(404, None);
    let t = s.get("/v1/admin/tenants/acme", As::Admin).await;
    assert_ne!(t.expect(200, None)["max_reservation_extensions"], 99);
    s.stop().await;
}

async fn unknown_permission_is_rejected(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    for permissions in [
        json!(["reservations:fly"]),
        json!(["balances:read", "everything"]),
        json!(["BALANCES:READ"]),
    ] {
        let body = json!({"tenant_id": "acme", "name": "k", "permissions": permissions});
        let r = s.post("/v1/admin/api-keys", As::Admin, body).await;
        assert_refused(&r, 400, "INVALID_REQUEST", &permissions.to_string());
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(message.contains("permissions"), "{message}");
    }
    s.stop().await;
}

async fn health_endpoints_are_public(engine: Engine) {
    let s = TestServer::start(engine).await;
    for path in [
        "/actuator/health",
        "/actuator/health/liveness",
        "/actuator/health/readiness",
    ] {
        for who in [As::Nobody, As::Key("not-a-key")] {
            let r = s.get(path, who).await;
            assert_eq!(r.expect(200, None), &json!({"status": "UP"}), "{path}");
        }
    }
    s.stop().await;
}
