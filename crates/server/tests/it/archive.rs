//! Settled reservations leave memory for the history store (DESIGN §3a): every read, replay
//! and refusal answers as it did while they were in memory, and listings merge the two.

use std::time::{Duration, Instant};

use crate::common::{metric, reserve_body, As, Engine, Resp, TestServer, T0};
use crate::listing::{ids, walk};
use serde_json::{json, Value};

engine_tests!(
    archived_reservations_answer_as_before,
    listings_merge_memory_and_archive_in_every_order,
);

const UNIT: &str = "USD_MICROCENTS";

/// Moves the clock past the archive delay (2 s in tests) and waits until the sweep has
/// archived `total` reservations since the start, and the history store holds them.
async fn archived(s: &TestServer, total: u64) {
    s.advance(2_001);
    swept(s, "cycles_sweep_archived_total", total).await;
    // The history store's count follows its writer, which runs after the sweep's record is durable.
    swept(s, "cycles_reservations_archived", total).await;
}

/// Waits until the sweep's counter `name` reaches `total`.
async fn swept(s: &TestServer, name: &str, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(s, name).await < total {
        assert!(Instant::now() < deadline, "{name} stayed under {total}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn acme() -> Value {
    json!({"tenant": "acme", "agent": "bot"})
}

async fn reserve(s: &TestServer, key: &str, idem: &str, estimate: i64) -> Resp {
    s.post(
        "/v1/reservations",
        As::Key(key),
        reserve_body(idem, acme(), estimate),
    )
    .await
}

fn id(r: &Resp) -> String {
    r.expect(200, None)["reservation_id"]
        .as_str()
        .expect("an id")
        .to_string()
}

async fn settle(s: &TestServer, key: &str, id: &str, op: &str, idem: &str) -> Resp {
    let body = match op {
        "commit" => json!({"idempotency_key": idem, "actual": {"unit": UNIT, "amount": 40}}),
        "release" => json!({"idempotency_key": idem, "reason": "done"}),
        _ => json!({"idempotency_key": idem, "extend_by_ms": 1_000}),
    };
    s.post(&format!("/v1/reservations/{id}/{op}"), As::Key(key), body)
        .await
}

/// Every request that names a settled reservation, answered the same before and after it
/// was archived: status and body.
async fn answers(s: &TestServer, key: &str, other: &str, ids: &[String]) -> Vec<(u16, Value)> {
    let (committed, released, extended, expired) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let mut out = Vec::new();
    // Errors name their request: the rest of the body is the answer.
    let mut push = |mut r: Resp| {
        if let Some(error) = r.body.as_object_mut() {
            error.remove("request_id");
            error.remove("trace_id");
        }
        out.push((r.status, r.body))
    };
    for id in ids {
        push(s.get(&format!("/v1/reservations/{id}"), As::Key(key)).await);
        push(s.get(&format!("/v1/reservations/{id}"), As::Admin).await);
        push(
            s.get(&format!("/v1/reservations/{id}"), As::Key(other))
                .await,
        );
    }
    // Replays of the settlements, and of the extension before its commit.
    push(settle(s, key, committed, "commit", "c-0").await);
    push(settle(s, key, released, "release", "r-1").await);
    push(settle(s, key, extended, "extend", "e-2").await);
    push(settle(s, key, extended, "commit", "c-2").await);
    // Another key on a settled reservation: 409 finalized, or 410 expired.
    for id in ids {
        push(settle(s, key, id, "commit", "late").await);
        push(settle(s, key, id, "release", "late").await);
        push(settle(s, key, id, "extend", "late").await);
    }
    // The same key with another body: a mismatch, wherever its record is.
    let changed = json!({"idempotency_key": "c-0", "actual": {"unit": UNIT, "amount": 41}});
    push(
        s.post(
            &format!("/v1/reservations/{committed}/commit"),
            As::Key(key),
            changed,
        )
        .await,
    );
    // The admin's release, replayed.
    push(admin_release(s, &ids[4]).await);
    // Replays of the reserves (their keys' digests are what stays in memory).
    for (i, estimate) in [(0, 100), (1, 100), (2, 100), (3, 100), (4, 100)] {
        push(reserve(s, key, &format!("k-{i}"), estimate).await);
    }
    push(reserve(s, key, "k-0", 101).await);
    push(
        s.get("/v1/reservations?idempotency_key=k-0", As::Key(key))
            .await,
    );
    push(s.get("/v1/reservations/rsv_unknown", As::Key(key)).await);
    push(
        s.post(
            &format!("/v1/reservations/{expired}/commit"),
            As::Admin,
            json!({"idempotency_key": "x", "actual": {"unit": UNIT, "amount": 1}}),
        )
        .await,
    );
    out
}

async fn admin_release(s: &TestServer, id: &str) -> Resp {
    let body = json!({"idempotency_key": "a-4", "reason": "operator"});
    s.post(&format!("/v1/reservations/{id}/release"), As::Admin, body)
        .await
}

async fn archived_reservations_answer_as_before(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let other = s.setup("beta", 1_000).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(id(&reserve(&s, &key, &format!("k-{i}"), 100).await));
    }
    let settlements = [
        (0, "commit", "c-0"),
        (1, "release", "r-1"),
        (2, "extend", "e-2"),
        (2, "commit", "c-2"),
    ];
    for (i, op, idem) in settlements {
        settle(&s, &key, &ids[i], op, idem).await.expect(200, None);
    }
    admin_release(&s, &ids[4]).await.expect(200, None);
    // The fourth lapses (60 s and 5 s of grace) and the sweep expires it.
    s.advance(66_000);
    swept(&s, "cycles_sweep_expired_total", 1).await;
    let before = answers(&s, &key, &other, &ids).await;
    assert!(
        before.iter().any(|(status, _)| *status == 409) && before.iter().any(|(s, _)| *s == 410),
        "the refusals are exercised: {before:?}"
    );
    archived(&s, 5).await;
    assert_eq!(metric(&s, "cycles_reservations").await, 0);
    assert_eq!(metric(&s, "cycles_reservations_archived").await, 5);
    assert_eq!(metric(&s, "cycles_archived_reserve_keys").await, 5);
    let after = answers(&s, &key, &other, &ids).await;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(a, b, "answer {i} changed once archived");
    }
    assert_eq!(before.len(), after.len());
    // The admin's release and both its replays, the one after archiving included, are
    // filed under the reservation's tenant.
    let path = format!("/v1/admin/audit/logs?resource_id={}", ids[4]);
    let logs = s.get(&path, As::Admin).await.expect(200, None)["logs"].clone();
    let tenants: Vec<&Value> = logs
        .as_array()
        .expect("logs")
        .iter()
        .map(|e| &e["tenant_id"])
        .collect();
    assert_eq!(tenants, [&json!("acme"); 3], "{logs}");
    // Nothing came back into memory, and no replay made a new reservation.
    assert_eq!(metric(&s, "cycles_reservations").await, 0);
    s.stop().await;
}

