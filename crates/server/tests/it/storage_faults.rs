//! A failing disk seen through HTTP (the embedded engine, faults injected into its journal):
//! writes answer 503 with `Retry-After` and record nothing, readiness is DOWN, reads are
//! served, and when the disk recovers so does the server, without a restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use store::embedded::{DiskFault, DiskFaults};

use crate::common::{amount, metric, reserve_body, As, TestServer};

const READINESS: &str = "/actuator/health/readiness";

/// Waits up to 10 s for `path` to answer `status`.
async fn until_status(s: &TestServer, path: &str, who: As<'_>, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.get(path, who).await.status != status {
        assert!(Instant::now() < deadline, "{path} never answered {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_refuses_writes_serves_reads_and_recovers() {
    let faults = Arc::new(DiskFaults::default());
    let s = TestServer::start_embedded(|config| config.faults = faults.clone()).await;
    let key = s.setup("acme", 1_000).await;
    let subject = json!({"tenant": "acme"});
    s.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("r1", subject.clone(), 100),
    )
    .await
    .expect(200, None);
    let balances = "/v1/balances?tenant=acme";

    faults.inject(Some(DiskFault::SyncError));
    let refused = s
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r2", subject.clone(), 200),
        )
        .await;
    refused.expect(503, Some("INTERNAL_ERROR"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("nothing was recorded"),
        "{}",
        refused.body
    );
    let ready = s.get(READINESS, As::Nobody).await;
    assert_eq!(ready.expect(503, None)["status"], "DOWN");
    // Reads are served from the durable state, where the refused reservation is not.
    until_status(&s, balances, As::Key(&key), 200).await;
    let balance = &s.get(balances, As::Key(&key)).await.body["balances"][0];
    assert_eq!(amount(balance, "reserved"), 100, "{balance}");
    s.get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None);
    // Every write is refused, the admin plane's too, and quickly.
    let started = Instant::now();
    s.post(
        "/v1/admin/tenants",
        As::Admin,
        json!({"tenant_id": "other", "name": "o"}),
    )
    .await
    .expect(503, Some("INTERNAL_ERROR"));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(metric(&s, "cycles_journal_faulted").await, 1);

    faults.inject(None);
    until_status(&s, READINESS, As::Nobody, 200).await;
    assert_eq!(metric(&s, "cycles_journal_faulted").await, 0);
    assert_eq!(metric(&s, "cycles_journal_faults_total").await, 1);
    s.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("r2", subject, 200),
    )
    .await
    .expect(200, None);
    let balance = &s.get(balances, As::Key(&key)).await.body["balances"][0];
    assert_eq!(amount(balance, "reserved"), 300, "{balance}");
    s.post(
        "/v1/admin/tenants",
        As::Admin,
        json!({"tenant_id": "other", "name": "o"}),
    )
    .await
    .expect(201, None);
}
