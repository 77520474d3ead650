//! Reservation leases over HTTP with the manual clock (runtime spec §5.4, §6.7, A-15–A-18):
//! default TTL and grace, the tenant's TTL cap, the commit/release window, extend, the
//! extension cap, reads of lapsed reservations, and the background sweep.

use std::time::Duration;

use crate::common::{amount, assert_invariant, reserve_body, As, Engine, Resp, TestServer, T0};
use serde_json::{json, Value};

const UNIT: &str = "USD_MICROCENTS";
const ESTIMATE: i64 = 100;
const DEFAULT_TTL: i64 = 60_000;
const DEFAULT_GRACE: i64 = 5_000;

engine_tests!(
    defaults_are_sixty_seconds_and_five_seconds_grace,
    settlement_window_ends_with_grace_inclusive,
    tenant_limits_cap_the_ttl_silently,
    lease_bounds_are_validated,
    extend_grows_the_current_expiry_until_it_lapses,
    extensions_are_capped_per_tenant,
    lapsed_reservation_reads_as_expired,
    sweep_expires_lapsed_reservations_untouched,
);

/// A lease operation on a reservation.
#[derive(Clone, Copy, Debug)]
enum Op {
    Commit,
    Release,
    Extend(i64),
}

/// Sends `op` with idempotency key `idem`.
async fn act(s: &TestServer, key: &str, id: &str, op: Op, idem: &str) -> Resp {
    let (path, body) = match op {
        Op::Commit => (
            "commit",
            json!({"idempotency_key": idem, "actual": {"unit": UNIT, "amount": ESTIMATE / 2}}),
        ),
        Op::Release => (
            "release",
            json!({"idempotency_key": idem, "reason": "done"}),
        ),
        Op::Extend(by) => (
            "extend",
            json!({"idempotency_key": idem, "extend_by_ms": by}),
        ),
    };
    let path = format!("/v1/reservations/{id}/{path}");
    checked(s.post(&path, As::Key(key), body).await)
}

/// Asserts the ledger invariant on every Balance of a response, then hands it back.
fn checked(r: Resp) -> Resp {
    for b in r.body["balances"].as_array().into_iter().flatten() {
        assert_invariant(b);
    }
    r
}

/// Reserves `ESTIMATE` for `subject` with extra body fields; returns the 200 body.
async fn lease(s: &TestServer, key: &str, idem: &str, subject: Value, extra: Value) -> Value {
    let body = with_fields(reserve_body(idem, subject, ESTIMATE), extra);
    let r = checked(s.post("/v1/reservations", As::Key(key), body).await);
    r.expect(200, None).clone()
}

/// `body` with every field of the object `extra` set on it.
fn with_fields(mut body: Value, extra: Value) -> Value {
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            body[k] = v;
        }
    }
    body
}

fn id_of(body: &Value) -> String {
    body["reservation_id"]
        .as_str()
        .expect("reservation_id")
        .to_string()
}

fn acme() -> Value {
    json!({"tenant": "acme"})
}

/// `(expires_at_ms, remaining_ttl_ms)` of a reserve or extend response.
fn lease_times(body: &Value) -> (i64, i64) {
    let n = |f: &str| body[f].as_i64().unwrap_or_else(|| panic!("{f} in {body}"));
    (n("expires_at_ms"), n("remaining_ttl_ms"))
}

async fn get(s: &TestServer, key: &str, id: &str) -> Resp {
    s.get(&format!("/v1/reservations/{id}"), As::Key(key)).await
}

/// `(reserved, remaining)` of a budget.
async fn held(s: &TestServer, scope: &str) -> (i64, i64) {
    let b = s.ledger(scope, UNIT).await;
    (amount(&b, "reserved"), amount(&b, "remaining"))
}

/// A tenant created with `settings`, its key and a 1 000 000 budget; returns the key.
async fn tenant_with_settings(s: &TestServer, t: &str, settings: Value) -> String {
    s.tenant_with(with_fields(json!({"tenant_id": t, "name": t}), settings))
        .await;
    let key = s.key(t).await;
    s.budget(&format!("tenant:{t}"), UNIT, 1_000_000, json!({}))
        .await;
    key
}

