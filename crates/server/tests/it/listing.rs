//! `GET /v1/reservations`: filters, orders, cursors bound to their query, stable pages.

use std::collections::HashSet;

use crate::common::{reserve_body, As, Engine, TestServer, T0};
use serde_json::{json, Value};

engine_tests!(
    pages_are_complete_and_stable_under_inserts,
    every_order_is_sorted_both_ways,
    filters_select_the_right_rows,
    cursors_are_bound_to_their_query,
    admin_listing_requires_a_tenant,
    query_parameters_are_validated,
);

/// Creates `n` reservations one millisecond apart (estimate = 10 + i); returns their ids.
async fn reserve_many(s: &TestServer, key: &str, n: usize, agent: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let subject = json!({"tenant": "acme", "agent": agent});
        let body = reserve_body(&format!("{agent}-{i}"), subject, 10 + i as i64);
        let r = s.post("/v1/reservations", As::Key(key), body).await;
        ids.push(
            r.expect(200, None)["reservation_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        s.advance(1);
    }
    ids
}

/// Follows `next_cursor` to the end; returns every row.
pub(crate) async fn walk(s: &TestServer, key: &str, query: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("/v1/reservations?{query}&cursor={c}"),
            None => format!("/v1/reservations?{query}"),
        };
        let page = s.get(&url, As::Key(key)).await.expect(200, None).clone();
        rows.extend(page["reservations"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(page["has_more"], true);
                cursor = Some(c.to_string());
            }
            None => {
                assert_eq!(page["has_more"], false);
                return rows;
            }
        }
    }
}

pub(crate) fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["reservation_id"].as_str().unwrap().to_string())
        .collect()
}

async fn pages_are_complete_and_stable_under_inserts(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000_000).await;
    let created = reserve_many(&s, &key, 25, "a").await;
    // First page (newest first), then insert more rows before following the cursor.
    let first = s
        .get("/v1/reservations?limit=10", As::Key(&key))
        .await
        .expect(200, None)
        .clone();
    let mut seen = ids(first["reservations"].as_array().unwrap());
    assert_eq!(
        seen,
        created.iter().rev().take(10).cloned().collect::<Vec<_>>()
    );
    reserve_many(&s, &key, 5, "b").await;
    let mut cursor = first["next_cursor"].as_str().unwrap().to_string();
    loop {
        let page = s
            .get(
                &format!("/v1/reservations?limit=10&cursor={cursor}"),
                As::Key(&key),
            )
            .await
            .expect(200, None)
            .clone();
        seen.extend(ids(page["reservations"].as_array().unwrap()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    // Rows newer than the first page are not mixed in; every older row comes exactly once.
    let expected: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(seen, expected);
    s.stop().await;
}

async fn every_order_is_sorted_both_ways(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000_000).await;
    let created = reserve_many(&s, &key, 12, "a").await;
    // Make statuses differ: commit some, release some.
    for (i, id) in created.iter().enumerate().take(6) {
        let (op, body) = if i % 2 == 0 {
            (
                "commit",
                json!({"idempotency_key": format!("c{i}"), "actual": {"unit": "USD_MICROCENTS", "amount": 1}}),
            )
        } else {
            ("release", json!({"idempotency_key": format!("r{i}")}))
        };
        s.post(&format!("/v1/reservations/{id}/{op}"), As::Key(&key), body)
            .await
            .expect(200, None);
    }
    for (sort, field) in [
        ("reservation_id", "reservation_id"),
        ("tenant", "reservation_id"),
        ("scope_path", "scope_path"),
        ("status", "status"),
        ("reserved", "reserved"),
        ("created_at_ms", "created_at_ms"),
        ("expires_at_ms", "expires_at_ms"),
    ] {
        for dir in ["asc", "desc"] {
            let rows = walk(&s, &key, &format!("sort_by={sort}&sort_dir={dir}&limit=5")).await;
            assert_eq!(rows.len(), 12, "{sort} {dir}");
            let keys: Vec<Value> = rows
                .iter()
                .map(|r| match field {
                    "reserved" => r["reserved"]["amount"].clone(),
                    // Statuses sort by lifecycle order, not by name.
                    "status" => json!(["ACTIVE", "COMMITTED", "RELEASED", "EXPIRED"]
                        .iter()
                        .position(|x| *x == r["status"])),
                    f => r[f].clone(),
                })
                .collect();
            let mut sorted = keys.clone();
            sorted.sort_by(cmp_json);
            if dir == "desc" {
                sorted.reverse();
            }
            assert_eq!(keys, sorted, "{sort} {dir}");
        }
    }
    s.stop().await;
}

fn cmp_json(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => a.as_str().cmp(&b.as_str()),
    }
}

