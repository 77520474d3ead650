//! The official Rust SDK (`runcycles` 0.3.2, pinned) against our server.
//!
//! Every flow goes through the SDK's public API, exactly as an application would, and then
//! checks the outcome on our server's ledger through the admin lookup. The SDK validates
//! success bodies strictly (exact status, closed field sets, no nulls): a response it does not
//! accept surfaces here as an SDK error, so these tests are also wire-compatibility tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{amount, Engine, TestServer, T0};
use runcycles::models::{
    Action, Amount, BalanceParams, CommitRequest, CommitStatus, Decision, DecisionRequest,
    EventCreateRequest, EventStatus, ExtendRequest, ExtendStatus, IdempotencyKey,
    ListReservationsParams, ReleaseStatus, ReservationCreateRequest, ReservationStatus, Subject,
};
use runcycles::{with_cycles, CyclesClient, Error, WithCyclesConfig};
use serde_json::{json, Value};

engine_tests!(
    guard_commit_charges_the_actual,
    guard_dropped_without_commit_auto_releases,
    guard_release_returns_the_hold,
    guard_extend_moves_expiry,
    with_cycles_commits_on_success_and_releases_on_error,
    decide_allows_and_denies_without_holding,
    dry_run_holds_nothing,
    events_charge_directly,
    balances_report_the_ledger,
    list_and_get_reservations,
    budget_exceeded_is_the_typed_error,
    expired_commit_recovers_via_event,
    idempotent_replays_charge_once,
);

const TENANT: &str = "acme";
const ROOT: &str = "tenant:acme";
const UNIT: &str = "USD_MICROCENTS";

/// An SDK client for `key`, with the durable journal off (nothing may leak between runs or
/// into `$HOME`) and short retry backoff.
fn sdk(s: &TestServer, key: &str) -> CyclesClient {
    CyclesClient::builder(key, s.base.clone())
        .tenant(TENANT)
        .journal_enabled(false)
        .retry_initial_delay(Duration::from_millis(50))
        .build()
}

fn subject() -> Subject {
    Subject {
        tenant: Some(TENANT.into()),
        ..Default::default()
    }
}

fn action() -> Action {
    Action::new("llm.completion", "gpt-4o-mini")
}

/// A reserve request for `estimate` USD_MICROCENTS at the tenant.
fn reserve(estimate: i64) -> ReservationCreateRequest {
    ReservationCreateRequest::builder()
        .subject(subject())
        .action(action())
        .estimate(Amount::usd_microcents(estimate))
        .build()
}

fn commit(actual: i64) -> CommitRequest {
    CommitRequest::builder()
        .actual(Amount::usd_microcents(actual))
        .build()
}

/// `(spent, reserved, remaining)` of the tenant budget, read through the admin plane.
async fn ledger(s: &TestServer) -> (i64, i64, i64) {
    let b = s.ledger(ROOT, UNIT).await;
    (
        amount(&b, "spent"),
        amount(&b, "reserved"),
        amount(&b, "remaining"),
    )
}

/// Polls the ledger until `check` holds (for effects the SDK applies in the background).
async fn eventually(s: &TestServer, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        last = s.ledger(ROOT, UNIT).await;
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}; last ledger: {last}");
}

async fn guard_commit_charges_the_actual(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let guard = client.reserve(reserve(100_000)).await.expect("reserve");
    assert_eq!(guard.decision(), Decision::Allow);
    assert_eq!(guard.affected_scopes(), [ROOT.to_string()]);
    assert_eq!(guard.expires_at_ms(), Some((T0 + 60_000) as u64));
    assert!(guard.caps().is_none());
    assert_eq!(ledger(&s).await, (0, 100_000, 900_000));

    let resp = guard.commit(commit(42_000)).await.expect("commit");
    assert_eq!(resp.status, CommitStatus::Committed);
    assert_eq!(resp.charged, Amount::usd_microcents(42_000));
    assert_eq!(resp.released, Some(Amount::usd_microcents(58_000)));
    assert!(!resp.is_recovered_via_event());
    assert_eq!(ledger(&s).await, (42_000, 0, 958_000));
    s.stop().await;
}

