//! The history store: what is append-only and historical (audit entries, events, the
//! versions of every webhook delivery, and settled reservations once archived) lives on
//! disk, indexed for the API's queries, never in the ledger's memory.
//!
//! The journal stays the one durable step: an entry is written in the journal record of the
//! change it describes, and the history store is a projection of the journal, applied after
//! the record is durable, by one background writer ([`Projector`]). It remembers the last
//! journal sequence number it holds, so the projection is idempotent: recovery re-projects
//! the journal's tail after it, and the journal is never pruned past what it holds (see
//! [`Progress::pending`]). Reads go to the store directly, never through the ledger lock.

mod events_sql;
mod reservations_sql;
mod sqlite;

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use ledger::{
    ArchiveLookup, Archived, AuditEntry, AuditPage, AuditQuery, Delivery, DeliveryPage,
    DeliveryQuery, Effect, Event, EventPage, EventQuery, ListReservations, Millis, ReservationPage,
    TERMINAL_RETENTION_MS,
};

use crate::{Clock, StoreError};
pub use sqlite::{SqliteHistory, FILE_NAME};

/// What a journal record leaves in the history store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Audit(AuditEntry),
    Event(Event),
    /// A version of a delivery (the last one written wins).
    Delivery(Delivery),
    /// A settled reservation that left the state, with its idempotency records.
    Archived(Arc<Archived>),
}

impl Item {
    /// The history an effect carries, if any.
    pub fn of(effect: &Effect) -> Option<Item> {
        match effect {
            Effect::Audit(entry) => Some(Item::Audit((**entry).clone())),
            Effect::Event(event) => Some(Item::Event((**event).clone())),
            Effect::PutDelivery(d) => Some(Item::Delivery((**d).clone())),
            Effect::ArchiveReservation(a) => Some(Item::Archived(a.clone())),
            _ => None,
        }
    }
}

/// Journal records' history, by each record's sequence number.
pub type Entries = Vec<(u64, Item)>;

/// How long audit entries are kept (0 days: forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Audit entries of a known caller (a tenant key or the admin key).
    pub authenticated_days: u32,
    /// Audit entries of requests refused before their caller was known
    /// ([`ledger::UNAUTH_TENANT`]).
    pub unauthenticated_days: u32,
    pub events_days: u32,
    /// Deliveries, by when they were created.
    pub deliveries_days: u32,
}

impl Retention {
    /// The reference's defaults (and the server's flags').
    pub const DEFAULT: Retention = Retention {
        authenticated_days: 400,
        unauthenticated_days: 30,
        events_days: 90,
        deliveries_days: 14,
    };
}

impl Default for Retention {
    fn default() -> Self {
        Retention::DEFAULT
    }
}

const DAY_MS: Millis = 24 * 3_600_000;

/// What retention deletes: everything older than these (`None`: kept forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cutoffs {
    pub authenticated: Option<Millis>,
    pub unauthenticated: Option<Millis>,
    pub events: Option<Millis>,
    pub deliveries: Option<Millis>,
    /// Archived reservations, by when they settled (their retention is the protocol's).
    pub settled: Option<Millis>,
}

impl Retention {
    /// The cutoffs at `now`.
    pub fn cutoffs(self, now: Millis) -> Cutoffs {
        let cutoff = |days: u32| (days > 0).then(|| now - i64::from(days) * DAY_MS);
        Cutoffs {
            authenticated: cutoff(self.authenticated_days),
            unauthenticated: cutoff(self.unauthenticated_days),
            events: cutoff(self.events_days),
            deliveries: cutoff(self.deliveries_days),
            settled: Some(now - TERMINAL_RETENTION_MS),
        }
    }
}

