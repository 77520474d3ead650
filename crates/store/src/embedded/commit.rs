//! The ledger lock and group commit.
//!
//! Commands are applied in one total order under the ledger lock, on the thread of the request
//! that brought them: no hand-off to another thread, so a request that needs no `fdatasync` (a
//! read of durable state, or anything in memory-only mode) never waits for a wake-up. Each
//! applied command's effects are encoded into the `pending` journal buffer under the same lock,
//! so the buffer's order is the apply order.
//!
//! Durability is a group commit on the syncer thread, which does nothing but I/O: it takes
//! *all* pending frames, writes them with one `write` + one `fdatasync`, publishes the new
//! durable sequence number and wakes the requests it answered. Commands applied while a sync
//! runs go together in the next one, so under load a sync covers many commands, latency stays
//! near one `fdatasync`, and no request worker blocks on the disk.
//!
//! The one exception is a request that is alone in the server ([`crate::Load::Alone`]): no
//! one would share its sync, so it runs the round itself on its own thread when the journal
//! is free, and saves the two thread wake-ups of the hand-off (request → syncer → request).
//! Whoever holds the [`Syncer`] lock owns the journal, so rounds never overlap.
//!
//! A journal that cannot be written (a `write` or `fdatasync` failing, a full disk, a
//! read-only file system) is a *fault*: no reply is sent for a record that is not durable,
//! and from then on nothing is acknowledged that would need the journal. The records not
//! yet durable are dropped and their requests refused; the syncer rolls the state back to
//! the durable records (read again from the disk), which lets reads be served while writes
//! are refused; then it tries, with backoff, to cut the journal back to its durable records
//! and write to it again. When that succeeds, writes resume — no restart needed. Sequence
//! numbers after a fault continue from the durable ones, so each fault ends an *epoch*
//! (with the journal held, so no round is being written): a request waiting for a record of
//! an ended epoch is answered by whether that record was durable when the epoch ended.

use std::future::Future;
use std::io;
use std::mem;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ledger::{apply_in, stage_in, ArchiveLookup, Effect, Found, Operation, State};

use super::journal::{encode_record, JournalRecord, JournalWriter, HEADER_LEN};
use super::recovery::recover_until;
use super::snapshot;
use super::waiters::{WaitKey, Waiters};
use crate::history::{Entries, Item, Projector};
use crate::{AuditFacts, Clock, Reply, RequestContext, StoreError};

/// Counters shared with `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub commands: AtomicU64,
    pub batches: AtomicU64,
    /// Rounds run by a request that was alone, on its own thread.
    pub batches_alone: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub snapshots: AtomicU64,
    /// Journal faults: writes refused from each until the journal was writable again.
    pub faults: AtomicU64,
}

/// The first wait before a faulted journal is tried again; it doubles up to the second.
const HEAL_FIRST_DELAY: Duration = Duration::from_millis(50);
const HEAL_MAX_DELAY: Duration = Duration::from_secs(2);

/// Why the journal cannot be written, while it cannot.
#[derive(Debug, Clone)]
pub struct Fault {
    pub why: String,
    /// Whether the state has been rolled back to the durable records: until then nothing at
    /// all is served, since the memory is ahead of the disk.
    pub readable: bool,
    /// Whether the epoch the fault ended has been closed (see [`Shared::end_epoch`]).
    pub epoch_ended: bool,
}

/// Everything under the ledger lock.
pub struct Ledger {
    pub state: State,
    /// The ledger's clock never steps back, even when the wall clock does.
    pub last_now: i64,
    /// The sequence number the next journal record gets.
    pub next_seq: u64,
    /// Encoded frames not yet written (strict mode only).
    pub pending: Vec<u8>,
    /// The audit entries in those frames, by sequence number: projected into the history
    /// store once the frames are durable.
    pub history: Entries,
    /// Whether effects are journaled (strict) or only kept in memory (none).
    pub journaled: bool,
    /// Set by shutdown: no command is applied after it.
    pub closed: bool,
    /// Whether the syncer writes a snapshot once it has synced the last round.
    pub final_snapshot: bool,
    /// Set while the journal cannot be written (see the module's documentation).
    pub fault: Option<Fault>,
}

