//! Bad input, error bodies and correlation ids over HTTP: every refusal is a well-formed
//! error that names the offending field and leaves the ledger untouched, and every success
//! body is one the strict official clients accept.

use crate::common::{self, reserve_body, As, Engine, Resp, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    reserve_rejects_malformed_bodies_and_unknown_fields,
    reserve_rejects_wrong_types_and_out_of_range_values,
    reserve_rejects_bad_subjects_and_actions,
    settlement_bodies_are_validated,
    events_and_decide_bodies_are_validated,
    idempotency_key_rules,
    inclusive_limits_are_accepted,
    oversized_body_is_rejected,
    long_reservation_id_is_rejected,
    balance_queries_are_validated,
    repeated_or_empty_query_parameters_are_refused_by_name,
    error_bodies_carry_the_correlation_ids,
    trace_id_precedence,
    unknown_route_is_a_json_not_found,
    reserve_in_another_unit_is_unit_mismatch_with_details,
    reserve_without_any_budget_is_not_found,
    commit_in_another_unit_is_unit_mismatch,
    success_bodies_match_the_client_schemas,
    null_field_values_are_rejected,
);

const USD: &str = "USD_MICROCENTS";
const ROOT: &str = "tenant:acme";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const OTHER_TRACE: &str = "0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A request body: JSON (sent with a matching `X-Idempotency-Key` by the harness) or raw bytes.
enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

/// One bad request: where it goes, what it carries, and the words (space-separated) its
/// message must contain.
struct Bad {
    path: String,
    body: Body,
    names: &'static str,
}

/// Bad requests made by editing one field of `base` each: `(JSON pointer, value, names)`.
fn edits(path: &str, base: &Value, list: Vec<(&str, Value, &'static str)>) -> Vec<Bad> {
    list.into_iter()
        .map(|(pointer, value, names)| Bad {
            path: path.to_string(),
            body: Body::Json(patched(base, pointer, value)),
            names,
        })
        .collect()
}

/// Bad requests with whole bodies: `(body, names)`.
fn whole(path: &str, list: Vec<(Body, &'static str)>) -> Vec<Bad> {
    list.into_iter()
        .map(|(body, names)| Bad {
            path: path.to_string(),
            body,
            names,
        })
        .collect()
}

fn raw(bytes: &[u8]) -> Body {
    Body::Raw(bytes.to_vec())
}

/// `base` with the value at JSON pointer `pointer` replaced (parents must exist).
fn patched(base: &Value, pointer: &str, value: Value) -> Value {
    let mut body = base.clone();
    let (parent, field) = pointer.rsplit_once('/').expect("pointer");
    body.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("no object at {parent} in {base}"))
        .insert(field.to_string(), value);
    body
}

fn reserve_base(key: &str) -> Value {
    reserve_body(key, json!({"tenant": "acme"}), 1_000)
}

fn event_base(key: &str) -> Value {
    json!({
        "idempotency_key": key,
        "subject": {"tenant": "acme"},
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "actual": {"unit": USD, "amount": 1_000},
    })
}

fn decide_base(key: &str) -> Value {
    reserve_base(key)
}

fn commit_base(key: &str) -> Value {
    json!({"idempotency_key": key, "actual": {"unit": USD, "amount": 10}})
}

fn extend_base(key: &str) -> Value {
    json!({"idempotency_key": key, "extend_by_ms": 1_000})
}

fn release_base(key: &str) -> Value {
    json!({"idempotency_key": key})
}

async fn send_body(s: &TestServer, path: &str, key: &str, body: &Body) -> Resp {
    match body {
        Body::Json(v) => s.post(path, As::Key(key), v.clone()).await,
        Body::Raw(bytes) => s.post_raw(path, As::Key(key), bytes.clone()).await,
    }
}

/// Sends a request with extra headers (the harness only sets the auth headers).
async fn send_with(
    s: &TestServer,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Resp {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", s.base));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(body) = body {
        req = req.header("Content-Type", "application/json").body(body);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Resp {
        status,
        headers,
        body,
    }
}

fn is_trace_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && s.bytes().any(|b| b != b'0')
}

/// An error body is exactly `{error, message, request_id, trace_id}` (plus `details` on
/// UNIT_MISMATCH), and its ids are the ones in the `X-Request-Id` / `X-Cycles-Trace-Id`
/// headers.
fn assert_error_envelope(r: &Resp) {
    let obj = r
        .body
        .as_object()
        .unwrap_or_else(|| panic!("error body is not a JSON object: {:?}", r.body));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let expected: &[&str] = if obj.contains_key("details") {
        assert_eq!(
            r.code(),
            "UNIT_MISMATCH",
            "details on an undocumented error: {}",
            r.body
        );
        &["details", "error", "message", "request_id", "trace_id"]
    } else {
        &["error", "message", "request_id", "trace_id"]
    };
    assert_eq!(keys, expected, "error body keys: {}", r.body);
    for k in ["error", "message", "request_id", "trace_id"] {
        assert!(obj[k].is_string(), "{k} is not a string: {}", r.body);
    }
    let request_id = obj["request_id"].as_str().unwrap();
    let trace_id = obj["trace_id"].as_str().unwrap();
    assert!(!request_id.is_empty(), "empty request_id: {}", r.body);
    assert!(is_trace_id(trace_id), "bad trace_id: {}", r.body);
    assert_eq!(r.header("x-request-id"), Some(request_id), "X-Request-Id");
    assert_eq!(
        r.header("x-cycles-trace-id"),
        Some(trace_id),
        "X-Cycles-Trace-Id"
    );
}

/// 400 INVALID_REQUEST whose message contains every (space-separated) word of `names`.
fn assert_invalid(r: &Resp, names: &str, what: &str) {
    assert_eq!(r.status, 400, "{what}: status; body {}", r.body);
    assert_eq!(r.code(), "INVALID_REQUEST", "{what}: code; body {}", r.body);
    let message = r.body["message"].as_str().unwrap_or_default();
    for name in names.split_whitespace() {
        assert!(
            message.contains(name),
            "{what}: message does not name `{name}`: {message}"
        );
    }
    assert_error_envelope(r);
}

/// Tenant `acme` with a key and a 1 000 000 USD_MICROCENTS root budget.
async fn acme(s: &TestServer) -> String {
    s.setup("acme", 1_000_000).await
}

/// A live reservation of 1 000 at the root; returns its id.
async fn reservation(s: &TestServer, key: &str, idem: &str) -> String {
    s.post("/v1/reservations", As::Key(key), reserve_base(idem))
        .await
        .expect(200, None)["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

/// Sends every bad request and checks each is refused and leaves the root budget as it was.
async fn assert_all_rejected(s: &TestServer, key: &str, cases: Vec<Bad>) {
    let before = s.ledger(ROOT, USD).await;
    for case in cases {
        let r = send_body(s, &case.path, key, &case.body).await;
        let what = match &case.body {
            Body::Json(v) => format!("POST {} {v}", case.path),
            Body::Raw(b) => format!(
                "POST {} {}",
                case.path,
                String::from_utf8_lossy(&b[..b.len().min(200)])
            ),
        };
        assert_invalid(&r, case.names, &what);
        assert_eq!(
            s.ledger(ROOT, USD).await,
            before,
            "{what}: the budget changed"
        );
    }
}

fn assert_no_nulls(v: &Value, at: &str) {
    match v {
        Value::Null => panic!("JSON null at {at}"),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                assert_no_nulls(item, &format!("{at}[{i}]"));
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                assert_no_nulls(item, &format!("{at}.{k}"));
            }
        }
        _ => {}
    }
}

fn assert_keys_within(v: &Value, allowed: &[&str], what: &str) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {v}"));
    for k in obj.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: unexpected key `{k}` in {v}"
        );
    }
}