/// Without `ttl_ms`/`grace_period_ms` a lease is 60 s plus 5 s of grace; at the end of the
/// grace a commit still succeeds, one millisecond later it is 410 and the hold is returned.
async fn defaults_are_sixty_seconds_and_five_seconds_grace(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let a = lease(&s, &key, "a", acme(), json!({})).await;
    let b = lease(&s, &key, "b", acme(), json!({})).await;
    assert_eq!(lease_times(&a), (T0 + DEFAULT_TTL, DEFAULT_TTL));
    let detail = get(&s, &key, &id_of(&b)).await;
    assert_eq!(detail.expect(200, None)["expires_at_ms"], T0 + DEFAULT_TTL);
    assert_eq!(held(&s, "tenant:acme").await, (200, 999_800));

    s.advance(DEFAULT_TTL + DEFAULT_GRACE);
    act(&s, &key, &id_of(&a), Op::Commit, "c-a")
        .await
        .expect(200, None);
    s.advance(1);
    act(&s, &key, &id_of(&b), Op::Commit, "c-b")
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    get(&s, &key, &id_of(&b))
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    assert_eq!(held(&s, "tenant:acme").await, (0, 1_000_000 - ESTIMATE / 2));
    s.stop().await;
}

/// Commit and release are accepted until `expires_at + grace` inclusive and refused with 410
/// after it, for the default, zero and maximum grace; a refused settlement returns the hold.
async fn settlement_window_ends_with_grace_inclusive(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let mut spent = 0;
    for op in [Op::Commit, Op::Release] {
        for grace in [DEFAULT_GRACE, 0, 60_000] {
            let extra = json!({"ttl_ms": 1_000, "grace_period_ms": grace});
            let on_time = lease(
                &s,
                &key,
                &format!("{op:?}-{grace}-1"),
                acme(),
                extra.clone(),
            )
            .await;
            let late = lease(&s, &key, &format!("{op:?}-{grace}-2"), acme(), extra).await;
            s.advance(1_000 + grace);
            let r = act(&s, &key, &id_of(&on_time), op, &format!("{op:?}-{grace}-a")).await;
            r.expect(200, None);
            s.advance(1);
            let r = act(&s, &key, &id_of(&late), op, &format!("{op:?}-{grace}-b")).await;
            r.expect(410, Some("RESERVATION_EXPIRED"));
            if matches!(op, Op::Commit) {
                spent += ESTIMATE / 2;
            }
            assert_eq!(
                held(&s, "tenant:acme").await,
                (0, 1_000_000 - spent),
                "{op:?} grace {grace}"
            );
        }
    }
    s.stop().await;
}

/// The tenant's default TTL applies without `ttl_ms`; a TTL above the tenant's maximum is
/// capped silently (A-18), and the cap is the real lease, not just a display value.
async fn tenant_limits_cap_the_ttl_silently(engine: Engine) {
    let s = TestServer::start(engine).await;
    let settings = json!({"default_reservation_ttl_ms": 20_000, "max_reservation_ttl_ms": 30_000});
    let key = tenant_with_settings(&s, "acme", settings).await;
    let defaulted = lease(&s, &key, "d", acme(), json!({})).await;
    assert_eq!(lease_times(&defaulted), (T0 + 20_000, 20_000));
    let capped = lease(&s, &key, "c", acme(), json!({"ttl_ms": 120_000})).await;
    assert_eq!(lease_times(&capped), (T0 + 30_000, 30_000));
    let short = lease(&s, &key, "s", acme(), json!({"ttl_ms": 10_000})).await;
    assert_eq!(lease_times(&short), (T0 + 10_000, 10_000));

    s.advance(30_000 + DEFAULT_GRACE + 1);
    act(&s, &key, &id_of(&capped), Op::Commit, "late")
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    s.stop().await;
}