async fn guard_dropped_without_commit_auto_releases(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let guard = client.reserve(reserve(50_000)).await.expect("reserve");
    let id = guard.reservation_id().clone();
    assert_eq!(ledger(&s).await, (0, 50_000, 950_000));
    drop(guard);

    // The SDK releases from a spawned task: wait for it, bounded.
    let b = eventually(&s, "the auto-release", |b| amount(b, "reserved") == 0).await;
    assert_eq!(
        (amount(&b, "spent"), amount(&b, "remaining")),
        (0, 1_000_000)
    );
    let detail = client.get_reservation(&id).await.expect("get");
    assert_eq!(detail.status, ReservationStatus::Released);
    assert_eq!(detail.committed, None);
    s.stop().await;
}

async fn guard_release_returns_the_hold(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    let guard = client.reserve(reserve(600)).await.expect("reserve");
    let id = guard.reservation_id().clone();
    assert_eq!(ledger(&s).await, (0, 600, 400));
    let resp = guard.release("not needed").await.expect("release");
    assert_eq!(resp.status, ReleaseStatus::Released);
    assert_eq!(resp.released, Amount::usd_microcents(600));
    assert_eq!(ledger(&s).await, (0, 0, 1_000));

    // The reservation is final: a later commit through the low-level API is refused.
    let err = client
        .commit_reservation(&id, &commit(1))
        .await
        .expect_err("commit after release");
    assert_eq!(err.status(), Some(409));
    assert_eq!(
        err.error_code(),
        Some(runcycles::models::ErrorCode::ReservationFinalized)
    );
    assert_eq!(ledger(&s).await, (0, 0, 1_000));
    s.stop().await;
}

async fn guard_extend_moves_expiry(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    // The default 60 s TTL keeps the SDK's own heartbeat idle for the whole test (it first
    // beats at about remaining_ttl_ms − 15 s), so every extension below is ours.
    let guard = client.reserve(reserve(10)).await.expect("reserve");
    let id = guard.reservation_id().clone();
    s.advance(4_000);
    guard.extend(5_000).await.expect("guard extend");
    let detail = client.get_reservation(&id).await.expect("get");
    assert_eq!(detail.status, ReservationStatus::Active);
    assert_eq!(detail.expires_at_ms, (T0 + 65_000) as u64);

    // The low-level call exposes the response: expiry moves relative to the current expiry.
    let resp = client
        .extend_reservation(&id, &ExtendRequest::new(1_000))
        .await
        .expect("extend");
    assert_eq!(resp.status, ExtendStatus::Active);
    assert_eq!(resp.expires_at_ms, (T0 + 66_000) as u64);
    assert_eq!(resp.remaining_ttl_ms, Some(62_000));

    // Extending holds no extra budget; the commit settles as usual.
    assert_eq!(ledger(&s).await, (0, 10, 990));
    guard.commit(commit(10)).await.expect("commit");
    assert_eq!(ledger(&s).await, (10, 0, 990));
    s.stop().await;
}

async fn with_cycles_commits_on_success_and_releases_on_error(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let reply = with_cycles(
        &client,
        WithCyclesConfig::new(Amount::usd_microcents(20_000))
            .action("llm.completion", "gpt-4o-mini")
            .subject(subject()),
        |ctx| async move {
            assert_eq!(ctx.decision, Decision::Allow);
            Ok(("hello".to_string(), Amount::usd_microcents(7_000)))
        },
    )
    .await
    .expect("with_cycles");
    assert_eq!(reply, "hello");
    assert_eq!(ledger(&s).await, (7_000, 0, 993_000));

    let err = with_cycles(
        &client,
        WithCyclesConfig::new(Amount::usd_microcents(30_000))
            .action("llm.completion", "gpt-4o-mini")
            .subject(subject()),
        |_ctx| async move { Err::<(String, Amount), _>("the model call failed".into()) },
    )
    .await
    .expect_err("the closure failed");
    assert!(matches!(err, Error::Validation(_)), "{err:?}");
    // The failed call's hold is released, nothing is charged.
    assert_eq!(ledger(&s).await, (7_000, 0, 993_000));
    s.stop().await;
}

async fn decide_allows_and_denies_without_holding(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    let decide = |estimate: i64| {
        DecisionRequest::builder()
            .subject(subject())
            .action(action())
            .estimate(Amount::usd_microcents(estimate))
            .build()
    };
    let allow = client.decide(&decide(500)).await.expect("decide allow");
    assert_eq!(allow.decision, Decision::Allow);
    assert_eq!(allow.reason_code, None);

    let deny = client.decide(&decide(5_000)).await.expect("decide deny");
    assert_eq!(deny.decision, Decision::Deny);
    assert_eq!(deny.reason_code.as_deref(), Some("BUDGET_EXCEEDED"));
    assert_eq!(ledger(&s).await, (0, 0, 1_000));
    s.stop().await;
}

