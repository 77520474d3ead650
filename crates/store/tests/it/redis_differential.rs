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
use std::time::Duration;

use ledger::State;
use store::redis::{RedisConfig, RedisDurability, RedisStore, ScratchLedger, Topology};
use store::{Clock, Load, ManualClock, Store};

use proptest::prelude::*;

use crate::recovery::{
    canonical, commit, commit_by, fund, fund_to, provision, release_by, reserve, reserve_for,
    workload, Command, Party, STEP_MS, T0,
};

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
    let config = config(url, namespace, clock, dir, snapshot_records);
    RedisStore::open(config).expect("open the Redis engine").0
}

/// How [`open`] configures an instance.
fn config(
    url: &str,
    namespace: &str,
    clock: Arc<ManualClock>,
    dir: &std::path::Path,
    snapshot_records: u64,
) -> RedisConfig {
    let mut config = RedisConfig::new(url, dir, clock);
    // The model's time is the test's.
    config.clock_from_redis = false;
    config.namespace = namespace.into();
    config.durability = RedisDurability::None;
    config.timeout = Duration::from_secs(2);
    config.snapshot_records = snapshot_records;
    config
}

/// A plain connection to the test Redis, to look at a ledger's keys directly.
fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to Redis")
}

/// How [`run_workload`] sends its commands to the three instances.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// Each to the next instance, from a busy server: every command's instance first
    /// reads what the one before appended.
    InTurn,
    /// Two to each instance in turn, the second as a request alone in its server.
    InPairs,
}

