//! The embedded engine: one ledger thread owns the state; handlers send it commands over a
//! bounded queue. It applies them in batches, appends their effects to the journal with one
//! write and one `fdatasync` per batch, and only then replies. Snapshots are written in the
//! background and let older journal segments go.

mod files;
pub mod journal;
mod recovery;
pub mod snapshot;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use ledger::{apply, Command, Effect, State};
use tokio::sync::{mpsc, oneshot};

use crate::{BoxFuture, Clock, Health, Metric, Reply, Store, StoreError};
use journal::{JournalRecord, JournalWriter, HEADER_LEN};
pub use recovery::{recover, Recovered};

/// Commands waiting for the ledger thread. Senders wait when it is full (back-pressure).
pub const DEFAULT_QUEUE_CAPACITY: usize = 16_384;
/// Commands applied per journal write.
pub const DEFAULT_MAX_BATCH: usize = 1_024;
/// Journal bytes after which a snapshot is taken and older segments are dropped.
pub const DEFAULT_SNAPSHOT_AFTER_BYTES: u64 = 256 << 20;

/// When a reply may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every write is on disk (`fdatasync`) before its reply. The default.
    Strict,
    /// Nothing is written: state lives in memory and is lost on exit. For tests and for
    /// measuring the floor.
    None,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Strict => "strict",
            Durability::None => "none",
        }
    }
}

pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub queue_capacity: usize,
    pub max_batch: usize,
    pub snapshot_after_bytes: u64,
    pub clock: Arc<dyn Clock>,
}

impl EmbeddedConfig {
    pub fn new(
        data_dir: impl Into<PathBuf>,
        durability: Durability,
        clock: Arc<dyn Clock>,
    ) -> Self {
        EmbeddedConfig {
            data_dir: data_dir.into(),
            durability,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_batch: DEFAULT_MAX_BATCH,
            snapshot_after_bytes: DEFAULT_SNAPSHOT_AFTER_BYTES,
            clock,
        }
    }
}

/// What opening the store found, for the startup log.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub snapshot_seq: Option<u64>,
    pub records_replayed: u64,
    pub truncated_bytes: u64,
    pub last_seq: u64,
    pub reservations: usize,
}

// Nearly every request is `Apply`; boxing the command would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Request {
    Apply {
        command: Command,
        reply: oneshot::Sender<Result<Reply, StoreError>>,
    },
    Shutdown(oneshot::Sender<()>),
}

/// Counters shared between the ledger thread and `/metrics`.
#[derive(Debug, Default)]
struct Counters {
    commands: AtomicU64,
    batches: AtomicU64,
    syncs: AtomicU64,
    journal_bytes: AtomicU64,
    snapshots: AtomicU64,
    reservations: AtomicU64,
    budgets: AtomicU64,
}

/// Set once the journal cannot be written: from then on every command is refused.
type Failure = Arc<Mutex<Option<String>>>;

pub struct EmbeddedStore {
    tx: mpsc::Sender<Request>,
    counters: Arc<Counters>,
    failure: Failure,
    durability: Durability,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Held for the store's lifetime so that two processes never share a data directory.
    _lock: Option<File>,
}

impl EmbeddedStore {
    pub fn open(config: EmbeddedConfig) -> io::Result<(Self, OpenReport)> {
        let (state, journal, lock, report) = match config.durability {
            Durability::None => (State::new(), None, None, OpenReport::default()),
            Durability::Strict => {
                let (state, journal, lock, report) = open_durable(&config.data_dir)?;
                (state, Some(journal), Some(lock), report)
            }
        };
        let failure: Failure = Arc::default();
        let counters: Arc<Counters> = Arc::default();
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let ledger = LedgerThread {
            state,
            journal,
            next_seq: report.last_seq + 1,
            last_now: i64::MIN,
            clock: config.clock,
            failure: failure.clone(),
            counters: counters.clone(),
            dir: config.data_dir,
            max_batch: config.max_batch.max(1),
            snapshot_after_bytes: config.snapshot_after_bytes,
            snapshot: None,
        };
        let thread = thread::Builder::new()
            .name("cycles-ledger".into())
            .spawn(move || ledger.run(rx))?;
        Ok((
            EmbeddedStore {
                tx,
                counters,
                failure,
                durability: config.durability,
                thread: Mutex::new(Some(thread)),
                _lock: lock,
            },
            report,
        ))
    }
}

