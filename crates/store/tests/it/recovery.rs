//! Crash tests for the embedded engine's journal (DESIGN.md §3, §8).
//!
//! A store is driven through a fixed workload while a model applies the same commands to an
//! in-memory [`State`] at the same instants; the model's state after every journaled command
//! is the acknowledged history. The journal is then cut (or damaged) and recovered, and the
//! result must be a prefix of that history: exactly the records that survived whole.
//!
//! The journal format is parsed here independently of the engine (an 8-byte header, then
//! frames of payload length (u32 LE), CRC32C (u32 LE), payload), so the expected prefix at
//! each offset does not come from the code under test.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{
    apply_in, Action, Actor, Applied, ArchiveLookup, Commit, CreateApiKey, CreateBudget,
    CreateTenant, Effect, Found, FundBudget, Funding, FundingOp, GetReservation, Idempotency,
    Maintain, NewApiKey, NewBudget, NewTenant, Operation, Origin, Rejection, Release, Reserve,
    SnapshotData, State, Subject, Unit, TERMINAL_RETENTION_MS,
};
use store::embedded::{recover, verify, Durability, EmbeddedConfig, EmbeddedStore, Recovered};
use store::{Clock, Load, ManualClock, Store};
use tempfile::TempDir;

const TENANT: &str = "t";
const DIGEST: [u8; 32] = [7; 32];

/// A tenant and the digest of its API key: whose commands a workload's are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Party {
    pub tenant: &'static str,
    pub digest: [u8; 32],
}

/// The crash tests' tenant.
const T: Party = Party {
    tenant: TENANT,
    digest: DIGEST,
};
pub(crate) const UNIT: Unit = Unit::UsdMicrocents;
pub(crate) const T0: i64 = 1_800_000_000_000;
/// Clock advance between commands (well inside the default 60 s reservation TTL).
pub(crate) const STEP_MS: i64 = 10;
/// Commands per workload.
const OPS: usize = 60;
/// The journal's file header (magic + format version).
const HEADER: usize = 8;
/// A frame's length and checksum fields.
const FRAME_HEADER: usize = 8;

// ---------------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------------

/// One operation of a workload. Each operation has its own output type; the workload holds
/// them in one list, so the answers of the store and of the model are compared as their
/// `Debug` text (every field, so equal text is equal answers).
#[derive(Clone)]
pub(crate) enum Command {
    CreateTenant(CreateTenant),
    CreateApiKey(CreateApiKey),
    CreateBudget(CreateBudget),
    Reserve(Reserve),
    Commit(Commit),
    Release(Release),
    FundBudget(FundBudget),
    Maintain(Maintain),
}

/// An operation's answer with its output as text.
pub(crate) type Answer = Result<String, Rejection>;

fn answer<T: std::fmt::Debug>(result: Result<T, Rejection>) -> Answer {
    result.map(|output| format!("{output:?}"))
}

/// Runs `$body` with `$op` bound to the operation inside `$command`, whatever its type.
macro_rules! with_operation {
    ($command:expr, $op:ident => $body:expr) => {
        match $command {
            Command::CreateTenant($op) => $body,
            Command::CreateApiKey($op) => $body,
            Command::CreateBudget($op) => $body,
            Command::Reserve($op) => $body,
            Command::Commit($op) => $body,
            Command::Release($op) => $body,
            Command::FundBudget($op) => $body,
            Command::Maintain($op) => $body,
        }
    };
}

/// What a model's history store holds for a lookup.
pub(crate) type Archive<'a> = &'a dyn Fn(&ArchiveLookup) -> Found;

impl Command {
    /// Applies the command to the model's `state` (with nothing archived).
    pub(crate) fn apply(self, state: &mut State, now: i64) -> Applied<String> {
        self.apply_with(state, now, &|_| None)
    }

    /// Applies the command to the model's `state`, given what `archive` holds of the
    /// reservations it archived.
    pub(crate) fn apply_with(
        self,
        state: &mut State,
        now: i64,
        archive: Archive,
    ) -> Applied<String> {
        fn erased<O: Operation>(
            state: &mut State,
            op: O,
            now: i64,
            archive: Archive,
        ) -> Applied<String> {
            let found = op.archive_lookup(state, now).map(|lookup| archive(&lookup));
            let applied = apply_in(state, op, now, &Origin::default, found);
            Applied {
                result: answer(applied.result),
                effects: applied.effects,
                tenant: applied.tenant,
            }
        }
        with_operation!(self, op => erased(state, op, now, archive))
    }

    /// Sends the command to the store.
    pub(crate) async fn execute(self, store: &impl Store, load: Load) -> Answer {
        let answered =
            with_operation!(self, op => store.execute(op, load).await.map(|r| answer(r.result)));
        answered.expect("the store answers")
    }
}

fn idem(key: String) -> Idempotency {
    let mut fingerprint = [0u8; 32];
    for (slot, byte) in fingerprint.iter_mut().zip(key.bytes()) {
        *slot = byte;
    }
    Idempotency {
        key: key.into(),
        fingerprint,
    }
}

fn tenant(id: &str) -> Command {
    Command::CreateTenant(CreateTenant {
        actor: Actor::Admin,
        tenant: NewTenant {
            tenant_id: id.into(),
            name: format!("Tenant {id}"),
            parent_tenant_id: None,
            default_commit_overage_policy: None,
            default_reservation_ttl_ms: None,
            max_reservation_ttl_ms: None,
            max_reservation_extensions: None,
            reservation_expiry_policy: None,
            metadata: BTreeMap::new(),
        },
    })
}

fn budget(party: Party, scope: &str, allocated: i64) -> Command {
    Command::CreateBudget(CreateBudget {
        actor: Actor::Admin,
        budget: NewBudget {
            ledger_id: format!("ledger-{scope}"),
            tenant_id: Some(party.tenant.into()),
            scope: scope.into(),
            unit: UNIT,
            allocated,
            overdraft_limit: 0,
            commit_overage_policy: None,
            rollover_policy: None,
            period_start_ms: None,
            period_end_ms: None,
            metadata: None,
        },
    })
}

/// A tenant, its API key, and budgets at the tenant and at one agent.
pub(crate) fn provisioning() -> Vec<Command> {
    provision(T, 10_000_000, 2_000_000)
}

