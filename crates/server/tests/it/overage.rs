//! Commit overage policies end to end (runtime spec §6.3–§6.6, reference-behaviour §5): REJECT,
//! ALLOW_IF_AVAILABLE and ALLOW_WITH_OVERDRAFT on commits and direct events, the over-limit and
//! debt states they leave behind, how funding clears them, and frozen budgets.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::common::{amount, assert_invariant, reserve_body, As, Engine, Resp, TestServer};
use serde_json::{json, Value};

const UNIT: &str = "USD_MICROCENTS";
const AIA: Option<&str> = Some("ALLOW_IF_AVAILABLE");
const AWO: Option<&str> = Some("ALLOW_WITH_OVERDRAFT");
const REJECT: Option<&str> = Some("REJECT");

engine_tests!(
    reject_refuses_overage_and_keeps_the_reservation,
    policy_comes_from_request_then_budget_then_tenant,
    covered_overage_is_charged_in_full,
    capped_overage_flags_and_blocks_until_funded,
    over_limit_blocks_reserve_even_with_remaining,
    overdraft_turns_the_shortfall_into_debt,
    overdraft_beyond_the_limit_changes_nothing,
    lowered_limit_blocks_until_debt_is_repaid,
    capped_commit_flags_only_the_short_scope,
    overdraft_is_capped_by_zero_limit_scopes,
    events_follow_the_overage_policies,
    capped_event_flags_only_the_short_scope,
    frozen_budget_refuses_new_spend,
);

// ---------------------------------------------------------------------------------------------
// Helpers

/// A fresh idempotency key per request.
fn fresh(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

fn tenant_only(t: &str) -> Value {
    json!({ "tenant": t })
}

fn agent(t: &str) -> Value {
    json!({ "tenant": t, "agent": "bot" })
}

fn agent_scope(t: &str) -> String {
    format!("tenant:{t}/agent:bot")
}

fn money(v: i64) -> Value {
    json!({ "unit": UNIT, "amount": v })
}

/// Copies every field of `extra` (an object) into `body`.
fn merged(mut body: Value, extra: Value) -> Value {
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            body[k] = v;
        }
    }
    body
}

/// Asserts the ledger invariant on every Balance of a response body.
fn check_balances(body: &Value) {
    for b in body["balances"].as_array().into_iter().flatten() {
        assert_invariant(b);
    }
}

/// A tenant, its key and a budget at `tenant:<t>` carrying `extra` fields; returns the key.
async fn open(s: &TestServer, t: &str, allocated: i64, extra: Value) -> String {
    s.tenant(t).await;
    let key = s.key(t).await;
    s.budget(&format!("tenant:{t}"), UNIT, allocated, extra)
        .await;
    key
}

/// `(allocated, spent, reserved, debt, remaining, is_over_limit)` of a budget.
async fn ledger(s: &TestServer, scope: &str) -> (i64, i64, i64, i64, i64, bool) {
    let b = s.ledger(scope, UNIT).await;
    let n = |f: &str| amount(&b, f);
    let over = b["is_over_limit"].as_bool().expect("is_over_limit");
    (
        n("allocated"),
        n("spent"),
        n("reserved"),
        n("debt"),
        n("remaining"),
        over,
    )
}

async fn reserve(s: &TestServer, key: &str, subject: Value, estimate: i64, extra: Value) -> Resp {
    let body = merged(reserve_body(&fresh("r"), subject, estimate), extra);
    let r = s.post("/v1/reservations", As::Key(key), body).await;
    check_balances(&r.body);
    r
}

