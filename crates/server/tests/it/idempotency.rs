//! Idempotency over HTTP: replays return the original response and charge once, different
//! payloads under one key conflict, namespaces are per endpoint (and per reservation), and
//! failures are not remembered.

use crate::common::{self, amount, reserve_body, As, Engine, Resp, TestServer};
use serde_json::{json, Value};

engine_tests!(
    reserve_replay_returns_the_original_and_holds_once,
    commit_replay_returns_the_original_and_charges_once,
    release_replay_returns_the_original,
    extend_replay_returns_the_original_and_extends_once,
    event_replay_returns_the_original_and_charges_once,
    decide_and_dry_run_replays_return_the_original,
    different_payload_is_a_mismatch_everywhere,
    dry_run_and_live_share_the_reserve_namespace,
    json_formatting_does_not_matter,
    commit_key_may_be_reused_for_an_event,
    same_commit_key_on_two_reservations_commits_both,
    failed_requests_are_re_evaluated,
    keys_are_scoped_per_tenant_not_per_api_key,
);

const USD: &str = "USD_MICROCENTS";
const ROOT: &str = "tenant:acme";

fn subject() -> Value {
    json!({"tenant": "acme"})
}

fn event_body(key: &str, actual: i64) -> Value {
    json!({
        "idempotency_key": key,
        "subject": subject(),
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "actual": {"unit": USD, "amount": actual},
    })
}

fn commit_body(key: &str, actual: i64) -> Value {
    json!({"idempotency_key": key, "actual": {"unit": USD, "amount": actual}})
}

fn extend_body(key: &str, by: i64) -> Value {
    json!({"idempotency_key": key, "extend_by_ms": by})
}

fn release_body(key: &str, reason: &str) -> Value {
    json!({"idempotency_key": key, "reason": reason})
}

fn op_path(id: &str, op: &str) -> String {
    format!("/v1/reservations/{id}/{op}")
}

/// A server with tenant `acme`, its key, and a root budget of `allocated`.
async fn acme(engine: Engine, allocated: i64) -> (TestServer, String) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", allocated).await;
    (s, key)
}

async fn post(s: &TestServer, key: &str, path: &str, body: Value) -> Resp {
    s.post(path, As::Key(key), body).await
}

/// Reserves with `body`; returns the whole 200 body.
async fn reserve(s: &TestServer, key: &str, body: Value) -> Value {
    post(s, key, "/v1/reservations", body)
        .await
        .expect(200, None)
        .clone()
}