/// `ttl_ms` must be 1 000..86 400 000 and `grace_period_ms` 0..60 000 (out of range → 400).
async fn lease_bounds_are_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let bad = [
        json!({"ttl_ms": 999}),
        json!({"ttl_ms": 86_400_001}),
        json!({"grace_period_ms": -1}),
        json!({"grace_period_ms": 60_001}),
    ];
    for (i, extra) in bad.into_iter().enumerate() {
        let body = with_fields(reserve_body(&format!("bad{i}"), acme(), ESTIMATE), extra);
        let r = s.post("/v1/reservations", As::Key(&key), body).await;
        r.expect(400, Some("INVALID_REQUEST"));
    }
    let edge = json!({"ttl_ms": 86_400_000, "grace_period_ms": 60_000});
    let b = lease(&s, &key, "edge", acme(), edge).await;
    // The tenant's default maximum TTL (1 h) caps the 24 h request.
    assert_eq!(lease_times(&b), (T0 + 3_600_000, 3_600_000));
    s.stop().await;
}

/// `extend_by_ms` is added to the current expiry (not to now), extend is accepted up to the
/// expiry inclusive and refused with 410 within the grace period, and grace then counts from
/// the extended expiry.
async fn extend_grows_the_current_expiry_until_it_lapses(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let r = lease(&s, &key, "r", acme(), json!({"ttl_ms": 10_000})).await;
    let id = id_of(&r);
    s.advance(4_000);
    let e = act(&s, &key, &id, Op::Extend(5_000), "e1").await;
    let eb = e.expect(200, None);
    assert_eq!(eb["status"], "ACTIVE");
    assert_eq!(lease_times(eb), (T0 + 15_000, 11_000));

    s.advance(11_000); // exactly the new expiry
    let e = act(&s, &key, &id, Op::Extend(2_000), "e2").await;
    assert_eq!(lease_times(e.expect(200, None)), (T0 + 17_000, 2_000));
    let detail = get(&s, &key, &id).await;
    assert_eq!(detail.expect(200, None)["expires_at_ms"], T0 + 17_000);

    s.advance(2_001); // T0 + 17 001, within grace: settlement yes, extension no
    act(&s, &key, &id, Op::Extend(2_000), "e3")
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    assert_eq!(
        get(&s, &key, &id).await.expect(200, None)["status"],
        "ACTIVE"
    );
    s.advance(DEFAULT_GRACE - 1); // T0 + 22 000 = extended expiry + grace
    act(&s, &key, &id, Op::Commit, "c").await.expect(200, None);
    s.stop().await;
}

/// Extends `id` `n` times (1 ms each) and returns the status of every response.
async fn extend_times(s: &TestServer, key: &str, id: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 0..n {
        let r = act(s, key, id, Op::Extend(1), &format!("x{i}")).await;
        if r.status != 200 {
            assert_eq!(r.code(), "MAX_EXTENSIONS_EXCEEDED", "{}", r.body);
        }
        statuses.push(r.status);
    }
    statuses
}

/// The tenant's `max_reservation_extensions` (default 10) caps extensions with 409
/// MAX_EXTENSIONS_EXCEEDED; a replay of an earlier extension still returns its response.
async fn extensions_are_capped_per_tenant(engine: Engine) {
    let s = TestServer::start(engine).await;
    let cases = [
        ("two", Some(2), 2),
        ("zero", Some(0), 0),
        ("dflt", None, 10),
    ];
    for (t, max, allowed) in cases {
        let settings = max.map_or(json!({}), |m| json!({"max_reservation_extensions": m}));
        let key = tenant_with_settings(&s, t, settings).await;
        let subject = json!({"tenant": t});
        let id = id_of(&lease(&s, &key, "r", subject, json!({})).await);
        let mut expected = vec![200; allowed];
        expected.push(409);
        assert_eq!(
            extend_times(&s, &key, &id, allowed + 1).await,
            expected,
            "{t}"
        );
        let detail = get(&s, &key, &id).await;
        let expires = T0 + DEFAULT_TTL + allowed as i64;
        assert_eq!(detail.expect(200, None)["expires_at_ms"], expires, "{t}");
        if allowed > 0 {
            let replay = act(&s, &key, &id, Op::Extend(1), "x0").await;
            assert_eq!(
                replay.expect(200, None)["expires_at_ms"],
                T0 + DEFAULT_TTL + 1
            );
        }
    }
    s.stop().await;
}