const UNITS: [&str; 4] = ["USD_MICROCENTS", "TOKENS", "CREDITS", "RISK_POINTS"];

/// An `Amount` is exactly `{unit, amount}`, with a known unit and an int64 amount.
fn assert_amount(v: &Value, signed: bool, what: &str) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {v}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["amount", "unit"], "{what}: Amount keys in {v}");
    assert!(
        UNITS.contains(&v["unit"].as_str().unwrap_or_default()),
        "{what}: bad unit in {v}"
    );
    let amount = v["amount"]
        .as_i64()
        .unwrap_or_else(|| panic!("{what}: amount is not an int64 in {v}"));
    assert!(signed || amount >= 0, "{what}: negative amount in {v}");
}

fn assert_amount_fields(v: &Value, fields: &[&str], what: &str) {
    for f in fields {
        if let Some(a) = v.get(*f) {
            assert_amount(a, false, &format!("{what}.{f}"));
        }
    }
}

const BALANCE_KEYS: &[&str] = &[
    "scope",
    "scope_path",
    "remaining",
    "reserved",
    "spent",
    "allocated",
    "debt",
    "overdraft_limit",
    "is_over_limit",
];

fn assert_balances(v: &Value, what: &str) {
    let Some(list) = v.get("balances") else {
        return;
    };
    for (i, b) in list.as_array().expect("balances array").iter().enumerate() {
        let what = format!("{what}.balances[{i}]");
        assert_keys_within(b, BALANCE_KEYS, &what);
        assert!(b["scope"].is_string(), "{what}: scope missing in {b}");
        assert!(b["scope_path"].is_string(), "{what}: scope_path in {b}");
        assert_amount(&b["remaining"], true, &format!("{what}.remaining"));
        assert_amount_fields(
            b,
            &["reserved", "spent", "allocated", "debt", "overdraft_limit"],
            &what,
        );
        if let Some(flag) = b.get("is_over_limit") {
            assert!(flag.is_boolean(), "{what}: is_over_limit in {b}");
        }
    }
}

const CREATE_KEYS: &[&str] = &[
    "decision",
    "reservation_id",
    "affected_scopes",
    "expires_at_ms",
    "remaining_ttl_ms",
    "scope_path",
    "reserved",
    "caps",
    "reason_code",
    "retry_after_ms",
    "balances",
    "cycles_evidence",
];
const COMMIT_KEYS: &[&str] = &[
    "status",
    "charged",
    "released",
    "balances",
    "cycles_evidence",
];
const EXTEND_KEYS: &[&str] = &["status", "expires_at_ms", "remaining_ttl_ms", "balances"];
const RELEASE_KEYS: &[&str] = &["status", "released", "balances", "cycles_evidence"];
const EVENT_KEYS: &[&str] = &["status", "event_id", "charged", "balances"];
const DECIDE_KEYS: &[&str] = &[
    "decision",
    "caps",
    "reason_code",
    "retry_after_ms",
    "affected_scopes",
    "cycles_evidence",
];

/// A success body the strict clients accept: the status they require, no nulls, only the
/// allowed keys, well-formed Amounts and Balances.
fn assert_success_schema(r: &Resp, status: u16, keys: &[&str], what: &str) -> Value {
    let body = r.expect(status, None).clone();
    assert_no_nulls(&body, what);
    assert_keys_within(&body, keys, what);
    assert_amount_fields(&body, &["reserved", "charged", "released"], what);
    assert_balances(&body, what);
    body
}

