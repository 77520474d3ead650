//! Concurrency over real HTTP: shared budgets are never oversubscribed by concurrent reserves
//! (runtime spec §1 core invariants), concurrent commits charge exactly what they report, and
//! concurrent same-key requests settle exactly once (§6.8).

use std::collections::BTreeSet;

use crate::common::{amount, assert_invariant, reserve_body, Engine, TestServer};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

const UNIT: &str = "USD_MICROCENTS";
const PARENT: &str = "tenant:acme";
const CHILD: &str = "tenant:acme/agent:swarm";

engine_tests!(
    concurrent_reserves_never_oversubscribe,
    concurrent_same_key_reserves_make_one_reservation,
    concurrent_commits_settle_a_reservation_once,
);

/// One request to send: a path and a body, sent with the tenant key.
struct Call {
    path: String,
    body: Value,
}

/// Sends every call at once on a shared client and returns `(status, body)` in call order.
async fn fire_all(s: &TestServer, key: &str, calls: Vec<Call>) -> Vec<(u16, Value)> {
    let client = reqwest::Client::new();
    let handles: Vec<JoinHandle<(u16, Value)>> = calls
        .into_iter()
        .map(|call| {
            let request = client
                .post(format!("{}{}", s.base, call.path))
                .header("X-Cycles-API-Key", key)
                .json(&call.body);
            tokio::spawn(async move {
                let resp = request.send().await.expect("request");
                let status = resp.status().as_u16();
                (status, resp.json().await.expect("json body"))
            })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

fn swarm() -> Value {
    json!({"tenant": "acme", "agent": "swarm"})
}

fn reserve_call(idem: &str, estimate: i64) -> Call {
    Call {
        path: "/v1/reservations".into(),
        body: reserve_body(idem, swarm(), estimate),
    }
}

fn commit_call(id: &str, idem: &str, actual: i64) -> Call {
    Call {
        path: format!("/v1/reservations/{id}/commit"),
        body: json!({"idempotency_key": idem, "actual": {"unit": UNIT, "amount": actual}}),
    }
}

/// `(spent, reserved, remaining)` of a budget (invariant checked).
async fn totals(s: &TestServer, scope: &str) -> (i64, i64, i64) {
    let b = s.ledger(scope, UNIT).await;
    (
        amount(&b, "spent"),
        amount(&b, "reserved"),
        amount(&b, "remaining"),
    )
}

/// A tenant with a key and 1 000 000 at both the tenant and the agent scope.
async fn two_level_budget(s: &TestServer) -> String {
    let key = s.setup("acme", 1_000_000).await;
    s.budget(CHILD, UNIT, 1_000_000, json!({})).await;
    key
}

/// The ledger invariant on every Balance of a response.
fn check_balances(body: &Value) {
    let balances = body["balances"].as_array().expect("balances");
    assert_eq!(balances.len(), 2, "{body}");
    balances.iter().for_each(assert_invariant);
}

fn reservation_id(body: &Value) -> String {
    body["reservation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("reservation_id in {body}"))
        .to_string()
}

/// 250 concurrent reserves of 10 000 against 1 000 000 at two levels: exactly 100 succeed, the
/// rest are 409 BUDGET_EXCEEDED, and both ledgers hold exactly what the successes imply. Then
/// all 100 are committed concurrently with random actuals ≤ estimate: spent is exactly the sum
/// of `charged`.
async fn concurrent_reserves_never_oversubscribe(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = two_level_budget(&s).await;
    let calls = (0..250)
        .map(|i| reserve_call(&format!("r{i}"), 10_000))
        .collect();
    let replies = fire_all(&s, &key, calls).await;

    let mut ids = Vec::new();
    for (status, body) in &replies {
        match status {
            200 => {
                assert_eq!(body["reserved"]["amount"], 10_000, "{body}");
                check_balances(body);
                ids.push(reservation_id(body));
            }
            409 => assert_eq!(body["error"], "BUDGET_EXCEEDED", "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(ids.len(), 100);
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 100);
    for scope in [PARENT, CHILD] {
        assert_eq!(totals(&s, scope).await, (0, 1_000_000, 0), "{scope}");
    }

    let actuals: Vec<i64> = ids.iter().map(|_| rand::random_range(0..=10_000)).collect();
    let calls = ids
        .iter()
        .zip(&actuals)
        .map(|(id, actual)| commit_call(id, &format!("c-{id}"), *actual))
        .collect();
    let mut charged = 0;
    for ((status, body), actual) in fire_all(&s, &key, calls).await.iter().zip(&actuals) {
        assert_eq!(*status, 200, "{body}");
        check_balances(body);
        assert_eq!(amount(body, "charged"), *actual, "{body}");
        let released = body.get("released").map_or(0, |_| amount(body, "released"));
        assert_eq!(released, 10_000 - actual, "{body}");
        charged += amount(body, "charged");
    }
    for scope in [PARENT, CHILD] {
        assert_eq!(
            totals(&s, scope).await,
            (charged, 0, 1_000_000 - charged),
            "{scope}"
        );
    }
    s.stop().await;
}

/// 100 concurrent reserves with one idempotency key and body make one reservation: every
/// response is 200 with the same reservation_id, and the budget holds the estimate once.
async fn concurrent_same_key_reserves_make_one_reservation(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = two_level_budget(&s).await;
    let calls = (0..100).map(|_| reserve_call("same-key", 10_000)).collect();
    let replies = fire_all(&s, &key, calls).await;
    let ids: BTreeSet<String> = replies
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 200, "{body}");
            reservation_id(body)
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    for scope in [PARENT, CHILD] {
        assert_eq!(totals(&s, scope).await, (0, 10_000, 990_000), "{scope}");
    }
    s.stop().await;
}

/// Concurrent commits of one reservation: with one key all 50 get the same 200 and it is
/// charged once; with 50 different keys exactly one wins and the rest are 409
/// RESERVATION_FINALIZED.
async fn concurrent_commits_settle_a_reservation_once(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = two_level_budget(&s).await;
    let reserved = fire_all(
        &s,
        &key,
        vec![reserve_call("a", 10_000), reserve_call("b", 10_000)],
    )
    .await;
    let (a, b) = (
        reservation_id(&reserved[0].1),
        reservation_id(&reserved[1].1),
    );

    let same = (0..50).map(|_| commit_call(&a, "one-key", 7_000)).collect();
    let replies = fire_all(&s, &key, same).await;
    for (status, body) in &replies {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body, &replies[0].1);
    }
    for scope in [PARENT, CHILD] {
        assert_eq!(totals(&s, scope).await, (7_000, 10_000, 983_000), "{scope}");
    }

    let distinct = (0..50)
        .map(|i| commit_call(&b, &format!("k{i}"), 4_000))
        .collect();
    let replies = fire_all(&s, &key, distinct).await;
    let winners = replies.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(winners, 1);
    for (status, body) in replies.iter().filter(|(status, _)| *status != 200) {
        assert_eq!(
            (*status, body["error"].as_str()),
            (409, Some("RESERVATION_FINALIZED")),
            "{body}"
        );
    }
    for scope in [PARENT, CHILD] {
        assert_eq!(totals(&s, scope).await, (11_000, 0, 989_000), "{scope}");
    }
    s.stop().await;
}