/// A live reservation under `policy` (none: the server resolves it); returns its id.
async fn hold(
    s: &TestServer,
    key: &str,
    subject: Value,
    estimate: i64,
    policy: Option<&str>,
) -> String {
    let extra = policy.map_or(json!({}), |p| json!({ "overage_policy": p }));
    let r = reserve(s, key, subject, estimate, extra).await;
    r.expect(200, None)["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

/// A dry-run reserve that must be denied; returns the reason code.
async fn dry_run_denial(s: &TestServer, key: &str, subject: Value, estimate: i64) -> String {
    let r = reserve(s, key, subject, estimate, json!({ "dry_run": true })).await;
    let b = r.expect(200, None);
    assert_eq!(b["decision"], "DENY", "{b}");
    for absent in ["reservation_id", "expires_at_ms", "remaining_ttl_ms"] {
        assert!(b.get(absent).is_none(), "{absent} on a dry run: {b}");
    }
    assert!(b["affected_scopes"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    b["reason_code"].as_str().expect("reason_code").to_string()
}

/// `/v1/decide` for `subject` and `estimate`; returns `(decision, reason_code)`.
async fn decide(s: &TestServer, key: &str, subject: Value, estimate: i64) -> (String, String) {
    let body = reserve_body(&fresh("d"), subject, estimate);
    let r = s.post("/v1/decide", As::Key(key), body).await;
    let b = r.expect(200, None);
    let text = |f: &str| b[f].as_str().unwrap_or("").to_string();
    (text("decision"), text("reason_code"))
}

async fn commit_as(s: &TestServer, key: &str, id: &str, idem: &str, actual: i64) -> Resp {
    let body = json!({ "idempotency_key": idem, "actual": money(actual) });
    let r = s
        .post(&format!("/v1/reservations/{id}/commit"), As::Key(key), body)
        .await;
    check_balances(&r.body);
    r
}

async fn commit(s: &TestServer, key: &str, id: &str, actual: i64) -> Resp {
    commit_as(s, key, id, &fresh("c"), actual).await
}

/// Commits and returns `(charged, released)` (`released` is 0 when absent).
async fn settled(s: &TestServer, key: &str, id: &str, actual: i64) -> (i64, i64) {
    let r = commit(s, key, id, actual).await;
    let b = r.expect(200, None);
    assert_eq!(b["status"], "COMMITTED");
    let released = b.get("released").map_or(0, |_| amount(b, "released"));
    (amount(b, "charged"), released)
}

/// Reserves and commits `spend` exactly (no overage involved).
async fn spend(s: &TestServer, key: &str, subject: Value, spend: i64) {
    let id = hold(s, key, subject, spend, None).await;
    assert_eq!(settled(s, key, &id, spend).await, (spend, 0));
}

async fn status_of(s: &TestServer, key: &str, id: &str) -> String {
    let r = s.get(&format!("/v1/reservations/{id}"), As::Key(key)).await;
    r.expect(200, None)["status"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

async fn event(
    s: &TestServer,
    key: &str,
    subject: Value,
    actual: i64,
    policy: Option<&str>,
) -> Resp {
    let mut body = json!({
        "idempotency_key": fresh("e"),
        "subject": subject,
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "actual": money(actual),
    });
    if let Some(p) = policy {
        body["overage_policy"] = json!(p);
    }
    let r = s.post("/v1/events", As::Key(key), body).await;
    check_balances(&r.body);
    r
}

/// An event that must apply; returns `charged` when the response carries it.
async fn applied(
    s: &TestServer,
    key: &str,
    subject: Value,
    actual: i64,
    policy: Option<&str>,
) -> Option<i64> {
    let r = event(s, key, subject, actual, policy).await;
    let b = r.expect(201, None);
    assert_eq!(b["status"], "APPLIED");
    assert!(b["event_id"].as_str().is_some_and(|id| !id.is_empty()));
    b.get("charged").map(|_| amount(b, "charged"))
}

/// An admin funding operation on `tenant:<t>`; returns the response body.
async fn fund(s: &TestServer, t: &str, operation: &str, value: i64) -> Value {
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{t}&unit={UNIT}&tenant_id={t}");
    let body = json!({ "operation": operation, "amount": money(value) });
    s.post(&path, As::Admin, body)
        .await
        .expect(200, None)
        .clone()
}

/// `PATCH /v1/admin/budgets` with a new overdraft limit; returns the ledger.
async fn set_overdraft_limit(s: &TestServer, scope: &str, limit: i64) -> Value {
    let path = format!("/v1/admin/budgets?scope={scope}&unit={UNIT}");
    let body = json!({ "overdraft_limit": money(limit) });
    let r = s
        .send(reqwest::Method::PATCH, &path, As::Admin, Some(&body))
        .await;
    let b = r.expect(200, None).clone();
    assert_invariant(&b);
    b
}

async fn set_frozen(s: &TestServer, scope: &str, frozen: bool) -> Resp {
    let op = if frozen { "freeze" } else { "unfreeze" };
    let path = format!("/v1/admin/budgets/{op}?scope={scope}&unit={UNIT}");
    s.send(reqwest::Method::POST, &path, As::Admin, None).await
}

/// Example 6/7 of runtime spec §6.5 before the commit: allocated 1 000 000 with the given
/// overdraft limit, spent 885 000, an ALLOW_WITH_OVERDRAFT hold of 100 000, remaining 15 000.
/// With `on_budget` the policy comes from the budget instead of the request.
async fn overdraft_setup(s: &TestServer, t: &str, limit: i64, on_budget: bool) -> (String, String) {
    let mut extra = json!({ "overdraft_limit": money(limit) });
    if on_budget {
        extra["commit_overage_policy"] = json!("ALLOW_WITH_OVERDRAFT");
    }
    let key = open(s, t, 1_000_000, extra).await;
    spend(s, &key, tenant_only(t), 885_000).await;
    let policy = if on_budget { None } else { AWO };
    let id = hold(s, &key, tenant_only(t), 100_000, policy).await;
    assert_eq!(
        ledger(s, &format!("tenant:{t}")).await,
        (1_000_000, 885_000, 100_000, 0, 15_000, false)
    );
    (key, id)
}

// ---------------------------------------------------------------------------------------------
// Commits

/// §6.5 examples 4, 1 and 2: REJECT refuses any overage and changes nothing; the reservation
/// stays ACTIVE and can be committed with a smaller actual (errors are not replayed, so even
/// the same commit key works).
async fn reject_refuses_overage_and_keeps_the_reservation(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 1_000_000, json!({})).await;
    let id = hold(&s, &key, tenant_only("acme"), 500_000, REJECT).await;
    commit_as(&s, &key, &id, "c1", 600_000)
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 0, 500_000, 0, 500_000, false)
    );
    assert_eq!(status_of(&s, &key, &id).await, "ACTIVE");

    let c = commit_as(&s, &key, &id, "c1", 423_000).await;
    let cb = c.expect(200, None);
    assert_eq!(
        (amount(cb, "charged"), amount(cb, "released")),
        (423_000, 77_000)
    );
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 423_000, 0, 0, 577_000, false)
    );
    assert_eq!(status_of(&s, &key, &id).await, "COMMITTED");

    // A == E: charged in full, nothing released (no `released` field).
    let id2 = hold(&s, &key, tenant_only("acme"), 500_000, REJECT).await;
    assert_eq!(settled(&s, &key, &id2, 500_000).await, (500_000, 0));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 923_000, 0, 0, 77_000, false)
    );
    s.stop().await;
}

