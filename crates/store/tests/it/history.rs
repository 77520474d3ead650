//! The history store (DESIGN §3a): an audit entry is written with its operation's journal
//! record, read back from the history store on disk, caught up from the journal when the
//! history store is behind it at start, and deleted by retention.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ledger::{
    Actor, AuditEntry, AuditFilter, AuditQuery, AuditSort, CreateTenant, CreateWebhook,
    DeliveryQuery, EventType, NewTenant, NewWebhook, RetryPolicy, TenantWritten, WebhookPlane,
    Window, ADMIN_TENANT, UNAUTH_TENANT,
};
use store::embedded::{Durability, EmbeddedConfig, EmbeddedStore, OpenReport};
use store::history::Retention;
use store::{AuditFn, Load, ManualClock, RequestContext, Store};
use tempfile::TempDir;

const T0: i64 = 1_800_000_000_000;
const DAY_MS: i64 = 86_400_000;

fn open(
    dir: &Path,
    durability: Durability,
    clock: &Arc<ManualClock>,
    retention: Retention,
) -> (EmbeddedStore, OpenReport) {
    let mut config = EmbeddedConfig::new(dir, durability, clock.clone());
    config.retention = retention;
    EmbeddedStore::open(config).expect("open store")
}

pub fn create(id: &str, name: &str) -> CreateTenant {
    CreateTenant {
        actor: Actor::Admin,
        tenant: NewTenant {
            tenant_id: id.into(),
            name: name.into(),
            parent_tenant_id: None,
            default_commit_overage_policy: None,
            default_reservation_ttl_ms: None,
            max_reservation_ttl_ms: None,
            max_reservation_extensions: None,
            reservation_expiry_policy: None,
            metadata: Default::default(),
        },
    }
}

/// An entry named `log_id` for `tenant`, with the status the operation's result gives.
fn audit(log_id: &'static str, tenant: &'static str) -> RequestContext<TenantWritten> {
    let audit: AuditFn<TenantWritten> = Box::new(move |facts| {
        Some(AuditEntry {
            log_id: log_id.into(),
            timestamp_ms: facts.now,
            tenant_id: tenant.into(),
            key_id: None,
            user_agent: None,
            source_ip: None,
            operation: "createTenant".into(),
            resource_type: Some("tenant".into()),
            resource_id: None,
            request_id: None,
            trace_id: None,
            status: if facts.result.is_ok() { 201 } else { 409 },
            error_code: facts
                .result
                .as_ref()
                .err()
                .map(|_| "DUPLICATE_RESOURCE".into()),
            metadata: None,
        })
    });
    RequestContext {
        audit: Some(audit),
        ..RequestContext::default()
    }
}

/// Every entry, newest first: `(log_id, status)`.
async fn entries(store: &EmbeddedStore) -> Vec<(String, u16)> {
    let query = AuditQuery {
        filter: AuditFilter::default(),
        sort: AuditSort::Timestamp,
        window: Window {
            descending: true,
            after: None,
            limit: 100,
        },
    };
    let page = store
        .read_history(move |h| h.audit_page(&query))
        .await
        .expect("audit page");
    page.entries
        .into_iter()
        .map(|e| (e.log_id, e.status))
        .collect()
}

fn ids(list: &[(String, u16)]) -> Vec<&str> {
    list.iter().map(|(id, _)| id.as_str()).collect()
}

#[tokio::test]
async fn an_entry_is_written_with_its_change_and_read_back() {
    for durability in [Durability::Strict, Durability::None] {
        let dir = TempDir::new().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let (store, _) = open(dir.path(), durability, &clock, Retention::default());
        let done = store
            .execute_in(
                create("acme", "Acme"),
                Load::Busy,
                audit("log_1", ADMIN_TENANT),
            )
            .await
            .unwrap();
        assert!(done.result.is_ok());
        // A refusal changes nothing and still leaves its entry.
        let refused = store
            .execute_in(
                create("acme", "Other"),
                Load::Busy,
                audit("log_2", ADMIN_TENANT),
            )
            .await
            .unwrap();
        assert!(refused.result.is_err(), "{durability:?}");
        // Read your writes: both acknowledged, both there.
        assert_eq!(
            entries(&store).await,
            [("log_2".into(), 409), ("log_1".into(), 201)],
            "{durability:?}"
        );
        store.shutdown().await;
        drop(store);
        if durability == Durability::Strict {
            let (store, _) = open(dir.path(), durability, &clock, Retention::default());
            assert_eq!(ids(&entries(&store).await), ["log_2", "log_1"]);
        }
    }
}