/// Sends the workload to three instances (each compacting the log once it holds
/// `snapshot_records` records past the snapshot), checking every answer against the pure
/// ledger; answers the model state and the compactions the instances made.
async fn run_workload(
    url: &str,
    namespace: &str,
    clock: &Arc<ManualClock>,
    snapshot_records: u64,
    sent: Sending,
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
    let last = commands.len() - 1;
    for (i, command) in commands.into_iter().enumerate() {
        if i == last && snapshot_records != u64::MAX {
            // Compactions start at least a second apart: the last command, sent a second
            // after the others, finds none under way and leaves the log a short tail,
            // however fast the machine appended the others.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        clock.advance(STEP_MS);
        let expected = command.clone().apply(&mut model, clock.now_ms());
        let (store, load) = match sent {
            Sending::InTurn => (&stores[i % stores.len()], Load::Busy),
            // The second of each pair finds its instance holding the lease, and runs on
            // the caller's thread.
            Sending::InPairs => (
                &stores[(i / 2) % stores.len()],
                if i % 2 == 1 { Load::Alone } else { Load::Busy },
            ),
        };
        let answered = command.execute(store, load).await;
        assert_eq!(
            answered, expected.result,
            "command {i}: the Redis engine and the ledger disagree"
        );
    }
    let (mut compactions, mut alone, mut woken) = (0, 0, 0);
    for store in stores {
        // Closing waits for a compaction under way.
        store.shutdown().await;
        compactions += metric(&store, "cycles_redis_snapshots_total");
        alone += metric(&store, "cycles_redis_rounds_alone_total");
        woken += metric(&store, "cycles_redis_lease_wakes_total");
    }
    // Every command sent to another instance than the last (all of them in turn, one
    // pair in two) takes the lease over from an idle holder, which wakes it.
    assert!(
        woken > 100,
        "the instance next in turn was woken {woken} times"
    );
    if sent == Sending::InPairs {
        assert!(alone > 50, "{alone} rounds ran on the caller's thread");
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
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "differential");
    let namespace = &namespace_ledger.namespace;
    let clock = Arc::new(ManualClock::new(T0));
    let (model, compactions) =
        run_workload(&url, namespace, &clock, u64::MAX, Sending::InPairs).await;
    assert_eq!(compactions, 0);
    let (snapshot, records) = assert_reads_back(&url, namespace, &model);
    assert_eq!(snapshot, None);
    assert!(records > 300, "{records} records");
}

/// A commit naming a reservation that the sweep archives in the same round finds its
/// archive in the round (the round's history reaches the history store only once the round
/// is appended), so it is refused as finalized, not as unknown. The sweep and the commit
/// are sent together, many times, so that many pairs share a round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_archived_earlier_in_the_round_is_found() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "same-round");
    let namespace = &namespace_ledger.namespace;
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&url, namespace, clock.clone(), dir.path(), u64::MAX);
    for command in crate::recovery::provisioning() {
        assert!(command.execute(&store, Load::Busy).await.is_ok());
    }
    let sweep = || {
        Command::Maintain(ledger::Maintain {
            limit: 16,
            archive_after_ms: 0,
        })
    };
    for n in 0..60 {
        let id = format!("res-round-{n}");
        let reserved = reserve(&id, 100).execute(&store, Load::Busy).await;
        assert!(reserved.is_ok(), "{reserved:?}");
        let committed = commit(&id, &format!("{n}-a"), 40)
            .execute(&store, Load::Busy)
            .await;
        assert!(committed.is_ok(), "{committed:?}");
        clock.advance(STEP_MS);
        let second = commit(&id, &format!("{n}-b"), 40);
        let (swept, refused) = tokio::join!(
            sweep().execute(&store, Load::Busy),
            second.execute(&store, Load::Busy)
        );
        assert!(swept.is_ok(), "{swept:?}");
        assert!(
            matches!(refused, Err(ledger::Rejection::ReservationFinalized { .. })),
            "pair {n}: {refused:?}"
        );
    }
    store.shutdown().await;
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
                // By key alone (no times): the test's own read, not a reserve's.
                archived.push(h.archived(&ledger::ArchiveLookup::CreatedBy {
                    tenant: "t".into(),
                    key: format!("reserve-res-{n}").into(),
                    created_at: Vec::new(),
                    any_time: true,
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
    let whole_ledger = ScratchLedger::new(&url, Topology::Single, "uncompacted");
    let whole = &whole_ledger.namespace;
    let compacted_ledger = ScratchLedger::new(&url, Topology::Single, "compacted");
    let compacted = &compacted_ledger.namespace;
    let clock = Arc::new(ManualClock::new(T0));
    let (model, none) = run_workload(&url, whole, &clock, u64::MAX, Sending::InTurn).await;
    let clock = Arc::new(ManualClock::new(T0));
    let (compacted_model, compactions) =
        run_workload(&url, compacted, &clock, 20, Sending::InTurn).await;
    assert_eq!(none, 0);
    assert!(compactions >= 3, "{compactions} compactions");
    assert!(canonical(&model) == canonical(&compacted_model));
    let (none, all) = assert_reads_back(&url, whole, &model);
    let (snapshot, tail) = assert_reads_back(&url, compacted, &model);
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
    let fresh_whole = open(&url, whole, clock.clone(), dirs[0].path(), u64::MAX);
    let fresh_compacted = open(&url, compacted, clock.clone(), dirs[1].path(), u64::MAX);
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
}

/// A compaction trims the log in bounded steps (whole stream nodes, then exactly): a log of
/// thousands of rounds is left holding the records after the snapshot, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_trims_a_long_log_to_the_records_after_its_snapshot() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "long-log");
    let namespace = &namespace_ledger.namespace;
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    // Sent one at a time, each command is a round of its own: a stream entry per record,
    // so the compaction trims more entries than a trimming step takes (1 000), in stream
    // nodes of a few entries each. The workload appends some 1 700 records.
    let store = open(&url, namespace, clock.clone(), dir.path(), 1_500);
    let mut model = Model::default();
    run(&store, &clock, &mut model, workload(0, 3_100)).await;
    compacted_through(&store, 1_500).await;
    let snapshot = metric(&store, "cycles_redis_snapshot_version");
    let mut conn = connect(&url);
    let log = format!("{{{}}}:log", *namespace);
    let entries: u64 = redis::cmd("XLEN").arg(&log).query(&mut conn).expect("XLEN");
    let after: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&log)
        .arg(format!("({snapshot}-0"))
        .arg("+")
        .query(&mut conn)
        .expect("XRANGE");
    assert!(
        !after.ids.is_empty(),
        "no records after the snapshot at {snapshot}"
    );
    assert_eq!(
        entries,
        after.ids.len() as u64,
        "the log still holds records up to the snapshot at {snapshot}"
    );
    drop(store);
}