/// The reservation's `overage_policy` wins; without it the deepest budget's
/// `commit_overage_policy`, then the tenant's `default_commit_overage_policy`.
async fn policy_comes_from_request_then_budget_then_tenant(engine: Engine) {
    let s = TestServer::start(engine).await;
    s.tenant_with(json!({
        "tenant_id": "acme", "name": "acme", "default_commit_overage_policy": "REJECT"
    }))
    .await;
    let key = s.key("acme").await;
    s.budget("tenant:acme", UNIT, 1_000_000, json!({})).await;

    // Tenant default REJECT, for commits and for events.
    let id = hold(&s, &key, tenant_only("acme"), 100, None).await;
    commit(&s, &key, &id, 150)
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    event(&s, &key, tenant_only("acme"), 2_000_000, None)
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    // The request overrides the tenant default.
    let id = hold(&s, &key, tenant_only("acme"), 100, AWO).await;
    assert_eq!(settled(&s, &key, &id, 150).await, (150, 0));

    // A budget policy overrides the tenant default; the request overrides the budget.
    s.budget(
        &agent_scope("acme"),
        UNIT,
        1_000_000,
        json!({ "commit_overage_policy": "ALLOW_IF_AVAILABLE" }),
    )
    .await;
    let id = hold(&s, &key, agent("acme"), 100, None).await;
    assert_eq!(settled(&s, &key, &id, 150).await, (150, 0));
    let id = hold(&s, &key, agent("acme"), 100, REJECT).await;
    commit(&s, &key, &id, 150)
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    s.stop().await;
}

