//! The audit log over HTTP (admin spec §2.4 listAuditLogs, §3.5): one entry per audited
//! request, successful or refused, found by its request id; the list's filters, orders,
//! cursors and refusals.

use std::collections::BTreeSet;

use crate::common::{reserve_body, As, Engine, Resp, TestServer};
use crate::webhooks::{allow_loopback, Receiver};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    every_admin_write_leaves_one_entry,
    refusals_are_audited_with_their_code,
    tenant_key_writes_name_the_key,
    a_tenants_own_webhook_writes_are_audited,
    admin_release_is_audited_and_reads_are_not,
    audit_log_filters,
    audit_log_orders_and_pages,
    audit_list_refuses_bad_parameters,
    unknown_callers_have_a_budget_per_address,
);

const USD: &str = "USD_MICROCENTS";
const LOGS: &str = "/v1/admin/audit/logs";

fn usd(amount: i64) -> Value {
    json!({"unit": USD, "amount": amount})
}

/// The one entry the request answered by `r` left, checked against the response's ids.
async fn entry_of(s: &TestServer, r: &Resp) -> Value {
    let request_id = r.header("x-request-id").expect("request id").to_string();
    let found = s
        .get(&format!("{LOGS}?request_id={request_id}"), As::Admin)
        .await;
    let logs = found.expect(200, None)["logs"]
        .as_array()
        .expect("logs")
        .clone();
    assert_eq!(logs.len(), 1, "one entry for {request_id}: {logs:?}");
    let e = logs[0].clone();
    assert_eq!(e["status"], r.status, "{e}");
    assert_eq!(
        e["trace_id"],
        r.header("x-cycles-trace-id").expect("trace"),
        "{e}"
    );
    assert!(
        e["log_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("log_")),
        "{e}"
    );
    assert!(e["timestamp"].as_str().is_some(), "{e}");
    assert_eq!(e["source_ip"], "127.0.0.1", "{e}");
    e
}

/// Asserts an entry's operation, tenant, resource and actor.
#[track_caller]
fn assert_entry(e: &Value, operation: &str, tenant: &str, resource: (&str, &str), actor: &str) {
    assert_eq!(e["operation"], operation, "{e}");
    assert_eq!(e["tenant_id"], tenant, "{e}");
    assert_eq!(e["resource_type"], resource.0, "{e}");
    assert_eq!(e["resource_id"], resource.1, "{e}");
    assert_eq!(e["metadata"]["actor_type"], actor, "{e}");
}

async fn logs(s: &TestServer, query: &str) -> Vec<Value> {
    let r = s.get(&format!("{LOGS}?{query}"), As::Admin).await;
    r.expect(200, None)["logs"]
        .as_array()
        .expect("logs")
        .clone()
}

fn field(logs: &[Value], name: &str) -> Vec<String> {
    logs.iter()
        .map(|e| match &e[name] {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        })
        .collect()
}

/// Every admin-plane write, through the API's own operation ids, each with its status,
/// resource and the tenant it is filed under.
async fn every_admin_write_leaves_one_entry(engine: Engine) {
    let s = TestServer::start(engine).await;
    let tenant = json!({"tenant_id": "acme", "name": "Acme"});
    let r = s.post("/v1/admin/tenants", As::Admin, tenant.clone()).await;
    r.expect(201, None);
    assert_entry(
        &entry_of(&s, &r).await,
        "createTenant",
        "acme",
        ("tenant", "acme"),
        "admin",
    );
    // The same tenant again: 200, unchanged, and still audited as what it answered.
    let r = s.post("/v1/admin/tenants", As::Admin, tenant).await;
    r.expect(200, None);
    assert_eq!(entry_of(&s, &r).await["status"], 200);
    let r = s
        .send(
            Method::PATCH,
            "/v1/admin/tenants/acme",
            As::Admin,
            Some(&json!({"name": "ACME"})),
        )
        .await;
    r.expect(200, None);
    assert_entry(
        &entry_of(&s, &r).await,
        "updateTenant",
        "acme",
        ("tenant", "acme"),
        "admin",
    );

    let r = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "k"}),
        )
        .await;
    let key_id = r.expect(201, None)["key_id"].as_str().unwrap().to_string();
    let e = entry_of(&s, &r).await;
    assert_entry(&e, "createApiKey", "acme", ("api_key", &key_id), "admin");
    assert!(
        !e.to_string().contains("cyc_live_"),
        "no secret in the log: {e}"
    );
    let path = format!("/v1/admin/api-keys/{key_id}");
    let r = s
        .send(
            Method::PATCH,
            &path,
            As::Admin,
            Some(&json!({"name": "renamed"})),
        )
        .await;
    r.expect(200, None);
    assert_entry(
        &entry_of(&s, &r).await,
        "updateApiKey",
        "acme",
        ("api_key", &key_id),
        "admin",
    );

    let budget = json!({"tenant_id": "acme", "scope": "tenant:acme", "unit": USD,
                        "allocated": usd(1_000)});
    let r = s.post("/v1/admin/budgets", As::Admin, budget).await;
    let ledger_id = r.expect(201, None)["ledger_id"]
        .as_str()
        .unwrap()
        .to_string();
    let e = entry_of(&s, &r).await;
    let on_behalf = "admin_on_behalf_of";
    assert_entry(
        &e,
        "createBudget",
        "acme",
        ("budget", "tenant:acme"),
        on_behalf,
    );
    assert_eq!(e["metadata"]["ledger_id"], ledger_id.as_str());
    let address = format!("scope=tenant:acme&unit={USD}");
    for (method, path, body, operation) in [
        (
            Method::PATCH,
            "/v1/admin/budgets",
            json!({"overdraft_limit": usd(5)}),
            "updateBudget",
        ),
        (
            Method::POST,
            "/v1/admin/budgets/freeze",
            json!({}),
            "freezeBudget",
        ),
        (
            Method::POST,
            "/v1/admin/budgets/unfreeze",
            json!({}),
            "unfreezeBudget",
        ),
        (
            Method::POST,
            "/v1/admin/budgets/fund",
            json!({"operation": "CREDIT", "amount": usd(10), "idempotency_key": "f1"}),
            "fundBudget",
        ),
    ] {
        let tenant = if operation == "fundBudget" {
            "&tenant_id=acme"
        } else {
            ""
        };
        let r = s
            .send(
                method,
                &format!("{path}?{address}{tenant}"),
                As::Admin,
                Some(&body),
            )
            .await;
        r.expect(200, None);
        let e = entry_of(&s, &r).await;
        assert_entry(&e, operation, "acme", ("budget", "tenant:acme"), on_behalf);
    }

    let policy = json!({"tenant_id": "acme", "name": "p", "scope_pattern": "tenant:acme/*"});
    let r = s.post("/v1/admin/policies", As::Admin, policy).await;
    let policy_id = r.expect(201, None)["policy_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_entry(
        &entry_of(&s, &r).await,
        "createPolicy",
        "acme",
        ("policy", &policy_id),
        on_behalf,
    );
    let r = s
        .send(
            Method::PATCH,
            &format!("/v1/admin/policies/{policy_id}"),
            As::Admin,
            Some(&json!({"name": "q"})),
        )
        .await;
    r.expect(200, None);
    assert_entry(
        &entry_of(&s, &r).await,
        "updatePolicy",
        "acme",
        ("policy", &policy_id),
        on_behalf,
    );

    let r = s
        .post(
            "/v1/auth/validate",
            As::Admin,
            json!({"key_secret": "cyc_live_nope"}),
        )
        .await;
    r.expect(200, None);
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["operation"], &e["metadata"]["valid"]),
        (&json!("validateApiKey"), &json!(false))
    );

    let bulk = json!({"filter": {"tenant_id": "acme"}, "action": "CREDIT", "amount": usd(1),
                      "idempotency_key": "b1"});
    let r = s
        .post("/v1/admin/budgets/bulk-action", As::Admin, bulk)
        .await;
    r.expect(200, None);
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["operation"], &e["resource_id"]),
        (&json!("bulkActionBudgets"), &json!("bulk-action"))
    );
    assert_eq!(e["metadata"]["succeeded"], 1, "{e}");
    assert_eq!(e["metadata"]["succeeded_ids"], json!([ledger_id]), "{e}");
    // The action, its filter as sent and its key; the tenant its filter names.
    assert_eq!(e["metadata"]["action"], "CREDIT", "{e}");
    assert_eq!(e["metadata"]["filter"], json!({"tenant_id": "acme"}), "{e}");
    assert_eq!(e["metadata"]["idempotency_key"], "b1", "{e}");
    assert_eq!(e["tenant_id"], "acme", "{e}");
    let bulk = json!({"filter": {"search": "acme"}, "action": "SUSPEND", "idempotency_key": "b2"});
    let r = s
        .post("/v1/admin/tenants/bulk-action", As::Admin, bulk)
        .await;
    r.expect(200, None);
    let e = entry_of(&s, &r).await;
    assert_eq!(e["operation"], "bulkActionTenants");
    assert_eq!(e["metadata"]["actor_type"], on_behalf, "{e}");
    assert_eq!(e["metadata"]["action"], "SUSPEND", "{e}");
    assert_eq!(
        e["tenant_id"], "__admin__",
        "a tenant filter may match many: {e}"
    );
    // Again: the row is skipped, and the entry says why.
    let bulk = json!({"filter": {"search": "acme"}, "action": "SUSPEND", "idempotency_key": "b3"});
    let r = s
        .post("/v1/admin/tenants/bulk-action", As::Admin, bulk)
        .await;
    r.expect(200, None);
    let e = entry_of(&s, &r).await;
    let skipped = json!([{"id": "acme", "reason": "ALREADY_IN_TARGET_STATE"}]);
    assert_eq!(e["metadata"]["skipped_rows"], skipped, "{e}");

    let r = s.send(Method::DELETE, &path, As::Admin, None).await;
    r.expect(200, None);
    assert_entry(
        &entry_of(&s, &r).await,
        "revokeApiKey",
        "acme",
        ("api_key", &key_id),
        "admin",
    );
    // Seventeen requests, seventeen entries: nothing else was written.
    assert_eq!(logs(&s, "limit=100").await.len(), 17);
}