// ---------------------------------------------------------------------------------------
// Bad request bodies
// ---------------------------------------------------------------------------------------

async fn reserve_rejects_malformed_bodies_and_unknown_fields(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let base = reserve_base("r1");
    let (action, estimate) = (&base["action"], &base["estimate"]);
    let p = "/v1/reservations";
    let mut cases = whole(
        p,
        vec![
            (raw(br#"{"idempotency_key": "r1", "subject": "#), ""),
            (raw(b"not json"), ""),
            (raw(b""), ""),
            (raw(b"   "), ""),
            (raw(b"[]"), ""),
            (raw(b"null"), ""),
            (
                raw(br#"{"idempotency_key":"r1","subject":{"tenant":"acme"},"action":{"kind":"k","name":"n"},"estimate":{"unit":"USD_MICROCENTS","amount":99999999999999999999999}}"#),
                "estimate.amount",
            ),
            (
                Body::Json(json!({"subject": {"tenant": "acme"}, "action": action, "estimate": estimate})),
                "idempotency_key",
            ),
            (
                Body::Json(json!({"idempotency_key": "r1", "action": action, "estimate": estimate})),
                "subject",
            ),
            (
                Body::Json(json!({"idempotency_key": "r1", "subject": {"tenant": "acme"}, "estimate": estimate})),
                "action",
            ),
            (
                Body::Json(json!({"idempotency_key": "r1", "subject": {"tenant": "acme"}, "action": action})),
                "estimate",
            ),
        ],
    );
    cases.extend(edits(
        p,
        &base,
        vec![
            ("/surprise", json!(1), "surprise"),
            ("/subject/zone", json!("eu"), "subject zone"),
            ("/action/model", json!("x"), "action model"),
            ("/estimate/currency", json!("EUR"), "estimate currency"),
            ("/estimate", json!({"amount": 5}), "estimate unit"),
            ("/action", json!({"kind": "llm.completion"}), "action name"),
        ],
    ));
    assert_all_rejected(&s, &key, cases).await;
    s.stop().await;
}

async fn reserve_rejects_wrong_types_and_out_of_range_values(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let too_big = json!(9_223_372_036_854_775_808u64);
    let cases = edits(
        "/v1/reservations",
        &reserve_base("r1"),
        vec![
            ("/estimate/amount", json!("1000"), "estimate.amount"),
            ("/estimate/amount", json!(10.5), "estimate.amount"),
            ("/estimate/amount", json!(-1), "estimate.amount"),
            ("/estimate/amount", too_big, "estimate.amount"),
            ("/estimate/unit", json!("DOLLARS"), "estimate.unit"),
            ("/subject", json!("acme"), "subject"),
            ("/subject/tenant", json!(7), "subject.tenant"),
            ("/action/tags", json!("a,b"), "action.tags"),
            ("/idempotency_key", json!(12), "idempotency_key"),
            ("/ttl_ms", json!("60000"), "ttl_ms"),
            ("/ttl_ms", json!(999), "ttl_ms"),
            ("/ttl_ms", json!(86_400_001), "ttl_ms"),
            ("/ttl_ms", json!(-1), "ttl_ms"),
            ("/grace_period_ms", json!(-1), "grace_period_ms"),
            ("/grace_period_ms", json!(60_001), "grace_period_ms"),
            ("/dry_run", json!("yes"), "dry_run"),
            ("/overage_policy", json!("SOMETIMES"), "overage_policy"),
            ("/metadata", json!("text"), "metadata"),
        ],
    );
    assert_all_rejected(&s, &key, cases).await;
    s.stop().await;
}

async fn reserve_rejects_bad_subjects_and_actions(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let seventeen: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("d{i}"), json!("v"))).collect();
    let eleven: Vec<String> = (0..11).map(|i| format!("t{i}")).collect();
    let cases = edits(
        "/v1/reservations",
        &reserve_base("r1"),
        vec![
            (
                "/subject",
                json!({"dimensions": {"run_id": "1"}}),
                "subject",
            ),
            ("/subject", json!({}), "subject"),
            ("/subject/agent", json!("a/b"), "subject.agent"),
            ("/subject/agent", json!("a:b"), "subject.agent"),
            ("/subject/agent", json!("a b"), "subject.agent"),
            ("/subject/agent", json!(""), "subject.agent"),
            (
                "/subject/workspace",
                json!("w".repeat(129)),
                "subject.workspace",
            ),
            (
                "/subject/dimensions",
                Value::Object(seventeen),
                "subject.dimensions",
            ),
            (
                "/subject/dimensions",
                json!({"k": "v".repeat(257)}),
                "subject.dimensions",
            ),
            ("/action/kind", json!("k".repeat(65)), "action.kind"),
            ("/action/name", json!("n".repeat(257)), "action.name"),
            ("/action/tags", json!(eleven), "action.tags"),
            ("/action/tags", json!(["t".repeat(65)]), "action.tags"),
        ],
    );
    assert_all_rejected(&s, &key, cases).await;
    // A dimension's key has no bound of its own (the spec bounds values): accepted, and
    // round-tripped.
    let long_key = "k".repeat(300);
    let mut body = reserve_base("r-dims");
    body["subject"]["dimensions"] = json!({ long_key.clone(): "v" });
    let r = s.post("/v1/reservations", As::Key(&key), body).await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s
        .get(&format!("/v1/reservations/{id}"), As::Key(&key))
        .await;
    assert_eq!(r.expect(200, None)["subject"]["dimensions"][&long_key], "v");
    s.stop().await;
}

async fn settlement_bodies_are_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let id = reservation(&s, &key, "r1").await;
    let path = |op: &str| format!("/v1/reservations/{id}/{op}");
    let too_big = json!(9_223_372_036_854_775_808u64);
    let long_model = json!({"model_version": "m".repeat(129)});
    let mut cases = whole(
        &path("commit"),
        vec![
            (raw(b"{"), ""),
            (raw(b""), ""),
            (Body::Json(json!({"idempotency_key": "c1"})), "actual"),
        ],
    );
    cases.extend(edits(
        &path("commit"),
        &commit_base("c1"),
        vec![
            ("/extra", json!(true), "extra"),
            ("/actual/amount", json!(-5), "actual.amount"),
            ("/actual/amount", json!("5"), "actual.amount"),
            ("/actual/amount", too_big, "actual.amount"),
            ("/actual/extra", json!(1), "actual extra"),
            (
                "/metrics",
                json!({"tokens_input": 1, "gpu": 2}),
                "metrics gpu",
            ),
            (
                "/metrics",
                json!({"tokens_input": -1}),
                "metrics.tokens_input",
            ),
            (
                "/metrics",
                json!({"latency_ms": "fast"}),
                "metrics.latency_ms",
            ),
            ("/metrics", long_model, "metrics.model_version"),
        ],
    ));
    cases.extend(whole(
        &path("extend"),
        vec![
            (raw(b"[1]"), ""),
            (Body::Json(json!({"idempotency_key": "e1"})), "extend_by_ms"),
        ],
    ));
    cases.extend(edits(
        &path("extend"),
        &extend_base("e1"),
        vec![
            ("/extend_by_ms", json!(0), "extend_by_ms"),
            ("/extend_by_ms", json!(-10), "extend_by_ms"),
            ("/extend_by_ms", json!(86_400_001), "extend_by_ms"),
            ("/extend_by_ms", json!("1000"), "extend_by_ms"),
            ("/ttl_ms", json!(1000), "ttl_ms"),
        ],
    ));
    cases.extend(whole(
        &path("release"),
        vec![(Body::Json(json!({})), "idempotency_key")],
    ));
    cases.extend(edits(
        &path("release"),
        &release_base("l1"),
        vec![
            ("/reason", json!("r".repeat(257)), "reason"),
            ("/amount", json!(1), "amount"),
        ],
    ));
    assert_all_rejected(&s, &key, cases).await;
    let g = s
        .get(&format!("/v1/reservations/{id}"), As::Key(&key))
        .await;
    let g = g.expect(200, None);
    assert_eq!(g["status"], "ACTIVE");
    assert_eq!(g["expires_at_ms"], common::T0 + 60_000, "extend applied");
    s.stop().await;
}