/// §6.5 example 3: an overage the budget covers is charged in full under every non-REJECT
/// policy (explicit or defaulted).
async fn covered_overage_is_charged_in_full(engine: Engine) {
    let s = TestServer::start(engine).await;
    for (t, policy) in [("cov-aia", AIA), ("cov-awo", AWO), ("cov-default", None)] {
        let key = open(&s, t, 1_000_000, json!({})).await;
        let id = hold(&s, &key, tenant_only(t), 500_000, policy).await;
        assert_eq!(settled(&s, &key, &id, 600_000).await, (600_000, 0), "{t}");
        assert_eq!(
            ledger(&s, &format!("tenant:{t}")).await,
            (1_000_000, 600_000, 0, 0, 400_000, false),
            "{t}"
        );
    }
    s.stop().await;
}

/// §6.5 example 5: ALLOW_IF_AVAILABLE caps an uncovered overage, never fails, never creates
/// debt, and flags the scope; every new reservation is then refused with
/// OVERDRAFT_LIMIT_EXCEEDED (even one the remaining covers) until funding clears the flag.
async fn capped_overage_flags_and_blocks_until_funded(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 1_000_000, json!({})).await;
    let acme = || tenant_only("acme");
    spend(&s, &key, acme(), 900_000).await;
    let id = hold(&s, &key, acme(), 100_000, AIA).await;
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 900_000, 100_000, 0, 0, false)
    );
    let c = commit(&s, &key, &id, 150_000).await;
    let cb = c.expect(200, None);
    assert_eq!(amount(cb, "charged"), 100_000);
    assert!(cb.get("released").is_none(), "{cb}");
    assert_eq!(cb["balances"][0]["is_over_limit"], true);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 1_000_000, 0, 0, 0, true)
    );

    // A zero estimate is covered by remaining 0: only the flag refuses it.
    for estimate in [0, 1] {
        reserve(&s, &key, acme(), estimate, json!({}))
            .await
            .expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    }
    assert_eq!(
        dry_run_denial(&s, &key, acme(), 0).await,
        "OVERDRAFT_LIMIT_EXCEEDED"
    );
    assert_eq!(
        decide(&s, &key, acme(), 0).await,
        ("DENY".into(), "OVERDRAFT_LIMIT_EXCEEDED".into())
    );
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 1_000_000, 0, 0, 0, true)
    );

    // Funding recomputes is_over_limit = debt > overdraft_limit (0 > 0).
    let f = fund(&s, "acme", "CREDIT", 500_000).await;
    assert_eq!(amount(&f, "new_remaining"), 500_000);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_500_000, 1_000_000, 0, 0, 500_000, false)
    );
    hold(&s, &key, acme(), 100_000, None).await;
    s.stop().await;
}

/// Over-limit blocks reservations regardless of remaining (runtime spec §4.1 rule 4), while
/// existing reservations still settle and events still apply.
async fn over_limit_blocks_reserve_even_with_remaining(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 1_000_000, json!({})).await;
    let acme = || tenant_only("acme");
    let first = hold(&s, &key, acme(), 600_000, None).await;
    let second = hold(&s, &key, acme(), 400_000, AIA).await;
    // Remaining is 0, so the 100 000 overage is capped to nothing.
    assert_eq!(settled(&s, &key, &second, 500_000).await, (400_000, 0));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 400_000, 600_000, 0, 0, true)
    );
    assert_eq!(settled(&s, &key, &first, 100_000).await, (100_000, 500_000));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 500_000, 0, 0, 500_000, true)
    );
    reserve(&s, &key, acme(), 10_000, json!({}))
        .await
        .expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    assert_eq!(applied(&s, &key, acme(), 10_000, None).await, None);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 510_000, 0, 0, 490_000, true)
    );
    fund(&s, "acme", "CREDIT", 1).await;
    hold(&s, &key, acme(), 10_000, None).await;
    s.stop().await;
}

