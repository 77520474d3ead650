//! The embedded engine: the state lives in memory behind one ledger lock; each command is
//! applied on the thread of the request that brought it, its effects appended to the
//! journal buffer, and a group commit (one write + one `fdatasync` for everything pending)
//! makes them durable before the reply (see [`commit`]). Snapshots are written in the
//! background and let older journal segments go.

mod commit;
mod faults;
pub use faults::{DiskFault, DiskFaults};
mod files;
pub use files::{create_private_dir, lock_dir, make_private, private_file, report_privacy};
pub mod journal;
mod recovery;
pub mod snapshot;
mod waiters;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};

use ledger::{ArchiveLookup, Found, Operation, State};

use crate::history::History;
use crate::history::{Projector, Retention};
use crate::{Clock, Health, Load, Metric, Reply, RequestContext, Store, StoreError};
use commit::{Counters, Ledger, Shared, Step, Syncer, Wait};
use journal::{JournalWriter, HEADER_LEN};
pub use recovery::{recover, recover_with_history, Recovered};
use waiters::Waiters;

/// Journal bytes after which a snapshot is taken and older segments are dropped (at least;
/// see [`EmbeddedConfig::snapshot_after_bytes`]).
pub const DEFAULT_SNAPSHOT_AFTER_BYTES: u64 = 256 << 20;

/// Journal records after which a snapshot is taken (at least; see
/// [`EmbeddedConfig::snapshot_after_records`]).
pub const DEFAULT_SNAPSHOT_AFTER_RECORDS: u64 = 50_000;

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
    /// A snapshot is taken once the journal since the last one holds this many bytes and at
    /// least as many as that snapshot: a large state is not rewritten for every few hundred
    /// MiB of journal (the snapshots never write more than the journal did), and a restart
    /// replays at most about one snapshot's worth of journal.
    pub snapshot_after_bytes: u64,
    /// A snapshot is also taken once the journal since the last one holds this many records
    /// (and at least that snapshot's bytes): what a restart after a crash replays is
    /// records, each applied in turn, so this bounds its time where a byte count cannot
    /// (records of a few hundred bytes fill 256 MiB with hundreds of thousands).
    pub snapshot_after_records: u64,
    pub clock: Arc<dyn Clock>,
    /// How long audit entries are kept in the history store.
    pub retention: Retention,
    /// Faults injected into the journal's file operations (tests arm them; none by default).
    pub faults: Arc<DiskFaults>,
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
            snapshot_after_bytes: DEFAULT_SNAPSHOT_AFTER_BYTES,
            snapshot_after_records: DEFAULT_SNAPSHOT_AFTER_RECORDS,
            clock,
            retention: Retention::default(),
            faults: Arc::default(),
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
    /// History (audit entries, events, deliveries, archived reservations) a crash left on
    /// its way, taken from the journal and handed to the history writer at start.
    pub history_reprojected: usize,
    /// History rows deleted at start because the history store was ahead of the journal.
    pub history_trimmed: u64,
}

pub struct EmbeddedStore {
    shared: Arc<Shared>,
    durability: Durability,
    /// The group-commit thread (strict mode).
    syncer: Mutex<Option<JoinHandle<()>>>,
    /// Held for the store's lifetime so that two processes never share a data directory.
    _lock: Option<File>,
}