async fn events_and_decide_bodies_are_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let event = event_base("ev1");
    let too_big = json!(9_223_372_036_854_775_808u64);
    let mut cases = whole("/v1/events", vec![(raw(b"{]"), "")]);
    cases.extend(edits(
        "/v1/events",
        &event,
        vec![
            ("/estimate", event["actual"].clone(), "estimate"),
            ("/actual/amount", json!(-1), "actual.amount"),
            ("/actual/amount", too_big, "actual.amount"),
            ("/subject", json!({"dimensions": {"a": "b"}}), "subject"),
            ("/subject/app", json!("x/y"), "subject.app"),
            (
                "/metrics",
                json!({"tokens_output": 1, "cost": 3}),
                "metrics cost",
            ),
            ("/client_time_ms", json!(-1), "client_time_ms"),
            ("/action/kind", json!("k".repeat(65)), "action.kind"),
        ],
    ));
    cases.extend(whole("/v1/decide", vec![(raw(b""), "")]));
    cases.extend(edits(
        "/v1/decide",
        &decide_base("d1"),
        vec![
            ("/dry_run", json!(true), "dry_run"),
            ("/estimate/amount", json!(-3), "estimate.amount"),
            ("/subject/toolset", json!("a b"), "subject.toolset"),
            (
                "/action/tags",
                json!((0..11).collect::<Vec<_>>()),
                "action.tags",
            ),
        ],
    ));
    assert_all_rejected(&s, &key, cases).await;
    s.stop().await;
}

async fn idempotency_key_rules(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let id = reservation(&s, &key, "r0").await;
    let long = "k".repeat(257);
    let mut cases = Vec::new();
    for (path, base) in [
        ("/v1/reservations".to_string(), reserve_base("x")),
        ("/v1/decide".to_string(), decide_base("x")),
        ("/v1/events".to_string(), event_base("x")),
        (format!("/v1/reservations/{id}/commit"), commit_base("x")),
        (format!("/v1/reservations/{id}/release"), release_base("x")),
        (format!("/v1/reservations/{id}/extend"), extend_base("x")),
    ] {
        cases.extend(edits(
            &path,
            &base,
            vec![
                ("/idempotency_key", json!(""), "idempotency_key"),
                ("/idempotency_key", json!(long), "idempotency_key"),
            ],
        ));
    }
    assert_all_rejected(&s, &key, cases).await;

    // The header and the body must agree.
    let before = s.ledger(ROOT, USD).await;
    for (path, body) in [
        ("/v1/reservations".to_string(), reserve_base("body-key")),
        ("/v1/decide".to_string(), decide_base("body-key")),
        ("/v1/events".to_string(), event_base("body-key")),
        (
            format!("/v1/reservations/{id}/commit"),
            commit_base("body-key"),
        ),
        (
            format!("/v1/reservations/{id}/release"),
            release_base("body-key"),
        ),
        (
            format!("/v1/reservations/{id}/extend"),
            extend_base("body-key"),
        ),
    ] {
        let headers = [
            ("X-Cycles-API-Key", key.as_str()),
            ("X-Idempotency-Key", "header-key"),
        ];
        let body = Some(body.to_string().into_bytes());
        let r = send_with(&s, Method::POST, &path, &headers, body).await;
        assert_invalid(
            &r,
            "X-Idempotency-Key",
            &format!("header mismatch on {path}"),
        );
        assert_eq!(
            s.ledger(ROOT, USD).await,
            before,
            "header mismatch on {path}"
        );
    }
    // A 256-character key is fine.
    let longest = reserve_base(&"k".repeat(256));
    s.post("/v1/reservations", As::Key(&key), longest)
        .await
        .expect(200, None);
    s.stop().await;
}