/// `party`'s tenant, its API key, and budgets at the tenant and at its agent `a`.
pub(crate) fn provision(party: Party, tenant_allocated: i64, agent_allocated: i64) -> Vec<Command> {
    let scope = format!("tenant:{}", party.tenant);
    vec![
        tenant(party.tenant),
        Command::CreateApiKey(CreateApiKey {
            actor: Actor::Admin,
            key: NewApiKey {
                key_id: format!("key-{}", party.tenant),
                tenant_id: party.tenant.into(),
                key_prefix: "cyc_live_".into(),
                digest: party.digest,
                name: "agent key".into(),
                description: None,
                permissions: None,
                scope_filter: Vec::new(),
                expires_at_ms: Some(i64::MAX),
                metadata: None,
            },
        }),
        budget(party, &scope, tenant_allocated),
        budget(party, &format!("{scope}/agent:a"), agent_allocated),
    ]
}

pub(crate) fn reserve(id: &str, estimate: i64) -> Command {
    reserve_for(T, id, estimate, None)
}

/// A reserve by `party`'s key at its agent `a`, its idempotency key named after `id`.
pub(crate) fn reserve_for(party: Party, id: &str, estimate: i64, ttl_ms: Option<i64>) -> Command {
    Command::Reserve(Reserve {
        actor: Actor::ApiKey(party.digest),
        idem: idem(format!("reserve-{id}")),
        reservation_id: id.into(),
        subject: Subject {
            tenant: Some(party.tenant.into()),
            agent: Some("a".into()),
            ..Subject::default()
        },
        action: Action {
            kind: "llm.completion".into(),
            name: "model".into(),
            tags: None,
        },
        unit: UNIT,
        estimate,
        ttl_ms,
        grace_period_ms: 0,
        overage_policy: None,
        dry_run: false,
        metadata: None,
    })
}

pub(crate) fn commit(id: &str, key: &str, actual: i64) -> Command {
    commit_by(T, id, key, actual)
}

/// A commit of reservation `id` by `party`'s key (whichever tenant's the reservation is).
pub(crate) fn commit_by(party: Party, id: &str, key: &str, actual: i64) -> Command {
    Command::Commit(Commit {
        actor: Actor::ApiKey(party.digest),
        idem: idem(format!("commit-{key}")),
        reservation_id: id.into(),
        unit: UNIT,
        actual,
        metadata: None,
    })
}

fn release(id: &str) -> Command {
    release_by(T, id)
}

/// A release of reservation `id` by `party`'s key.
pub(crate) fn release_by(party: Party, id: &str) -> Command {
    Command::Release(Release {
        actor: Actor::ApiKey(party.digest),
        idem: idem(format!("release-{id}")),
        reservation_id: id.into(),
        reason: Some("not needed".into()),
    })
}

pub(crate) fn credit(n: usize) -> Command {
    fund(n, 1_000)
}

/// A credit of `amount` to the tenant's budget.
pub(crate) fn fund(n: usize, amount: i64) -> Command {
    fund_to(T, n, amount)
}

/// A credit of `amount` to `party`'s tenant budget, its idempotency key named after `n`.
pub(crate) fn fund_to(party: Party, n: usize, amount: i64) -> Command {
    Command::FundBudget(FundBudget {
        actor: Actor::Admin,
        fund: Funding {
            tenant_id: Some(party.tenant.into()),
            scope: format!("tenant:{}", party.tenant),
            unit: UNIT,
            operation: FundingOp::Credit,
            amount,
            spent: None,
            reason: None,
            idem: Some(idem(format!("fund-{n}"))),
        },
    })
}

/// `len` commands: provisioning, then reservations that are committed, released, left
/// ACTIVE, left to lapse and expired by a maintenance command, or followed by a funding
/// credit, plus a rejected second commit now and then (it writes nothing, so the history
/// must not count it). `start` keeps ids unique when a test
/// drives two workloads into one store.
pub(crate) fn workload(start: usize, len: usize) -> Vec<Command> {
    let mut commands = if start == 0 {
        provisioning()
    } else {
        Vec::new()
    };
    let mut n = start;
    while commands.len() < len {
        let id = format!("res-{n}");
        let estimate = 1_000 + 7 * n as i64;
        if n % 10 == 4 {
            // Lapses before the next command (STEP_MS later), which expires it.
            commands.push(reserve_for(T, &id, estimate, Some(1)));
            commands.push(Command::Maintain(Maintain {
                limit: 16,
                archive_after_ms: 0,
            }));
            n += 1;
            continue;
        }
        commands.push(reserve(&id, estimate));
        match n % 5 {
            0 => commands.push(commit(&id, &id, estimate / 2)),
            1 => commands.push(release(&id)),
            2 => commands.push(credit(n)),
            3 => {
                commands.push(commit(&id, &id, estimate + 5));
                commands.push(commit(&id, &format!("{id}-again"), 1));
            }
            _ => {}
        }
        n += 1;
    }
    commands.truncate(len);
    commands
}

// ---------------------------------------------------------------------------------------
// The model: the acknowledged history
// ---------------------------------------------------------------------------------------

/// The state in a form two states can be compared in (snapshot vectors built from hash maps
/// come out in arbitrary order).
pub(crate) fn canonical(state: &State) -> SnapshotData {
    let mut data = state.to_snapshot();
    data.reservations
        .sort_by(|a, b| a.reservation_id.cmp(&b.reservation_id));
    data.idempotency.sort_by(|a, b| a.0.cmp(&b.0));
    data
}

/// The same commands applied in memory at the same instants.
struct Model {
    state: State,
    /// `history[k]` is the state after the first `k` journal records.
    history: Vec<SnapshotData>,
}

impl Model {
    fn new() -> Self {
        Model {
            state: State::new(),
            history: vec![canonical(&State::new())],
        }
    }
}

/// A store in a temporary data directory with a manual clock.
struct Harness {
    dir: TempDir,
    clock: Arc<ManualClock>,
    model: Model,
}