fn open_durable(dir: &Path) -> io::Result<(State, JournalWriter, File, OpenReport)> {
    fs::create_dir_all(dir)?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    lock.try_lock().map_err(|_| {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "data directory {} is in use by another process",
                dir.display()
            ),
        )
    })?;
    let recovered = recover(dir, true)?;
    let next_seq = recovered.last_seq + 1;
    let journal = match &recovered.tail_segment {
        Some((path, len)) if *len >= HEADER_LEN => JournalWriter::reopen(dir, path, *len)?,
        Some((path, _)) => {
            fs::remove_file(path)?;
            JournalWriter::create(dir, next_seq)?
        }
        None => JournalWriter::create(dir, next_seq)?,
    };
    let report = OpenReport {
        snapshot_seq: recovered.snapshot_seq,
        records_replayed: recovered.records_replayed,
        truncated_bytes: recovered.truncated_bytes,
        last_seq: recovered.last_seq,
        reservations: recovered.state.reservation_count(),
    };
    Ok((recovered.state, journal, lock, report))
}

impl Store for EmbeddedStore {
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, StoreError>> {
        Box::pin(async move {
            let (reply, rx) = oneshot::channel();
            self.tx
                .send(Request::Apply { command, reply })
                .await
                .map_err(|_| StoreError::ShuttingDown)?;
            rx.await.map_err(|_| StoreError::ShuttingDown)?
        })
    }

    fn health(&self) -> Health {
        match self.failure.lock().ok().and_then(|f| f.clone()) {
            Some(why) => Health {
                ready: false,
                detail: format!("journal unavailable: {why}"),
            },
            None if self.tx.is_closed() => Health {
                ready: false,
                detail: "shutting down".into(),
            },
            None => Health {
                ready: true,
                detail: format!("embedded ({})", self.durability.as_str()),
            },
        }
    }

    fn metrics(&self) -> Vec<Metric> {
        let c = &self.counters;
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let queued = (self.tx.max_capacity() - self.tx.capacity()) as u64;
        vec![
            metric(
                "cycles_store_commands_total",
                "Commands applied by the ledger thread.",
                true,
                get(&c.commands),
            ),
            metric(
                "cycles_store_batches_total",
                "Batches applied (one journal write each).",
                true,
                get(&c.batches),
            ),
            metric(
                "cycles_journal_syncs_total",
                "fdatasync calls on the journal.",
                true,
                get(&c.syncs),
            ),
            metric(
                "cycles_journal_bytes_total",
                "Bytes appended to the journal.",
                true,
                get(&c.journal_bytes),
            ),
            metric(
                "cycles_snapshots_total",
                "Snapshots started.",
                true,
                get(&c.snapshots),
            ),
            metric(
                "cycles_store_queue_depth",
                "Commands waiting for the ledger thread.",
                false,
                queued,
            ),
            metric(
                "cycles_reservations",
                "Reservations held in the state (all statuses).",
                false,
                get(&c.reservations),
            ),
            metric("cycles_budgets", "Budget ledgers.", false, get(&c.budgets)),
        ]
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            if self.tx.send(Request::Shutdown(done)).await.is_ok() {
                let _ = rx.await;
            }
            let handle = self.thread.lock().ok().and_then(|mut t| t.take());
            if let Some(handle) = handle {
                let _ = tokio::task::spawn_blocking(move || handle.join()).await;
            }
        })
    }
}

fn metric(name: &'static str, help: &'static str, counter: bool, value: u64) -> Metric {
    Metric {
        name,
        help,
        counter,
        value,
    }
}

struct LedgerThread {
    state: State,
    journal: Option<JournalWriter>,
    next_seq: u64,
    last_now: i64,
    clock: Arc<dyn Clock>,
    failure: Failure,
    counters: Arc<Counters>,
    dir: PathBuf,
    max_batch: usize,
    snapshot_after_bytes: u64,
    snapshot: Option<JoinHandle<io::Result<()>>>,
}

type Pending = (oneshot::Sender<Result<Reply, StoreError>>, Reply);