/// A refused write is audited with the status and code it was answered, filed under the
/// admin when the admin key was right and under `__unauth__` when no caller was known.
async fn refusals_are_audited_with_their_code(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let r = s
        .post("/v1/admin/tenants", As::Admin, json!({"tenant_id": "Bad!"}))
        .await;
    r.expect(400, Some("INVALID_REQUEST"));
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["tenant_id"], &e["error_code"]),
        (&json!("__admin__"), &json!("INVALID_REQUEST"))
    );
    assert_eq!(e["metadata"]["path"], "/v1/admin/tenants", "{e}");
    assert_eq!(e["metadata"]["method"], "POST", "{e}");
    assert!(
        e["metadata"]["error_message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{e}"
    );

    let r = s.post("/v1/admin/tenants", As::Nobody, json!({})).await;
    r.expect(401, Some("UNAUTHORIZED"));
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["tenant_id"], &e["metadata"]["actor_type"]),
        (&json!("__unauth__"), &json!("unauthenticated"))
    );
    let r = s
        .send(
            Method::PATCH,
            "/v1/admin/tenants/ghost",
            As::Admin,
            Some(&json!({"name": "x"})),
        )
        .await;
    r.expect(404, None);
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["resource_id"], &e["status"]),
        (&json!("ghost"), &json!(404))
    );

    s.budget("tenant:acme", USD, 10, json!({})).await;
    let dup =
        json!({"tenant_id": "acme", "scope": "tenant:acme", "unit": USD, "allocated": usd(1)});
    let r = s.post("/v1/admin/budgets", As::Admin, dup).await;
    r.expect(409, Some("DUPLICATE_RESOURCE"));
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["tenant_id"], &e["resource_type"], &e["resource_id"]),
        (&json!("__admin__"), &json!("budget"), &json!("tenant:acme"))
    );
    // A tenant key (unknown) where the admin key is needed: no caller.
    let r = s
        .send(
            Method::DELETE,
            "/v1/admin/api-keys/key_x",
            As::Key("cyc_live_wrong"),
            None,
        )
        .await;
    r.expect(401, None);
    assert_eq!(entry_of(&s, &r).await["tenant_id"], "__unauth__");
}