impl Harness {
    fn new() -> Self {
        Harness {
            dir: tempfile::tempdir().expect("temp dir"),
            clock: Arc::new(ManualClock::new(T0)),
            model: Model::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn open(&self, snapshot_after_bytes: Option<u64>) -> EmbeddedStore {
        open_store(self.path(), self.clock.clone(), |config| {
            if let Some(bytes) = snapshot_after_bytes {
                config.snapshot_after_bytes = bytes;
            }
        })
    }

    /// Sends each command to the store and to the model; every reply must match the
    /// model's. Commands alternate between the two ways a record becomes durable: handed to
    /// the syncer thread, and synced by a request that is alone.
    async fn drive(&mut self, store: &EmbeddedStore, commands: Vec<Command>) {
        for (i, command) in commands.into_iter().enumerate() {
            self.clock.advance(STEP_MS);
            let expected = command
                .clone()
                .apply(&mut self.model.state, self.clock.now_ms());
            let load = if i % 2 == 0 { Load::Busy } else { Load::Alone };
            let answered = command.execute(store, load).await;
            assert_eq!(answered, expected.result, "store and model disagree");
            if !expected.effects.is_empty() {
                self.model.history.push(canonical(&self.model.state));
            }
        }
    }
}

fn open_store(
    dir: &Path,
    clock: Arc<ManualClock>,
    configure: impl FnOnce(&mut EmbeddedConfig),
) -> EmbeddedStore {
    let mut config = EmbeddedConfig::new(dir, Durability::Strict, clock);
    configure(&mut config);
    EmbeddedStore::open(config).expect("open store").0
}

// ---------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------

/// `(first seq, path)` of files named `{prefix}{seq:020}{suffix}`, by sequence number.
fn numbered(dir: &Path, prefix: &str, suffix: &str) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| {
            let path = e.expect("dir entry").path();
            let name = path.file_name()?.to_str()?;
            let seq = name
                .strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse()
                .ok()?;
            Some((seq, path))
        })
        .collect();
    out.sort();
    out
}

fn segments(dir: &Path) -> Vec<(u64, PathBuf)> {
    numbered(dir, "journal-", ".log")
}

fn snapshots(dir: &Path) -> Vec<(u64, PathBuf)> {
    numbered(dir, "snapshot-", ".bin")
}

fn last_segment(dir: &Path) -> (u64, PathBuf) {
    segments(dir).pop().expect("a journal segment")
}

/// A scratch directory for cut-and-recover rounds: in memory where the system has a tmpfs
/// (repair's `fsync` is then free), so sweeping thousands of cuts stays fast.
fn scratch_dir() -> TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

/// Copies a data directory's files (not its lock) into a fresh scratch directory.
fn copy_dir(src: &Path) -> TempDir {
    let dst = scratch_dir();
    for entry in fs::read_dir(src).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.file_name().is_some_and(|n| n != "LOCK") {
            fs::copy(&path, dst.path().join(path.file_name().expect("name"))).expect("copy");
        }
    }
    dst
}

/// Where each whole frame of a segment ends.
fn frame_ends(bytes: &[u8]) -> Vec<usize> {
    assert!(
        bytes.len() >= HEADER && &bytes[..4] == b"CYCJ",
        "segment header"
    );
    let mut ends = Vec::new();
    let mut at = HEADER;
    while at + FRAME_HEADER <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + FRAME_HEADER + len;
        // A zero length is the preallocated space after the last record.
        if len == 0 || end > bytes.len() {
            break;
        }
        ends.push(end);
        at = end;
    }
    ends
}