/// A history store that lost its last writes (a crash between the journal's sync and the
/// projection) is caught up from the journal at start, each entry once.
#[tokio::test]
async fn a_history_behind_the_journal_catches_up_at_start() {
    let dir = TempDir::new().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (store, _) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    for (i, (id, log)) in [("a", "log_a"), ("b", "log_b"), ("c", "log_c")]
        .into_iter()
        .enumerate()
    {
        clock.advance(1);
        let r = store
            .execute_in(create(id, id), Load::Busy, audit(log, ADMIN_TENANT))
            .await
            .unwrap();
        assert!(r.result.is_ok(), "{i}");
    }
    drop(store);
    // As if the projection of the last two records had never been written.
    let db = rusqlite::Connection::open(dir.path().join("history.sqlite")).unwrap();
    db.execute("DELETE FROM audit WHERE log_id IN ('log_b', 'log_c')", [])
        .unwrap();
    db.execute("UPDATE meta SET value = 1 WHERE name = 'held_seq'", [])
        .unwrap();
    drop(db);
    let (store, report) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    // Two records, each with its audit entry and its `tenant.created` event.
    assert_eq!(report.history_reprojected, 4);
    assert_eq!(ids(&entries(&store).await), ["log_c", "log_b", "log_a"]);
    drop(store);
    // Caught up: the next start takes nothing again.
    let (store, report) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    assert_eq!(report.history_reprojected, 0);
    assert_eq!(entries(&store).await.len(), 3);
}

/// A history store that cannot be written (here a trigger refuses every audit row, as a
/// failing disk would) does not hold the store's shutdown up retrying, and loses nothing:
/// what it missed stays in the journal and is written at the next start.
#[tokio::test]
async fn a_history_write_failing_at_shutdown_is_given_up_and_written_at_the_next_start() {
    let dir = TempDir::new().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (store, _) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    let db = rusqlite::Connection::open(dir.path().join("history.sqlite")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .unwrap();
    let r = store
        .execute_in(create("a", "A"), Load::Busy, audit("log_a", ADMIN_TENANT))
        .await
        .unwrap();
    assert!(r.result.is_ok(), "acknowledged once in the journal");
    // The writer has failed and is waiting to retry (it doubles its wait up to 5 s).
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Stopped on a thread and runtime of its own: one that never stops must fail the test,
    // not hang it (this runtime would wait for its blocking work when dropped).
    let (stopped, stop) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(store.shutdown());
        drop(store);
        let _ = stopped.send(());
    });
    stop.recv_timeout(Duration::from_secs(20))
        .expect("the store stops although its history cannot be written");
    db.execute_batch("DROP TRIGGER refuse").unwrap();
    drop(db);
    let (store, report) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    // The record's audit entry and its `tenant.created` event.
    assert_eq!(report.history_reprojected, 2);
    assert_eq!(ids(&entries(&store).await), ["log_a"]);
}

/// A history store ahead of its journal (a data directory restored from a history copy taken
/// after the journal's) loses, at start, the entries of the records the journal lacks: an
/// entry never outlives its change.
#[tokio::test]
async fn a_history_ahead_of_the_journal_is_trimmed_at_start() {
    let dir = TempDir::new().unwrap();
    let saved = TempDir::new().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let journal_files = |dir: &Path| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("journal-") || name.starts_with("snapshot-")
            })
            .collect();
        files.sort();
        files
    };
    let (store, _) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    let r = store
        .execute_in(create("a", "a"), Load::Busy, audit("log_a", ADMIN_TENANT))
        .await
        .unwrap();
    assert!(r.result.is_ok());
    drop(store);
    for f in journal_files(dir.path()) {
        std::fs::copy(&f, saved.path().join(f.file_name().unwrap())).unwrap();
    }
    let (store, _) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    for (id, log) in [("b", "log_b"), ("c", "log_c")] {
        let r = store
            .execute_in(create(id, id), Load::Busy, audit(log, ADMIN_TENANT))
            .await
            .unwrap();
        assert!(r.result.is_ok());
    }
    drop(store);
    // The journal as it was after the first change; the history store as it is now.
    for f in journal_files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    for f in journal_files(saved.path()) {
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let (store, report) = open(dir.path(), Durability::Strict, &clock, Retention::default());
    // Two records' audit entries and events.
    assert_eq!((report.last_seq, report.history_trimmed), (1, 4));
    assert_eq!(ids(&entries(&store).await), ["log_a"]);
    // The next changes are journaled and audited after it as usual.
    let r = store
        .execute_in(create("d", "d"), Load::Busy, audit("log_d", ADMIN_TENANT))
        .await
        .unwrap();
    assert!(r.result.is_ok());
    assert_eq!(ids(&entries(&store).await), ["log_d", "log_a"]);
}