impl EmbeddedStore {
    pub fn open(config: EmbeddedConfig) -> io::Result<(Self, OpenReport)> {
        let (state, syncer, lock, report, projector) = match config.durability {
            Durability::None => {
                let projector =
                    Projector::open_embedded(None, config.retention, config.clock.clone())?;
                (State::new(), None, None, OpenReport::default(), projector)
            }
            Durability::Strict => {
                let (state, journal, lock, report, projector) = open_durable(&config)?;
                let last_snapshot_len = snapshot::newest_len(&config.data_dir)?;
                let syncer = Syncer {
                    journal,
                    spare: Vec::new(),
                    dir: config.data_dir,
                    snapshot_after_bytes: config.snapshot_after_bytes,
                    snapshot_after_records: config.snapshot_after_records,
                    last_snapshot_len,
                    snapshot: None,
                };
                (state, Some(syncer), Some(lock), report, projector)
            }
        };
        let shared = Shared {
            ledger: Mutex::new(Ledger {
                state,
                last_now: i64::MIN,
                next_seq: report.last_seq + 1,
                pending: Vec::new(),
                history: Vec::new(),
                journaled: syncer.is_some(),
                closed: false,
                final_snapshot: false,
                fault: None,
            }),
            journal: syncer.map(Mutex::new),
            work: Condvar::new(),
            durable_seq: AtomicU64::new(report.last_seq),
            waiters: Waiters::default(),
            epoch: AtomicU64::new(0),
            durable_at_fault: AtomicU64::new(0),
            counters: Counters::default(),
            clock: config.clock,
            projector,
        };
        let shared = Arc::new(shared);
        let thread = match shared.journal {
            Some(_) => {
                let shared = shared.clone();
                Some(
                    thread::Builder::new()
                        .name("cycles-syncer".into())
                        .spawn(move || shared.run_syncer())?,
                )
            }
            None => None,
        };
        let store = EmbeddedStore {
            shared,
            durability: config.durability,
            syncer: Mutex::new(thread),
            _lock: lock,
        };
        Ok((store, report))
    }
}

impl EmbeddedStore {
    /// Applies an operation (with its audit entry, if any) and waits until what its reply
    /// depends on is durable.
    async fn run<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
    ) -> Result<Reply<O::Output>, StoreError> {
        let (reply, wait) = match self.apply(operation, load, context, None)? {
            Step::Done(reply, wait) => (reply, wait),
            Step::Lookup {
                operation,
                context,
                lookup,
                seen,
            } => {
                let found = self.read_archived(lookup, seen).await?;
                match self.apply(operation, load, context, Some(found))? {
                    Step::Done(reply, wait) => (reply, wait),
                    Step::Lookup { .. } => unreachable!("an operation given what it names"),
                }
            }
        };
        if let Some(wait) = wait {
            self.shared.wait_durable(wait).await?;
        }
        Ok(reply)
    }

    /// Applies an operation; a request that is alone and finds the journal free then runs
    /// the round itself (see `commit`), so its wait below is already over.
    fn apply<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
        found: Option<Found>,
    ) -> Result<Step<O>, StoreError> {
        let journal = match (load, &self.shared.journal) {
            (Load::Alone, Some(journal)) => journal.try_lock().ok(),
            _ => None,
        };
        let step = self
            .shared
            .apply(operation, journal.is_none(), context, found)?;
        if let (Some(mut journal), Step::Done(_, Some(_))) = (journal, &step) {
            self.shared.sync_alone(&mut journal)?;
        }
        Ok(step)
    }

    /// Reads what `lookup` names from the history store. The archive that took it out of
    /// the state is at or before `seen`, the last record its operation saw applied; unless
    /// the history store already holds that far, the read waits until `seen` is durable
    /// (its history is then handed over) and what was handed over is written.
    ///
    /// A read of what is already written is an indexed point read on a connection of its
    /// own (tens of microseconds): done in place, like taking the ledger lock, rather than
    /// paying two thread hand-offs. One that must wait runs on the blocking pool.
    async fn read_archived(
        &self,
        lookup: ArchiveLookup,
        seen: Option<Wait>,
    ) -> Result<Found, StoreError> {
        let history = self.shared.projector.history().clone();
        let progress = self.shared.projector.progress().clone();
        let behind = match seen {
            Some(wait) => wait.seq > history.held_seq().unwrap_or(0),
            None => progress.pending(),
        };
        let found = if behind {
            if let Some(wait) = seen {
                self.shared.wait_durable(wait).await?;
            }
            let read = move || {
                progress.wait_caught_up(crate::history::CATCH_UP);
                history.archived(&lookup)
            };
            tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| StoreError::Unavailable(format!("history read: {e}")))?
        } else {
            history.archived(&lookup)
        };
        found
            .map(|found| found.map(Arc::new))
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }
}