/// The `at` (newest record's time) of every entry of one of a ledger's history streams.
fn history_times(url: &str, namespace: &str, kind: &str) -> Vec<i64> {
    let mut conn = connect(url);
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

/// The pure ledger, with the reservations it archived (what an engine's history store
/// answers its lookups with).
#[derive(Default)]
struct Model {
    state: State,
    archive: Vec<Arc<ledger::Archived>>,
}

impl Model {
    fn apply(&mut self, command: Command, now: i64) -> crate::recovery::Answer {
        let archive = &self.archive;
        let find = |lookup: &ledger::ArchiveLookup| -> ledger::Found {
            archive
                .iter()
                .filter(|a| lookup.names(a))
                .max_by_key(|a| a.reservation.created_at_ms)
                .cloned()
        };
        let applied = command.apply_with(&mut self.state, now, &find);
        for effect in applied.effects {
            if let ledger::Effect::ArchiveReservation(a) = effect {
                self.archive.push(a);
            }
        }
        applied.result
    }
}

/// Sends `commands` to `store`, each answered as the pure ledger answers it.
async fn run(store: &RedisStore, clock: &ManualClock, model: &mut Model, commands: Vec<Command>) {
    for command in commands {
        clock.advance(STEP_MS);
        let expected = model.apply(command.clone(), clock.now_ms());
        assert_eq!(command.execute(store, Load::Busy).await, expected);
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
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "retention");
    let namespace = &namespace_ledger.namespace;
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = open(&url, namespace, clock.clone(), dir.path(), 20);
    let mut model = Model::default();
    // A compaction starts a second after the last one at the soonest.
    let spacing = std::time::Duration::from_millis(1_100);
    run(&store, &clock, &mut model, workload(0, 200)).await;
    let first = metric(&store, "cycles_redis_log_version");
    tokio::time::sleep(spacing).await;
    run(&store, &clock, &mut model, workload(1_000, 30)).await;
    compacted_through(&store, first).await;
    let before = history_times(&url, namespace, "archived");
    let events_before = history_times(&url, namespace, "events");
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
    let after = history_times(&url, namespace, "archived");
    assert!(!after.is_empty(), "the last compactions copied none");
    assert!(
        after.iter().all(|at| *at >= cutoff),
        "archived reservations past retention are still in Redis: {after:?}, cutoff {cutoff}"
    );
    // Events are kept 90 days: none went.
    let events_after = history_times(&url, namespace, "events");
    assert!(events_after.starts_with(&events_before));
    let verified =
        store::redis::verify(&url, &Topology::Single, namespace).expect("read the ledger back");
    assert!(canonical(&verified.state) == canonical(&model.state));
}

// ---------------------------------------------------------------------------------------
// Random sequences
// ---------------------------------------------------------------------------------------

/// Two tenants whose names share a prefix.
const PARTIES: [Party; 2] = [
    Party {
        tenant: "acme",
        digest: [1; 32],
    },
    Party {
        tenant: "acme-corp",
        digest: [2; 32],
    },
];

/// An amount: small, near 2^53 (where a double loses units), or near 2^63 − 1.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..5_000,
        1 => (-3i64..=3).prop_map(|d| (1i64 << 53) + d),
        1 => (0i64..=3).prop_map(|d| i64::MAX - d),
    ]
}

/// One step of a random sequence: a command (reservation ids and idempotency keys drawn
/// from a few, so that replays, conflicts and cross-tenant requests come up), or time
/// passing.
#[derive(Debug, Clone)]
enum Step {
    Reserve {
        who: usize,
        n: usize,
        estimate: i64,
        ttl_ms: Option<i64>,
    },
    Commit {
        who: usize,
        owner: usize,
        n: usize,
        key: usize,
        actual: i64,
    },
    Release {
        who: usize,
        owner: usize,
        n: usize,
    },
    Fund {
        who: usize,
        n: usize,
        amount: i64,
    },
    Maintain,
    Wait(i64),
}

fn step() -> impl Strategy<Value = Step> {
    let who = 0..PARTIES.len();
    prop_oneof![
        4 => (who.clone(), 0..8usize, amount(), proptest::option::of(1i64..120_000))
            .prop_map(|(who, n, estimate, ttl_ms)| Step::Reserve { who, n, estimate, ttl_ms }),
        3 => (who.clone(), who.clone(), 0..8usize, 0..4usize, amount()).prop_map(
            |(who, owner, n, key, actual)| Step::Commit { who, owner, n, key, actual }
        ),
        1 => (who.clone(), who.clone(), 0..8usize)
            .prop_map(|(who, owner, n)| Step::Release { who, owner, n }),
        1 => (who, 0..3usize, amount()).prop_map(|(who, n, amount)| Step::Fund { who, n, amount }),
        1 => Just(Step::Maintain),
        1 => (0i64..7_200_000).prop_map(Step::Wait),
    ]
}

