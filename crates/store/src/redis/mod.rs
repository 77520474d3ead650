//! The Redis engine: many `cycles` processes serve one ledger kept in Redis (one server or a
//! Redis Cluster), each exactly as correct as the embedded engine, because each runs the
//! same pure `ledger::apply` on the same records.
//!
//! Redis holds the ledger's journal: a log of rounds of journal records (the effects each
//! operation made, as the embedded engine journals them). An instance keeps the state in
//! memory, as the embedded engine does, built by replaying that log. One instance at a time
//! holds the writer's *lease*: it applies operations to its state, appends their records to
//! the log in one script per round (fenced: only while it holds the lease and the log ends
//! where the round starts), and replies once Redis has acknowledged the append. An instance
//! that takes the lease first reads the rounds others appended since it last read the log,
//! so every operation is decided on the whole ledger, in one total order, whatever instance
//! it reached. Writers hand the lease over when another instance asks for it (see
//! [`writer`]).
//!
//! Redis never evaluates a rule: its scripts compare versions and append bytes, so the
//! budgets' int64 arithmetic, the idempotency records and the events are the ledger's, the
//! same bytes the embedded engine journals.
//!
//! Each instance keeps the history (audit entries, events, deliveries, archived
//! reservations) the log carries in a local history store, a cache it rebuilds from Redis
//! at start.
//!
//! The log does not grow for ever: once it holds enough records past the last snapshot, a
//! compaction replaces them by a snapshot of the state and moves the history they carried
//! to streams of their own, trimmed by retention (see [`compaction`]).

mod compaction;
mod jobs;
mod log;
#[cfg(any(test, feature = "testing"))]
mod scratch;
mod writer;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use ledger::Operation;
use tokio::sync::oneshot;

use crate::history::{History, Projector, Retention};
use crate::{Clock, Health, Load, Metric, Reply, RequestContext, Store, StoreError};

use jobs::{Barrier, Job, OperationJob};
pub use log::{Settings, Topology};
#[cfg(any(test, feature = "testing"))]
pub use scratch::ScratchLedger;
use writer::{Shared, Writer, WriterSeat};

/// Operations queued for the writer, at most; more wait for room.
const QUEUE_DEPTH: usize = 4096;

/// What the engine demands of Redis's persistence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisDurability {
    /// Redis must have its append-only file on (`appendonly yes`): an acknowledged
    /// operation survives a Redis restart as far as its `appendfsync` allows (`always`: every
    /// one; `everysec`: all but the last second). The default.
    Aof,
    /// No persistence demanded: a Redis restart loses the ledger (the engine then refuses
    /// to serve). For tests and for measuring the floor, as the embedded `none` mode.
    None,
}

impl RedisDurability {
    pub fn as_str(self) -> &'static str {
        match self {
            RedisDurability::Aof => "aof",
            RedisDurability::None => "none",
        }
    }
}

pub struct RedisConfig {
    /// `redis://host:port[/db]`; for a Cluster, its nodes' URLs, and with Sentinels,
    /// theirs, comma-separated.
    pub url: String,
    pub topology: Topology,
    /// Names the ledger: its keys are `{namespace}:…`, one hash slot.
    pub namespace: String,
    pub durability: RedisDurability,
    /// How long one command may take before Redis counts as down.
    pub timeout: Duration,
    /// How long the writer's lease lasts without a write.
    pub lease: Duration,
    /// Replicas each round must reach (`WAIT`, once per round) before its replies are sent:
    /// a round they do not all acknowledge within `timeout` is answered "outcome unknown"
    /// (it is on the primary, and may be lost if it fails over). 0: none waited for. Not
    /// on a Cluster (`WAIT` names no key, so it cannot be sent to the ledger's master).
    pub replicas: u32,
    /// Where this instance keeps its history cache (rebuilt from the log at start).
    pub history_dir: PathBuf,
    pub clock: Arc<dyn Clock>,
    /// The ledger's time is Redis's clock (read at start and at each lease, and run
    /// forward by `clock` between), so that every instance decides with the same time
    /// whatever its own clock says. Off: `clock` alone (tests that set the time).
    pub clock_from_redis: bool,
    pub retention: Retention,
    /// Records the log holds past its snapshot before a compaction replaces them (and how
    /// many an instance replays to start, at most, beyond those appended meanwhile).
    pub snapshot_records: u64,
    /// The base URL this instance's peers reach its HTTP server at. With it, the instance
    /// names it in its lease, and hands its writes to a peer that holds the lease instead
    /// of waiting for it (see [`writer`]'s forwarding); without it, it waits its turn.
    pub advertise: Option<String>,
}

/// The defaults of [`RedisConfig`]'s timings.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
pub const DEFAULT_LEASE: Duration = Duration::from_millis(2000);
/// The default of [`RedisConfig::snapshot_records`]: about 1 s of replay to start.
pub const DEFAULT_SNAPSHOT_RECORDS: u64 = 100_000;