/// A tenant key's writes on the admin plane are filed under its tenant with its key id, and
/// so are its refusals once the key is known.
async fn tenant_key_writes_name_the_key(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let r = s
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "w", "permissions": ["budgets:write", "budgets:read"]}),
        )
        .await;
    let created = r.expect(201, None).clone();
    let (secret, key_id) = (
        created["key_secret"].as_str().unwrap(),
        created["key_id"].as_str().unwrap(),
    );
    let body = json!({"scope": "tenant:acme/workspace:eng", "unit": USD, "allocated": usd(5)});
    let r = s
        .post("/v1/admin/budgets", As::Key(secret), body.clone())
        .await;
    r.expect(201, None);
    let e = entry_of(&s, &r).await;
    assert_entry(
        &e,
        "createBudget",
        "acme",
        ("budget", "tenant:acme/workspace:eng"),
        "api_key",
    );
    assert_eq!(e["key_id"], key_id);
    // Without policies:write: refused, and the refusal names the key.
    let r = s
        .post(
            "/v1/admin/policies",
            As::Key(secret),
            json!({"name": "p", "scope_pattern": "tenant:acme/*"}),
        )
        .await;
    r.expect(403, None);
    let e = entry_of(&s, &r).await;
    assert_eq!(
        (&e["tenant_id"], &e["key_id"], &e["status"]),
        (&json!("acme"), &json!(key_id), &json!(403))
    );
    // A malformed body from a known key: 400, still under the key's tenant.
    let r = s
        .post_raw("/v1/admin/budgets", As::Key(secret), b"{".to_vec())
        .await;
    r.expect(400, None);
    assert_eq!(entry_of(&s, &r).await["key_id"], key_id);
    // The key filter finds exactly these three.
    assert_eq!(logs(&s, &format!("key_id={key_id}")).await.len(), 3);
}