/// The reservation `n` of `party` (its reserve's idempotency key is named after it too).
fn reservation(party: Party, n: usize) -> String {
    format!("res-{}-{n}", party.tenant)
}

impl Step {
    fn command(&self) -> Option<Command> {
        Some(match *self {
            Step::Reserve {
                who,
                n,
                estimate,
                ttl_ms,
            } => {
                let party = PARTIES[who];
                reserve_for(party, &reservation(party, n), estimate, ttl_ms)
            }
            Step::Commit {
                who,
                owner,
                n,
                key,
                actual,
            } => {
                let id = reservation(PARTIES[owner], n);
                commit_by(PARTIES[who], &id, &format!("{id}-{key}"), actual)
            }
            Step::Release { who, owner, n } => {
                release_by(PARTIES[who], &reservation(PARTIES[owner], n))
            }
            Step::Fund { who, n, amount } => fund_to(PARTIES[who], n + 100 * who, amount),
            Step::Maintain => Command::Maintain(ledger::Maintain {
                limit: 16,
                archive_after_ms: 0,
            }),
            Step::Wait(_) => return None,
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sequences through three instances of one ledger, compacted every 7 records,
    /// and through the pure ledger: every answer equal, and the ledger read back from Redis
    /// equal to the ledger's state, every rule holding.
    #[test]
    fn random_sequences_answer_as_the_ledger(steps in proptest::collection::vec(step(), 1..60)) {
        let Some(url) = redis_url() else { return Ok(()) };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(random_sequence(&url, &steps));
    }
}

async fn random_sequence(url: &str, steps: &[Step]) {
    let namespace_ledger = ScratchLedger::new(url, Topology::Single, "random");
    let namespace = &namespace_ledger.namespace;
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("temp dir"))
        .collect();
    let clock = Arc::new(ManualClock::new(T0));
    let stores: Vec<RedisStore> = dirs
        .iter()
        .map(|d| open(url, namespace, clock.clone(), d.path(), 7))
        .collect();
    let mut model = Model::default();
    let mut commands: Vec<Command> = PARTIES
        .iter()
        .flat_map(|p| provision(*p, 1 << 40, 1 << 30))
        .collect();
    commands.push(fund(0, 1));
    let mut sent = 0;
    for command in commands {
        run(&stores[sent % 3], &clock, &mut model, vec![command]).await;
        sent += 1;
    }
    for step in steps {
        match step.command() {
            Some(command) => {
                run(&stores[sent % 3], &clock, &mut model, vec![command]).await;
                sent += 1;
            }
            None => {
                if let Step::Wait(ms) = step {
                    clock.advance(*ms);
                }
            }
        }
    }
    let mut compactions = 0;
    for store in &stores {
        store.shutdown().await;
        compactions += metric(store, "cycles_redis_snapshots_total");
    }
    drop(stores);
    // The provisioning alone is more than 7 records.
    assert!(compactions > 0, "no compaction ran");
    assert_reads_back(url, namespace, &model.state);
}

/// Two instances on one machine never share a history directory: the second is refused at
/// start (each deletes the cache it finds there), and the directory is free again once the
/// first has stopped.
#[test]
fn a_history_directory_serves_one_instance() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "dir-lock");
    let namespace = &namespace_ledger.namespace;
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let first = open(&url, namespace, clock.clone(), dir.path(), u64::MAX);
    let second = config(&url, namespace, clock.clone(), dir.path(), u64::MAX);
    let refused = RedisStore::open(second)
        .err()
        .expect("a second instance on the same history directory");
    assert!(
        refused.to_string().contains("is in use by another process"),
        "{refused}"
    );
    drop(first);
    drop(open(&url, namespace, clock, dir.path(), u64::MAX));
}