async fn dry_run_holds_nothing(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    let dry = |estimate: i64| {
        ReservationCreateRequest::builder()
            .subject(subject())
            .action(action())
            .estimate(Amount::usd_microcents(estimate))
            .dry_run(true)
            .build()
    };
    let allow = client
        .create_reservation(&dry(400))
        .await
        .expect("dry run allow");
    assert_eq!(allow.decision, Decision::Allow);
    assert_eq!(allow.reservation_id, None);
    assert_eq!(allow.expires_at_ms, None);
    assert_eq!(allow.remaining_ttl_ms, None);
    assert_eq!(allow.affected_scopes, [ROOT.to_string()]);

    // Over budget, a dry run answers DENY with 200 (a live reserve would be a 409).
    let deny = client
        .create_reservation(&dry(4_000))
        .await
        .expect("dry run deny");
    assert_eq!(deny.decision, Decision::Deny);
    assert_eq!(deny.reservation_id, None);
    assert_eq!(deny.reason_code.as_deref(), Some("BUDGET_EXCEEDED"));
    assert_eq!(ledger(&s).await, (0, 0, 1_000));
    s.stop().await;
}

async fn events_charge_directly(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    let event = EventCreateRequest::builder()
        .subject(subject())
        .action(action())
        .actual(Amount::usd_microcents(700))
        .build();
    // create_event accepts only an exact, schema-valid 201.
    let resp = client.create_event(&event).await.expect("event");
    assert_eq!(resp.status, EventStatus::Applied);
    assert!(!resp.event_id.as_str().is_empty());
    assert_eq!(ledger(&s).await, (700, 0, 300));
    s.stop().await;
}

async fn balances_report_the_ledger(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 10_000).await;
    s.budget("tenant:acme/agent:bot", UNIT, 5_000, json!({}))
        .await;
    let client = sdk(&s, &key);

    let guard = client.reserve(reserve(3_000)).await.expect("reserve");
    let event = EventCreateRequest::builder()
        .subject(subject())
        .action(action())
        .actual(Amount::usd_microcents(2_000))
        .build();
    client.create_event(&event).await.expect("event");

    let resp = client
        .get_balances(&BalanceParams {
            tenant: Some(TENANT.into()),
            ..Default::default()
        })
        .await
        .expect("balances");
    let root = resp
        .balances
        .iter()
        .find(|b| b.scope_path == ROOT)
        .unwrap_or_else(|| panic!("no {ROOT} balance in {:?}", resp.balances));
    assert_eq!(root.remaining.amount, 5_000);
    assert_eq!(root.reserved, Some(Amount::usd_microcents(3_000)));
    assert_eq!(root.spent, Some(Amount::usd_microcents(2_000)));
    assert_eq!(root.allocated, Some(Amount::usd_microcents(10_000)));
    // `scope` is "full path vs leaf" ambiguous in the spec; match on `scope_path`.
    let agent = resp
        .balances
        .iter()
        .find(|b| b.scope_path == "tenant:acme/agent:bot")
        .unwrap_or_else(|| panic!("no agent balance in {:?}", resp.balances));
    assert_eq!(agent.remaining.amount, 5_000);

    // The SDK refuses a filterless query before sending it.
    let err = client
        .get_balances(&BalanceParams::default())
        .await
        .expect_err("no filter");
    assert!(matches!(err, Error::Validation(_)), "{err:?}");
    guard.commit(commit(3_000)).await.expect("commit");
    assert_eq!(ledger(&s).await, (5_000, 0, 5_000));
    s.stop().await;
}