/// The journal file and the background snapshot: whoever runs a round holds it (the syncer
/// thread, or a request that is alone).
pub struct Syncer {
    pub journal: JournalWriter,
    /// The previous round's buffer, swapped with `Ledger::pending` so neither reallocates.
    pub spare: Vec<u8>,
    pub dir: PathBuf,
    pub snapshot_after_bytes: u64,
    pub snapshot_after_records: u64,
    /// The size of the newest snapshot: the journal must grow at least as much before the
    /// next one (see [`super::EmbeddedConfig::snapshot_after_bytes`]).
    pub last_snapshot_len: u64,
    pub snapshot: Option<JoinHandle<io::Result<u64>>>,
}

pub struct Shared {
    pub ledger: Mutex<Ledger>,
    /// The journal (strict mode). Locked before the ledger when both are held.
    pub journal: Option<Mutex<Syncer>>,
    /// Signalled when `pending` goes from empty to non-empty, and on shutdown.
    pub work: Condvar,
    /// Every journal record up to this sequence number is on disk.
    pub durable_seq: AtomicU64,
    /// Requests waiting for a sync.
    pub waiters: Waiters,
    /// Bumped once per fault, with the journal and the ledger held, before any later
    /// `durable_seq` (see [`Shared::end_epoch`]).
    pub epoch: AtomicU64,
    /// The last durable record of the epoch the latest fault ended.
    pub durable_at_fault: AtomicU64,
    pub counters: Counters,
    pub clock: Arc<dyn Clock>,
    /// The history store and its writer.
    pub projector: Projector,
}

fn lock<T>(mutex: &Mutex<T>) -> Result<MutexGuard<'_, T>, StoreError> {
    mutex
        .lock()
        .map_err(|_| StoreError::Unavailable("the ledger panicked; restart the server".into()))
}

/// What a reply waits for before it is sent: journal record `seq`, written in `epoch`.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    pub seq: u64,
    pub epoch: u64,
}

/// What applying an operation came to.
pub enum Step<O: Operation> {
    /// Applied: its reply, and the record that must be durable before it is sent.
    Done(Reply<O::Output>, Option<Wait>),
    /// Not applied: it names an archived reservation, to be read from the history store
    /// (outside the ledger lock) before it runs again with what was found. `seen` is the
    /// last record it saw applied (none without a journal): the archive of what it names is
    /// at or before it.
    Lookup {
        operation: O,
        context: RequestContext<O::Output>,
        lookup: ArchiveLookup,
        seen: Option<Wait>,
    },
}

fn unavailable(fault: &Fault) -> StoreError {
    StoreError::Unavailable(format!("storage cannot take writes: {}", fault.why))
}

impl Shared {
    /// The journal could not be written: see the module's documentation. The syncer is
    /// woken to heal; waiting requests are answered when it ends the epoch.
    fn fail(&self, why: String) {
        if let Ok(mut ledger) = self.ledger.lock() {
            self.fault_locked(&mut ledger, why);
        }
        self.work.notify_one();
    }

    /// [`Self::fail`] with the ledger lock held (the caller wakes the syncer).
    fn fault_locked(&self, ledger: &mut Ledger, why: String) {
        tracing::error!(%why, "journal write failed: refusing writes until it can be written again");
        if let Some(fault) = &mut ledger.fault {
            // Already faulted (a failure while healing): the state is the durable one or
            // is about to be read again from the disk.
            fault.why = why;
            return;
        }
        self.counters.faults.fetch_add(1, Ordering::Relaxed);
        ledger.fault = Some(Fault {
            why,
            readable: false,
            epoch_ended: false,
        });
        // Records not yet taken by a round are never written now. Their requests, and those
        // of a round still being written, learn their fate when the syncer ends the epoch.
        ledger.pending.clear();
        ledger.history.clear();
    }