/// An operator's release of a tenant's reservation is audited on the tenant's behalf; the
/// tenant's own runtime calls and every read are not audited.
/// A tenant's webhook writes with its own key (create, update, test, delete) each leave an
/// entry under the tenant and the key, as the admin plane's writes do; reading them does not.
async fn a_tenants_own_webhook_writes_are_audited(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let (secret, key_id) = s
        .key_with(
            "acme",
            json!({"permissions": ["webhooks:read", "webhooks:write"]}),
        )
        .await;
    let (_receiver, url) = Receiver::start().await;
    allow_loopback(&s).await;
    let body = json!({"url": url, "event_types": ["budget.funded"]});
    let r = s.post("/v1/webhooks", As::Key(&secret), body).await;
    let id = r.expect(201, None)["subscription"]["subscription_id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/webhooks/{id}");
    let patch = json!({"name": "renamed"});
    let written = [
        ("createTenantWebhook", 201, r),
        (
            "updateTenantWebhook",
            200,
            s.send(Method::PATCH, &path, As::Key(&secret), Some(&patch))
                .await,
        ),
        (
            "testTenantWebhook",
            200,
            s.post(&format!("{path}/test"), As::Key(&secret), json!({}))
                .await,
        ),
        (
            "deleteTenantWebhook",
            204,
            s.send(Method::DELETE, &path, As::Key(&secret), None).await,
        ),
    ];
    assert_eq!(
        written[2].2.body["success"], true,
        "the probe reached the receiver"
    );
    for (operation, status, r) in &written {
        r.expect(*status, None);
        let e = entry_of(&s, r).await;
        assert_entry(&e, operation, "acme", ("webhook", &id), "api_key");
        assert_eq!(e["key_id"], key_id.as_str());
    }
    s.get("/v1/webhooks", As::Key(&secret))
        .await
        .expect(200, None);
    assert_eq!(logs(&s, &format!("key_id={key_id}")).await.len(), 4);
    s.stop().await;
}