/// Recovers the data directory: the state from its snapshot and journal, and the history
/// store's writer handed what the journal holds beyond it (what a crash left on its way).
fn open_durable(
    config: &EmbeddedConfig,
) -> io::Result<(State, JournalWriter, File, OpenReport, Projector)> {
    let dir = &config.data_dir;
    create_private_dir(dir)?;
    let lock = lock_dir(dir)?;
    report_privacy(dir, &make_private(dir));
    let projector = Projector::open_embedded(Some(dir), config.retention, config.clock.clone())?;
    let held = projector.history().held_seq()?;
    let mut backlog = Vec::new();
    let recovered = recover_with_history(dir, true, held, |seq, entry| {
        backlog.push((seq, entry));
    })?;
    let history_reprojected = backlog.len();
    projector
        .history()
        .index_keys(recovered.state.archived_keys_need_key_index())?;
    if !backlog.is_empty() {
        // Written by the history writer while the store serves, not before: a crash under
        // load can leave a journal's worth of rows on their way, and a read that needs them
        // waits for them as it waits for any acknowledged change's (the journal keeps their
        // records until they are written).
        projector.project(recovered.last_seq, backlog);
    }
    // Ahead of the journal: entries without their changes, which a restart must not keep.
    let history_trimmed = if held > recovered.last_seq {
        let trimmed = projector.history().trim_after(recovered.last_seq)?;
        tracing::warn!(
            history_seq = held,
            journal_seq = recovered.last_seq,
            trimmed,
            "the history store was ahead of the journal (restored from a later copy?): \
             entries of records the journal does not hold were deleted"
        );
        trimmed
    } else {
        0
    };
    let next_seq = recovered.last_seq + 1;
    let journal = match &recovered.tail_segment {
        Some((first, _, len)) if *len >= HEADER_LEN => {
            JournalWriter::reopen(dir, *first, *len, config.faults.clone())?
        }
        Some((_, path, _)) => {
            fs::remove_file(path)?;
            JournalWriter::create(dir, next_seq, config.faults.clone())?
        }
        None => JournalWriter::create(dir, next_seq, config.faults.clone())?,
    };
    let report = OpenReport {
        snapshot_seq: recovered.snapshot_seq,
        records_replayed: recovered.records_replayed,
        truncated_bytes: recovered.truncated_bytes,
        last_seq: recovered.last_seq,
        reservations: recovered.state.reservation_count(),
        history_reprojected,
        history_trimmed,
    };
    Ok((recovered.state, journal, lock, report, projector))
}