    /// Ends the epoch a fault interrupted, once, with the journal held (so no round is being
    /// written and `durable_seq` is final for it) and the ledger held: records up to
    /// `durable_seq` were durable, every later one of that epoch never will be. Waiting
    /// requests are woken to see which theirs was. Sequence numbers are reused from here on,
    /// under the new epoch.
    fn end_epoch(&self, ledger: &mut Ledger) -> bool {
        let Some(fault) = &mut ledger.fault else {
            return false;
        };
        if fault.epoch_ended {
            return false;
        }
        fault.epoch_ended = true;
        let durable = self.durable_seq.load(Ordering::Acquire);
        self.durable_at_fault.store(durable, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// While the journal is faulted: what changes nothing (a read, a refusal) is served from
    /// the durable state once it is rolled back; anything with an effect or an audit entry
    /// is refused, and the state is left as it was.
    fn serve_faulted<O: Operation>(
        ledger: &Ledger,
        fault: &Fault,
        operation: O,
        now: i64,
        context: RequestContext<O::Output>,
        found: Option<Found>,
    ) -> Result<Step<O>, StoreError> {
        if !fault.readable {
            return Err(unavailable(fault));
        }
        let RequestContext { origin, audit } = context;
        let staged = stage_in(&ledger.state, operation, now, &origin, found);
        let audited = audit.is_some_and(|audit| {
            audit(AuditFacts {
                result: &staged.result,
                tenant: staged.tenant.as_ref(),
                state: &ledger.state,
                now,
            })
            .is_some()
        });
        if !staged.effects.is_empty() || audited {
            return Err(unavailable(fault));
        }
        let reply = Reply {
            result: staged.result,
            tenant: staged.tenant,
        };
        Ok(Step::Done(reply, None))
    }

    /// Applies a command and returns its reply with the journal sequence number that must be
    /// durable before the reply may be sent (`None`: nothing to wait for), or, for a command
    /// naming an archived reservation it was not given (`found`), what to look up first.
    /// `wake_syncer` is false when the caller holds the journal and runs the round itself.
    /// With `audit`, the command's audit entry is made from its result and written in its
    /// journal record.
    pub fn apply<O: Operation>(
        &self,
        operation: O,
        wake_syncer: bool,
        context: RequestContext<O::Output>,
        found: Option<Found>,
    ) -> Result<Step<O>, StoreError> {
        let mut ledger = lock(&self.ledger)?;
        if ledger.closed {
            return Err(StoreError::ShuttingDown);
        }
        let now = self.clock.now_ms().max(ledger.last_now);
        ledger.last_now = now;
        let epoch = self.epoch.load(Ordering::Acquire);
        if found.is_none() {
            if let Some(lookup) = operation.archive_lookup(&ledger.state, now) {
                let seen = ledger.journaled.then(|| Wait {
                    seq: ledger.next_seq - 1,
                    epoch,
                });
                return Ok(Step::Lookup {
                    operation,
                    context,
                    lookup,
                    seen,
                });
            }
        }
        if let Some(fault) = &ledger.fault {
            return Self::serve_faulted(&ledger, fault, operation, now, context, found);
        }
        let RequestContext { origin, audit } = context;
        let mut applied = apply_in(&mut ledger.state, operation, now, &origin, found);
        let entry = audit.and_then(|audit| {
            audit(AuditFacts {
                result: &applied.result,
                tenant: applied.tenant.as_ref(),
                state: &ledger.state,
                now,
            })
        });
        if let Some(entry) = entry {
            applied.effects.push(Effect::Audit(Box::new(entry)));
        }
        // What the record leaves in the history store (its events, deliveries and audit
        // entry). Journaled, it waits beside the frame for the round; without a journal it
        // goes straight to the history store, once the lock is let go.
        let mut items: Vec<Item> = applied.effects.iter().filter_map(Item::of).collect();
        if ledger.journaled && !applied.effects.is_empty() {
            let record = JournalRecord {
                seq: ledger.next_seq,
                at_ms: now,
                effects: applied.effects,
            };
            let was_idle = ledger.pending.is_empty();
            if let Err(e) = encode_record(&record, &mut ledger.pending) {
                // The state already changed: without its record it must be rolled back.
                let why = e.to_string();
                self.fault_locked(&mut ledger, why.clone());
                drop(ledger);
                self.work.notify_one();
                return Err(StoreError::Unavailable(why));
            }
            // Only history whose frame is in the buffer: never any without its record.
            let seq = ledger.next_seq;
            ledger
                .history
                .extend(items.drain(..).map(|item| (seq, item)));
            ledger.next_seq += 1;
            if was_idle && wake_syncer {
                self.work.notify_one();
            }
        }
        self.counters.commands.fetch_add(1, Ordering::Relaxed);
        // Even a read or a refusal saw the state up to here, so it waits for that too: a
        // reply never shows what a crash could still undo.
        let seen = ledger.next_seq - 1;
        let wait = (ledger.journaled && self.durable_seq.load(Ordering::Acquire) < seen)
            .then_some(Wait { seq: seen, epoch });
        // Without a journal the history goes to the history store at once, handed over
        // before the lock is let go: a request that then finds a reservation gone from the
        // state finds its archive on the way (`Step::Lookup` waits for what was handed over).
        if !ledger.journaled && !items.is_empty() {
            self.projector
                .project(0, items.into_iter().map(|item| (0, item)).collect());
        }
        drop(ledger);
        let reply = Reply {
            result: applied.result,
            tenant: applied.tenant,
        };
        Ok(Step::Done(reply, wait))
    }

    /// Returns once the journal record `wait` names is durable; refused if a fault ends its
    /// epoch first.
    pub fn wait_durable(&self, wait: Wait) -> Durable<'_> {
        Durable {
            shared: self,
            key: self.waiters.key(wait.seq),
            epoch: wait.epoch,
        }
    }

    /// Refuses new commands and wakes the syncer for its last round; with `snapshot`, it
    /// then writes a final snapshot (a store dropped without shutdown skips it, like a crash).
    pub fn close(&self, snapshot: bool) {
        if let Ok(mut ledger) = self.ledger.lock() {
            ledger.closed = true;
            ledger.final_snapshot |= snapshot;
        }
        self.work.notify_one();
    }

    /// The syncer thread: group commits until shutdown, then a final snapshot.
    pub fn run_syncer(&self) {
        let Some(journal) = &self.journal else {
            return;
        };
        loop {
            match self.wait_for_work() {
                Ok(Work::Round) => {}
                Ok(Work::Heal) => {
                    if self.heal(journal) {
                        continue;
                    }
                    // Closing while faulted: nothing more can be written.
                    self.waiters.wake_all();
                    return;
                }
                Err(e) => {
                    self.fail(e.to_string());
                    return;
                }
            }
            let Ok(mut syncer) = lock(journal) else {
                self.fail("the journal's owner panicked".into());
                return;
            };
            let round = match self.take_round(&mut syncer) {
                Ok(Some(round)) => round,
                // A request that was alone took the frames first.
                Ok(None) => continue,
                Err(e) => {
                    self.fail(e.to_string());
                    return;
                }
            };
            let (closing, final_snapshot) = (round.closing, round.final_snapshot);
            if let Err(e) = self.sync(&mut syncer, round) {
                self.fail(e.to_string());
                continue;
            }
            if closing {
                self.waiters.wake_all();
                // A running snapshot finishes before the data directory is let go.
                if let Some(handle) = syncer.snapshot.take() {
                    let _ = handle.join();
                }
                if final_snapshot {
                    self.final_snapshot(&syncer);
                }
                return;
            }
        }
    }

    /// Runs a round on the caller's thread: for a request that is alone and holds the
    /// journal. Whatever is pending (its own record, and any that came meanwhile) is made
    /// durable and its waiters woken, exactly as the syncer thread would.
    pub fn sync_alone(&self, syncer: &mut Syncer) -> Result<(), StoreError> {
        let Some(round) = self.take_round(syncer)? else {
            return Ok(());
        };
        self.counters.batches_alone.fetch_add(1, Ordering::Relaxed);
        self.sync(syncer, round).map_err(|e| {
            let why = e.to_string();
            self.fail(why.clone());
            StoreError::Unavailable(why)
        })
    }

    /// Waits until there are pending frames, shutdown, or a fault.
    fn wait_for_work(&self) -> Result<Work, StoreError> {
        let mut ledger = lock(&self.ledger)?;
        while ledger.pending.is_empty() && !ledger.closed && ledger.fault.is_none() {
            ledger = self.work.wait(ledger).map_err(|_| {
                StoreError::Unavailable("the ledger panicked; restart the server".into())
            })?;
        }
        Ok(match ledger.fault {
            Some(_) => Work::Heal,
            None => Work::Round,
        })
    }

    /// After a fault: tries to heal the journal until it is healed (`true`) or the store
    /// closes (`false`), waiting longer after each failure.
    fn heal(&self, journal: &Mutex<Syncer>) -> bool {
        let mut delay = HEAL_FIRST_DELAY;
        let mut last_error = String::new();
        loop {
            let Ok(mut syncer) = lock(journal) else {
                return false;
            };
            match self.try_heal(&mut syncer) {
                Ok(()) => return true,
                Err(e) => {
                    let why = e.to_string();
                    // Said once per distinct error, not at every attempt.
                    if why != last_error {
                        tracing::warn!(error = %why, "the journal cannot be written yet; retrying");
                        last_error = why;
                    }
                }
            }
            drop(syncer);
            let Ok(ledger) = lock(&self.ledger) else {
                return false;
            };
            if ledger.closed {
                return false;
            }
            let Ok((ledger, _)) = self.work.wait_timeout(ledger, delay) else {
                return false;
            };
            if ledger.closed {
                return false;
            }
            delay = (delay * 2).min(HEAL_MAX_DELAY);
        }
    }

    /// One attempt at healing: the state rolled back to the durable records (read from the
    /// disk), then the journal cut back to them and written again (see
    /// [`JournalWriter::discard_unsynced`]). Writes resume when both succeed.
    fn try_heal(&self, syncer: &mut Syncer) -> io::Result<()> {
        // The failed round's frames are never written now.
        syncer.spare.clear();
        let readable = {
            let mut ledger = lock(&self.ledger).map_err(io::Error::other)?;
            if self.end_epoch(&mut ledger) {
                self.waiters.wake_all();
            }
            ledger.fault.as_ref().is_some_and(|f| f.readable)
        };
        let durable = self.durable_seq.load(Ordering::Acquire);
        if !readable {
            let state = recover_until(&syncer.dir, durable)?;
            let mut ledger = lock(&self.ledger).map_err(io::Error::other)?;
            ledger.state = state;
            ledger.next_seq = durable + 1;
            if let Some(fault) = &mut ledger.fault {
                fault.readable = true;
            }
            tracing::warn!(
                durable_seq = durable,
                "state rolled back to the durable journal records: serving reads, refusing writes"
            );
        }
        syncer.journal.discard_unsynced()?;
        let mut ledger = lock(&self.ledger).map_err(io::Error::other)?;
        if let Some(fault) = ledger.fault.take() {
            tracing::warn!(after = %fault.why, "the journal is writable again: accepting writes");
        }
        Ok(())
    }

    /// Takes every pending frame for one round (`None`: nothing pending and not closing).
    fn take_round(&self, syncer: &mut Syncer) -> Result<Option<Round>, StoreError> {
        let snapshot_idle = syncer.reap_snapshot();
        let mut ledger = lock(&self.ledger)?;
        if ledger.pending.is_empty() && !ledger.closed {
            return Ok(None);
        }
        mem::swap(&mut ledger.pending, &mut syncer.spare);
        let history = mem::take(&mut ledger.history);
        let upto = ledger.next_seq - 1;
        // The round whose frames take the segment past the threshold starts the snapshot,
        // not whichever write comes after it: on a server that has gone quiet that may be
        // much later, in the middle of other work.
        let snapshot_due = snapshot_idle && syncer.snapshot_due(syncer.spare.len(), upto);
        Ok(Some(Round {
            upto,
            history,
            closing: ledger.closed,
            final_snapshot: ledger.final_snapshot,
            // A closing round leaves the snapshot to `final_snapshot`, which follows it.
            snapshot: (snapshot_due && !ledger.closed).then(|| ledger.state.snapshot_source()),
        }))
    }

    /// Writes the round's frames with one `fdatasync`, publishes the durable sequence number
    /// and wakes the requests it answered; starts a snapshot when one is due.
    fn sync(&self, syncer: &mut Syncer, round: Round) -> io::Result<()> {
        if !syncer.spare.is_empty() {
            syncer.journal.write_durable(&syncer.spare)?;
            let c = &self.counters;
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.journal_bytes
                .fetch_add(syncer.spare.len() as u64, Ordering::Relaxed);
            syncer.spare.clear();
        }
        // Handed over before the durable sequence is published: whoever sees the change
        // acknowledged also finds its entry on its way (see `history::Progress`).
        if !round.history.is_empty() {
            self.projector.project(round.upto, round.history);
        }
        self.durable_seq.store(round.upto, Ordering::Release);
        self.waiters.wake_durable(round.upto);
        if let Some(source) = round.snapshot {
            self.start_snapshot(syncer, round.upto, source)?;
        }
        Ok(())
    }

    /// Rotates the journal at `seq + 1` and writes the state as of `seq` in the background.
    fn start_snapshot(
        &self,
        syncer: &mut Syncer,
        seq: u64,
        source: ledger::SnapshotSource,
    ) -> io::Result<()> {
        let started = Instant::now();
        syncer
            .journal
            .rotate(seq + 1)
            .map_err(|e| io::Error::other(format!("journal rotation: {e}")))?;
        self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            seq,
            rotate_ms = started.elapsed().as_millis() as u64,
            "snapshot started"
        );
        let dir = syncer.dir.clone();
        let floor = self.projector.floor();
        syncer.snapshot = thread::Builder::new()
            .name("cycles-snapshot".into())
            .spawn(move || snapshot::write_and_prune(&dir, seq, &source, || floor.get()))
            .ok();
        Ok(())
    }