/// Entries past their tier's retention go; the rest stay; 0 days keeps everything.
#[tokio::test]
async fn retention_deletes_entries_past_their_tier() {
    let dir = TempDir::new().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let retention = Retention::DEFAULT;
    let (store, _) = open(dir.path(), Durability::Strict, &clock, retention);
    let write = |id: &'static str, log: &'static str, tenant: &'static str| {
        store.execute_in(create(id, id), Load::Busy, audit(log, tenant))
    };
    write("a", "old", "a").await.unwrap();
    write("b", "old_unauth", UNAUTH_TENANT).await.unwrap();
    clock.advance(31 * DAY_MS);
    write("c", "newer", "c").await.unwrap();
    store.expire_history().await;
    assert_eq!(ids(&entries(&store).await), ["newer", "old"]);
    clock.advance(370 * DAY_MS);
    store.expire_history().await;
    assert_eq!(ids(&entries(&store).await), ["newer"]);
    store.shutdown().await;
    drop(store);

    let forever = Retention {
        authenticated_days: 0,
        unauthenticated_days: 0,
        events_days: 0,
        deliveries_days: 0,
    };
    let (store, _) = open(dir.path(), Durability::Strict, &clock, forever);
    write_after(&store, &clock).await;
    clock.advance(10_000 * DAY_MS);
    store.expire_history().await;
    assert_eq!(ids(&entries(&store).await), ["unauth_forever", "newer"]);
}

async fn write_after(store: &EmbeddedStore, clock: &ManualClock) {
    clock.advance(1);
    store
        .execute_in(
            create("d", "d"),
            Load::Busy,
            audit("unauth_forever", UNAUTH_TENANT),
        )
        .await
        .unwrap();
}

/// Events are kept 90 days and webhook deliveries 14 by default (the reference's retention),
/// each deleted by its own tier.
#[tokio::test]
async fn events_and_deliveries_expire_after_their_tiers() {
    let dir = TempDir::new().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (store, _) = open(dir.path(), Durability::Strict, &clock, Retention::DEFAULT);
    let subscribe = CreateWebhook {
        actor: Actor::Admin,
        plane: WebhookPlane::Admin,
        owner: None,
        webhook: NewWebhook {
            subscription_id: "whsub_all".into(),
            name: None,
            description: None,
            url: "https://hooks.example/cycles".into(),
            event_types: vec![EventType::TenantCreated],
            event_categories: Vec::new(),
            scope_filter: None,
            thresholds: None,
            sealed_secret: "sealed".into(),
            headers: Vec::new(),
            retry_policy: RetryPolicy::default(),
            disable_after_failures: 10,
            metadata: None,
        },
    };
    store
        .execute(subscribe, Load::Busy)
        .await
        .unwrap()
        .result
        .unwrap();
    let tenant = |id: &'static str| store.execute(create(id, id), Load::Busy);
    let held = || async {
        let query = DeliveryQuery {
            subscription_id: "whsub_all".into(),
            status: None,
            from_ms: None,
            to_ms: None,
            after: None,
            limit: 100,
        };
        store
            .read_history(move |h| Ok((h.event_count(), h.delivery_page(&query)?.deliveries.len())))
            .await
            .unwrap()
    };
    tenant("first").await.unwrap().result.unwrap();
    clock.advance(20 * DAY_MS);
    tenant("second").await.unwrap().result.unwrap();
    // Two `tenant.created` events and the subscription's `webhook.created`; a delivery each
    // for the two tenants.
    assert_eq!(held().await, (3, 2));

    // 20 days on: the first delivery is past 14 days, every event within 90.
    store.expire_history().await;
    assert_eq!(held().await, (3, 1));

    // 91 days after the first two events, 71 after the last: only it is left.
    clock.advance(71 * DAY_MS);
    store.expire_history().await;
    assert_eq!(held().await, (1, 0));
}