/// The ledger's time is Redis's clock, whatever an instance's own clock says: two
/// instances whose clocks are a year apart hold reservations until the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledgers_time_is_redis_clock() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "clock");
    let namespace = &namespace_ledger.namespace;
    let year = 365 * 24 * 3_600_000;
    let stores: Vec<(RedisStore, tempfile::TempDir)> = [T0, T0 + year]
        .into_iter()
        .map(|t| {
            let dir = tempfile::tempdir().expect("temp dir");
            let mut config = RedisConfig::new(&url, dir.path(), Arc::new(ManualClock::new(t)));
            config.namespace = namespace.clone();
            config.durability = RedisDurability::None;
            let store = RedisStore::open(config).expect("open the Redis engine").0;
            (store, dir)
        })
        .collect();
    for command in provision(PARTIES[0], 1 << 40, 1 << 30) {
        command
            .execute(&stores[0].0, Load::Busy)
            .await
            .expect("provision");
    }
    let redis_now = {
        let mut conn = connect(&url);
        let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
        s * 1_000 + us / 1_000
    };
    for (i, (store, _)) in stores.iter().enumerate() {
        let id = format!("res-clock-{i}");
        let answer = reserve_for(PARTIES[0], &id, 10, Some(60_000))
            .execute(store, Load::Busy)
            .await
            .expect("reserved");
        let expires: i64 = answer
            .split("expires_at_ms: Some(")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no expiry in {answer}"));
        let held_for = expires - redis_now;
        assert!(
            (55_000..=70_000).contains(&held_for),
            "instance {i} holds it until {held_for} ms after Redis's now"
        );
    }
    drop(stores);
}

/// A state larger than a snapshot part (1 MiB) goes to Redis in several parts and reads
/// back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_several_parts_reads_back() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "parts");
    let namespace = &namespace_ledger.namespace;
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = open(&url, namespace, clock.clone(), dir.path(), 5_000);
    let mut model = Model::default();
    let mut commands = provision(PARTIES[0], 1 << 40, 1 << 40);
    commands.extend(
        (0..5_000).map(|n| reserve_for(PARTIES[0], &format!("res-parts-{n}"), 1, Some(3_600_000))),
    );
    run(&store, &clock, &mut model, commands).await;
    compacted_through(&store, 5_000).await;
    store.shutdown().await;
    let mut conn = connect(&url);
    let parts: u64 = redis::cmd("HGET")
        .arg(format!("{{{}}}:snapshot", *namespace))
        .arg("parts")
        .query(&mut conn)
        .expect("the snapshot's parts");
    assert!(parts >= 2, "{parts} part(s)");
    let (snapshot, _) = assert_reads_back(&url, namespace, &model.state);
    assert!(snapshot.is_some_and(|v| v >= 5_000));
}

/// More history of one kind than one entry holds (about 256 KiB) goes to its stream in
/// several entries, and a new instance reads all of it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_larger_than_an_entry_reads_back_whole() {
    let Some(url) = redis_url() else { return };
    let namespace_ledger = ScratchLedger::new(&url, Topology::Single, "chunks");
    let namespace = &namespace_ledger.namespace;
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = open(&url, namespace, clock.clone(), dir.path(), 3_000);
    let mut model = Model::default();
    let party = PARTIES[0];
    let mut commands = provision(party, 1 << 40, 1 << 40);
    for n in 0..1_500 {
        let id = format!("res-chunk-{n}");
        commands.push(reserve_for(party, &id, 10, None));
        commands.push(commit_by(party, &id, &id, 5));
        if n % 16 == 15 {
            commands.push(Command::Maintain(ledger::Maintain {
                limit: 64,
                archive_after_ms: 0,
            }));
        }
    }
    run(&store, &clock, &mut model, commands).await;
    compacted_through(&store, 3_000).await;
    store.shutdown().await;
    let entries = history_times(&url, namespace, "archived").len();
    assert!(entries >= 2, "{entries} history entries");
    let fresh_dir = tempfile::tempdir().expect("temp dir");
    let fresh = open(&url, namespace, clock.clone(), fresh_dir.path(), 3_000);
    let archived = fresh
        .read_history(|h| Ok(h.archived_count()))
        .await
        .expect("read the history");
    assert!(
        model.archive.len() > 1_000,
        "{} archived",
        model.archive.len()
    );
    assert_eq!(archived, model.archive.len() as u64);
    drop(fresh);
    assert_reads_back(&url, namespace, &model.state);
}