async fn list_and_get_reservations(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let committed = client.reserve(reserve(1_000)).await.expect("reserve 1");
    let committed_id = committed.reservation_id().clone();
    committed.commit(commit(400)).await.expect("commit");
    let active = client.reserve(reserve(2_000)).await.expect("reserve 2");
    let active_id = active.reservation_id().clone();

    let all = client
        .list_reservations(&ListReservationsParams {
            tenant: Some(TENANT.into()),
            ..Default::default()
        })
        .await
        .expect("list");
    let status_of = |id: &runcycles::models::ReservationId| {
        all.reservations
            .iter()
            .find(|r| &r.reservation_id == id)
            .map(|r| r.status)
    };
    assert_eq!(all.reservations.len(), 2, "{:?}", all.reservations);
    assert_eq!(status_of(&committed_id), Some(ReservationStatus::Committed));
    assert_eq!(status_of(&active_id), Some(ReservationStatus::Active));

    let only_active = client
        .list_reservations(&ListReservationsParams {
            status: Some("ACTIVE".into()),
            ..Default::default()
        })
        .await
        .expect("list active");
    let ids: Vec<_> = only_active
        .reservations
        .iter()
        .map(|r| r.reservation_id.clone())
        .collect();
    assert_eq!(ids, vec![active_id.clone()]);
    let row = &only_active.reservations[0];
    assert_eq!(row.reserved, Amount::usd_microcents(2_000));
    assert_eq!(row.scope_path, ROOT);
    assert_eq!(row.subject.tenant.as_deref(), Some(TENANT));

    let detail = client.get_reservation(&committed_id).await.expect("get");
    assert_eq!(detail.status, ReservationStatus::Committed);
    assert_eq!(detail.reserved, Amount::usd_microcents(1_000));
    assert_eq!(detail.committed, Some(Amount::usd_microcents(400)));
    assert_eq!(detail.finalized_at_ms, Some(T0 as u64));
    assert_eq!(detail.created_at_ms, T0 as u64);
    assert_eq!(detail.action, action());
    assert_eq!(detail.affected_scopes, [ROOT.to_string()]);

    let err = client
        .get_reservation(&runcycles::models::ReservationId::new("rsv_missing"))
        .await
        .expect_err("unknown id");
    assert_eq!(err.status(), Some(404));
    assert_eq!(
        err.error_code(),
        Some(runcycles::models::ErrorCode::NotFound)
    );
    active.release("done").await.expect("release");
    assert_eq!(ledger(&s).await, (400, 0, 999_600));
    s.stop().await;
}

async fn budget_exceeded_is_the_typed_error(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000).await;
    let client = sdk(&s, &key);

    let err = client
        .reserve(reserve(5_000))
        .await
        .expect_err("over budget");
    match &err {
        Error::BudgetExceeded {
            status, request_id, ..
        } => {
            assert_eq!(*status, Some(409));
            assert!(request_id.is_some(), "request id from body or header");
        }
        other => panic!("expected Error::BudgetExceeded, got {other:?}"),
    }
    assert!(err.is_budget_exceeded());
    assert!(!err.is_retryable());

    // with_cycles never runs the closure when the reserve is refused.
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let err = with_cycles(
        &client,
        WithCyclesConfig::new(Amount::usd_microcents(5_000)).subject(subject()),
        |_ctx| async move {
            flag.store(true, Ordering::SeqCst);
            Ok(((), Amount::usd_microcents(0)))
        },
    )
    .await
    .expect_err("over budget");
    assert!(err.is_budget_exceeded(), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst), "the guarded closure ran");
    assert_eq!(ledger(&s).await, (0, 0, 1_000));
    s.stop().await;
}