    /// At shutdown, after the last sync: a snapshot of everything, so the next start replays
    /// nothing.
    fn final_snapshot(&self, syncer: &Syncer) {
        if syncer.journal.segment_len() <= HEADER_LEN {
            return;
        }
        let Ok(ledger) = self.ledger.lock() else {
            return;
        };
        let (seq, source) = (ledger.next_seq - 1, ledger.state.snapshot_source());
        drop(ledger);
        let floor = self.projector.floor();
        if let Err(e) = snapshot::write_and_prune(&syncer.dir, seq, &source, || floor.get()) {
            tracing::warn!(error = %e, "final snapshot failed; the journal still has everything");
        }
    }
}

/// What the syncer wakes up for.
enum Work {
    Round,
    Heal,
}

/// What one group commit covers.
struct Round {
    /// Every record up to this sequence number is in the round's frames (or already durable).
    upto: u64,
    /// The audit entries in the round's frames.
    history: Entries,
    /// Shutdown was requested: this is the last round.
    closing: bool,
    final_snapshot: bool,
    /// The state as of `upto`, when a snapshot is due.
    snapshot: Option<ledger::SnapshotSource>,
}

impl Syncer {
    /// Whether no snapshot is running. A finished one is joined here: its outcome is logged
    /// and its size taken.
    fn reap_snapshot(&mut self) -> bool {
        if self.snapshot.as_ref().is_some_and(|h| !h.is_finished()) {
            return false;
        }
        if let Some(handle) = self.snapshot.take() {
            match handle.join() {
                Ok(Ok(len)) => self.last_snapshot_len = len,
                Ok(Err(e)) => tracing::warn!(error = %e, "snapshot failed; will retry"),
                Err(_) => tracing::warn!("snapshot thread panicked; will retry"),
            }
        }
        true
    }