impl RedisConfig {
    pub fn new(
        url: impl Into<String>,
        history_dir: impl Into<PathBuf>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        RedisConfig {
            url: url.into(),
            topology: Topology::Single,
            namespace: "cycles".into(),
            durability: RedisDurability::Aof,
            timeout: DEFAULT_TIMEOUT,
            lease: DEFAULT_LEASE,
            replicas: 0,
            history_dir: history_dir.into(),
            clock,
            clock_from_redis: true,
            retention: Retention::default(),
            snapshot_records: DEFAULT_SNAPSHOT_RECORDS,
            advertise: None,
        }
    }
}

/// What opening the engine found, for the startup log.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// The ledger's marker: its id and when it was created.
    pub ledger: String,
    /// Whether this start created the ledger.
    pub created: bool,
    /// The records read from the log.
    pub records: u64,
    pub settings: Option<Settings>,
}

pub struct RedisStore {
    /// Whether writes are handed to a peer holding the lease ([`RedisConfig::advertise`]).
    forwards: bool,
    jobs: SyncSender<Box<dyn Job>>,
    shared: Arc<Shared>,
    seat: Arc<WriterSeat>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The history directory's lock, held while the store is open: two instances on one
    /// machine never share (and delete) one history cache.
    _lock: std::fs::File,
}

impl RedisStore {
    /// Connects, checks Redis's settings, and reads the ledger's log. Refuses a Redis that
    /// would lose budgets silently (an eviction policy, no persistence without
    /// [`RedisDurability::None`]) and a ledger whose keys were lost.
    pub fn open(config: RedisConfig) -> io::Result<(Self, OpenReport)> {
        if config.topology == Topology::Cluster && config.replicas > 0 {
            return Err(io::Error::other(
                "waiting for replicas is not supported on a Redis Cluster (WAIT cannot be \
                 routed to the ledger's master)",
            ));
        }
        log::check_url(&config.url, &config.topology)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        crate::embedded::create_private_dir(&config.history_dir)?;
        let lock = crate::embedded::lock_dir(&config.history_dir)?;
        let privacy = crate::embedded::make_private(&config.history_dir);
        crate::embedded::report_privacy(&config.history_dir, &privacy);
        // A cache of the log: what an earlier run left may be another ledger's.
        for suffix in ["", "-wal", "-shm"] {
            let path = config
                .history_dir
                .join(format!("{}{suffix}", crate::history::FILE_NAME));
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        let projector = Projector::open_embedded(
            Some(&config.history_dir),
            config.retention,
            config.clock.clone(),
        )?;
        let shared = Arc::new(Shared::new(projector, config.clock.clone()));
        let forwards = config.advertise.is_some();
        let (writer, report) = Writer::open(config, shared.clone())?;
        let seat = Arc::new(WriterSeat::new(writer));
        let (jobs, queue) = mpsc::sync_channel(QUEUE_DEPTH);
        let thread = thread::Builder::new().name("cycles-redis".into()).spawn({
            let seat = seat.clone();
            move || seat.serve(queue)
        })?;
        let store = RedisStore {
            forwards,
            jobs,
            shared,
            seat,
            thread: Mutex::new(Some(thread)),
            _lock: lock,
        };
        Ok((store, report))
    }

    /// Runs an operation (on the writer thread, or on the caller's if it is alone) and
    /// waits for its reply, which comes once its records (and everything it saw) are in
    /// Redis.
    async fn run<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
    ) -> Result<Reply<O::Output>, StoreError> {
        // A request meant to write finds a holder read a moment ago before its handler runs
        // (the server asks [`RedisStore::holder_address`]); here, it waits for a round.
        let forwardable = crate::forwarding::allowed();
        let (answer, rx) = oneshot::channel();
        let RequestContext { origin, audit } = context;
        let job = OperationJob {
            operation,
            forwardable,
            // Taken here: the request's origin is where the request runs, not on the writer.
            origin: origin(),
            audit,
            answer,
        };
        self.submit(Box::new(job), load == Load::Alone)?;
        match rx.await {
            Ok(reply) => reply,
            // Dropped unrun: the engine could not take writes.
            Err(_) => Err(self.shared.unavailable()),
        }
    }

    /// Hands `job` to the writer; with `here`, the caller runs it itself if the writer is
    /// free and need not wait (see [`WriterSeat`]).
    fn submit(&self, job: Box<dyn Job>, here: bool) -> Result<(), StoreError> {
        if self.shared.closed() {
            return Err(StoreError::ShuttingDown);
        }
        let job = if here {
            self.seat.run_alone(job)
        } else {
            Some(job)
        };
        match job {
            Some(job) => self.seat.enqueue(&self.jobs, job),
            None => Ok(()),
        }
    }

    /// The ledger's secret among its instances (they present it when they hand each other
    /// a request), once read from Redis.
    pub fn peer_secret(&self) -> Option<Arc<str>> {
        self.shared.peer_secret.get().cloned()
    }

    /// Whether writes may be answered [`StoreError::Forward`].
    pub fn forwards(&self) -> bool {
        self.forwards
    }