async fn expired_commit_recovers_via_event(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let req = ReservationCreateRequest::builder()
        .subject(subject())
        .action(action())
        .estimate(Amount::usd_microcents(10_000))
        .ttl_ms(1_000)
        .grace_period_ms(0)
        .build();
    let guard = client.reserve(req).await.expect("reserve");
    let id = guard.reservation_id().clone();
    // A 1 s lease is shorter than the SDK's retry-safety budget, so its heartbeat makes one
    // immediate extension and then stops. Let it settle, then move the server clock well past
    // any expiry it could have reached; the sweeper returns the hold.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.advance(60_000);
    eventually(&s, "the expiry sweep", |b| amount(b, "reserved") == 0).await;
    let detail = client.get_reservation(&id).await;
    assert!(
        matches!(&detail, Err(e) if e.status() == Some(410))
            || matches!(&detail, Ok(d) if d.status == ReservationStatus::Expired),
        "{detail:?}"
    );

    // The commit lands late: 410 RESERVATION_EXPIRED, and the guard records the spend as an
    // event with the commit's idempotency key.
    let late = CommitRequest::builder()
        .idempotency_key(IdempotencyKey::new("late-commit-1"))
        .actual(Amount::usd_microcents(8_000))
        .metadata(json!({"note": "late"}))
        .build();
    let resp = guard.commit(late.clone()).await.expect("recovered commit");
    assert_eq!(resp.status, CommitStatus::RecoveredViaEvent);
    assert!(resp.is_recovered_via_event());
    assert_eq!(resp.charged, Amount::usd_microcents(8_000));
    assert_eq!(ledger(&s).await, (8_000, 0, 992_000));

    // The recovery was an event keyed like the commit: replaying that event is a no-op.
    let replay = EventCreateRequest::builder()
        .idempotency_key(IdempotencyKey::new("late-commit-1"))
        .subject(subject())
        .action(action())
        .actual(Amount::usd_microcents(8_000))
        .metadata(json!({
            "note": "late",
            "recovered_reservation_id": id.as_str(),
            "recovery_reason": "commit_after_reservation_expired",
        }))
        .build();
    let again = client.create_event(&replay).await.expect("event replay");
    assert_eq!(Some(again.event_id), resp.recovered_via_event);
    assert_eq!(ledger(&s).await, (8_000, 0, 992_000));

    // The low-level commit still reports the expiry itself.
    let err = client
        .commit_reservation(&id, &commit(1))
        .await
        .expect_err("expired");
    assert_eq!(err.status(), Some(410));
    assert_eq!(
        err.error_code(),
        Some(runcycles::models::ErrorCode::ReservationExpired)
    );
    s.stop().await;
}

async fn idempotent_replays_charge_once(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup(TENANT, 1_000_000).await;
    let client = sdk(&s, &key);

    let req = ReservationCreateRequest::builder()
        .idempotency_key(IdempotencyKey::new("reserve-once"))
        .subject(subject())
        .action(action())
        .estimate(Amount::usd_microcents(5_000))
        .build();
    let first = client.create_reservation(&req).await.expect("reserve");
    let second = client.create_reservation(&req).await.expect("replay");
    let id = first.reservation_id.clone().expect("id");
    assert_eq!(second.reservation_id.as_ref(), Some(&id));
    assert_eq!(second.expires_at_ms, first.expires_at_ms);
    assert_eq!(ledger(&s).await, (0, 5_000, 995_000));

    // A same-key extend replay answers the first extension and does not extend twice.
    let extend = ExtendRequest {
        idempotency_key: IdempotencyKey::new("extend-once"),
        extend_by_ms: 1_000,
        metadata: None,
    };
    let first_ext = client
        .extend_reservation(&id, &extend)
        .await
        .expect("extend");
    let second_ext = client
        .extend_reservation(&id, &extend)
        .await
        .expect("replay");
    assert_eq!(first_ext.expires_at_ms, (T0 + 61_000) as u64);
    assert_eq!(second_ext.expires_at_ms, first_ext.expires_at_ms);
    let detail = client.get_reservation(&id).await.expect("get");
    assert_eq!(detail.expires_at_ms, (T0 + 61_000) as u64);

    let c = CommitRequest::builder()
        .idempotency_key(IdempotencyKey::new("commit-once"))
        .actual(Amount::usd_microcents(3_000))
        .build();
    let first = client.commit_reservation(&id, &c).await.expect("commit");
    let second = client.commit_reservation(&id, &c).await.expect("replay");
    assert_eq!(first.status, CommitStatus::Committed);
    assert_eq!(second.status, CommitStatus::Committed);
    assert_eq!(second.charged, first.charged);
    assert_eq!(second.released, first.released);
    assert_eq!(ledger(&s).await, (3_000, 0, 997_000));

    // The same key with a different body is a mismatch, not a second charge.
    let other = CommitRequest::builder()
        .idempotency_key(IdempotencyKey::new("commit-once"))
        .actual(Amount::usd_microcents(4_000))
        .build();
    let err = client
        .commit_reservation(&id, &other)
        .await
        .expect_err("mismatch");
    assert_eq!(
        err.error_code(),
        Some(runcycles::models::ErrorCode::IdempotencyMismatch)
    );

    let event = EventCreateRequest::builder()
        .idempotency_key(IdempotencyKey::new("event-once"))
        .subject(subject())
        .action(action())
        .actual(Amount::usd_microcents(1_500))
        .build();
    let first = client.create_event(&event).await.expect("event");
    let second = client.create_event(&event).await.expect("replay");
    assert_eq!(first.event_id, second.event_id);
    assert_eq!(ledger(&s).await, (4_500, 0, 995_500));
    s.stop().await;
}