async fn filters_select_the_right_rows(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000_000).await;
    let a = reserve_many(&s, &key, 4, "alpha").await;
    let b = reserve_many(&s, &key, 3, "beta").await;
    s.post(
        &format!("/v1/reservations/{}/commit", a[0]),
        As::Key(&key),
        json!({"idempotency_key": "c", "actual": {"unit": "USD_MICROCENTS", "amount": 5}}),
    )
    .await
    .expect(200, None);
    let only = |rows: Vec<Value>| ids(&rows).into_iter().collect::<HashSet<_>>();
    assert_eq!(
        only(walk(&s, &key, "agent=beta").await),
        b.iter().cloned().collect()
    );
    assert_eq!(
        only(walk(&s, &key, "agent=BETA").await).len(),
        3,
        "filters are case-insensitive"
    );
    let committed = walk(&s, &key, "status=COMMITTED").await;
    assert_eq!(ids(&committed), vec![a[0].clone()]);
    assert_eq!(committed[0]["committed"]["amount"], 5);
    assert_eq!(walk(&s, &key, "status=ACTIVE&agent=alpha").await.len(), 3);
    // finalized window: only finalized rows can match.
    let fin = walk(&s, &key, "finalized_from=2000-01-01T00:00:00Z").await;
    assert_eq!(ids(&fin), vec![a[0].clone()]);
    // created window (inclusive), in ISO-8601: the 2nd..3rd alpha rows (T0+1, T0+2).
    let from = protocol::format_rfc3339(T0 + 1);
    let to = protocol::format_rfc3339(T0 + 2);
    let window = walk(&s, &key, &format!("from={from}&to={to}&sort_dir=asc")).await;
    assert_eq!(ids(&window), vec![a[1].clone(), a[2].clone()]);
    // An empty list parameter asks for nothing; an empty scalar one is refused, by name
    // (it is not read as absent), but for a window's bounds (query_parameters_are_validated).
    assert_eq!(walk(&s, &key, "include=").await.len(), 7);
    for blank in ["status", "agent"] {
        let r = s
            .get(
                &format!("/v1/reservations?{blank}=&include="),
                As::Key(&key),
            )
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
        assert!(
            r.body["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with(blank),
            "{blank}=: {}",
            r.body
        );
    }
    // The create idempotency key finds exactly its reservation, as sent: keys are opaque, so
    // one with a space around it is another key, and one past 256 characters is refused
    // whatever it ends with.
    assert_eq!(
        ids(&walk(&s, &key, "idempotency_key=beta-1").await),
        vec![b[1].clone()]
    );
    assert!(walk(&s, &key, "idempotency_key=%20beta-1").await.is_empty());
    let long = format!("k{}", "%20".repeat(256));
    s.get(
        &format!("/v1/reservations?idempotency_key={long}"),
        As::Key(&key),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    // include projects metadata; it does not change matching.
    let body = json!({
        "idempotency_key": "m1", "subject": {"tenant": "acme"},
        "action": {"kind": "k", "name": "n"},
        "estimate": {"unit": "USD_MICROCENTS", "amount": 1}, "metadata": {"run": 7}
    });
    s.post("/v1/reservations", As::Key(&key), body)
        .await
        .expect(200, None);
    let plain = walk(&s, &key, "idempotency_key=m1").await;
    assert!(plain[0].get("metadata").is_none());
    let with = walk(&s, &key, "idempotency_key=m1&include=metadata,evidence").await;
    assert_eq!(with[0]["metadata"], json!({"run": 7}));
    s.stop().await;
}

async fn cursors_are_bound_to_their_query(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    reserve_many(&s, &key, 5, "a").await;
    let page = s
        .get("/v1/reservations?limit=2&agent=a", As::Key(&key))
        .await
        .expect(200, None)
        .clone();
    let c = page["next_cursor"].as_str().unwrap();
    for other in [
        "agent=b",
        "agent=a&sort_dir=asc",
        "agent=a&sort_by=reserved",
        "agent=a&status=ACTIVE",
    ] {
        s.get(
            &format!("/v1/reservations?limit=2&{other}&cursor={c}"),
            As::Key(&key),
        )
        .await
        .expect(400, Some("INVALID_REQUEST"));
    }
    // include is projection only: it does not invalidate the cursor.
    s.get(
        &format!("/v1/reservations?limit=2&agent=a&include=metadata&cursor={c}"),
        As::Key(&key),
    )
    .await
    .expect(200, None);
    s.get("/v1/reservations?cursor=not-a-cursor", As::Key(&key))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    // A cursor edited so that its position is text in a numeric order is refused too.
    s.get(
        &format!("/v1/reservations?limit=2&agent=a&cursor={}", retyped(c)),
        As::Key(&key),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    s.stop().await;
}

/// `cursor` (hex of JSON) with its numeric position replaced by a text one.
fn retyped(cursor: &str) -> String {
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&cursor[i..i + 2], 16).expect("hex cursor"))
        .collect();
    let mut c: Value = serde_json::from_slice(&bytes).expect("JSON cursor");
    assert!(c["v"].get("Int").is_some(), "a numeric position: {c}");
    c["v"] = json!({"Text": "zzz"});
    let edited = serde_json::to_vec(&c).expect("JSON");
    edited.iter().map(|b| format!("{b:02x}")).collect()
}