/// Past its grace a reservation reads as 410 RESERVATION_EXPIRED, every settlement is 410, and
/// a replay of its reserve returns the original response with `remaining_ttl_ms` 0.
async fn lapsed_reservation_reads_as_expired(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let r = lease(&s, &key, "r", acme(), json!({})).await;
    let id = id_of(&r);
    s.advance(DEFAULT_TTL + DEFAULT_GRACE + 1);
    get(&s, &key, &id)
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    for (op, idem) in [
        (Op::Commit, "c"),
        (Op::Release, "rel"),
        (Op::Extend(1_000), "e"),
    ] {
        act(&s, &key, &id, op, idem)
            .await
            .expect(410, Some("RESERVATION_EXPIRED"));
    }
    let replay = lease(&s, &key, "r", acme(), json!({})).await;
    assert_eq!(replay["reservation_id"], r["reservation_id"]);
    assert_eq!(lease_times(&replay), (T0 + DEFAULT_TTL, 0));
    assert_eq!(held(&s, "tenant:acme").await, (0, 1_000_000));
    s.stop().await;
}

/// Polls the budget until `reserved` is `want` (the sweep runs every 20 ms); at most ~2 s.
async fn wait_for_reserved(s: &TestServer, scope: &str, want: i64) {
    for _ in 0..200 {
        if held(s, scope).await.0 == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{scope}: reserved is {:?}, expected {want}",
        held(s, scope).await
    );
}

/// The background sweep expires reservations past their grace without any request touching
/// them, returns every hold, and leaves an extended reservation alone until its own deadline.
async fn sweep_expires_lapsed_reservations_untouched(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    s.budget("tenant:acme/agent:bot", UNIT, 500_000, json!({}))
        .await;
    let bot = json!({"tenant": "acme", "agent": "bot"});
    let a = id_of(&lease(&s, &key, "a", acme(), json!({})).await);
    let b = id_of(&lease(&s, &key, "b", bot, json!({})).await);
    let c = id_of(&lease(&s, &key, "c", acme(), json!({})).await);
    act(&s, &key, &c, Op::Extend(30_000), "e")
        .await
        .expect(200, None);
    assert_eq!(held(&s, "tenant:acme").await, (300, 999_700));
    assert_eq!(held(&s, "tenant:acme/agent:bot").await, (100, 499_900));

    s.advance(DEFAULT_TTL + DEFAULT_GRACE + 1);
    wait_for_reserved(&s, "tenant:acme", ESTIMATE).await;
    assert_eq!(held(&s, "tenant:acme/agent:bot").await, (0, 500_000));
    for id in [&a, &b] {
        get(&s, &key, id)
            .await
            .expect(410, Some("RESERVATION_EXPIRED"));
    }
    assert_eq!(
        get(&s, &key, &c).await.expect(200, None)["status"],
        "ACTIVE"
    );

    s.advance(30_000);
    wait_for_reserved(&s, "tenant:acme", 0).await;
    assert_eq!(held(&s, "tenant:acme").await, (0, 1_000_000));
    get(&s, &key, &c)
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    wait_for_metric(&s, "cycles_sweep_expired_total", 3).await;
    s.stop().await;
}

/// Polls `/metrics` until the counter `name` reads `want`; at most ~2 s (the sweeper counts
/// a batch just after the ledger applied it).
async fn wait_for_metric(s: &TestServer, name: &str, want: u64) {
    let mut seen = None;
    for _ in 0..100 {
        let resp = s.get("/metrics", As::Admin).await;
        let text = resp.body.as_str().unwrap_or_default().to_owned();
        seen = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok());
        if seen == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} is {seen:?}, expected {want}");
}