fn id_of(body: &Value) -> String {
    body["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

/// The body without the volatile `remaining_ttl_ms`.
fn stable(body: &Value) -> Value {
    let mut b = body.clone();
    if let Some(obj) = b.as_object_mut() {
        obj.remove("remaining_ttl_ms");
    }
    b
}

/// Sends `body` again and checks the replay is the original (apart from `remaining_ttl_ms`,
/// which must be `ttl`); returns the replay.
async fn assert_replay(
    s: &TestServer,
    key: &str,
    path: &str,
    body: Value,
    original: &Value,
    status: u16,
    ttl: Option<i64>,
) -> Value {
    let r = post(s, key, path, body).await;
    let replay = r.expect(status, None).clone();
    assert_eq!(
        stable(&replay),
        stable(original),
        "replay of {path} differs"
    );
    assert_eq!(
        replay.get("remaining_ttl_ms").and_then(Value::as_i64),
        ttl,
        "remaining_ttl_ms of the replay of {path}: {replay}"
    );
    replay
}

/// `(allocated, reserved, spent, remaining)` of the root budget.
async fn totals(s: &TestServer) -> (i64, i64, i64, i64) {
    let b = s.ledger(ROOT, USD).await;
    (
        amount(&b, "allocated"),
        amount(&b, "reserved"),
        amount(&b, "spent"),
        amount(&b, "remaining"),
    )
}

async fn detail(s: &TestServer, key: &str, id: &str) -> Value {
    s.get(&format!("/v1/reservations/{id}"), As::Key(key))
        .await
        .expect(200, None)
        .clone()
}

async fn assert_mismatch(s: &TestServer, key: &str, path: &str, body: Value) {
    let before = s.ledger(ROOT, USD).await;
    let r = post(s, key, path, body).await;
    r.expect(409, Some("IDEMPOTENCY_MISMATCH"));
    assert_eq!(
        s.ledger(ROOT, USD).await,
        before,
        "{path}: a mismatch changed the budget"
    );
}

async fn fund(s: &TestServer, credit: i64) {
    let r = s
        .post(
            &format!("/v1/admin/budgets/fund?scope={ROOT}&unit={USD}&tenant_id=acme"),
            As::Admin,
            json!({"operation": "CREDIT", "amount": {"unit": USD, "amount": credit}}),
        )
        .await;
    r.expect(200, None);
}

async fn reserve_replay_returns_the_original_and_holds_once(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let body = reserve_body("r1", subject(), 300);
    let original = reserve(&s, &key, body.clone()).await;
    assert_eq!(original["remaining_ttl_ms"], 60_000);
    let id = id_of(&original);
    let p = "/v1/reservations";
    assert_replay(&s, &key, p, body.clone(), &original, 200, Some(60_000)).await;
    s.advance(1_500);
    assert_replay(&s, &key, p, body.clone(), &original, 200, Some(58_500)).await;
    assert_eq!(totals(&s).await, (1_000, 300, 0, 700), "held twice");
    // Still the original after the reservation is committed: now with no lease left.
    post(&s, &key, &op_path(&id, "commit"), commit_body("c1", 100))
        .await
        .expect(200, None);
    assert_replay(&s, &key, p, body.clone(), &original, 200, Some(0)).await;
    assert_eq!(totals(&s).await, (1_000, 0, 100, 900));
    // And after the lease has long passed.
    s.advance(3_600_000);
    assert_replay(&s, &key, p, body, &original, 200, Some(0)).await;
    assert_eq!(totals(&s).await, (1_000, 0, 100, 900));
    s.stop().await;
}

async fn commit_replay_returns_the_original_and_charges_once(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let id = id_of(&reserve(&s, &key, reserve_body("r1", subject(), 300)).await);
    let path = op_path(&id, "commit");
    let body = commit_body("c1", 120);
    let original = post(&s, &key, &path, body.clone())
        .await
        .expect(200, None)
        .clone();
    assert_eq!(amount(&original, "charged"), 120);
    for _ in 0..2 {
        assert_replay(&s, &key, &path, body.clone(), &original, 200, None).await;
    }
    assert_eq!(totals(&s).await, (1_000, 0, 120, 880), "charged twice");
    // The replay outlives the reservation's own grace period.
    s.advance(600_000);
    assert_replay(&s, &key, &path, body, &original, 200, None).await;
    assert_eq!(detail(&s, &key, &id).await["status"], "COMMITTED");
    // Another key on the finalized reservation is not a replay.
    post(&s, &key, &path, commit_body("c2", 120))
        .await
        .expect(409, Some("RESERVATION_FINALIZED"));
    assert_eq!(totals(&s).await, (1_000, 0, 120, 880));
    s.stop().await;
}

async fn release_replay_returns_the_original(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let id = id_of(&reserve(&s, &key, reserve_body("r1", subject(), 300)).await);
    let path = op_path(&id, "release");
    let body = release_body("l1", "done");
    let original = post(&s, &key, &path, body.clone())
        .await
        .expect(200, None)
        .clone();
    assert_eq!(original["status"], "RELEASED");
    s.advance(10_000);
    assert_replay(&s, &key, &path, body, &original, 200, None).await;
    assert_eq!(totals(&s).await, (1_000, 0, 0, 1_000), "released twice");
    s.stop().await;
}

async fn extend_replay_returns_the_original_and_extends_once(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let mut create = reserve_body("r1", subject(), 300);
    create["ttl_ms"] = json!(10_000);
    let id = id_of(&reserve(&s, &key, create).await);
    let path = op_path(&id, "extend");
    s.advance(2_000);
    let body = extend_body("e1", 5_000);
    let original = post(&s, &key, &path, body.clone())
        .await
        .expect(200, None)
        .clone();
    let expires = common::T0 + 15_000;
    assert_eq!(
        (&original["expires_at_ms"], &original["remaining_ttl_ms"]),
        (&json!(expires), &json!(13_000))
    );
    s.advance(1_000);
    assert_replay(&s, &key, &path, body.clone(), &original, 200, Some(12_000)).await;
    assert_eq!(detail(&s, &key, &id).await["expires_at_ms"], expires);
    // A different key extends again, from the current expiry.
    post(&s, &key, &path, extend_body("e2", 5_000))
        .await
        .expect(200, None);
    assert_eq!(
        detail(&s, &key, &id).await["expires_at_ms"],
        expires + 5_000
    );
    // Once committed, the replay is still the original, with no lease left.
    post(&s, &key, &op_path(&id, "commit"), commit_body("c1", 300))
        .await
        .expect(200, None);
    assert_replay(&s, &key, &path, body, &original, 200, Some(0)).await;
    s.stop().await;
}

async fn event_replay_returns_the_original_and_charges_once(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let body = event_body("ev1", 250);
    let original = post(&s, &key, "/v1/events", body.clone())
        .await
        .expect(201, None)
        .clone();
    assert_eq!(original["status"], "APPLIED");
    s.advance(60_000);
    let replay = assert_replay(&s, &key, "/v1/events", body, &original, 201, None).await;
    assert_eq!(replay["event_id"], original["event_id"]);
    assert_eq!(totals(&s).await, (1_000, 0, 250, 750), "charged twice");
    s.stop().await;
}

/// DENY decisions are 200 successes: they replay too, even after the budget has changed.
async fn decide_and_dry_run_replays_return_the_original(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let decide = reserve_body("d1", subject(), 5_000);
    let mut dry = reserve_body("dry1", subject(), 5_000);
    dry["dry_run"] = json!(true);
    let cases = [("/v1/decide", decide), ("/v1/reservations", dry)];
    let mut originals = Vec::new();
    for (path, body) in &cases {
        let original = post(&s, &key, path, body.clone())
            .await
            .expect(200, None)
            .clone();
        assert_eq!(
            (&original["decision"], &original["reason_code"]),
            (&json!("DENY"), &json!("BUDGET_EXCEEDED")),
            "{path}"
        );
        originals.push(original);
    }
    fund(&s, 10_000).await;
    for ((path, body), original) in cases.into_iter().zip(&originals) {
        assert_replay(&s, &key, path, body, original, 200, None).await;
    }
    assert_eq!(totals(&s).await, (11_000, 0, 0, 11_000));
    s.stop().await;
}

async fn different_payload_is_a_mismatch_everywhere(engine: Engine) {
    let (s, key) = acme(engine, 10_000).await;
    let id = id_of(&reserve(&s, &key, reserve_body("r1", subject(), 300)).await);
    let other = id_of(&reserve(&s, &key, reserve_body("r2", subject(), 300)).await);
    let (commit, release, extend) = (
        op_path(&id, "commit"),
        op_path(&other, "release"),
        op_path(&other, "extend"),
    );
    let firsts = [
        (commit.as_str(), commit_body("k", 100)),
        (extend.as_str(), extend_body("k", 1_000)),
        (release.as_str(), release_body("k", "first")),
        ("/v1/events", event_body("k", 50)),
        ("/v1/decide", reserve_body("k", subject(), 10)),
    ];
    for (path, body) in firsts {
        let r = post(&s, &key, path, body).await;
        assert!(r.status == 200 || r.status == 201, "{path}: {}", r.body);
    }
    let mut tagged = reserve_body("r1", subject(), 300);
    tagged["action"]["tags"] = json!(["x"]);
    let mut longer = reserve_body("r1", subject(), 300);
    longer["ttl_ms"] = json!(30_000);
    let seconds = [
        ("/v1/reservations", reserve_body("r1", subject(), 301)),
        ("/v1/reservations", tagged),
        ("/v1/reservations", longer),
        (commit.as_str(), commit_body("k", 101)),
        (extend.as_str(), extend_body("k", 2_000)),
        (release.as_str(), release_body("k", "second")),
        ("/v1/events", event_body("k", 51)),
        ("/v1/decide", reserve_body("k", subject(), 11)),
    ];
    for (path, body) in seconds {
        assert_mismatch(&s, &key, path, body).await;
    }
    s.stop().await;
}

async fn dry_run_and_live_share_the_reserve_namespace(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let live = reserve_body("live", subject(), 100);
    reserve(&s, &key, live.clone()).await;
    let mut flipped = live;
    flipped["dry_run"] = json!(true);
    assert_mismatch(&s, &key, "/v1/reservations", flipped).await;

    let mut dry = reserve_body("dry", subject(), 100);
    dry["dry_run"] = json!(true);
    let evaluation = reserve(&s, &key, dry.clone()).await;
    assert!(evaluation.get("reservation_id").is_none(), "{evaluation}");
    // A dry run is never upgraded into a live reservation under its key.
    dry["dry_run"] = json!(false);
    assert_mismatch(&s, &key, "/v1/reservations", dry.clone()).await;
    dry.as_object_mut().unwrap().remove("dry_run");
    assert_mismatch(&s, &key, "/v1/reservations", dry).await;
    assert_eq!(totals(&s).await, (1_000, 100, 0, 900));
    s.stop().await;
}

async fn json_formatting_does_not_matter(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let original = reserve(&s, &key, reserve_body("r1", subject(), 300)).await;
    let id = id_of(&original);
    let reordered = br#"
        {  "estimate" : { "amount" : 300, "unit" : "USD_MICROCENTS" },
           "action"   : { "name" : "gpt-4o-mini", "kind" : "llm.completion" },
           "subject"  : { "tenant" : "acme" },
           "idempotency_key" : "r1"  }
    "#;
    let r = s
        .post_raw("/v1/reservations", As::Key(&key), reordered.to_vec())
        .await;
    assert_eq!(stable(r.expect(200, None)), stable(&original));
    assert_eq!(totals(&s).await, (1_000, 300, 0, 700), "held twice");

    let path = op_path(&id, "commit");
    let committed = post(
        &s,
        &key,
        &path,
        json!({"idempotency_key": "c1", "actual": {"unit": USD, "amount": 120},
               "metrics": {"tokens_input": 5, "custom": {"b": 2, "a": [1, {"y": 0, "x": 1}]}}}),
    )
    .await
    .expect(200, None)
    .clone();
    let spaced = br#"{"metrics":{"custom":{"a":[1,{"x":1,"y":0}],"b":2},"tokens_input":5},
        "actual":{"amount":120,"unit":"USD_MICROCENTS"},"idempotency_key":"c1"}"#;
    let r = s.post_raw(&path, As::Key(&key), spaced.to_vec()).await;
    assert_eq!(r.expect(200, None), &committed);
    assert_eq!(totals(&s).await, (1_000, 0, 120, 880), "charged twice");
    s.stop().await;
}

/// The SDKs' expired-commit recovery: after a 410 they post the commit's key to
/// `/v1/events`, which is a separate namespace.
async fn commit_key_may_be_reused_for_an_event(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let mut create = reserve_body("r1", subject(), 300);
    create["ttl_ms"] = json!(1_000);
    create["grace_period_ms"] = json!(0);
    let id = id_of(&reserve(&s, &key, create).await);
    s.advance(2_000);
    let commit = op_path(&id, "commit");
    post(&s, &key, &commit, commit_body("settle-1", 200))
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    let event = post(&s, &key, "/v1/events", event_body("settle-1", 200)).await;
    assert_eq!(event.expect(201, None)["status"], "APPLIED");
    assert_eq!(totals(&s).await, (1_000, 0, 200, 800));
    // The commit is still refused (the event did not make it a replay).
    post(&s, &key, &commit, commit_body("settle-1", 200))
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));

    // A key used by a successful commit may also be used for an event.
    let id = id_of(&reserve(&s, &key, reserve_body("r2", subject(), 100)).await);
    post(&s, &key, &op_path(&id, "commit"), commit_body("both", 100))
        .await
        .expect(200, None);
    post(&s, &key, "/v1/events", event_body("both", 50))
        .await
        .expect(201, None);
    assert_eq!(totals(&s).await, (1_000, 0, 350, 650));
    s.stop().await;
}