async fn admin_release_is_audited_and_reads_are_not(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let before = logs(&s, "limit=100").await.len();
    let reserve = |k: &'static str| reserve_body(k, json!({"tenant": "acme"}), 10);
    let r = s
        .post("/v1/reservations", As::Key(&key), reserve("r1"))
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s
        .post(
            &format!("/v1/reservations/{id}/release"),
            As::Admin,
            json!({"idempotency_key": "rel-1", "reason": "[INCIDENT_FORCE_RELEASE] stuck"}),
        )
        .await;
    r.expect(200, None);
    let e = entry_of(&s, &r).await;
    assert_entry(
        &e,
        "releaseReservation",
        "acme",
        ("reservation", &id),
        "admin_on_behalf_of",
    );
    assert_eq!(e["metadata"]["released"], 10, "{e}");
    assert_eq!(
        e["metadata"]["reason"], "[INCIDENT_FORCE_RELEASE] stuck",
        "{e}"
    );
    // The tenant's own reserve and release, and reads of every kind: no entry.
    let r = s
        .post("/v1/reservations", As::Key(&key), reserve("r2"))
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    s.post(
        &format!("/v1/reservations/{id}/release"),
        As::Key(&key),
        json!({"idempotency_key": "rel-2"}),
    )
    .await
    .expect(200, None);
    for path in [
        "/v1/admin/tenants",
        "/v1/admin/budgets?tenant_id=acme",
        "/v1/admin/overview",
        LOGS,
    ] {
        s.get(path, As::Admin).await.expect(200, None);
    }
    assert_eq!(logs(&s, "limit=100").await.len(), before + 1);
}

/// Twelve entries over three tenants, refused and not, to filter.
async fn some_history(s: &TestServer) {
    for t in ["acme", "beta", "gamma"] {
        s.tenant(t).await;
        s.budget(&format!("tenant:{t}"), USD, 10, json!({})).await;
    }
    // Refusals: a duplicate (409), a bad body (400), no key (401).
    let dup =
        json!({"tenant_id": "beta", "scope": "tenant:beta", "unit": USD, "allocated": usd(1)});
    s.post("/v1/admin/budgets", As::Admin, dup)
        .await
        .expect(409, None);
    s.post("/v1/admin/tenants", As::Admin, json!({"tenant_id": 7}))
        .await
        .expect(400, None);
    s.post("/v1/admin/tenants", As::Nobody, json!({}))
        .await
        .expect(401, None);
    s.advance(60_000);
    let patch = json!({"name": "Gamma Corp"});
    s.send(
        Method::PATCH,
        "/v1/admin/tenants/gamma",
        As::Admin,
        Some(&patch),
    )
    .await
    .expect(200, None);
    s.send(
        Method::PATCH,
        "/v1/admin/tenants/beta",
        As::Admin,
        Some(&patch),
    )
    .await
    .expect(200, None);
    s.budget("tenant:acme/workspace:eng", USD, 10, json!({}))
        .await;
}