/// What a history store does: the narrow surface an engine's history lives behind, so each
/// engine keeps it where it belongs (the embedded one in a file beside its journal).
pub trait History: Send + Sync + 'static {
    /// Adds the entries of journal records up to `upto`, with `upto` as the sequence number
    /// held, in one durable step.
    fn append(&self, upto: u64, entries: &[(u64, Item)]) -> io::Result<()>;

    /// The last journal sequence number whose entries are held durably (0: none).
    fn held_seq(&self) -> io::Result<u64>;

    /// One page of the audit log.
    fn audit_page(&self, query: &AuditQuery) -> io::Result<AuditPage>;

    /// One page of the event log.
    fn event_page(&self, query: &EventQuery) -> io::Result<EventPage>;

    /// One event by id.
    fn event(&self, event_id: &str) -> io::Result<Option<Event>>;

    /// Events since `since_ms`, by category name.
    fn event_counts(&self, since_ms: Millis) -> io::Result<Vec<(String, u64)>>;

    /// One page of a subscription's deliveries.
    fn delivery_page(&self, query: &DeliveryQuery) -> io::Result<DeliveryPage>;

    /// The archived reservation `lookup` names, with its records.
    fn archived(&self, lookup: &ArchiveLookup) -> io::Result<Option<Archived>>;

    /// Keeps an index of archived reservations by their reserve's key, or drops it, as
    /// `needed` says: the state needs it while it holds keys of archived reserves without
    /// their creation times ([`ledger::State::archived_keys_need_key_index`]). Called once
    /// the state is loaded, before it serves.
    fn index_keys(&self, needed: bool) -> io::Result<()>;

    /// One page of `tenant`'s archived reservations for a listing (its order, cursor and
    /// filters), to merge with the state's ([`ListReservations::merge`]).
    fn archived_page(&self, tenant: &str, query: &ListReservations) -> io::Result<ReservationPage>;

    /// Deletes what is older than its cutoff; answers how many rows went.
    fn expire(&self, cutoffs: Cutoffs) -> io::Result<u64>;

    /// Deletes the entries of journal records after `seq` and holds `seq`: for a history
    /// store found ahead of its journal (restored from a copy taken after the journal's),
    /// whose extra entries have no change beside them. Answers how many went.
    fn trim_after(&self, seq: u64) -> io::Result<u64>;

    /// How many audit entries are held.
    fn audit_count(&self) -> u64;

    /// How many events are held.
    fn event_count(&self) -> u64;

    /// How many archived reservations are held.
    fn archived_count(&self) -> u64;
}

/// What is handed to the projector, in journal order.
enum Work {
    Append { upto: u64, entries: Entries },
    Expire,
}

/// How far the projection has come: batches handed over and batches written. When the two
/// are equal, everything durable in the journal is in the history store too.
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
    written: Mutex<u64>,
    advanced: Condvar,
}

impl Progress {
    /// Whether entries handed over are not yet written. While they are, the journal records
    /// after the store's held sequence number must stay on disk.
    pub fn pending(&self) -> bool {
        self.pending_batches() > 0
    }

    /// Batches handed over and not yet written.
    pub fn pending_batches(&self) -> u64 {
        let written = *self.written.lock().unwrap_or_else(|e| e.into_inner());
        self.sent.load(Ordering::Acquire).saturating_sub(written)
    }

    /// Waits (at most `timeout`) until every batch handed over so far is written: a read
    /// after an acknowledged change then sees the change's entry.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let target = self.sent.load(Ordering::Acquire);
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let (written, _) = self
            .advanced
            .wait_timeout_while(written, timeout, |w| *w < target)
            .unwrap_or_else(|e| e.into_inner());
        *written >= target
    }

    fn mark_written(&self, batches: u64) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        *written += batches;
        self.advanced.notify_all();
    }
}

/// What the journal must keep for the history store: read by the snapshot thread when it
/// prunes (see [`crate::embedded::snapshot::prune`]).
#[derive(Clone)]
pub struct Floor {
    history: Arc<dyn History>,
    progress: Arc<Progress>,
}

impl Floor {
    /// The last sequence number the history store holds, when entries after it are still
    /// on their way (`None`: it has everything, the journal need keep nothing for it).
    pub fn get(&self) -> Option<u64> {
        self.progress
            .pending()
            .then(|| self.history.held_seq().unwrap_or(0))
    }
}

/// The history store with its background writer.
pub struct Projector {
    history: Arc<dyn History>,
    queue: Mutex<Option<SyncSender<Work>>>,
    progress: Arc<Progress>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Set by [`Projector::shutdown`]: a write that fails then is given up, not retried.
    stopping: Arc<AtomicBool>,
    /// The last record whose entries were handed over ([`Projector::project`]).
    handed: AtomicU64,
}

/// Batches the writer may fall behind by before the syncer waits for it (backpressure, so a
/// slow disk bounds memory instead of growing it).
const QUEUE_DEPTH: usize = 1024;
/// How often retention runs on its own.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(3600);
/// How long a read of the history waits for the entries of changes already acknowledged
/// (a few milliseconds behind at most, unless the disk is failing).
pub const CATCH_UP: Duration = Duration::from_secs(5);

impl Projector {
    /// Starts the writer for `history`, with `retention` run at start and then hourly.
    pub fn start(
        history: Arc<dyn History>,
        retention: Retention,
        clock: Arc<dyn Clock>,
    ) -> io::Result<Self> {
        let (queue, work) = mpsc::sync_channel(QUEUE_DEPTH);
        let progress = Arc::new(Progress::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            history: history.clone(),
            progress: progress.clone(),
            retention,
            clock,
            stopping: stopping.clone(),
        };
        let thread = thread::Builder::new()
            .name("cycles-history".into())
            .spawn(move || writer.run(work))?;
        Ok(Projector {
            history,
            queue: Mutex::new(Some(queue)),
            progress,
            thread: Mutex::new(Some(thread)),
            stopping,
            handed: AtomicU64::new(0),
        })
    }