async fn same_commit_key_on_two_reservations_commits_both(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let a = id_of(&reserve(&s, &key, reserve_body("ra", subject(), 300)).await);
    let b = id_of(&reserve(&s, &key, reserve_body("rb", subject(), 300)).await);
    for id in [&a, &b] {
        let r = post(&s, &key, &op_path(id, "commit"), commit_body("same", 100)).await;
        assert_eq!(r.expect(200, None)["status"], "COMMITTED", "{id}");
        assert_eq!(detail(&s, &key, id).await["status"], "COMMITTED");
    }
    assert_eq!(totals(&s).await, (1_000, 0, 200, 800));
    // The same holds for release and extend keys.
    let c = id_of(&reserve(&s, &key, reserve_body("rc", subject(), 10)).await);
    let d = id_of(&reserve(&s, &key, reserve_body("rd", subject(), 10)).await);
    for id in [&c, &d] {
        post(&s, &key, &op_path(id, "extend"), extend_body("same", 1_000))
            .await
            .expect(200, None);
        post(&s, &key, &op_path(id, "release"), release_body("same", "x"))
            .await
            .expect(200, None);
        assert_eq!(detail(&s, &key, id).await["status"], "RELEASED");
    }
    s.stop().await;
}

/// Only successes are remembered: a retry of a refused request is evaluated afresh.
async fn failed_requests_are_re_evaluated(engine: Engine) {
    let (s, key) = acme(engine, 100).await;
    let body = reserve_body("r1", subject(), 500);
    post(&s, &key, "/v1/reservations", body.clone())
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    fund(&s, 1_000).await;
    let retry = reserve(&s, &key, body).await;
    assert_eq!(retry["decision"], "ALLOW");
    assert_eq!(totals(&s).await, (1_100, 500, 0, 600));

    // A commit refused for its unit may be retried under the same key with a fixed body.
    let id = id_of(&retry);
    let path = op_path(&id, "commit");
    let wrong = json!({"idempotency_key": "c1", "actual": {"unit": "TOKENS", "amount": 10}});
    post(&s, &key, &path, wrong)
        .await
        .expect(400, Some("UNIT_MISMATCH"));
    post(&s, &key, &path, commit_body("c1", 400))
        .await
        .expect(200, None);
    assert_eq!(totals(&s).await, (1_100, 0, 400, 700));

    // An event refused under REJECT succeeds on retry once the budget allows it.
    let mut event = event_body("ev1", 1_000);
    event["overage_policy"] = json!("REJECT");
    post(&s, &key, "/v1/events", event.clone())
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    fund(&s, 500).await;
    post(&s, &key, "/v1/events", event).await.expect(201, None);
    assert_eq!(totals(&s).await, (1_600, 0, 1_400, 200));
    s.stop().await;
}