/// §6.5 example 6: the unfunded part of an overage becomes debt within the limit
/// (deficit model, A-4). Debt within a non-zero limit does not block reservations (A-1).
async fn overdraft_turns_the_shortfall_into_debt(engine: Engine) {
    let s = TestServer::start(engine).await;
    let (key, id) = overdraft_setup(&s, "acme", 100_000, false).await;
    assert_eq!(settled(&s, &key, &id, 160_000).await, (160_000, 0));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 1_000_000, 0, 45_000, -45_000, false)
    );
    // Remaining is negative: a shortfall, not an outstanding-debt refusal.
    reserve(&s, &key, tenant_only("acme"), 1, json!({}))
        .await
        .expect(409, Some("BUDGET_EXCEEDED"));
    // CREDIT raises allocated and remaining; it does not repay debt.
    let f = fund(&s, "acme", "CREDIT", 100_000).await;
    assert_eq!(
        (amount(&f, "previous_debt"), amount(&f, "new_debt")),
        (45_000, 45_000)
    );
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_100_000, 1_000_000, 0, 45_000, 55_000, false)
    );
    hold(&s, &key, tenant_only("acme"), 10_000, None).await;
    s.stop().await;
}

/// §6.5 example 7: a deficit beyond the overdraft limit refuses the commit with no mutation;
/// the reservation stays ACTIVE and a covered commit then succeeds. The policy here comes from
/// the budget's `commit_overage_policy`.
async fn overdraft_beyond_the_limit_changes_nothing(engine: Engine) {
    let s = TestServer::start(engine).await;
    let (key, id) = overdraft_setup(&s, "acme", 40_000, true).await;
    commit(&s, &key, &id, 160_000)
        .await
        .expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 885_000, 100_000, 0, 15_000, false)
    );
    assert_eq!(status_of(&s, &key, &id).await, "ACTIVE");
    assert_eq!(settled(&s, &key, &id, 115_000).await, (115_000, 0));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000_000, 1_000_000, 0, 0, 0, false)
    );
    s.stop().await;
}

/// Debt left over after the overdraft limit is lowered to 0: the PATCH recomputes
/// `is_over_limit = debt > limit`, so the scope is over limit and reservations get
/// OVERDRAFT_LIMIT_EXCEEDED, which beats DEBT_OUTSTANDING (§4.1 rule 3) even when remaining
/// covers the estimate. Partial REPAY_DEBT keeps it blocked; full repayment clears it.
///
/// DEBT_OUTSTANDING (debt > 0 with limit 0 and the flag clear) cannot be reached over the API:
/// debt only arises on scopes with a non-zero limit, and every write that can lower the limit
/// or change the debt (PATCH, funding) recomputes `is_over_limit = debt > limit`.
async fn lowered_limit_blocks_until_debt_is_repaid(engine: Engine) {
    let s = TestServer::start(engine).await;
    let (key, id) = overdraft_setup(&s, "acme", 100_000, false).await;
    settled(&s, &key, &id, 160_000).await;
    let patched = set_overdraft_limit(&s, "tenant:acme", 0).await;
    assert_eq!(patched["is_over_limit"], true);
    assert_eq!(amount(&patched, "debt"), 45_000);
    fund(&s, "acme", "CREDIT", 100_000).await;
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_100_000, 1_000_000, 0, 45_000, 55_000, true)
    );
    let acme = || tenant_only("acme");
    let blocked = |r: Resp| {
        r.expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    };
    blocked(reserve(&s, &key, acme(), 10_000, json!({})).await);
    assert_eq!(
        dry_run_denial(&s, &key, acme(), 10_000).await,
        "OVERDRAFT_LIMIT_EXCEEDED"
    );

    let f = fund(&s, "acme", "REPAY_DEBT", 20_000).await;
    assert_eq!(
        (amount(&f, "new_debt"), amount(&f, "new_remaining")),
        (25_000, 75_000)
    );
    blocked(reserve(&s, &key, acme(), 10_000, json!({})).await);

    fund(&s, "acme", "REPAY_DEBT", 25_000).await;
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_100_000, 1_000_000, 0, 0, 100_000, false)
    );
    hold(&s, &key, acme(), 10_000, None).await;
    s.stop().await;
}

