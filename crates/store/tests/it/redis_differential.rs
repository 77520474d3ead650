//! The Redis engine against the pure ledger: the crash tests' workload (reservations
//! committed, released, expired by the sweep and archived, rejected second commits,
//! credits), plus credits and a reserve past 2^53 and a credit that would pass 2^63 − 1,
//! sent in turn to three instances of one ledger. Every answer must be the ledger's, and
//! the ledger read back from Redis must be the ledger's state, field for field, with every
//! rule holding.
//!
//! Needs a Redis: `CYCLES_TEST_REDIS_URL` (`.ci/run` sets it); without it the test passes
//! without running, saying so.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ledger::State;
use store::redis::{RedisConfig, RedisDurability, RedisStore, Topology};
use store::{Clock, Load, ManualClock, Store};

use crate::recovery::{canonical, fund, reserve, workload, Command, STEP_MS, T0};

fn redis_url() -> Option<String> {
    let url = std::env::var("CYCLES_TEST_REDIS_URL").ok();
    if url.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CYCLES_TEST_REDIS_URL is not set in CI"
        );
        eprintln!("skipped: the Redis differential test needs CYCLES_TEST_REDIS_URL");
    }
    url
}

fn open(
    url: &str,
    namespace: &str,
    clock: Arc<ManualClock>,
    dir: &std::path::Path,
    snapshot_records: u64,
) -> RedisStore {
    let mut config = RedisConfig::new(url, dir, clock);
    config.namespace = namespace.into();
    config.durability = RedisDurability::None;
    config.timeout = std::time::Duration::from_secs(2);
    config.snapshot_records = snapshot_records;
    RedisStore::open(config).expect("open the Redis engine").0
}

fn test_namespace(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cycles-{what}-{}-{nanos}", std::process::id())
}

/// Sends the workload to three instances in turn (each compacting the log once it holds
/// `snapshot_records` records past the snapshot), checking every answer against the pure
/// ledger; answers the model state and the compactions the instances made.
async fn run_workload(
    url: &str,
    namespace: &str,
    clock: &Arc<ManualClock>,
    snapshot_records: u64,
) -> (State, u64) {
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("temp dir"))
        .collect();
    let stores: Vec<RedisStore> = dirs
        .iter()
        .map(|d| open(url, namespace, clock.clone(), d.path(), snapshot_records))
        .collect();
    let mut commands = workload(0, 400);
    let huge = (1i64 << 53) + 1;
    commands.push(fund(90_001, huge));
    commands.push(fund(90_002, huge));
    commands.push(reserve("res-huge", huge));
    commands.push(fund(90_003, i64::MAX - 3 * huge));
    commands.push(fund(90_004, i64::MAX));
    commands.push(reserve("res-after-huge", 1_000));
    let mut model = State::new();
    for (i, command) in commands.into_iter().enumerate() {
        clock.advance(STEP_MS);
        let expected = command.clone().apply(&mut model, clock.now_ms());
        let answered = command.execute(&stores[i % stores.len()], Load::Busy).await;
        assert_eq!(
            answered, expected.result,
            "command {i}: the Redis engine and the ledger disagree"
        );
    }
    let mut compactions = 0;
    for store in stores {
        // Closing waits for a compaction under way.
        store.shutdown().await;
        compactions += metric(&store, "cycles_redis_snapshots_total");
    }
    (model, compactions)
}

fn metric(store: &RedisStore, name: &str) -> u64 {
    store
        .metrics()
        .into_iter()
        .find(|m| m.name == name)
        .map_or_else(|| panic!("no metric {name}"), |m| m.value)
}