/// Waits until a background snapshot has been written and has pruned the segments before
/// the previous snapshot (prune keeps one generation back), so that a copy of the directory
/// is a consistent crash image.
fn await_quiet(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let segs = segments(dir);
        let first = segs.last().map_or(1, |(s, _)| *s);
        let snapshot_done = snapshots(dir).iter().any(|(s, _)| *s + 1 >= first);
        let tmp = fs::read_dir(dir).expect("read dir").any(|e| {
            e.expect("entry")
                .path()
                .extension()
                .is_some_and(|x| x == "tmp")
        });
        if first == 1 || (segs.len() <= 2 && snapshot_done && !tmp) {
            return;
        }
        assert!(Instant::now() < deadline, "snapshot never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// Asserts that a recovery produced exactly `history[k]` and a sound state.
#[track_caller]
fn assert_prefix(what: &str, got: &Recovered, history: &[SnapshotData], k: usize) {
    let state = canonical(&got.state);
    if state != history[k] {
        let matched = history.iter().position(|h| *h == state);
        panic!(
            "{what}: expected the state after {k} records, got {} (last_seq {})",
            matched.map_or("a state outside the history".into(), |m| format!(
                "the state after {m}"
            )),
            got.last_seq
        );
    }
    assert_eq!(got.last_seq, k as u64, "{what}: last_seq");
    let violations = got.state.verify();
    assert!(violations.is_empty(), "{what}: {violations:?}");
}

/// Where to cut a segment whose frames end at `ends`: every offset of the header, around
/// every frame (at its start, one byte in, right after its length and checksum, halfway,
/// one byte short of its end), and every single offset of the last `tail` frames.
fn cut_offsets(ends: &[usize], tail: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (0..=HEADER).collect();
    let starts = std::iter::once(HEADER).chain(ends.iter().copied());
    for (start, end) in starts.zip(ends.iter().copied()) {
        cuts.extend([
            start + 1,
            start + FRAME_HEADER,
            (start + end) / 2,
            end - 1,
            end,
        ]);
    }
    let from = ends.len().checked_sub(tail + 1).map_or(HEADER, |i| ends[i]);
    cuts.extend(from..=ends.last().copied().unwrap_or(HEADER));
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Cuts the last journal segment of (a copy of) `src` at the offsets of [`cut_offsets`]
/// and recovers each.
///
/// `floor` is the sequence number already covered without this segment (its first seq − 1,
/// or a later snapshot). Every cut must recover `history[max(floor, first − 1 + whole
/// frames)]`: read-only (as `cycles verify` does, leaving the file alone) and with repair
/// (truncating to the last whole frame). Returns the number of cuts checked.
fn sweep(src: &Path, history: &[SnapshotData], tail: usize, floor: u64, zeros: Zeros) -> usize {
    let work = copy_dir(src);
    let (first, segment) = last_segment(work.path());
    let file = fs::read(&segment).expect("read segment");
    let ends = frame_ends(&file);
    let records_end = ends.last().copied().unwrap_or(HEADER);
    assert!(
        file[records_end..].iter().all(|&b| b == 0),
        "only preallocated zeros after the last record"
    );
    // Cuts inside the records; what a cut leaves after them is tested apart.
    let bytes = &file[..records_end];
    let cuts = cut_offsets(&ends, tail);
    let mut previous = 0;
    for &cut in &cuts {
        fs::write(&segment, &bytes[..cut]).expect("write cut segment");
        let whole = ends.iter().filter(|&&e| e <= cut).count();
        let k = (first - 1 + whole as u64).max(floor) as usize;
        let valid = if cut < HEADER {
            0
        } else {
            ends.iter()
                .copied()
                .filter(|&e| e <= cut)
                .max()
                .unwrap_or(HEADER)
        };
        let what = format!("cut at {cut} of {}", bytes.len());

        let (read_only, violations) = verify(work.path()).expect("verify");
        assert_prefix(&format!("{what} (verify)"), &read_only, history, k);
        assert!(violations.is_empty(), "{what}: {violations:?}");
        let len = fs::metadata(&segment).expect("stat").len();
        assert_eq!(
            len, cut as u64,
            "{what}: verify must not modify the journal"
        );

        let repaired = recover(work.path(), true).expect("recover");
        assert_prefix(&format!("{what} (repair)"), &repaired, history, k);
        assert_eq!(repaired.truncated_bytes, (cut - valid) as u64, "{what}");
        let len = fs::metadata(&segment).expect("stat").len();
        assert_eq!(len, valid as u64, "{what}: the torn tail is cut off");
        assert!(k >= previous, "{what}: the recovered prefix went backwards");
        previous = k;

        if zeros == Zeros::Skip {
            continue;
        }
        // The same cut inside preallocated space: zeros follow the torn bytes. Zeros right
        // after whole records are a clean end and stay; after anything else they go with it.
        // (Where the missing bytes were zeros themselves, the zeros restore them: a cut
        // header whose version field ends in zeros, a record whose last bytes were zeros.)
        let padded = [&bytes[..cut], &[0u8; PADDING][..]].concat();
        fs::write(&segment, &padded).expect("write padded segment");
        let what = format!("{what}, then {PADDING} zeros");
        let restored = |end: usize| end <= padded.len() && padded[..end] == file[..end];
        let header_whole = restored(HEADER);
        let whole = ends
            .iter()
            .take_while(|&&e| header_whole && restored(e))
            .count();
        let k = (first - 1 + whole as u64).max(floor) as usize;
        let valid = match whole {
            0 if header_whole => HEADER,
            0 => 0,
            n => ends[n - 1],
        };
        let (read_only, _) = verify(work.path()).expect("verify");
        assert_prefix(&format!("{what} (verify)"), &read_only, history, k);
        let repaired = recover(work.path(), true).expect("recover");
        assert_prefix(&format!("{what} (repair)"), &repaired, history, k);
        let clean = header_whole && padded[valid..].iter().all(|&b| b == 0);
        let kept = if clean { padded.len() } else { valid };
        assert_eq!(
            repaired.truncated_bytes,
            (padded.len() - kept) as u64,
            "{what}"
        );
        let len = fs::metadata(&segment).expect("stat").len();
        assert_eq!(len, kept as u64, "{what}: only a torn tail is cut off");
    }
    cuts.len()
}

/// Zeros after a cut in [`sweep`], as the preallocated space after a torn write leaves them.
const PADDING: usize = 4096;

/// Whether [`sweep`] also tries each cut followed by zeros (the sweeps behind snapshots
/// skip it: they test what a snapshot changes, and each round loads a snapshot).
#[derive(PartialEq)]
enum Zeros {
    Check,
    Skip,
}

/// Cuts the last segment of (a copy of) `src` at `cut`, opens a store on it (which repairs
/// it), writes one more command, and checks that a second recovery sees the prefix plus
/// that command, appended where the valid journal ended.
async fn reopen_after_cut(src: &Path, history: &[SnapshotData], cut: usize, k: usize) {
    let work = copy_dir(src);
    let (_, segment) = last_segment(work.path());
    let bytes = fs::read(&segment).expect("read segment");
    fs::write(&segment, &bytes[..cut]).expect("write cut segment");

    let clock = Arc::new(ManualClock::new(T0 + 1_000_000));
    let extra = tenant(&format!("extra-{cut}"));
    let mut expected = State::from_snapshot(history[k].clone());
    let applied = extra.clone().apply(&mut expected, clock.now_ms());
    assert!(applied.result.is_ok() && !applied.effects.is_empty());

    let store = open_store(work.path(), clock.clone(), |_| {});
    let answered = extra.execute(&store, Load::Alone).await;
    assert_eq!(answered, applied.result, "cut at {cut}");
    // A crash right after the acknowledgement: no shutdown, so no final snapshot.
    drop(store);

    let recovered = recover(work.path(), false).expect("recover");
    assert_eq!(
        canonical(&recovered.state),
        canonical(&expected),
        "cut at {cut}: the appended record must follow the recovered prefix"
    );
    assert_eq!(recovered.last_seq, k as u64 + 1, "cut at {cut}");
    assert_eq!(recovered.truncated_bytes, 0, "cut at {cut}: nothing torn");
    assert!(recovered.state.verify().is_empty());
}

/// Flips one bit in the payload of journal record `index` (0-based) of the last segment;
/// returns how many bytes the damaged record and those after it take.
fn flip_bit_in_record(dir: &Path, index: usize) -> usize {
    let (_, segment) = last_segment(dir);
    let mut bytes = fs::read(&segment).expect("read segment");
    let ends = frame_ends(&bytes);
    let start = if index == 0 { HEADER } else { ends[index - 1] };
    let middle = start + FRAME_HEADER + (ends[index] - start - FRAME_HEADER) / 2;
    bytes[middle] ^= 0x10;
    fs::write(&segment, &bytes).expect("write segment");
    bytes.len() - start
}

/// A journal of `OPS` commands whose store was never shut down (as after a crash).
async fn crashed_journal() -> Harness {
    let mut h = Harness::new();
    let store = h.open(None);
    h.drive(&store, workload(0, OPS)).await;
    drop(store);
    assert!(
        snapshots(h.path()).is_empty(),
        "no snapshot without shutdown"
    );
    assert_eq!(segments(h.path()).len(), 1);
    h
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// The workload exercises every kind of record the journal holds, expiry included.
#[test]
fn the_workload_expires_reservations() {
    let mut state = State::new();
    let mut now = T0;
    let mut expired = 0;
    for command in workload(0, OPS) {
        now += STEP_MS;
        let applied = command.apply(&mut state, now);
        expired += applied
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::ExpireReservation { .. }))
            .count();
    }
    assert!(expired >= 2, "{expired} expiries in the workload");
}

/// Every byte offset of the journal: the recovered state is the state after the records
/// that survived whole, never more, never less, and the ledger's rules hold.
#[tokio::test]
async fn every_cut_of_the_journal_recovers_a_prefix() {
    let h = crashed_journal().await;
    let records = h.model.history.len() - 1;
    assert!(records >= 50, "the workload journals most commands");
    let full = recover(h.path(), false).expect("recover");
    assert_prefix("intact journal", &full, &h.model.history, records);
    // The writer fills the segment with zeros ahead of its records; they are not damage.
    let segment = fs::read(last_segment(h.path()).1).expect("read segment");
    let records_end = frame_ends(&segment).last().copied().unwrap_or(HEADER);
    assert!(segment.len() > records_end, "the segment is preallocated");
    assert_eq!(
        full.truncated_bytes, 0,
        "zeros after the records are no torn tail"
    );
    let checked = sweep(h.path(), &h.model.history, 3, 0, Zeros::Check);
    assert!(checked > 1_000, "swept only {checked} offsets");
}

/// A whole record (its checksum holds) that this build cannot decode — one written by a
/// newer version — and a segment of another format version are refused, not cut off as a
/// torn tail: the data directory is left exactly as it was.
#[tokio::test]
async fn records_and_segments_of_a_newer_format_are_refused_not_cut() {
    let h = crashed_journal().await;
    let (_, segment) = last_segment(h.path());
    let original = fs::read(&segment).expect("read segment");
    let records_end = frame_ends(&original).last().copied().expect("records");

    let payload = [0xff_u8; 16];
    let mut newer = original.clone();
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    newer[records_end..records_end + frame.len()].copy_from_slice(&frame);

    let mut other_version = original.clone();
    other_version[4..8].copy_from_slice(&99_u32.to_le_bytes());

    for (what, bytes) in [("newer record", newer), ("other version", other_version)] {
        let work = copy_dir(h.path());
        let (_, path) = last_segment(work.path());
        fs::write(&path, &bytes).expect("write segment");
        let refused = recover(work.path(), true).expect_err(what).to_string();
        assert!(refused.contains("cannot read"), "{what}: {refused}");
        assert!(verify(work.path()).is_err(), "{what}: verify refuses too");
        assert_eq!(
            fs::read(&path).expect("read"),
            bytes,
            "{what}: left as it was"
        );
    }
}

/// After a cut, the store opens on the repaired journal, appends where it ended, and the
/// next recovery sees the new record after the prefix.
#[tokio::test]
async fn reopening_after_a_cut_appends_after_the_prefix() {
    let h = crashed_journal().await;
    let history = &h.model.history;
    let (_, segment) = last_segment(h.path());
    let len = fs::metadata(&segment).expect("stat").len() as usize;
    let ends = frame_ends(&fs::read(&segment).expect("read"));
    let n = ends.len();
    let mut cuts = vec![(0, 0), (3, 0), (HEADER, 0), (HEADER + 5, 0), (len, n)];
    for i in n - 3..n {
        // At a record boundary, one byte into the next frame, and mid-frame.
        cuts.push((ends[i - 1], i));
        cuts.push((ends[i - 1] + 1, i));
        cuts.push(((ends[i - 1] + ends[i]) / 2, i));
        cuts.push((ends[i] - 1, i));
    }
    for (cut, k) in cuts {
        reopen_after_cut(h.path(), history, cut, k).await;
    }
}

/// A flipped bit fails the record's checksum: recovery stops right before that record and
/// drops everything after it, whether it is the last record or one in the middle.
#[tokio::test]
async fn a_flipped_bit_stops_recovery_before_the_damaged_record() {
    let h = crashed_journal().await;
    let history = &h.model.history;
    let records = history.len() - 1;
    for index in [records - 1, records / 2, 0] {
        let work = copy_dir(h.path());
        let damaged = flip_bit_in_record(work.path(), index);
        let (read_only, _) = verify(work.path()).expect("verify");
        assert_prefix(
            &format!("bit flip in record {index}"),
            &read_only,
            history,
            index,
        );
        let repaired = recover(work.path(), true).expect("recover");
        assert_prefix(
            &format!("bit flip in record {index}"),
            &repaired,
            history,
            index,
        );
        assert_eq!(repaired.truncated_bytes, damaged as u64);
        // The damaged record and the ones after it are gone for good.
        let again = recover(work.path(), false).expect("recover");
        assert_eq!(again.truncated_bytes, 0);
        assert_prefix("after repair", &again, history, index);
    }
}

/// A clean shutdown writes a snapshot; commands after a restart go to the journal. Recovery
/// is the snapshot plus the later records, and a cut anywhere in the journal never goes back
/// past the snapshot.
#[tokio::test]
async fn a_snapshot_and_later_records_recover_the_final_state() {
    let mut h = Harness::new();
    let store = h.open(None);
    h.drive(&store, workload(0, OPS / 2)).await;
    store.shutdown().await;
    drop(store);
    let at_snapshot = h.model.history.len() as u64 - 1;
    assert_eq!(
        snapshots(h.path())
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![at_snapshot]
    );

    let store = h.open(None);
    h.drive(&store, workload(1_000, OPS / 2)).await;
    drop(store);
    let records = h.model.history.len() - 1;
    let recovered = recover(h.path(), false).expect("recover");
    assert_eq!(recovered.snapshot_seq, Some(at_snapshot));
    assert_eq!(recovered.records_replayed, records as u64 - at_snapshot);
    assert_prefix("snapshot + journal", &recovered, &h.model.history, records);

    // The journal still starts at record 1 (a lone segment is never pruned): records the
    // snapshot covers are skipped, and no cut can undo them.
    assert_eq!(last_segment(h.path()).0, 1);
    sweep(h.path(), &h.model.history, 1, at_snapshot, Zeros::Skip);
}

/// After a clean shutdown the snapshot covers everything: however the journal behind it is
/// cut, nothing is lost, and the store keeps appending after the snapshot's sequence.
#[tokio::test]
async fn a_cut_journal_behind_a_final_snapshot_loses_nothing() {
    let mut h = Harness::new();
    let store = h.open(None);
    h.drive(&store, workload(0, OPS)).await;
    store.shutdown().await;
    drop(store);
    let records = h.model.history.len() - 1;
    sweep(h.path(), &h.model.history, 1, records as u64, Zeros::Skip);
    for cut in [0, 5, HEADER, HEADER + 40] {
        reopen_after_cut(h.path(), &h.model.history, cut, records).await;
    }
}

/// A snapshot that is corrupt or cut short is skipped; while the journal still holds every
/// record (a lone segment is never pruned), recovery replays it all from the start.
#[tokio::test]
async fn a_corrupt_snapshot_falls_back_to_the_journal() {
    let mut h = Harness::new();
    let store = h.open(None);
    h.drive(&store, workload(0, OPS)).await;
    store.shutdown().await;
    drop(store);
    let records = h.model.history.len() - 1;
    let snapshot = snapshots(h.path()).pop().expect("a final snapshot").1;
    let good = fs::read(&snapshot).expect("read snapshot");

    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let damage: [(&str, Damage); 3] = [
        (
            "flipped payload bit",
            Box::new(|b| {
                let middle = b.len() / 2;
                b[middle] ^= 1;
            }),
        ),
        ("cut short", Box::new(|b| b.truncate(b.len() - 3))),
        ("bad magic", Box::new(|b| b[0] = b'X')),
    ];
    for (what, damage) in damage {
        let work = copy_dir(h.path());
        let mut bytes = good.clone();
        damage(&mut bytes);
        fs::write(work.path().join(snapshot.file_name().expect("name")), bytes).expect("write");
        let recovered = recover(work.path(), true).expect("recover");
        assert_eq!(
            recovered.snapshot_seq, None,
            "{what}: the snapshot is skipped"
        );
        assert_eq!(recovered.records_replayed, records as u64, "{what}");
        assert_prefix(what, &recovered, &h.model.history, records);
    }
}

/// A journal of `OPS` commands with a small snapshot threshold: it rotated, background
/// snapshots pruned the old segments, and the store was never shut down.
async fn rotated_journal() -> Harness {
    let mut h = Harness::new();
    let store = h.open(Some(4_096));
    h.drive(&store, workload(0, OPS)).await;
    drop(store);
    // Dropping the store joined its syncer and any snapshot it had started.
    await_quiet(h.path());
    assert!(last_segment(h.path()).0 > 1, "the journal never rotated");
    h
}

/// After rotation, recovery is the latest snapshot plus the newest segment, and every cut of
/// that segment recovers the snapshot plus the records that survived whole.
#[tokio::test]
async fn cuts_after_rotation_recover_a_prefix() {
    let h = rotated_journal().await;
    let records = h.model.history.len() - 1;
    let (first, _) = last_segment(h.path());
    let recovered = recover(h.path(), false).expect("recover");
    assert_eq!(recovered.snapshot_seq, Some(first - 1));
    assert_prefix("rotated journal", &recovered, &h.model.history, records);
    sweep(h.path(), &h.model.history, 2, first - 1, Zeros::Skip);
}

/// A snapshot waits until the journal since the previous one is at least as large as that
/// previous snapshot, so snapshots never rewrite a large state more often than the journal
/// grows by its size.
#[tokio::test]
async fn snapshots_wait_for_as_much_journal_as_the_last_snapshot() {
    let h = rotated_journal().await;
    let all = snapshots(h.path());
    let [.., (previous, previous_path), (newest, _)] = &all[..] else {
        panic!("prune keeps the previous snapshot: {all:?}");
    };
    let previous_len = fs::metadata(previous_path).expect("snapshot").len();
    let (_, between) = segments(h.path())
        .into_iter()
        .find(|(first, _)| *first == previous + 1)
        .expect("the journal after the previous snapshot is kept");
    let between_len = fs::metadata(&between).expect("segment").len();
    assert!(
        between_len >= previous_len.max(4_096),
        "snapshot {newest} started after {between_len} journal bytes; the previous snapshot has {previous_len}"
    );
}

/// A count of records starts a snapshot too, however far the journal is from the byte
/// threshold: what a restart after a crash replays is records, so their count bounds it.
#[tokio::test]
async fn a_count_of_records_starts_a_snapshot_before_the_bytes_do() {
    const RECORDS: u64 = 12;
    let mut h = Harness::new();
    let store = open_store(h.path(), h.clock.clone(), |config| {
        config.snapshot_after_records = RECORDS;
    });
    h.drive(&store, workload(0, OPS)).await;
    drop(store);
    await_quiet(h.path());
    let taken: Vec<u64> = snapshots(h.path()).iter().map(|(s, _)| *s).collect();
    assert!(!taken.is_empty(), "no snapshot after {OPS} commands");
    // Each snapshot waited for the count (and for the journal to outgrow the one before).
    let mut previous = 0;
    for seq in &taken {
        assert!(seq - previous >= RECORDS, "snapshots at {taken:?}");
        previous = *seq;
    }
    let records = h.model.history.len() - 1;
    let recovered = recover(h.path(), false).expect("recover");
    assert_eq!(recovered.snapshot_seq, taken.last().copied());
    assert!(
        recovered.records_replayed < records as u64,
        "recovery replayed all {records} records"
    );
    assert_prefix("records threshold", &recovered, &h.model.history, records);
}

/// The round whose records take the journal past the threshold starts the snapshot: a store
/// that then goes quiet is not left waiting for some later write to start it.
#[tokio::test]
async fn the_write_that_crosses_the_threshold_starts_the_snapshot() {
    const THRESHOLD: u64 = 4_096;
    let mut h = Harness::new();
    let store = h.open(Some(THRESHOLD));
    let journal_bytes = |store: &EmbeddedStore| {
        store
            .metrics()
            .into_iter()
            .find(|m| m.name == "cycles_journal_bytes_total")
            .map_or(0, |m| m.value)
    };
    let mut commands = workload(0, OPS).into_iter();
    // The segment's length counts its header too: these bytes take it past the threshold.
    while journal_bytes(&store) < THRESHOLD {
        let command = commands
            .next()
            .expect("the workload outgrows the threshold");
        h.drive(&store, vec![command]).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while snapshots(h.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no snapshot without a further write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(store);
}

/// Flips one bit in the middle of a file.
fn flip_middle(path: &Path) {
    let mut bytes = fs::read(path).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    fs::write(path, bytes).expect("write");
}

/// A damaged newest snapshot is skipped: recovery falls back to the previous snapshot, whose
/// journal prune keeps, and recovers every acknowledged record.
#[tokio::test]
async fn a_corrupt_newest_snapshot_falls_back_to_the_previous_one() {
    let h = rotated_journal().await;
    let all = snapshots(h.path());
    assert!(all.len() >= 2, "prune keeps the previous snapshot");
    let (newest, path) = all.last().expect("a snapshot").clone();
    flip_middle(&path);
    let recovered = recover(h.path(), false).expect("recover");
    assert!(recovered.snapshot_seq.is_some_and(|s| s < newest));
    assert_prefix(
        "fallback",
        &recovered,
        &h.model.history,
        h.model.history.len() - 1,
    );
}

/// With every snapshot damaged, the history before the oldest kept segment is gone: recovery
/// and verify refuse (an error) and leave the journal untouched, instead of starting from an
/// empty ledger.
#[tokio::test]
async fn missing_history_is_refused_not_truncated() {
    let h = rotated_journal().await;
    for (_, path) in snapshots(h.path()) {
        flip_middle(&path);
    }
    let (_, segment) = last_segment(h.path());
    let journal = fs::read(&segment).expect("read segment");
    assert!(verify(h.path()).is_err(), "verify accepted missing history");
    assert!(
        recover(h.path(), true).is_err(),
        "recovery accepted missing history"
    );
    assert_eq!(
        fs::read(&segment).expect("read segment"),
        journal,
        "the journal was changed"
    );
}

/// Requests that are alone run their own rounds; requests that think they are alone and
/// requests that hand off to the syncer, all at once on a multi-threaded runtime, lose no
/// acknowledgement in a crash (no shutdown), and the journal holds nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alone_and_busy_requests_interleave_without_losing_an_acknowledgement() {
    const ALONE: usize = 20;
    const TASKS: usize = 8;
    const EACH: usize = 40;
    let dir = TempDir::new().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open_store(dir.path(), clock.clone(), |c| {
        c.snapshot_after_bytes = 64 << 10
    }));
    let counter = |store: &EmbeddedStore, name: &str| {
        let metrics = store.metrics();
        metrics.iter().find(|m| m.name == name).expect(name).value
    };

    // One request at a time: nothing wakes the syncer thread, so every round is the
    // request's own.
    for i in 0..ALONE {
        let answered = tenant(&format!("a{i}")).execute(&*store, Load::Alone).await;
        assert!(answered.is_ok(), "{answered:?}");
    }
    assert_eq!(
        counter(&store, "cycles_store_batches_alone_total"),
        ALONE as u64
    );
    assert_eq!(counter(&store, "cycles_store_batches_total"), ALONE as u64);

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    let load = if (t + i) % 3 == 0 {
                        Load::Busy
                    } else {
                        Load::Alone
                    };
                    let answered = tenant(&format!("t{t}-{i}")).execute(&*store, load).await;
                    assert!(answered.is_ok(), "{answered:?}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let live = store.health();
    assert!(live.ready, "{}", live.detail);
    drop(Arc::try_unwrap(store).unwrap_or_else(|_| panic!("one owner left")));

    let recovered = recover(dir.path(), false).expect("recover");
    let tenants: Vec<String> = recovered
        .state
        .to_snapshot()
        .tenants
        .into_iter()
        .map(|t| t.tenant_id)
        .collect();
    assert_eq!(
        tenants.len(),
        ALONE + TASKS * EACH,
        "every acknowledged tenant, nothing else"
    );
    let acknowledged = (0..ALONE)
        .map(|i| format!("a{i}"))
        .chain((0..TASKS).flat_map(|t| (0..EACH).map(move |i| format!("t{t}-{i}"))));
    for name in acknowledged {
        assert!(tenants.contains(&name), "{name} was acknowledged");
    }
    assert!(recovered.state.verify().is_empty());
}

/// A settled reservation archived to the history store is read and replayed from it, after
/// a restart too (the snapshot holds nothing of it but its reserve key's digest), and goes
/// with its retention.
#[tokio::test]
async fn archived_reservations_outlive_a_restart_until_their_retention_ends() {
    let dir = scratch_dir();
    let clock = Arc::new(ManualClock::new(T0));
    let get = || GetReservation {
        actor: Actor::ApiKey(DIGEST),
        reservation_id: "res-a".into(),
    };
    async fn archived(store: &EmbeddedStore) -> u64 {
        let count = store.read_history(|h| Ok(h.archived_count()));
        count.await.expect("history")
    }
    // Snapshots after every record: the restart loads one written after the archive.
    let store = open_store(dir.path(), clock.clone(), |c| c.snapshot_after_bytes = 1);
    for command in provisioning() {
        assert!(command.execute(&store, Load::Busy).await.is_ok());
    }
    assert!(reserve("res-a", 100)
        .execute(&store, Load::Busy)
        .await
        .is_ok());
    let committed = commit("res-a", "c", 40).execute(&store, Load::Busy).await;
    assert!(committed.is_ok(), "{committed:?}");
    let settled = store.execute(get(), Load::Busy).await.expect("get").result;
    clock.advance(STEP_MS);
    let archive = Command::Maintain(Maintain {
        limit: 16,
        archive_after_ms: 0,
    });
    assert!(archive.execute(&store, Load::Busy).await.is_ok());
    assert_eq!(
        store.execute(get(), Load::Busy).await.unwrap().result,
        settled
    );
    assert_eq!(archived(&store).await, 1);
    store.shutdown().await;
    drop(store);

    let store = open_store(dir.path(), clock.clone(), |_| {});
    assert_eq!(archived(&store).await, 1);
    let state = recover(dir.path(), false).expect("recover").state;
    assert_eq!(state.reservation_count(), 0);
    assert_eq!(state.archived_key_count(), 1);
    assert_eq!(
        store.execute(get(), Load::Busy).await.unwrap().result,
        settled
    );
    let replayed = commit("res-a", "c", 40).execute(&store, Load::Busy).await;
    assert_eq!(
        replayed,
        committed.map(|c| c.replace("replayed: false", "replayed: true"))
    );
    // Another key: the reservation is final.
    let late = commit("res-a", "late", 40)
        .execute(&store, Load::Busy)
        .await;
    assert!(
        matches!(late, Err(Rejection::ReservationFinalized { .. })),
        "{late:?}"
    );

    // Thirty days after it settled, it is gone.
    clock.advance(TERMINAL_RETENTION_MS);
    store.expire_history().await;
    assert_eq!(archived(&store).await, 0);
    let gone = store.execute(get(), Load::Busy).await.unwrap().result;
    assert!(matches!(gone, Err(Rejection::NotFound(_))), "{gone:?}");
}

/// A history store restored from a copy taken after the journal's holds reservations
/// archived by records the journal lacks: at start they go, and only they (the journal's
/// state has them settled and still in memory, to be archived again).
#[tokio::test]
async fn archived_reservations_ahead_of_the_journal_are_trimmed_to_it() {
    let dir = scratch_dir();
    let clock = Arc::new(ManualClock::new(T0));
    let get = |id: &str| GetReservation {
        actor: Actor::ApiKey(DIGEST),
        reservation_id: id.into(),
    };
    let archive_one = || {
        Command::Maintain(Maintain {
            limit: 1,
            archive_after_ms: 0,
        })
    };
    async fn archived(store: &EmbeddedStore) -> u64 {
        let count = store.read_history(|h| Ok(h.archived_count()));
        count.await.expect("history")
    }
    let store = open_store(dir.path(), clock.clone(), |_| {});
    for command in provisioning() {
        assert!(command.execute(&store, Load::Busy).await.is_ok());
    }
    for id in ["res-a", "res-b", "res-c"] {
        assert!(reserve(id, 100).execute(&store, Load::Busy).await.is_ok());
        let key = format!("c-{id}");
        assert!(commit(id, &key, 40)
            .execute(&store, Load::Busy)
            .await
            .is_ok());
    }
    clock.advance(STEP_MS);
    // One archive record each, oldest first; the journal is copied after the first.
    assert!(archive_one().execute(&store, Load::Busy).await.is_ok());
    let journal = copy_dir(dir.path());
    for _ in 0..2 {
        assert!(archive_one().execute(&store, Load::Busy).await.is_ok());
    }
    let settled_b = store
        .execute(get("res-b"), Load::Busy)
        .await
        .unwrap()
        .result;
    assert!(settled_b.is_ok(), "{settled_b:?}");
    assert_eq!(archived(&store).await, 3);
    store.shutdown().await;
    drop(store);

    // The journal and snapshots as they were after the first archive; the history as now.
    for entry in fs::read_dir(dir.path()).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name.starts_with("journal-") || name.starts_with("snapshot-") {
            fs::remove_file(&path).expect("remove");
        }
    }
    for entry in fs::read_dir(journal.path()).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().expect("name").to_owned();
        if !name.to_string_lossy().starts_with("history.") {
            fs::copy(&path, dir.path().join(name)).expect("copy");
        }
    }
    let store = open_store(dir.path(), clock.clone(), |_| {});
    assert_eq!(archived(&store).await, 1, "res-b and res-c were trimmed");
    let state = recover(dir.path(), false).expect("recover").state;
    assert_eq!(
        state.reservation_count(),
        2,
        "res-b and res-c are in memory again"
    );
    for id in ["res-a", "res-b", "res-c"] {
        let answer = store.execute(get(id), Load::Busy).await.unwrap().result;
        assert!(answer.is_ok(), "{id}: {answer:?}");
    }
    assert_eq!(
        store
            .execute(get("res-b"), Load::Busy)
            .await
            .unwrap()
            .result,
        settled_b
    );
    // Archived again, each once.
    for _ in 0..2 {
        assert!(archive_one().execute(&store, Load::Busy).await.is_ok());
    }
    assert_eq!(archived(&store).await, 3);
}

/// A retried reserve finds its archived reservation by when that was created (the state
/// keeps the time beside the key's digest), through the history's index by creation time:
/// the history keeps no index of keys. Two keys that share a digest are told apart, before
/// a restart and after it (their times read from the snapshot).
#[tokio::test]
async fn a_retried_reserve_finds_its_archived_row_by_time_not_by_key() {
    let dir = scratch_dir();
    let clock = Arc::new(ManualClock::new(T0));
    let archive_all = || {
        Command::Maintain(Maintain {
            limit: 100,
            archive_after_ms: 0,
        })
    };
    // Their reserves' keys share a digest (found by search).
    let (a, b) = ("r70032", "r113524");
    assert_eq!(
        ledger::reserve_key_digest(TENANT, &format!("reserve-{a}")),
        ledger::reserve_key_digest(TENANT, &format!("reserve-{b}"))
    );
    let store = open_store(dir.path(), clock.clone(), |_| {});
    for command in provisioning() {
        assert!(command.execute(&store, Load::Busy).await.is_ok());
    }
    let settle = |id: &'static str| {
        let store = &store;
        let clock = clock.clone();
        async move {
            let answer = reserve(id, 100).execute(store, Load::Busy).await;
            assert!(
                answer.as_ref().is_ok_and(|a| a.contains("replayed: false")),
                "{answer:?}"
            );
            assert!(commit(id, id, 40).execute(store, Load::Busy).await.is_ok());
            clock.advance(STEP_MS);
            assert!(archive_all().execute(store, Load::Busy).await.is_ok());
        }
    };
    let replayed = |answer: Answer, id: &str| {
        let answer = answer.expect("a replay");
        assert!(answer.contains("replayed: true"), "{answer}");
        assert!(answer.contains(&format!("\"{id}\"")), "{answer}");
    };
    settle(a).await;
    replayed(reserve(a, 100).execute(&store, Load::Busy).await, a);
    // The other key is fresh, though its digest is held: its own reservation.
    settle(b).await;
    for id in [a, b] {
        replayed(reserve(id, 100).execute(&store, Load::Busy).await, id);
    }
    store.shutdown().await;
    drop(store);

    let store = open_store(dir.path(), clock.clone(), |_| {});
    for id in [a, b] {
        replayed(reserve(id, 100).execute(&store, Load::Busy).await, id);
    }
    store.shutdown().await;
    drop(store);
    let history = rusqlite::Connection::open(dir.path().join(store::history::FILE_NAME))
        .expect("open the history");
    let indexes: Vec<String> = history
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'reservations'",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("indexes");
    assert!(
        indexes.contains(&"reservations_created".to_string()),
        "{indexes:?}"
    );
    assert!(
        !indexes.contains(&"reservations_key".to_string()),
        "{indexes:?}"
    );
}