async fn audit_log_filters(engine: Engine) {
    let s = TestServer::start(engine).await;
    some_history(&s).await;
    let all = logs(&s, "limit=100").await;
    assert_eq!(all.len(), 12);
    let count = |q: &'static str| {
        let s = &s;
        async move { logs(s, q).await.len() }
    };
    assert_eq!(count("tenant_id=acme").await, 3);
    assert_eq!(count("tenant_id=__admin__").await, 2);
    assert_eq!(count("tenant_id=__unauth__").await, 1);
    assert_eq!(count("resource_id=tenant:acme").await, 1);
    assert_eq!(count("operation=updateTenant").await, 2);
    // Five createTenant (three made, one malformed, one without a key) and two updates.
    assert_eq!(count("operation=updateTenant,createTenant").await, 7);
    assert_eq!(
        count("operation=updateTenant&operation=createTenant").await,
        7
    );
    assert_eq!(count("resource_type=budget").await, 5);
    assert_eq!(
        count("resource_type=budget,tenant&operation=createBudget").await,
        5
    );
    // Codes: a success row never matches a code, and always passes an exclusion.
    assert_eq!(count("error_code=DUPLICATE_RESOURCE").await, 1);
    assert_eq!(count("error_code=DUPLICATE_RESOURCE,UNAUTHORIZED").await, 2);
    assert_eq!(count("error_code=NO_SUCH_CODE").await, 0);
    assert_eq!(count("error_code_exclude=UNAUTHORIZED").await, 11);
    assert_eq!(
        count("error_code=UNAUTHORIZED&error_code_exclude=UNAUTHORIZED").await,
        0
    );
    assert_eq!(count("status=201").await, 7);
    assert_eq!(count("status_min=400").await, 3);
    assert_eq!(count("status_min=400&status_max=401").await, 2);
    assert_eq!(count("status_max=299").await, 9);
    // Time: the last three came a minute later.
    let later = "2027-01-15T08:01:00.000Z";
    let at_t0 = "2027-01-15T08:00:00.000Z";
    assert_eq!(count_at(&s, &format!("from={later}")).await, 3);
    assert_eq!(count_at(&s, &format!("to={at_t0}")).await, 9);
    assert_eq!(count_at(&s, &format!("from={at_t0}&to={at_t0}")).await, 9);
    // Search: case-insensitive, over resource id, log id, error code and operation.
    // gamma's creation and update (resource "gamma"), and its budget's ("tenant:gamma").
    assert_eq!(count("search=GAMMA").await, 3);
    assert_eq!(count("search=duplicate").await, 1);
    assert_eq!(count("search=updatet").await, 2);
    let log_id = all[0]["log_id"].as_str().unwrap();
    assert_eq!(logs(&s, &format!("search={log_id}")).await.len(), 1);
    assert_eq!(count("search=").await, 12, "an empty search is none");
    // Correlation: a trace id given by the caller, and a request id.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = s
        .http_get_with(
            "/v1/admin/tenants",
            "traceparent",
            &format!("00-{trace}-00f067aa0ba902b7-01"),
        )
        .await;
    assert_eq!(
        r.status, 401,
        "no key: refused, but it is a GET and not audited"
    );
    assert_eq!(logs(&s, &format!("trace_id={trace}")).await.len(), 0);
    let trace_of = all[3]["trace_id"].as_str().unwrap();
    assert_eq!(
        field(&logs(&s, &format!("trace_id={trace_of}")).await, "log_id"),
        [all[3]["log_id"].as_str().unwrap()]
    );
    // Filters AND together.
    assert_eq!(count("tenant_id=acme&resource_type=tenant").await, 1);
    assert_eq!(count("tenant_id=acme&status=409").await, 0);
}

/// The manual clock starts at T0 = 2027-01-15T08:00:00Z.
async fn count_at(s: &TestServer, query: &str) -> usize {
    logs(s, query).await.len()
}

async fn audit_log_orders_and_pages(engine: Engine) {
    let s = TestServer::start(engine).await;
    some_history(&s).await;
    let newest_first = logs(&s, "limit=100").await;
    let oldest_first = logs(&s, "limit=100&sort_dir=asc").await;
    let mut reversed = field(&newest_first, "log_id");
    reversed.reverse();
    assert_eq!(
        field(&oldest_first, "log_id"),
        reversed,
        "ties keep the write order"
    );
    assert_eq!(oldest_first[0]["operation"], "createTenant");
    for (sort_by, numeric) in [
        ("timestamp", false),
        ("operation", false),
        ("resource_type", false),
        ("tenant_id", false),
        ("key_id", false),
        ("status", true),
    ] {
        for dir in ["asc", "desc"] {
            let query = format!("sort_by={sort_by}&sort_dir={dir}");
            let page = logs(&s, &format!("{query}&limit=100")).await;
            let values = field(&page, sort_by);
            let mut sorted = values.clone();
            if numeric {
                sorted.sort_by_key(|v| v.parse::<i64>().unwrap());
            } else {
                sorted.sort();
            }
            if dir == "desc" {
                sorted.reverse();
            }
            assert_eq!(values, sorted, "{query}");
            // Pages of 5 cover the same entries once, in the same order.
            let walked = walk(&s, &query, 5).await;
            assert_eq!(walked, field(&page, "log_id"), "{query}");
        }
    }
    // Limits: clamped above 100, at least 1.
    let r = s.get(&format!("{LOGS}?limit=1000"), As::Admin).await;
    assert_eq!(r.expect(200, None)["logs"].as_array().unwrap().len(), 12);
    let r = s.get(&format!("{LOGS}?limit=3"), As::Admin).await;
    let page = r.expect(200, None);
    assert_eq!(
        (page["logs"].as_array().unwrap().len(), &page["has_more"]),
        (3, &json!(true))
    );
    let r = s.get(&format!("{LOGS}?limit=12"), As::Admin).await;
    let page = r.expect(200, None);
    assert_eq!(page["has_more"], false);
    assert!(page.get("next_cursor").is_none());
}