/// Reads the ledger back from Redis and compares it with the model; answers where its
/// snapshot ends and the log's records read after it.
fn assert_reads_back(url: &str, namespace: &str, model: &State) -> (Option<u64>, u64) {
    let verified =
        store::redis::verify(url, &Topology::Single, namespace).expect("read the ledger back");
    assert!(verified.violations.is_empty(), "{:?}", verified.violations);
    assert!(
        canonical(&verified.state) == canonical(model),
        "the ledger read back from Redis is not the ledger's state"
    );
    (verified.snapshot, verified.records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_answer_as_the_ledger_and_keep_its_state() {
    let Some(url) = redis_url() else { return };
    let namespace = test_namespace("differential");
    let clock = Arc::new(ManualClock::new(T0));
    let (model, compactions) = run_workload(&url, &namespace, &clock, u64::MAX).await;
    assert_eq!(compactions, 0);
    let (snapshot, records) = assert_reads_back(&url, &namespace, &model);
    assert_eq!(snapshot, None);
    assert!(records > 300, "{records} records");
    store::redis::delete_ledger(&url, &Topology::Single, &namespace)
        .expect("delete the test ledger");
}

/// What an instance's history holds of the workload: its counts, every reservation it
/// archived (by the reserve that created it) and every event.
async fn history_of(
    store: &RedisStore,
) -> (
    u64,
    u64,
    u64,
    Vec<Option<ledger::Archived>>,
    Vec<ledger::Event>,
) {
    store
        .read_history(|h| {
            let mut archived = Vec::new();
            for n in 0..400 {
                archived.push(h.archived(&ledger::ArchiveLookup::CreatedBy {
                    tenant: "t".into(),
                    key: format!("reserve-res-{n}").into(),
                })?);
            }
            let events = h.event_page(&ledger::EventQuery {
                filter: Default::default(),
                sort: ledger::EventSort::Timestamp,
                window: ledger::Window {
                    descending: false,
                    after: None,
                    limit: 10_000,
                },
            })?;
            Ok((
                h.audit_count(),
                h.event_count(),
                h.archived_count(),
                archived,
                events.events,
            ))
        })
        .await
        .expect("read the history")
}

/// The same workload on a ledger compacted every 20 records and on one never compacted:
/// both read back as the ledger's state, the compacted log holds only its tail, and a new
/// instance of each (its history rebuilt from Redis) holds the same history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_ledger_keeps_its_state_and_its_history() {
    let Some(url) = redis_url() else { return };
    let whole = test_namespace("uncompacted");
    let compacted = test_namespace("compacted");
    let clock = Arc::new(ManualClock::new(T0));
    let (model, none) = run_workload(&url, &whole, &clock, u64::MAX).await;
    let clock = Arc::new(ManualClock::new(T0));
    let (compacted_model, compactions) = run_workload(&url, &compacted, &clock, 20).await;
    assert_eq!(none, 0);
    assert!(compactions >= 3, "{compactions} compactions");
    assert!(canonical(&model) == canonical(&compacted_model));
    let (none, all) = assert_reads_back(&url, &whole, &model);
    let (snapshot, tail) = assert_reads_back(&url, &compacted, &model);
    assert_eq!(none, None);
    assert!(all > 300, "{all} records in the uncompacted log");
    assert!(
        snapshot.is_some_and(|v| v + tail == all),
        "snapshot {snapshot:?}, then {tail}"
    );
    assert!(tail < 60, "{tail} records left in the compacted log");

    let dirs = [
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    ];
    let fresh_whole = open(&url, &whole, clock.clone(), dirs[0].path(), u64::MAX);
    let fresh_compacted = open(&url, &compacted, clock.clone(), dirs[1].path(), u64::MAX);
    let expected = history_of(&fresh_whole).await;
    let found = history_of(&fresh_compacted).await;
    assert!(expected.2 > 50, "{} reservations archived", expected.2);
    assert!(expected.3.iter().filter(|a| a.is_some()).count() > 50);
    assert!(!expected.4.is_empty(), "the workload made no events");
    assert_eq!(found.0, expected.0, "audit entries");
    assert_eq!(found.1, expected.1, "events");
    assert_eq!(found.2, expected.2, "archived reservations");
    assert!(found.3 == expected.3, "the archived reservations differ");
    assert!(found.4 == expected.4, "the events differ");
    drop((fresh_whole, fresh_compacted));
    for namespace in [whole, compacted] {
        store::redis::delete_ledger(&url, &Topology::Single, &namespace)
            .expect("delete the test ledger");
    }
}

/// The `at` (newest record's time) of every entry of one of a ledger's history streams.
fn history_times(url: &str, namespace: &str, kind: &str) -> Vec<i64> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to Redis");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{{{namespace}}}:history:{kind}"))
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .expect("XRANGE");
    entries
        .ids
        .iter()
        .map(|e| {
            e.get::<String>("at")
                .and_then(|at| at.parse().ok())
                .expect("at")
        })
        .collect()
}

/// Sends `commands` to `store`, each answered as the pure ledger answers it.
async fn run(store: &RedisStore, clock: &ManualClock, model: &mut State, commands: Vec<Command>) {
    for command in commands {
        clock.advance(STEP_MS);
        let expected = command.clone().apply(model, clock.now_ms());
        assert_eq!(command.execute(store, Load::Busy).await, expected.result);
    }
}

/// Waits until the ledger's snapshot holds record `version` (a compaction under way ends).
async fn compacted_through(store: &RedisStore, version: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while metric(store, "cycles_redis_snapshot_version") < version {
        assert!(
            std::time::Instant::now() < deadline,
            "no compaction reached {version}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// History moves to its streams as the log is compacted, and leaves them once past its
/// kind's retention: archived reservations after 30 days, events after 90.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_past_its_retention_leaves_redis() {
    let Some(url) = redis_url() else { return };
    let namespace = test_namespace("retention");
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = open(&url, &namespace, clock.clone(), dir.path(), 20);
    let mut model = State::new();
    // A compaction starts a second after the last one at the soonest.
    let spacing = std::time::Duration::from_millis(1_100);
    run(&store, &clock, &mut model, workload(0, 200)).await;
    let first = metric(&store, "cycles_redis_log_version");
    tokio::time::sleep(spacing).await;
    run(&store, &clock, &mut model, workload(1_000, 30)).await;
    compacted_through(&store, first).await;
    let before = history_times(&url, &namespace, "archived");
    let events_before = history_times(&url, &namespace, "events");
    assert!(!before.is_empty() && !events_before.is_empty());

    clock.advance(31 * 24 * 3_600_000);
    tokio::time::sleep(spacing).await;
    run(&store, &clock, &mut model, workload(2_000, 60)).await;
    let third = metric(&store, "cycles_redis_log_version");
    tokio::time::sleep(spacing).await;
    run(&store, &clock, &mut model, workload(3_000, 2)).await;
    compacted_through(&store, third).await;
    store.shutdown().await;

    let cutoff = clock.now_ms() - ledger::TERMINAL_RETENTION_MS;
    assert!(
        before.iter().all(|at| *at < cutoff),
        "{before:?}, cutoff {cutoff}"
    );
    let after = history_times(&url, &namespace, "archived");
    assert!(!after.is_empty(), "the last compactions copied none");
    assert!(
        after.iter().all(|at| *at >= cutoff),
        "archived reservations past retention are still in Redis: {after:?}, cutoff {cutoff}"
    );
    // Events are kept 90 days: none went.
    let events_after = history_times(&url, &namespace, "events");
    assert!(events_after.starts_with(&events_before));
    let verified =
        store::redis::verify(&url, &Topology::Single, &namespace).expect("read the ledger back");
    assert!(canonical(&verified.state) == canonical(&model));
    store::redis::delete_ledger(&url, &Topology::Single, &namespace)
        .expect("delete the test ledger");
}