impl Store for EmbeddedStore {
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
        self.shared.projector.read_caught_up(read).await
    }

    async fn expire_history(&self) {
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.projector.expire_now()).await;
    }

    fn health(&self) -> Health {
        let (closed, fault) = self
            .shared
            .ledger
            .lock()
            .map_or((true, None), |l| (l.closed, l.fault.clone()));
        match fault {
            Some(fault) => Health {
                ready: false,
                detail: format!(
                    "journal unavailable ({}), {}: {}",
                    if fault.readable {
                        "serving reads"
                    } else {
                        "serving nothing"
                    },
                    "refusing writes until it can be written again",
                    fault.why
                ),
            },
            None if closed => Health {
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
        // Sizes are read from the state when asked, not counted on every command.
        let (reservations, archived_keys, budgets, due, faulted) =
            self.shared.ledger.lock().map_or((0, 0, 0, 0, true), |l| {
                let s = &l.state;
                let faulted = l.fault.is_some();
                (
                    s.reservation_count(),
                    s.archived_key_count(),
                    s.budget_count(),
                    s.deliveries_due(),
                    faulted,
                )
            });
        let c = &self.shared.counters;
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        vec![
            metric(
                "cycles_store_commands_total",
                "Commands applied to the ledger.",
                true,
                get(&c.commands),
            ),
            metric(
                "cycles_store_batches_total",
                "Group commits: journal writes, each covering one or more commands.",
                true,
                get(&c.batches),
            ),
            metric(
                "cycles_store_batches_alone_total",
                "Group commits run by a request alone in the server, on its own thread.",
                true,
                get(&c.batches_alone),
            ),
            metric(
                "cycles_journal_syncs_total",
                "fdatasync calls on the journal (one per group commit).",
                true,
                get(&c.batches),
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
                "cycles_journal_faults_total",
                "Times the journal could not be written (writes refused until it could again).",
                true,
                get(&c.faults),
            ),
            metric(
                "cycles_journal_faulted",
                "1 while the journal cannot be written and writes are refused.",
                false,
                u64::from(faulted),
            ),
            metric(
                "cycles_store_waiting_for_sync",
                "Requests applied and waiting for their journal records to be durable.",
                false,
                self.shared.waiters.len() as u64,
            ),
            metric(
                "cycles_reservations",
                "Reservations in memory: the ACTIVE ones and those settled too recently to be \
                 archived yet.",
                false,
                reservations as u64,
            ),
            metric(
                "cycles_reservations_archived",
                "Settled reservations archived in the history store (on disk, not in memory).",
                false,
                self.shared.projector.history().archived_count(),
            ),
            metric(
                "cycles_archived_reserve_keys",
                "Digests of archived reservations' reserve keys kept in memory while their \
                 replay windows last (4 bytes each).",
                false,
                archived_keys as u64,
            ),
            metric("cycles_budgets", "Budget ledgers.", false, budgets as u64),
            metric(
                "cycles_webhook_deliveries_due",
                "Webhook deliveries queued or waiting for a retry (in the state).",
                false,
                due as u64,
            ),
            metric(
                "cycles_events",
                "Events in the history store (on disk, not in memory).",
                false,
                self.shared.projector.history().event_count(),
            ),
            metric(
                "cycles_audit_entries",
                "Audit entries in the history store (on disk, not in memory).",
                false,
                self.shared.projector.history().audit_count(),
            ),
            metric(
                "cycles_history_batches_pending",
                "Batches of history handed to the history store and not yet written.",
                false,
                self.shared.projector.progress().pending_batches(),
            ),
        ]
    }

    async fn shutdown(&self) {
        self.shared.close(true);
        let thread = self.syncer.lock().ok().and_then(|mut t| t.take());
        let shared = self.shared.clone();
        // The last sync, the final snapshot and the history's last batch: blocking work.
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(thread) = thread {
                let _ = thread.join();
            }
            shared.projector.shutdown();
        })
        .await;
    }
}

impl Drop for EmbeddedStore {
    /// A store dropped without `shutdown` stops like a crash would (no final snapshot), but
    /// its syncer has finished before the data directory's lock is released.
    fn drop(&mut self) {
        self.shared.close(false);
        if let Some(thread) = self.syncer.get_mut().ok().and_then(Option::take) {
            let _ = thread.join();
        }
        self.shared.projector.shutdown();
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

/// Whether `dir` holds a ledger: a journal segment or a snapshot.
pub fn holds_ledger(dir: &Path) -> io::Result<bool> {
    Ok(!files::list_segments(dir)?.is_empty() || !files::list_snapshots(dir)?.is_empty())
}

/// Recovers a data directory read-only and checks the ledger's rules on the result.
pub fn verify(dir: &Path) -> io::Result<(Recovered, Vec<ledger::Violation>)> {
    // A mistyped path is an empty directory, whose empty ledger would verify.
    if !holds_ledger(dir)? {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} holds no ledger (no journal segment or snapshot): is it a data directory?",
                dir.display()
            ),
        ));
    }
    let recovered = recover(dir, false)?;
    let violations = recovered.state.verify();
    Ok((recovered, violations))
}