    /// Opens the embedded history file in `dir` (or an in-memory one) and starts its writer.
    pub fn open_embedded(
        dir: Option<&Path>,
        retention: Retention,
        clock: Arc<dyn Clock>,
    ) -> io::Result<Self> {
        let history = match dir {
            Some(dir) => SqliteHistory::open(&dir.join(sqlite::FILE_NAME))?,
            None => SqliteHistory::in_memory()?,
        };
        Self::start(Arc::new(history), retention, clock)
    }

    pub fn history(&self) -> &Arc<dyn History> {
        &self.history
    }

    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    pub fn floor(&self) -> Floor {
        Floor {
            history: self.history.clone(),
            progress: self.progress.clone(),
        }
    }

    /// Runs `read` on the history, on the blocking pool, once every entry handed over so
    /// far is written: a read sees the history of every change acknowledged before it.
    pub async fn read_caught_up<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn History) -> io::Result<T> + Send + 'static,
    {
        let history = self.history.clone();
        let progress = self.progress.clone();
        let read = move || {
            progress.wait_caught_up(CATCH_UP);
            read(&*history)
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(Ok(page)) => Ok(page),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(e) => Err(StoreError::Unavailable(format!("history read: {e}"))),
        }
    }

    /// Hands over the entries of records up to `upto` (already durable in the journal).
    pub fn project(&self, upto: u64, entries: Entries) {
        self.handed.fetch_max(upto, Ordering::AcqRel);
        self.send(Work::Append { upto, entries });
    }

    /// The last record whose entries the history store holds or was handed (and writes,
    /// unless the process stops first): what a reading of the journal need not hand it
    /// again.
    pub fn handed_seq(&self) -> u64 {
        let held = self.history.held_seq().unwrap_or(0);
        held.max(self.handed.load(Ordering::Acquire))
    }

    /// After the history was cut back to `last` (the journal lost what followed): records
    /// numbered after it are new ones, handed over when they come.
    pub fn handed_back_to(&self, last: u64) {
        self.handed.fetch_min(last, Ordering::AcqRel);
    }

    /// Runs retention now (it also runs hourly); returns once it has run (the writer counts
    /// the work written only after running it).
    pub fn expire_now(&self) {
        self.send(Work::Expire);
        self.progress.wait_caught_up(Duration::from_secs(30));
    }

    fn send(&self, work: Work) {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = queue.as_ref() {
            self.progress.sent.fetch_add(1, Ordering::AcqRel);
            if queue.send(work).is_err() {
                // The writer is gone (it only stops on shutdown): what was not written is
                // re-projected from the journal on the next start.
                self.progress.sent.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Writes what is queued and stops the writer. A write that fails from now on is given
    /// up rather than retried, so that a failing disk cannot hold the process up: what it
    /// held stays pending (the journal keeps its records) and is written at the next start.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            // Cuts short the wait before a retry.
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Projector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The writer thread: appends in batches (everything queued goes in one transaction) and
/// runs retention.
struct Writer {
    history: Arc<dyn History>,
    progress: Arc<Progress>,
    retention: Retention,
    clock: Arc<dyn Clock>,
    stopping: Arc<AtomicBool>,
}

impl Writer {
    fn run(self, work: Receiver<Work>) {
        self.expire();
        loop {
            let first = match work.recv_timeout(EXPIRY_INTERVAL) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    self.expire();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut batch = vec![first];
            while let Ok(more) = work.try_recv() {
                batch.push(more);
            }
            if !self.write(batch) {
                return;
            }
        }
    }

    /// Writes a batch, retrying until the disk takes it: the journal keeps every record
    /// meanwhile, so nothing is lost, only late. Answers false when the write was given up
    /// at shutdown: nothing after it may be written then (the store's held sequence number
    /// would claim the entries that are missing).
    fn write(&self, batch: Vec<Work>) -> bool {
        let count = batch.len() as u64;
        let mut upto = None;
        let mut entries = Vec::new();
        let mut expire = false;
        for work in batch {
            match work {
                Work::Append {
                    upto: u,
                    entries: e,
                } => {
                    upto = Some(u);
                    entries.extend(e);
                }
                Work::Expire => expire = true,
            }
        }
        if let Some(upto) = upto {
            let mut delay = Duration::from_millis(10);
            while let Err(e) = self.history.append(upto, &entries) {
                if self.stopping.load(Ordering::Acquire) {
                    tracing::error!(
                        error = %e,
                        "history store write failed at shutdown; its entries are written at the next start"
                    );
                    return false;
                }
                tracing::error!(error = %e, "history store write failed; retrying");
                thread::park_timeout(delay);
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
        if expire {
            self.expire();
        }
        self.progress.mark_written(count);
        true
    }

    fn expire(&self) {
        let cutoffs = self.retention.cutoffs(self.clock.now_ms());
        match self.history.expire(cutoffs) {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "history past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "history retention failed; will retry"),
        }
    }
}