/// Each range's bounds are inclusive (dry runs, so nothing is held).
async fn inclusive_limits_are_accepted(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let mut base = reserve_base("x");
    base["dry_run"] = json!(true);
    let sixteen: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("d{i}"), json!("v".repeat(256))))
        .collect();
    let ten: Vec<String> = (0..10).map(|_| "t".repeat(64)).collect();
    let fine = [
        ("/ttl_ms", json!(1_000)),
        ("/ttl_ms", json!(86_400_000)),
        ("/grace_period_ms", json!(0)),
        ("/grace_period_ms", json!(60_000)),
        ("/estimate/amount", json!(0)),
        ("/subject/agent", json!("A-z_0.9")),
        ("/subject/workspace", json!("w".repeat(128))),
        ("/subject/dimensions", Value::Object(sixteen)),
        ("/action/kind", json!("k".repeat(64))),
        ("/action/tags", json!(ten)),
    ];
    for (i, (pointer, value)) in fine.into_iter().enumerate() {
        let mut body = patched(&base, pointer, value);
        body["idempotency_key"] = json!(format!("ok-{i}"));
        let r = s.post("/v1/reservations", As::Key(&key), body).await;
        assert_eq!(r.status, 200, "{pointer}: {}", r.body);
        assert_eq!(r.body["decision"], "ALLOW", "{pointer}: {}", r.body);
    }
    let id = reservation(&s, &key, "live").await;
    for (i, by) in [1, 86_400_000].into_iter().enumerate() {
        s.post(
            &format!("/v1/reservations/{id}/extend"),
            As::Key(&key),
            json!({"idempotency_key": format!("e{i}"), "extend_by_ms": by}),
        )
        .await
        .expect(200, None);
    }
    s.stop().await;
}

async fn oversized_body_is_rejected(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    // Refused from its declared length while the client still sends it, each followed on
    // the same pooled client by a request that must find a connection that works.
    let sizes = [300 * 1024, 2 * 1024 * 1024].repeat(8);
    let bodies = sizes.iter().map(|size| {
        let mut body = reserve_base("big");
        body["metadata"] = json!({"blob": "x".repeat(*size)});
        (raw(body.to_string().as_bytes()), "")
    });
    let cases = whole("/v1/reservations", bodies.collect());
    assert_all_rejected(&s, &key, cases).await;
    // Just under the limit is accepted.
    let mut body = reserve_base("almost");
    body["metadata"] = json!({"blob": "x".repeat(250 * 1024)});
    s.post("/v1/reservations", As::Key(&key), body)
        .await
        .expect(200, None);
    s.stop().await;
}

async fn long_reservation_id_is_rejected(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let before = s.ledger(ROOT, USD).await;
    let long = "r".repeat(129);
    for (path, body) in [
        (
            format!("/v1/reservations/{long}/commit"),
            Some(commit_base("c")),
        ),
        (
            format!("/v1/reservations/{long}/release"),
            Some(release_base("l")),
        ),
        (
            format!("/v1/reservations/{long}/extend"),
            Some(extend_base("e")),
        ),
        (format!("/v1/reservations/{long}"), None),
    ] {
        let r = match body {
            Some(b) => s.post(&path, As::Key(&key), b).await,
            None => s.get(&path, As::Key(&key)).await,
        };
        assert_invalid(&r, "reservation_id", &path);
    }
    // 128 characters is a valid id that does not exist.
    let r = s
        .get(
            &format!("/v1/reservations/{}", "r".repeat(128)),
            As::Key(&key),
        )
        .await;
    r.expect(404, Some("NOT_FOUND"));
    assert_error_envelope(&r);
    assert_eq!(s.ledger(ROOT, USD).await, before);
    s.stop().await;
}

async fn balance_queries_are_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    for (query, names) in [
        ("", "tenant"),
        ("?limit=10", "tenant"),
        ("?tenant=", "tenant"),
        ("?include_children=true", "tenant"),
        ("?tenant=acme&limit=0", "limit"),
        ("?tenant=acme&limit=201", "limit"),
        ("?tenant=acme&limit=x", "limit"),
        ("?tenant=acme&limit=-1", "limit"),
        ("?tenant=acme&cursor=zz", "cursor"),
        ("?tenant=acme&cursor=6e6f706521", "cursor"),
        ("?tenant=acme&include_children=maybe", "include_children"),
    ] {
        let r = s.get(&format!("/v1/balances{query}"), As::Key(&key)).await;
        assert_invalid(&r, names, &format!("GET /v1/balances{query}"));
    }
    // Bounds are inclusive; parameters the server does not implement are ignored.
    for query in [
        "?tenant=acme&limit=1",
        "?tenant=acme&limit=200",
        "?app=x",
        "?tenant=acme&include_children=true",
        "?tenant=acme&unknown_param=1",
    ] {
        s.get(&format!("/v1/balances{query}"), As::Key(&key))
            .await
            .expect(200, None);
    }
    s.stop().await;
}