    /// The peer holding the lease, if a round read it a moment ago: the server sends a
    /// request meant to write there at once, untried, without running its handler or
    /// waking the writer.
    pub fn holder_address(&self) -> Option<Arc<str>> {
        self.shared.holder_address()
    }

    /// Waits until this instance has read the log to its end (as of now) and handed its
    /// history over, so that a read of the history sees every change acknowledged before.
    async fn caught_up(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        // Under the lease a barrier's round reads nothing from Redis (the log ends where
        // this instance's state does), so it may run on the caller's thread under any
        // load, if the writer is free.
        self.submit(Box::new(Barrier(tx)), true)?;
        rx.await.unwrap_or_else(|_| Err(self.shared.unavailable()))
    }
}

impl Store for RedisStore {
    async fn execute<O: Operation>(
        &self,
        operation: O,
        load: Load,
    ) -> Result<Reply<O::Output>, StoreError> {
        self.run(operation, load, RequestContext::default()).await
    }

    async fn execute_in<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
    ) -> Result<Reply<O::Output>, StoreError> {
        self.run(operation, load, context).await
    }

    async fn read_history<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn History) -> io::Result<T> + Send + 'static,
    {
        self.caught_up().await?;
        self.shared.projector.read_caught_up(read).await
    }

    async fn expire_history(&self) {
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.projector.expire_now()).await;
    }

    fn health(&self) -> Health {
        self.shared.health()
    }

    fn metrics(&self) -> Vec<Metric> {
        self.shared.metrics()
    }

    async fn shutdown(&self) {
        self.shared.close();
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(thread) = thread {
                let _ = thread.join();
            }
            shared.projector.shutdown();
        })
        .await;
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.shared.close();
        if let Some(thread) = self.thread.get_mut().ok().and_then(Option::take) {
            let _ = thread.join();
        }
        self.shared.projector.shutdown();
    }
}

/// What [`verify`] read and found.
pub struct Verified {
    /// The last record of the snapshot the log starts after, if it was compacted.
    pub snapshot: Option<u64>,
    /// The log's records read after it.
    pub records: u64,
    pub state: ledger::State,
    /// The ledger's rules the state breaks.
    pub violations: Vec<ledger::Violation>,
}

/// Reads a ledger from Redis (its snapshot and the log after it), read-only (no lease is
/// taken, nothing is written), and checks the ledger's rules on the state it makes.
pub fn verify(url: &str, topology: &Topology, namespace: &str) -> io::Result<Verified> {
    let fail = |e: log::LogError| io::Error::other(e.to_string());
    let mut conn =
        log::Conn::open(url, topology, Duration::from_secs(10)).map_err(|e| fail(e.into()))?;
    let log = log::Log::new(namespace, String::new());
    match log.init(&mut conn, "", false) {
        Ok(_) => {}
        Err(log::LogError::Refused(log::Refused::Wiped)) => {
            return Err(io::Error::other(format!(
                "no ledger named '{namespace}' in this Redis (or its marker is gone)"
            )))
        }
        Err(e) => return Err(fail(e)),
    }
    // A compaction between reading the snapshot and the log after it: read again.
    for _ in 0..4 {
        let (mut state, snapshot) = match compaction::load_snapshot(&mut conn, &log.keys) {
            Ok(Some((pointer, state))) => (state, Some(pointer.version)),
            Ok(None) => (ledger::State::new(), None),
            Err(e) => return Err(fail(e)),
        };
        let mut records = 0;
        let read = log.read_after(&mut conn, snapshot.unwrap_or(0), |record| {
            records += 1;
            for effect in &record.effects {
                state.apply_effect(effect);
            }
        });
        match read {
            Err(log::LogError::Compacted(_)) => continue,
            Err(e) => return Err(fail(e)),
            Ok(_) => {
                return Ok(Verified {
                    snapshot,
                    records,
                    violations: state.verify(),
                    state,
                })
            }
        }
    }
    Err(io::Error::other(
        "the ledger was compacted every time it was read",
    ))
}

/// Counters shared with `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub commands: AtomicU64,
    pub rounds: AtomicU64,
    /// Rounds a request alone in the server ran on its own thread.
    pub rounds_alone: AtomicU64,
    /// Time spent in appends (the script's round trip), for its mean per round.
    pub append_micros: AtomicU64,
    pub log_bytes: AtomicU64,
    pub records_read: AtomicU64,
    pub leases: AtomicU64,
    pub lease_waits: AtomicU64,
    pub lease_wakes: AtomicU64,
    /// Time spent waiting for another instance to give the lease up.
    pub lease_wait_micros: AtomicU64,
    pub handoffs: AtomicU64,
    pub faults: AtomicU64,
    pub failed_reads: AtomicU64,
    pub reloads: AtomicU64,
    pub unreplicated: AtomicU64,
    /// Operations answered with the lease holder's address, to be sent there.
    pub forwarded: AtomicU64,
    /// Jobs answered without the lease (they changed nothing).
    pub reads: AtomicU64,
    pub snapshots: AtomicU64,
    pub snapshot_failures: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