/// Every order, both ways, with and without a status filter, paged seven at a time.
async fn listings(s: &TestServer, key: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for sort in [
        "reservation_id",
        "tenant",
        "scope_path",
        "status",
        "reserved",
        "created_at_ms",
        "expires_at_ms",
    ] {
        for dir in ["asc", "desc"] {
            // Rows 10 to 29 by creation; rows settled from T0 + 41 ms on (the first
            // settlements; after the 40 reserves, one millisecond apart).
            let (from, to) = (
                ledger::format_rfc3339(T0 + 10),
                ledger::format_rfc3339(T0 + 29),
            );
            let settled_from = ledger::format_rfc3339(T0 + 40);
            let filters = [
                String::new(),
                "&status=COMMITTED".into(),
                "&status=ACTIVE".into(),
                "&agent=a1".into(),
                format!("&from={from}&to={to}"),
                format!("&finalized_from={settled_from}&workspace=w1"),
            ];
            for filter in filters {
                let query = format!("limit=7&sort_by={sort}&sort_dir={dir}{filter}");
                out.push(ids(&walk(s, key, &query).await));
            }
        }
    }
    out
}

async fn listings_merge_memory_and_archive_in_every_order(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 10_000_000).await;
    let mut ids = Vec::new();
    for i in 0..40i64 {
        let subject = json!({"tenant": "acme", "workspace": format!("w{}", i % 3), "agent": format!("a{}", i % 2)});
        let mut body = reserve_body(&format!("k-{i}"), subject, 100 + (i * 37) % 11);
        body["ttl_ms"] = json!(3_600_000 - i * 1_000);
        let r = s.post("/v1/reservations", As::Key(&key), body).await;
        ids.push(id(&r));
        s.advance(1);
    }
    // A third committed, a third released, a third left ACTIVE.
    for (i, id) in ids.iter().enumerate() {
        match i % 3 {
            0 => settle(&s, &key, id, "commit", &format!("c-{i}")).await,
            1 => settle(&s, &key, id, "release", &format!("r-{i}")).await,
            _ => continue,
        }
        .expect(200, None);
    }
    let in_memory = listings(&s, &key).await;
    assert_eq!(in_memory[0].len(), 40);
    // Every filter selects some rows and leaves others (the first order, ascending).
    for listing in &in_memory[1..6] {
        assert!((1..40).contains(&listing.len()), "{listing:?}");
    }
    archived(&s, 27).await;
    assert_eq!(metric(&s, "cycles_reservations").await, 13);
    let merged = listings(&s, &key).await;
    assert_eq!(merged, in_memory, "archived rows list where they did");
    // Settle the ACTIVE ones now: the rows settled last are in memory, the others on disk.
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 2) {
        settle(&s, &key, id, "commit", &format!("c-{i}"))
            .await
            .expect(200, None);
    }
    let mixed = listings(&s, &key).await;
    archived(&s, 40).await;
    assert_eq!(metric(&s, "cycles_reservations").await, 0);
    let on_disk = listings(&s, &key).await;
    assert_eq!(
        mixed, on_disk,
        "a listing is the same wherever its rows are"
    );
    assert_eq!(on_disk[0].len(), 40);
    s.stop().await;
}