/// A documented scalar query parameter given twice or given empty is 400 INVALID_REQUEST
/// naming it, on every operation that takes one (credentials are still checked first); a
/// list parameter takes repeats and empty items, and undocumented parameters stay ignored.
async fn repeated_or_empty_query_parameters_are_refused_by_name(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let before = s.ledger(ROOT, USD).await;
    let with_key = [
        ("GET /v1/balances?tenant=acme&limit=1&limit=2", "limit"),
        ("GET /v1/balances?tenant=acme&tenant=acme", "tenant"),
        (
            "GET /v1/balances?tenant=acme&include_children=",
            "include_children",
        ),
        // A blank window bound is unset (the spec); a repeated one is refused.
        ("GET /v1/reservations?to=&to=", "to"),
        ("GET /v1/reservations?limit=%20", "limit"),
        (
            "GET /v1/reservations?sort_dir=asc&sort_dir=desc",
            "sort_dir",
        ),
        ("GET /v1/admin/policies?limit=", "limit"),
    ];
    let with_admin = [
        ("GET /v1/admin/budgets?tenant_id=acme&status=", "status"),
        (
            "GET /v1/admin/budgets/lookup?scope=a&scope=b&unit=TOKENS",
            "scope",
        ),
        (
            "GET /v1/admin/budgets/lookup?scope=tenant:acme&unit=",
            "unit",
        ),
        (
            "POST /v1/admin/budgets/fund?scope=tenant:acme&unit=TOKENS&tenant_id=",
            "tenant_id",
        ),
        (
            "POST /v1/admin/budgets/freeze?scope=a&unit=TOKENS&unit=TOKENS",
            "unit",
        ),
        (
            "DELETE /v1/admin/api-keys/probe?reason=a&reason=b",
            "reason",
        ),
    ];
    // POSTs carry a valid funding body: only the query is wrong.
    let fund = json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": 1}});
    for (who, cases) in [(As::Key(&key), &with_key[..]), (As::Admin, &with_admin[..])] {
        for (request, name) in cases {
            let (method, path) = request.split_once(' ').expect("METHOD path");
            let method = Method::from_bytes(method.as_bytes()).expect("a method");
            let body = (method == Method::POST).then_some(&fund);
            let r = s.send(method.clone(), path, who, body).await;
            assert_invalid(&r, name, request);
            let message = r.body["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with(&format!("{name}: ")),
                "{request}: {message}"
            );
            // Credentials are checked first.
            let anonymous = s.send(method, path, As::Nobody, body).await;
            anonymous.expect(401, Some("UNAUTHORIZED"));
        }
    }
    assert_eq!(s.ledger(ROOT, USD).await, before);
    for path in [
        "/v1/balances?tenant=acme&color=a&color=&color=b",
        "/v1/reservations?include=metadata&include=committed_metadata,&include=",
    ] {
        s.get(path, As::Key(&key)).await.expect(200, None);
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------
// Error bodies and correlation
// ---------------------------------------------------------------------------------------

async fn error_bodies_carry_the_correlation_ids(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let errors = [
        s.post("/v1/reservations", As::Nobody, reserve_base("a"))
            .await,
        s.post("/v1/reservations", As::Key("nope"), reserve_base("a"))
            .await,
        s.post_raw("/v1/reservations", As::Key(&key), b"{".to_vec())
            .await,
        s.get("/v1/reservations/missing", As::Key(&key)).await,
        s.post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("big", json!({"tenant": "acme"}), 5_000_000),
        )
        .await,
        s.get(
            "/v1/admin/budgets/lookup?scope=tenant:acme&unit=USD_MICROCENTS",
            As::Nobody,
        )
        .await,
    ];
    let expected = [
        (401, "UNAUTHORIZED"),
        (401, "UNAUTHORIZED"),
        (400, "INVALID_REQUEST"),
        (404, "NOT_FOUND"),
        (409, "BUDGET_EXCEEDED"),
        (401, "UNAUTHORIZED"),
    ];
    let mut request_ids = Vec::new();
    for (r, (status, code)) in errors.iter().zip(expected) {
        r.expect(status, Some(code));
        assert_error_envelope(r);
        request_ids.push(r.body["request_id"].as_str().unwrap().to_string());
    }
    request_ids.sort();
    request_ids.dedup();
    assert_eq!(
        request_ids.len(),
        errors.len(),
        "request ids are not unique"
    );
    // Success responses carry both headers too.
    let ok = s.get("/v1/balances?tenant=acme", As::Key(&key)).await;
    ok.expect(200, None);
    assert!(ok.header("x-request-id").is_some_and(|v| !v.is_empty()));
    assert!(ok.header("x-cycles-trace-id").is_some_and(is_trace_id));
    s.stop().await;
}

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// Sends a success and an error request with these extra headers and checks the trace id the
/// server used: `want`, or (for `None`) a freshly generated one per request. Neither request
/// may be rejected because of the headers, and the error body's `trace_id` equals its header.
async fn assert_trace(s: &TestServer, key: &str, extra: &[(&str, &str)], want: Option<&str>) {
    let mut headers = vec![("X-Cycles-API-Key", key)];
    headers.extend_from_slice(extra);
    let ok = send_with(s, Method::GET, "/v1/balances?tenant=acme", &headers, None).await;
    assert_eq!(ok.status, 200, "{extra:?} was rejected: {}", ok.body);
    let err = send_with(s, Method::GET, "/v1/reservations/nope", &headers, None).await;
    err.expect(404, Some("NOT_FOUND"));
    assert_error_envelope(&err);
    let used = [
        ok.header("x-cycles-trace-id").unwrap_or_default(),
        err.header("x-cycles-trace-id").unwrap_or_default(),
    ];
    match want {
        Some(want) => assert_eq!(used, [want, want], "{extra:?}"),
        None => {
            assert!(used.iter().all(|t| is_trace_id(t)), "{extra:?}: {used:?}");
            assert_ne!(used[0], used[1], "{extra:?}: generated trace ids repeat");
            for (_, inbound) in extra {
                let inbound = inbound.to_lowercase();
                assert!(
                    !used.iter().any(|t| inbound.contains(t)),
                    "{extra:?}: a malformed header was used: {used:?}"
                );
            }
        }
    }
}

async fn trace_id_precedence(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let span = "00f067aa0ba902b7";
    let zeros32 = "0".repeat(32);
    let tp = traceparent(TRACE, span);
    let x = ("X-Cycles-Trace-Id", OTHER_TRACE);
    // Valid headers: traceparent wins over X-Cycles-Trace-Id.
    assert_trace(&s, &key, &[("traceparent", &tp)], Some(TRACE)).await;
    assert_trace(&s, &key, &[x], Some(OTHER_TRACE)).await;
    assert_trace(&s, &key, &[("traceparent", &tp), x], Some(TRACE)).await;
    // A malformed traceparent is ignored: the valid X-Cycles-Trace-Id is used.
    let bad_traceparents = [
        "garbage".to_string(),
        String::new(),
        traceparent(&zeros32, span),
        traceparent(TRACE, "0000000000000000"),
        traceparent(&TRACE.to_uppercase(), span),
        traceparent(&TRACE[..31], span),
        format!("00-{TRACE}-{span}"),
    ];
    for bad_tp in &bad_traceparents {
        assert_trace(&s, &key, &[("traceparent", bad_tp), x], Some(OTHER_TRACE)).await;
        assert_trace(&s, &key, &[("traceparent", bad_tp)], None).await;
    }
    // A malformed X-Cycles-Trace-Id (uppercase, zero, wrong length, not hex) is ignored.
    let upper = OTHER_TRACE.to_uppercase();
    for bad_x in [&upper, &zeros32, &OTHER_TRACE[..31], "zz", "not a trace id"] {
        assert_trace(&s, &key, &[("X-Cycles-Trace-Id", bad_x)], None).await;
    }
    // Without any header a fresh id is generated per request.
    assert_trace(&s, &key, &[], None).await;
    s.stop().await;
}

async fn unknown_route_is_a_json_not_found(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    for (method, path) in [
        (Method::GET, "/v1/nope"),
        (Method::POST, "/v1/reservations/abc/finish"),
        (Method::GET, "/"),
        (Method::GET, "/v2/reservations"),
    ] {
        let r = send_with(&s, method, path, &[("X-Cycles-API-Key", &key)], None).await;
        r.expect(404, Some("NOT_FOUND"));
        assert_error_envelope(&r);
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------
// Units and missing budgets
// ---------------------------------------------------------------------------------------

async fn reserve_in_another_unit_is_unit_mismatch_with_details(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let before = s.ledger(ROOT, USD).await;
    let mut reserve = reserve_base("r1");
    reserve["estimate"]["unit"] = json!("TOKENS");
    let mut dry = reserve_base("r2");
    dry["estimate"]["unit"] = json!("TOKENS");
    dry["dry_run"] = json!(true);
    let mut decide = decide_base("d1");
    decide["estimate"]["unit"] = json!("TOKENS");
    let mut event = event_base("e1");
    event["actual"]["unit"] = json!("TOKENS");
    for (path, body) in [
        ("/v1/reservations", reserve),
        ("/v1/reservations", dry),
        ("/v1/decide", decide),
        ("/v1/events", event),
    ] {
        let r = s.post(path, As::Key(&key), body).await;
        r.expect(400, Some("UNIT_MISMATCH"));
        assert_error_envelope(&r);
        assert_eq!(
            r.body["details"],
            json!({
                "scope": "tenant:acme",
                "requested_unit": "TOKENS",
                "expected_units": ["USD_MICROCENTS"],
            }),
            "{path}"
        );
        assert_eq!(s.ledger(ROOT, USD).await, before, "{path}");
    }
    s.stop().await;
}

async fn reserve_without_any_budget_is_not_found(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant("acme").await;
    let key = s.key("acme").await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r1", json!({"tenant": "acme", "agent": "bot"}), 10),
        )
        .await;
    r.expect(404, Some("NOT_FOUND"));
    assert_error_envelope(&r);
    let message = r.body["message"].as_str().unwrap();
    assert!(
        message.starts_with("Budget not found for provided scope"),
        "message: {message}"
    );
    assert_eq!(r.header("x-cycles-tenant"), Some("acme"));
    // The same request as an event is also 404; as a dry run or a decide it is a DENY.
    let mut event = event_base("e1");
    event["subject"] = json!({"tenant": "acme", "agent": "bot"});
    let e = s.post("/v1/events", As::Key(&key), event).await;
    e.expect(404, Some("NOT_FOUND"));
    assert_error_envelope(&e);
    assert_eq!(e.header("x-cycles-tenant"), Some("acme"));
    let mut dry = reserve_body("r2", json!({"tenant": "acme"}), 10);
    dry["dry_run"] = json!(true);
    let d = s.post("/v1/reservations", As::Key(&key), dry).await;
    let d = d.expect(200, None);
    assert_eq!(
        (&d["decision"], &d["reason_code"]),
        (&json!("DENY"), &json!("BUDGET_NOT_FOUND"))
    );
    s.stop().await;
}

async fn commit_in_another_unit_is_unit_mismatch(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let id = reservation(&s, &key, "r1").await;
    let before = s.ledger(ROOT, USD).await;
    let path = format!("/v1/reservations/{id}/commit");
    let r = s
        .post(
            &path,
            As::Key(&key),
            json!({"idempotency_key": "c1", "actual": {"unit": "TOKENS", "amount": 10}}),
        )
        .await;
    r.expect(400, Some("UNIT_MISMATCH"));
    assert_error_envelope(&r);
    assert_eq!(s.ledger(ROOT, USD).await, before);
    let g = s
        .get(&format!("/v1/reservations/{id}"), As::Key(&key))
        .await;
    assert_eq!(g.expect(200, None)["status"], "ACTIVE");
    // The reservation is still settleable in its own unit.
    s.post(&path, As::Key(&key), commit_base("c2"))
        .await
        .expect(200, None);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------
// Success bodies
// ---------------------------------------------------------------------------------------

async fn success_bodies_match_the_client_schemas(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    s.budget("tenant:acme/agent:bot", USD, 300_000, json!({}))
        .await;
    let bot = json!({"tenant": "acme", "agent": "bot", "dimensions": {"run_id": "7"}});
    let k = As::Key(&key);

    let live = s
        .post(
            "/v1/reservations",
            k,
            reserve_body("r1", bot.clone(), 100_000),
        )
        .await;
    let live = assert_success_schema(&live, 200, CREATE_KEYS, "create");
    for f in [
        "reservation_id",
        "expires_at_ms",
        "remaining_ttl_ms",
        "reserved",
    ] {
        assert!(live.get(f).is_some(), "create lacks {f}: {live}");
    }
    let id = live["reservation_id"].as_str().unwrap().to_string();
    let replay = s
        .post(
            "/v1/reservations",
            k,
            reserve_body("r1", bot.clone(), 100_000),
        )
        .await;
    assert_success_schema(&replay, 200, CREATE_KEYS, "create replay");

    for (idem, estimate, decision) in [("dry-ok", 10, "ALLOW"), ("dry-no", 900_000, "DENY")] {
        let mut body = reserve_body(idem, bot.clone(), estimate);
        body["dry_run"] = json!(true);
        let dry = s.post("/v1/reservations", k, body).await;
        let dry = assert_success_schema(&dry, 200, CREATE_KEYS, "dry run");
        assert_eq!(dry["decision"], decision);
        for f in ["reservation_id", "expires_at_ms", "remaining_ttl_ms"] {
            assert!(dry.get(f).is_none(), "dry run has {f}: {dry}");
        }
        assert!(dry["affected_scopes"].is_array(), "dry run: {dry}");
        assert_eq!(
            dry.get("reason_code").is_some(),
            decision == "DENY",
            "{dry}"
        );
    }

    let ext = s
        .post(
            &format!("/v1/reservations/{id}/extend"),
            k,
            extend_base("e1"),
        )
        .await;
    assert_success_schema(&ext, 200, EXTEND_KEYS, "extend");

    let detail = s.get(&format!("/v1/reservations/{id}"), k).await;
    assert_no_nulls(detail.expect(200, None), "detail");

    let commit = s
        .post(
            &format!("/v1/reservations/{id}/commit"),
            k,
            json!({"idempotency_key": "c1", "actual": {"unit": USD, "amount": 40_000},
                   "metrics": {"tokens_input": 1, "latency_ms": 0}}),
        )
        .await;
    let commit = assert_success_schema(&commit, 200, COMMIT_KEYS, "commit");
    assert_eq!(commit["released"], json!({"unit": USD, "amount": 60_000}));

    let other = reservation(&s, &key, "r2").await;
    let rel = s
        .post(
            &format!("/v1/reservations/{other}/release"),
            k,
            release_base("l1"),
        )
        .await;
    assert_success_schema(&rel, 200, RELEASE_KEYS, "release");

    let dec = s.post("/v1/decide", k, decide_base("d1")).await;
    assert_success_schema(&dec, 200, DECIDE_KEYS, "decide");

    let mut event = event_base("ev1");
    event["subject"] = bot.clone();
    let ev = s.post("/v1/events", k, event).await;
    assert_success_schema(&ev, 201, EVENT_KEYS, "event");
    // An event capped by ALLOW_IF_AVAILABLE reports `charged`.
    let mut capped = event_base("ev2");
    capped["subject"] = bot;
    capped["actual"]["amount"] = json!(10_000_000);
    let capped = s.post("/v1/events", k, capped).await;
    let capped = assert_success_schema(&capped, 201, EVENT_KEYS, "capped event");
    assert!(capped.get("charged").is_some(), "capped event: {capped}");

    let bal = s.get("/v1/balances?tenant=acme", k).await;
    let bal = assert_success_schema(
        &bal,
        200,
        &["balances", "next_cursor", "has_more"],
        "balances",
    );
    assert_eq!(bal["balances"].as_array().map(Vec::len), Some(2), "{bal}");
    s.stop().await;
}

/// The request schemas declare typed, non-nullable fields, so a JSON `null` is a schema
/// violation (400 INVALID_REQUEST), not an absent field.
async fn null_field_values_are_rejected(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = acme(&s).await;
    let cases = edits(
        "/v1/reservations",
        &reserve_base("r1"),
        vec![
            ("/ttl_ms", Value::Null, "ttl_ms"),
            ("/grace_period_ms", Value::Null, "grace_period_ms"),
            ("/dry_run", Value::Null, "dry_run"),
            ("/overage_policy", Value::Null, "overage_policy"),
            ("/metadata", Value::Null, "metadata"),
            ("/subject/workspace", Value::Null, "subject.workspace"),
            ("/action/tags", Value::Null, "action.tags"),
        ],
    );
    assert_all_rejected(&s, &key, cases).await;
    s.stop().await;
}