/// Checks one multi-scope capped commit: reserve 100, commit 200 through a parent and a
/// child budget; the cap is the smaller remaining, and only a scope that could not cover the
/// 100 overage by itself is flagged. A flagged scope anywhere blocks the child subject.
async fn short_scope_case(s: &TestServer, t: &str, policy: Option<&str>, parent: i64, child: i64) {
    let key = open(s, t, parent, json!({})).await;
    s.budget(&agent_scope(t), UNIT, child, json!({})).await;
    let id = hold(s, &key, agent(t), 100, policy).await;
    assert_eq!(settled(s, &key, &id, 200).await, (150, 0), "{t}");
    for (scope, allocated) in [(format!("tenant:{t}"), parent), (agent_scope(t), child)] {
        let short = allocated - 100 < 100;
        assert_eq!(
            ledger(s, &scope).await,
            (allocated, 150, 0, 0, allocated - 150, short),
            "{scope}"
        );
    }
    reserve(s, &key, agent(t), 0, json!({}))
        .await
        .expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    // The parent alone is usable when only the child is flagged.
    let parent_alone = reserve(s, &key, tenant_only(t), 10, json!({})).await;
    if parent < child {
        parent_alone.expect(409, Some("OVERDRAFT_LIMIT_EXCEEDED"));
    } else {
        parent_alone.expect(200, None);
    }
}

/// Multi-scope ALLOW_IF_AVAILABLE (and ALLOW_WITH_OVERDRAFT with zero limits, which caps the
/// same way): only the short scope is flagged (reference-behaviour §5.2).
async fn capped_commit_flags_only_the_short_scope(engine: Engine) {
    let s = TestServer::start(engine).await;
    short_scope_case(&s, "child-aia", AIA, 1_000_000, 150).await;
    short_scope_case(&s, "child-awo", AWO, 1_000_000, 150).await;
    short_scope_case(&s, "parent-aia", AIA, 150, 1_000).await;
    short_scope_case(&s, "parent-awo", AWO, 150, 1_000).await;
    s.stop().await;
}

/// ALLOW_WITH_OVERDRAFT across a zero-limit parent and a child with a limit (§6.3): the
/// parent caps the overage to what it has (and is flagged), the child funds what it can of the
/// capped amount and owes the rest as debt within its limit.
async fn overdraft_is_capped_by_zero_limit_scopes(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 130, json!({})).await;
    let child = json!({ "overdraft_limit": money(1_000) });
    s.budget(&agent_scope("acme"), UNIT, 110, child).await;
    let id = hold(&s, &key, agent("acme"), 100, AWO).await;
    // Remaining after the hold: parent 30, child 10; the overage is 100.
    assert_eq!(settled(&s, &key, &id, 200).await, (130, 0));
    assert_eq!(ledger(&s, "tenant:acme").await, (130, 130, 0, 0, 0, true));
    assert_eq!(
        ledger(&s, &agent_scope("acme")).await,
        (110, 110, 0, 20, -20, false)
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Events

/// `POST /v1/events` under the three policies (§6.6): 201 with `charged` only when capped,
/// REJECT and an exceeded overdraft limit refuse with no mutation, debt up to the limit, and
/// neither debt nor over-limit blocks events.
async fn events_follow_the_overage_policies(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 1_000, json!({ "overdraft_limit": money(500) })).await;
    let acme = || tenant_only("acme");
    let refused = |r: Resp, code: &str| {
        r.expect(409, Some(code));
    };
    assert_eq!(applied(&s, &key, acme(), 300, None).await, None);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 300, 0, 0, 700, false)
    );
    refused(
        event(&s, &key, acme(), 800, REJECT).await,
        "BUDGET_EXCEEDED",
    );
    assert_eq!(applied(&s, &key, acme(), 700, REJECT).await, None);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 1_000, 0, 0, 0, false)
    );

    assert_eq!(applied(&s, &key, acme(), 200, AWO).await, None);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 1_000, 0, 200, -200, false)
    );
    refused(
        event(&s, &key, acme(), 400, AWO).await,
        "OVERDRAFT_LIMIT_EXCEEDED",
    );
    // Debt may reach the limit exactly; debt == limit is not over limit.
    assert_eq!(applied(&s, &key, acme(), 300, AWO).await, None);
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 1_000, 0, 500, -500, false)
    );
    refused(
        reserve(&s, &key, acme(), 1, json!({})).await,
        "BUDGET_EXCEEDED",
    );

    // Debt does not block events; a capped event charges 0 and flags the scope.
    assert_eq!(applied(&s, &key, acme(), 100, AIA).await, Some(0));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 1_000, 0, 500, -500, true)
    );
    refused(
        reserve(&s, &key, acme(), 0, json!({})).await,
        "OVERDRAFT_LIMIT_EXCEEDED",
    );
    // Over-limit does not block events either.
    assert_eq!(applied(&s, &key, acme(), 100, None).await, Some(0));

    // REPAY_DEBT repays 500 and credits the excess 1 000.
    let f = fund(&s, "acme", "REPAY_DEBT", 1_500).await;
    assert_eq!(
        (amount(&f, "new_debt"), amount(&f, "new_allocated")),
        (0, 2_000)
    );
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (2_000, 1_000, 0, 0, 1_000, false)
    );
    hold(&s, &key, acme(), 100, None).await;
    s.stop().await;
}