    /// Whether the segment, with `incoming` more bytes and records up to `upto`, has reached
    /// either threshold, and is as large as the last snapshot.
    fn snapshot_due(&self, incoming: usize, upto: u64) -> bool {
        let bytes = self.journal.segment_len() + incoming as u64;
        let records = (upto + 1).saturating_sub(self.journal.first_seq());
        let reached = bytes >= self.snapshot_after_bytes || records >= self.snapshot_after_records;
        reached && bytes >= self.last_snapshot_len
    }
}

/// The wait for one journal record to become durable (see [`Shared::wait_durable`]).
pub struct Durable<'a> {
    shared: &'a Shared,
    key: WaitKey,
    epoch: u64,
}

impl Future for Durable<'_> {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (shared, key) = (self.shared, self.key);
        // Registered before the checks below, so a sync that ends in between still wakes
        // this request.
        shared.waiters.register(key, cx.waker());
        // The durable sequence is read before the epoch: a sequence published after a fault
        // (by a later epoch, whose numbers repeat this one's) comes with that fault's epoch.
        let durable = shared.durable_seq.load(Ordering::Acquire);
        let epoch = shared.epoch.load(Ordering::Acquire);
        if epoch == self.epoch {
            return match durable >= key.0 {
                true => Poll::Ready(Ok(())),
                false => Poll::Pending,
            };
        }
        // A fault ended this record's epoch: it counts only if it was durable before that,
        // and only if no later fault has come since (then it is refused, never guessed).
        let was_durable =
            epoch == self.epoch + 1 && shared.durable_at_fault.load(Ordering::Acquire) >= key.0;
        Poll::Ready(match was_durable {
            true => Ok(()),
            false => Err(StoreError::Unavailable(
                "storage failed before this change was durable: it was not recorded".into(),
            )),
        })
    }
}

impl Drop for Durable<'_> {
    fn drop(&mut self) {
        self.shared.waiters.remove(self.key);
    }
}