/// The namespace is the effective tenant: another tenant's identical key is independent,
/// another API key of the same tenant replays.
async fn keys_are_scoped_per_tenant_not_per_api_key(engine: Engine) {
    let (s, key) = acme(engine, 1_000).await;
    let second_key = s.key("acme").await;
    let globex = s.setup("globex", 1_000).await;
    let body = reserve_body("shared", subject(), 300);
    let original = reserve(&s, &key, body.clone()).await;
    assert_replay(
        &s,
        &second_key,
        "/v1/reservations",
        body,
        &original,
        200,
        Some(60_000),
    )
    .await;
    assert_eq!(totals(&s).await, (1_000, 300, 0, 700));

    let theirs = reserve(
        &s,
        &globex,
        reserve_body("shared", json!({"tenant": "globex"}), 300),
    )
    .await;
    assert_ne!(id_of(&theirs), id_of(&original));
    let event = post(&s, &globex, "/v1/events", event_body("shared", 5)).await;
    assert_eq!(event.status, 403, "the subject names acme: {}", event.body);
    let mut theirs_event = event_body("shared", 5);
    theirs_event["subject"] = json!({"tenant": "globex"});
    post(&s, &globex, "/v1/events", theirs_event)
        .await
        .expect(201, None);
    post(&s, &key, "/v1/events", event_body("shared", 7))
        .await
        .expect(201, None);
    let globex_root = s.ledger("tenant:globex", USD).await;
    assert_eq!(
        (
            amount(&globex_root, "reserved"),
            amount(&globex_root, "spent")
        ),
        (300, 5)
    );
    assert_eq!(totals(&s).await, (1_000, 300, 7, 693));
    s.stop().await;
}