/// Every page of `query` in pages of `limit`, following `next_cursor`: the log ids.
async fn walk(s: &TestServer, query: &str, limit: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{LOGS}?{query}&limit={limit}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let r = s.get(&url, As::Admin).await;
        let body = r.expect(200, None);
        seen.extend(field(body["logs"].as_array().unwrap(), "log_id"));
        if body["has_more"] != json!(true) {
            let unique: BTreeSet<_> = seen.iter().collect();
            assert_eq!(unique.len(), seen.len(), "no entry twice: {query}");
            return seen;
        }
        cursor = Some(body["next_cursor"].as_str().expect("cursor").to_string());
    }
}

async fn audit_list_refuses_bad_parameters(engine: Engine) {
    let s = TestServer::start(engine).await;
    some_history(&s).await;
    let ops: Vec<String> = (0..26).map(|i| format!("op{i}")).collect();
    let r = s.get(&format!("{LOGS}?limit=2"), As::Admin).await;
    let cursor = r.expect(200, None)["next_cursor"]
        .as_str()
        .unwrap()
        .to_string();
    for (query, names) in [
        (format!("operation={}", ops.join(",")), "operation"),
        (
            format!("error_code_exclude={}", ops.join(",")),
            "error_code_exclude",
        ),
        ("status=200&status_min=100".into(), "status"),
        ("status=200&status_max=500".into(), "status"),
        ("status_min=500&status_max=400".into(), "status_min"),
        ("status_min=99".into(), "status_min"),
        ("status_max=600".into(), "status_max"),
        ("status=abc".into(), "status"),
        (format!("search={}", "x".repeat(129)), "search"),
        ("trace_id=ABCDEF".into(), "trace_id"),
        ("from=yesterday".into(), "from"),
        (
            "from=2027-01-16T00:00:00Z&to=2027-01-15T00:00:00Z".into(),
            "from",
        ),
        ("sort_by=log_id".into(), "sort_by"),
        ("sort_dir=up".into(), "sort_dir"),
        ("limit=0".into(), "limit"),
        ("cursor=zz".into(), "cursor"),
        (format!("cursor={cursor}&tenant_id=acme"), "cursor"),
        (format!("cursor={cursor}&sort_by=status"), "cursor"),
        ("tenant_id=a&tenant_id=b".into(), "tenant_id"),
    ] {
        let r = s.get(&format!("{LOGS}?{query}&limit=2"), As::Admin).await;
        r.expect(400, Some("INVALID_REQUEST"));
        let message = r.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{query}: {message}");
    }
    // Admin only.
    let key = s.key("acme").await;
    s.get(LOGS, As::Key(&key)).await.expect(401, None);
    s.get(LOGS, As::Nobody).await.expect(401, None);
    // Twenty-five is allowed; unknown parameters are ignored.
    let query = format!("operation={}&whatever=1", ops[..25].join(","));
    assert!(logs(&s, &query).await.is_empty());
    // None of the refused reads wrote anything (only the key's creation).
    assert_eq!(logs(&s, "limit=100").await.len(), 13);
}

/// A flood of refusals from an unknown caller leaves at most the address's budget of
/// entries (then counts them); known callers' refusals are never dropped.
async fn unknown_callers_have_a_budget_per_address(engine: Engine) {
    let s = TestServer::start_with(engine, |o| o.audit_unauthenticated_per_minute = 3).await;
    for _ in 0..5 {
        s.post("/v1/admin/tenants", As::Nobody, json!({}))
            .await
            .expect(401, None);
    }
    for _ in 0..5 {
        let bad = json!({"tenant_id": "Bad!"});
        s.post("/v1/admin/tenants", As::Admin, bad)
            .await
            .expect(400, None);
    }
    assert_eq!(logs(&s, "tenant_id=__unauth__").await.len(), 3);
    assert_eq!(logs(&s, "tenant_id=__admin__").await.len(), 5);
    let metrics = s.get("/metrics", As::Admin).await;
    let text = metrics.body.as_str().expect("metrics text").to_string();
    assert!(
        text.contains("cycles_audit_unauthenticated_skipped_total 2"),
        "{text}"
    );
}
