//! The reservation lifecycle over HTTP: reserve → commit / release / extend, reads.

use crate::common::{amount, assert_invariant, reserve_body, As, Engine, TestServer, T0};
use serde_json::json;

engine_tests!(
    reserve_commit_round_trip,
    reserve_release_returns_the_hold,
    extend_moves_expiry_and_counts,
    runaway_agent_stops_at_the_budget,
);

async fn reserve_commit_round_trip(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    s.budget(
        "tenant:acme/agent:bot",
        "USD_MICROCENTS",
        300_000,
        json!({}),
    )
    .await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r1", json!({"tenant": "acme", "agent": "bot"}), 100_000),
        )
        .await;
    let body = r.expect(200, None).clone();
    assert_eq!(body["decision"], "ALLOW");
    assert_eq!(
        body["affected_scopes"],
        json!(["tenant:acme", "tenant:acme/agent:bot"])
    );
    assert_eq!(body["scope_path"], "tenant:acme/agent:bot");
    assert_eq!(body["expires_at_ms"], T0 + 60_000);
    assert_eq!(body["remaining_ttl_ms"], 60_000);
    assert_eq!(r.header("x-cycles-tenant"), Some("acme"));
    assert!(r.header("date").is_some());
    assert_eq!(r.header("x-cycles-trace-id").map(str::len), Some(32));
    assert!(r.header("x-request-id").is_some());
    let id = body["reservation_id"].as_str().unwrap().to_string();

    let c = s
        .post(
            &format!("/v1/reservations/{id}/commit"),
            As::Key(&key),
            json!({"idempotency_key": "c1", "actual": {"unit": "USD_MICROCENTS", "amount": 42_000}}),
        )
        .await;
    let cb = c.expect(200, None);
    assert_eq!(cb["status"], "COMMITTED");
    assert_eq!(amount(cb, "charged"), 42_000);
    assert_eq!(amount(cb, "released"), 58_000);
    for b in cb["balances"].as_array().unwrap() {
        assert_invariant(b);
    }
    let root = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(
        (
            amount(&root, "spent"),
            amount(&root, "reserved"),
            amount(&root, "remaining")
        ),
        (42_000, 0, 958_000)
    );
    let leaf = s.ledger("tenant:acme/agent:bot", "USD_MICROCENTS").await;
    assert_eq!(amount(&leaf, "remaining"), 258_000);

    let g = s
        .get(&format!("/v1/reservations/{id}"), As::Key(&key))
        .await;
    let gb = g.expect(200, None);
    assert_eq!(gb["status"], "COMMITTED");
    assert_eq!(amount(gb, "committed"), 42_000);
    assert_eq!(gb["finalized_at_ms"], T0);
    assert_eq!(gb["subject"], json!({"tenant": "acme", "agent": "bot"}));
    s.stop().await;
}

async fn reserve_release_returns_the_hold(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let r = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r1", json!({"tenant": "acme"}), 600),
        )
        .await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        amount(
            &s.ledger("tenant:acme", "USD_MICROCENTS").await,
            "remaining"
        ),
        400
    );
    let rel = s
        .post(
            &format!("/v1/reservations/{id}/release"),
            As::Key(&key),
            json!({"idempotency_key": "rel1", "reason": "not needed"}),
        )
        .await;
    let rb = rel.expect(200, None);
    assert_eq!(rb["status"], "RELEASED");
    assert_eq!(amount(rb, "released"), 600);
    let b = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(
        (amount(&b, "remaining"), amount(&b, "reserved")),
        (1_000, 0)
    );
    // A second settlement with another key: the reservation is final.
    let again = s
        .post(
            &format!("/v1/reservations/{id}/commit"),
            As::Key(&key),
            json!({"idempotency_key": "c2", "actual": {"unit": "USD_MICROCENTS", "amount": 1}}),
        )
        .await;
    again.expect(409, Some("RESERVATION_FINALIZED"));
    s.stop().await;
}

async fn extend_moves_expiry_and_counts(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000).await;
    let mut body = reserve_body("r1", json!({"tenant": "acme"}), 10);
    body["ttl_ms"] = json!(10_000);
    let r = s.post("/v1/reservations", As::Key(&key), body).await;
    let id = r.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    s.advance(4_000);
    let e = s
        .post(
            &format!("/v1/reservations/{id}/extend"),
            As::Key(&key),
            json!({"idempotency_key": "e1", "extend_by_ms": 5_000}),
        )
        .await;
    let eb = e.expect(200, None);
    assert_eq!(eb["status"], "ACTIVE");
    assert_eq!(eb["expires_at_ms"], T0 + 15_000);
    assert_eq!(eb["remaining_ttl_ms"], 11_000);
    assert!(e.header("date").is_some());
    s.stop().await;
}

/// A $0.01 budget and reservations of 10 000 each, committed in full: exactly 100 succeed.
async fn runaway_agent_stops_at_the_budget(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let subject = json!({"tenant": "acme", "agent": "runaway"});
    let mut succeeded = 0;
    for i in 0..101 {
        let r = s
            .post(
                "/v1/reservations",
                As::Key(&key),
                reserve_body(&format!("r{i}"), subject.clone(), 10_000),
            )
            .await;
        if i == 100 {
            r.expect(409, Some("BUDGET_EXCEEDED"));
            break;
        }
        let id = r.expect(200, None)["reservation_id"]
            .as_str()
            .unwrap()
            .to_string();
        s.post(
            &format!("/v1/reservations/{id}/commit"),
            As::Key(&key),
            json!({"idempotency_key": format!("c{i}"), "actual": {"unit": "USD_MICROCENTS", "amount": 10_000}}),
        )
        .await
        .expect(200, None);
        succeeded += 1;
    }
    assert_eq!(succeeded, 100);
    let b = s.ledger("tenant:acme", "USD_MICROCENTS").await;
    assert_eq!(
        (amount(&b, "spent"), amount(&b, "remaining")),
        (1_000_000, 0)
    );
    s.stop().await;
}