impl LedgerThread {
    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut pending: Vec<Pending> = Vec::with_capacity(self.max_batch);
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.counters
                .commands
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            let mut shutdown = None;
            for request in batch.drain(..) {
                match request {
                    Request::Apply { command, reply } => {
                        self.apply_one(command, reply, &mut pending)
                    }
                    Request::Shutdown(done) => shutdown = Some(done),
                }
            }
            self.flush_and_reply(&mut pending);
            self.counters
                .reservations
                .store(self.state.reservation_count() as u64, Ordering::Relaxed);
            self.counters
                .budgets
                .store(self.state.budget_count() as u64, Ordering::Relaxed);
            if let Some(done) = shutdown {
                self.drain_on_shutdown(&mut rx, &mut pending);
                let _ = done.send(());
                return;
            }
            self.maybe_snapshot();
        }
    }

    /// A monotonic "now": the wall clock may step back, the ledger's time never does.
    fn tick(&mut self) -> i64 {
        self.last_now = self.last_now.max(self.clock.now_ms());
        self.last_now
    }

    fn failed(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    fn fail(&self, why: String) {
        tracing::error!(%why, "journal write failed: refusing all commands until restart");
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(why);
        }
    }

    fn apply_one(
        &mut self,
        command: Command,
        reply: oneshot::Sender<Result<Reply, StoreError>>,
        pending: &mut Vec<Pending>,
    ) {
        if let Some(why) = self.failed() {
            let _ = reply.send(Err(StoreError::Unavailable(why)));
            return;
        }
        let now = self.tick();
        let applied = apply(&mut self.state, command, now);
        if !applied.effects.is_empty() {
            if let Err(e) = self.record(now, applied.effects) {
                self.fail(e.to_string());
            }
        }
        pending.push((
            reply,
            Reply {
                result: applied.result,
                tenant: applied.tenant,
            },
        ));
    }

    fn record(&mut self, at_ms: i64, effects: Vec<Effect>) -> io::Result<()> {
        let Some(journal) = &mut self.journal else {
            return Ok(());
        };
        journal.append(&JournalRecord {
            seq: self.next_seq,
            at_ms,
            effects,
        })?;
        self.next_seq += 1;
        Ok(())
    }

    /// Makes the batch durable, then answers it. If the write fails nobody gets a success:
    /// the in-memory state is ahead of the disk, so the store stops serving.
    fn flush_and_reply(&mut self, pending: &mut Vec<Pending>) {
        if let Some(journal) = &mut self.journal {
            match journal.commit(true) {
                Ok(0) => {}
                Ok(bytes) => {
                    self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .journal_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => self.fail(e.to_string()),
            }
        }
        let failure = self.failed();
        for (reply, result) in pending.drain(..) {
            let _ = reply.send(match &failure {
                Some(why) => Err(StoreError::Unavailable(why.clone())),
                None => Ok(result),
            });
        }
    }

    /// Finishes what was already queued, then writes a final snapshot so the next start
    /// replays nothing.
    fn drain_on_shutdown(&mut self, rx: &mut mpsc::Receiver<Request>, pending: &mut Vec<Pending>) {
        rx.close();
        while let Ok(request) = rx.try_recv() {
            match request {
                Request::Apply { command, reply } => self.apply_one(command, reply, pending),
                Request::Shutdown(done) => {
                    let _ = done.send(());
                }
            }
        }
        self.flush_and_reply(pending);
        if let Some(handle) = self.snapshot.take() {
            let _ = handle.join();
        }
        let has_records = self
            .journal
            .as_ref()
            .is_some_and(|j| j.segment_len() > HEADER_LEN);
        if has_records && self.failed().is_none() {
            let seq = self.next_seq - 1;
            let source = self.state.snapshot_source();
            if let Err(e) = snapshot::write_snapshot(&self.dir, seq, &source)
                .and_then(|_| snapshot::prune(&self.dir, seq))
            {
                tracing::warn!(error = %e, "final snapshot failed; the journal still has everything");
            }
        }
    }

    /// Starts a background snapshot once the current journal segment is large enough.
    fn maybe_snapshot(&mut self) {
        if self.snapshot.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        if let Some(handle) = self.snapshot.take() {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "snapshot failed; will retry"),
                Err(_) => tracing::warn!("snapshot thread panicked; will retry"),
            }
        }
        if self.failed().is_some() {
            return;
        }
        let Some(journal) = &mut self.journal else {
            return;
        };
        if journal.segment_len() < self.snapshot_after_bytes {
            return;
        }
        let started = Instant::now();
        // O(1): the persistent maps are shared; the snapshot thread streams them to disk.
        let source = self.state.snapshot_source();
        let seq = self.next_seq - 1;
        if let Err(e) = journal.rotate(self.next_seq) {
            self.fail(format!("journal rotation: {e}"));
            return;
        }
        self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            seq,
            stall_ms = started.elapsed().as_millis() as u64,
            "snapshot started"
        );
        let dir = self.dir.clone();
        self.snapshot = thread::Builder::new()
            .name("cycles-snapshot".into())
            .spawn(move || {
                snapshot::write_snapshot(&dir, seq, &source)?;
                snapshot::prune(&dir, seq)
            })
            .ok();
    }
}

/// Recovers a data directory read-only and checks the ledger's rules on the result.
pub fn verify(dir: &Path) -> io::Result<(Recovered, Vec<ledger::Violation>)> {
    let recovered = recover(dir, false)?;
    let violations = recovered.state.verify();
    Ok((recovered, violations))
}