async fn admin_listing_requires_a_tenant(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    s.setup("other", 1_000_000).await;
    reserve_many(&s, &key, 3, "a").await;
    let r = s.get("/v1/reservations", As::Admin).await;
    r.expect(400, Some("INVALID_REQUEST"));
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .contains("tenant query parameter is required"));
    let acme = s.get("/v1/reservations?tenant=acme", As::Admin).await;
    assert_eq!(
        acme.expect(200, None)["reservations"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // In any case, as a tenant key's `tenant` is read.
    let upper = s.get("/v1/reservations?tenant=ACME", As::Admin).await;
    assert_eq!(upper.expect(200, None), acme.expect(200, None));
    let other = s.get("/v1/reservations?tenant=other", As::Admin).await;
    assert_eq!(
        other.expect(200, None)["reservations"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // A tenant key's `tenant` parameter is validation only.
    s.get("/v1/reservations?tenant=other", As::Key(&key))
        .await
        .expect(403, Some("FORBIDDEN"));
    s.stop().await;
}

async fn query_parameters_are_validated(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    for bad in [
        "status=DONE",
        "sort_by=amount",
        "sort_dir=up",
        "limit=0",
        "limit=201",
        "limit=x",
        "from=yesterday",
        "from=2030-01-02T00:00:00Z&to=2030-01-01T00:00:00Z",
        "expires_from=2030-01-02T00:00:00Z&expires_to=2030-01-01T00:00:00Z",
        "finalized_from=2030-01-02T00:00:00Z&finalized_to=2030-01-01T00:00:00Z",
    ] {
        let r = s
            .get(&format!("/v1/reservations?{bad}"), As::Key(&key))
            .await;
        r.expect(400, Some("INVALID_REQUEST"));
    }
    // Unknown parameters are ignored (additive-parameter rule).
    s.get("/v1/reservations?color=blue", As::Key(&key))
        .await
        .expect(200, None);
    // A blank window bound is unset (the spec's normative rule), not malformed: the page is
    // the one without it. A repeated one is still refused.
    reserve_many(&s, &key, 3, "bot").await;
    let all = s.get("/v1/reservations", As::Key(&key)).await;
    let all = all.expect(200, None).clone();
    assert_eq!(all["reservations"].as_array().map(Vec::len), Some(3));
    let blanks = "from=&to=%20&expires_from=&expires_to=&finalized_from=&finalized_to=";
    let r = s
        .get(&format!("/v1/reservations?{blanks}"), As::Key(&key))
        .await;
    assert_eq!(r.expect(200, None), &all);
    s.get("/v1/reservations?from=&from=", As::Key(&key))
        .await
        .expect(400, Some("INVALID_REQUEST"));
    // `include` takes any number of tokens, unknown and empty ones ignored (the spec).
    let many = format!("{}metadata", "x,".repeat(40));
    for include in [",".repeat(40), many] {
        let r = s
            .get(
                &format!("/v1/reservations?include={include}"),
                As::Key(&key),
            )
            .await;
        assert_eq!(r.expect(200, None)["reservations"], all["reservations"]);
    }
    s.stop().await;
}