/// A capped event over a parent with 50 left and a child with 950 charges 50 and flags only
/// the parent, under ALLOW_IF_AVAILABLE and under ALLOW_WITH_OVERDRAFT with zero limits.
async fn capped_event_flags_only_the_short_scope(engine: Engine) {
    let s = TestServer::start(engine).await;
    for (t, policy) in [("ev-aia", AIA), ("ev-awo", AWO)] {
        let key = open(&s, t, 50, json!({})).await;
        s.budget(&agent_scope(t), UNIT, 950, json!({})).await;
        assert_eq!(applied(&s, &key, agent(t), 100, policy).await, Some(50));
        assert_eq!(
            ledger(&s, &format!("tenant:{t}")).await,
            (50, 50, 0, 0, 0, true)
        );
        assert_eq!(
            ledger(&s, &agent_scope(t)).await,
            (950, 50, 0, 0, 900, false)
        );
    }
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Frozen budgets

/// A FROZEN budget refuses reservations (409, or DENY on a dry run and on /decide) and events;
/// unfreezing restores it. Freezing twice (or unfreezing an active budget) is a 409.
async fn frozen_budget_refuses_new_spend(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = open(&s, "acme", 1_000, json!({})).await;
    let acme = || tenant_only("acme");
    hold(&s, &key, acme(), 100, None).await;

    let f = set_frozen(&s, "tenant:acme", true).await;
    assert_eq!(f.expect(200, None)["status"], "FROZEN");
    assert_eq!(set_frozen(&s, "tenant:acme", true).await.status, 409);

    reserve(&s, &key, acme(), 100, json!({}))
        .await
        .expect(409, Some("BUDGET_FROZEN"));
    assert_eq!(dry_run_denial(&s, &key, acme(), 100).await, "BUDGET_FROZEN");
    assert_eq!(
        decide(&s, &key, acme(), 100).await,
        ("DENY".into(), "BUDGET_FROZEN".into())
    );
    event(&s, &key, acme(), 10, None)
        .await
        .expect(409, Some("BUDGET_FROZEN"));
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 0, 100, 0, 900, false)
    );

    let u = set_frozen(&s, "tenant:acme", false).await;
    assert_eq!(u.expect(200, None)["status"], "ACTIVE");
    assert_eq!(set_frozen(&s, "tenant:acme", false).await.status, 409);
    hold(&s, &key, acme(), 100, None).await;
    // A dry-run ALLOW carries no reservation and holds nothing.
    let dry = reserve(&s, &key, acme(), 100, json!({ "dry_run": true })).await;
    let db = dry.expect(200, None);
    assert_eq!(db["decision"], "ALLOW");
    assert!(db.get("reservation_id").is_none() && db.get("expires_at_ms").is_none());
    assert_eq!(
        ledger(&s, "tenant:acme").await,
        (1_000, 0, 200, 0, 800, false)
    );
    s.stop().await;
}
