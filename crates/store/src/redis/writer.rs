//! The writer: it owns the instance's state and its connection to Redis, and runs
//! operations in rounds, on its own thread or on that of a request alone in the server
//! ([`WriterSeat`]).
//!
//! A round takes every queued operation (up to [`MAX_ROUND_JOBS`]). An instance without the
//! lease first reads the log to its end and answers those that change nothing (reads,
//! refusals) from the state as the log ends, without taking the lease from the one that
//! writes. For the rest, it makes sure it holds the writer's lease and has read the log to
//! its end, applies them to the state in order, and appends the records of those that
//! changed something to the log in one script. Only then are they answered, reads and
//! refusals of that round included: a reply never shows what Redis has not acknowledged.
//!
//! **Faults.** A round whose append fails leaves the state ahead of the log: its operations
//! are refused (`503`; an append whose answer was lost may have happened, and says so), and
//! the state is read again from the log before anything else is served. While Redis cannot
//! be reached the engine answers `503` at once, trying again (half-open) after a delay that
//! doubles up to [`MAX_RETRY_DELAY`]: a circuit breaker. A ledger whose marker disappears
//! (Redis flushed, or restarted without its data) is never served again by this process.
//!
//! **The lease.** The holder keeps it while it writes (each append renews it). Another
//! instance that wants it leaves word; the holder gives it up after a round once it has
//! held it for [`HANDOFF_AFTER`], or when it is idle, so instances take turns in rounds.
//! Giving it up wakes the instance whose word it is (it blocks on a token, [`TURN_BLOCK`]
//! at a time, instead of asking every [`LEASE_POLL`] as the others do).
//!
//! **Forwarding.** An instance with an address for its peers
//! ([`RedisConfig::advertise`]) names it in its lease. Without the lease, such an instance
//! does not wait for it while a peer that named its address holds it: it answers each
//! operation that would write, and that its request lets it hand on
//! ([`crate::forwarding`]), with [`StoreError::Forward`], and the server sends the request
//! to the holder. So one instance decides every write while it is busy, in rounds as large
//! as the whole fleet's traffic, instead of each instance waiting its turn.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ledger::{Millis, State};

use super::compaction::{self, Compacted, Compactor};
use super::jobs::{Ctx, Job};
use super::log::{Lease, Link, Log, LogError, Refused, Settings};
use super::{Counters, OpenReport, RedisConfig, RedisDurability};
use crate::embedded::journal::{encode_record, JournalRecord};
use crate::history::{Item, Projector};
use crate::{Clock, Health, Metric, StoreError};

/// Operations in one round, at most.
const MAX_ROUND_JOBS: usize = 512;
/// How often an idle writer looks whether another instance wants its lease.
const IDLE_CHECK: Duration = Duration::from_millis(5);
/// How long a holder keeps the lease, at least, once another instance wants it.
const HANDOFF_AFTER: Duration = Duration::from_millis(2);
/// How long a round waits for the lease before its operations are refused.
const LEASE_WAIT: Duration = Duration::from_secs(5);
/// How long a waiting instance sleeps between two asks for the lease, at most, unless its
/// turn is next.
const LEASE_POLL: Duration = Duration::from_millis(1);
/// How long the instance whose turn is next waits to be woken before it asks again, at
/// most (within its word's life).
const TURN_BLOCK: Duration = Duration::from_millis(20);
/// How often an instance that hands every write to the lease's holder reads the log to
/// its end anyway (see `Writer::read_without_lease`).
const CATCH_UP_EVERY: Duration = Duration::from_millis(20);
/// Reads of the log to its end, without the lease, that may fail in a row before the
/// breaker opens: one reply late on a busy host refuses only the operations that waited
/// for it (see `Writer::read_without_lease`).
const FAILED_READS_TO_BREAK: u32 = 3;
/// How long the lease's holder, as a round read it, is taken to hold it still: a request
/// meant to write goes straight there meanwhile ([`Shared::holder_address`]).
const HOLDER_FRESH: Duration = Duration::from_millis(10);
/// How long after a compaction starts the next one may, at the soonest (one that failed is
/// not tried again at once).
const COMPACTION_SPACING: Duration = Duration::from_secs(1);
/// A snapshot this small is rewritten whenever the log's tail is long enough in records;
/// a larger one only once the tail is at least its size.
const SMALL_SNAPSHOT_BYTES: u64 = 16 << 20;
/// How long one of loading's commands may take, at least.
const LOAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one of the compactor's commands may take: it works in the background, and
/// moves a snapshot's parts.
const COMPACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// The first delay before a lost Redis is tried again; it doubles up to the second.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// What the writer shares with the store's callers.
pub struct Shared {
    pub projector: Projector,
    pub counters: Counters,
    clock: Arc<dyn Clock>,
    /// Why operations are refused, while they are.
    fault: Mutex<Option<String>>,
    closed: AtomicBool,
    holding: AtomicBool,
    version: AtomicU64,
    reservations: AtomicU64,
    budgets: AtomicU64,
    deliveries_due: AtomicU64,
    archived_keys: AtomicU64,
    /// The last record of the ledger's snapshot, as last seen.
    snapshot_version: AtomicU64,
    snapshot_bytes: AtomicU64,
    /// The ledger's secret among its instances, once read (see [`super::log::Keys::peers`]).
    pub peer_secret: OnceLock<Arc<str>>,
    /// The address of the peer holding the lease, and when a round read it: a request meant
    /// to write is sent there without reaching the writer while that is recent
    /// ([`Shared::holder_address`]). Set only on an instance that forwards.
    holder: RwLock<Option<(Arc<str>, Instant)>>,
}

impl Shared {
    pub fn new(projector: Projector, clock: Arc<dyn Clock>) -> Shared {
        Shared {
            projector,
            counters: Counters::default(),
            clock,
            fault: Mutex::new(None),
            closed: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            version: AtomicU64::new(0),
            reservations: AtomicU64::new(0),
            budgets: AtomicU64::new(0),
            deliveries_due: AtomicU64::new(0),
            archived_keys: AtomicU64::new(0),
            snapshot_version: AtomicU64::new(0),
            snapshot_bytes: AtomicU64::new(0),
            peer_secret: OnceLock::new(),
            holder: RwLock::new(None),
        }
    }

    /// The address of the peer holding the lease, if a round read it within
    /// [`HOLDER_FRESH`]. Between rounds the lease may have moved: a request sent to a
    /// former holder waits there for the lease, as any peer's request does.
    pub fn holder_address(&self) -> Option<Arc<str>> {
        let holder = self.holder.read().ok()?;
        let (address, read) = holder.as_ref()?;
        (read.elapsed() < HOLDER_FRESH).then(|| address.clone())
    }

    fn set_holder(&self, peer: Option<&Arc<str>>) {
        if let Ok(mut holder) = self.holder.write() {
            *holder = peer.map(|p| (p.clone(), Instant::now()));
        }
    }

    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().map_or(None, |f| f.clone())
    }

    fn set_fault(&self, why: Option<String>) {
        if let Ok(mut fault) = self.fault.lock() {
            *fault = why;
        }
    }

    /// The refusal of an operation the writer could not run.
    pub fn unavailable(&self) -> StoreError {
        match self.fault() {
            Some(why) => StoreError::Unavailable(why),
            None if self.closed() => StoreError::ShuttingDown,
            None => StoreError::Unavailable("the Redis engine stopped".into()),
        }
    }

    pub fn health(&self) -> Health {
        match self.fault() {
            Some(why) => Health {
                ready: false,
                detail: format!("redis unavailable, refusing every operation: {why}"),
            },
            None if self.closed() => Health {
                ready: false,
                detail: "shutting down".into(),
            },
            None => Health {
                ready: true,
                detail: "redis".into(),
            },
        }
    }

    pub fn metrics(&self) -> Vec<Metric> {
        let c = &self.counters;
        let get = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let m = |name, help, counter, value| Metric {
            name,
            help,
            counter,
            value,
        };
        vec![
            m("cycles_store_commands_total", "Commands applied to the ledger.", true, get(&c.commands)),
            m("cycles_redis_rounds_total", "Rounds of records appended to the ledger's log in Redis (one script each).", true, get(&c.rounds)),
            m("cycles_redis_rounds_alone_total", "Rounds a request alone in the server ran on its own thread instead of the writer's (the lease held, nothing queued), a read's included: not a subset of cycles_redis_rounds_total.", true, get(&c.rounds_alone)),
            m("cycles_redis_append_microseconds_total", "Time spent appending rounds to the log (each one script's round trip): over cycles_redis_rounds_total, the mean append.", true, get(&c.append_micros)),
            m("cycles_redis_log_bytes_total", "Bytes of records appended to the ledger's log.", true, get(&c.log_bytes)),
            m("cycles_redis_records_read_total", "Records other instances appended, read from the log.", true, get(&c.records_read)),
            m("cycles_redis_leases_total", "Times this instance took the writer's lease.", true, get(&c.leases)),
            m("cycles_redis_lease_waits_total", "Times this instance waited for another to give the lease up.", true, get(&c.lease_waits)),
            m("cycles_redis_lease_wakes_total", "Times this instance, next in turn, was woken by the holder giving the lease up.", true, get(&c.lease_wakes)),
            m("cycles_redis_lease_wait_microseconds_total", "Time operations waited for another instance to give the writer's lease up.", true, get(&c.lease_wait_micros)),
            m("cycles_redis_handoffs_total", "Times this instance gave the lease up to another that wanted it.", true, get(&c.handoffs)),
            m("cycles_redis_faults_total", "Times Redis could not be reached or refused a write (operations refused meanwhile).", true, get(&c.faults)),
            m("cycles_redis_failed_reads_total", "Reads of the log to its end, without the writer's lease, that Redis did not answer: the operations that waited for each were refused (the breaker opens at the third in a row).", true, get(&c.failed_reads)),
            m("cycles_redis_unreplicated_total", "Rounds that did not reach the replicas asked for (--redis-replicas) in time: their operations were answered outcome unknown.", true, get(&c.unreplicated)),
            m("cycles_redis_forwarded_total", "Operations a round of this instance handed to the instance holding the writer's lease (--redis-advertise-url), instead of waiting for the lease (requests sent there before their handler ran are in cycles_forward_sent_total only).", true, get(&c.forwarded)),
            m("cycles_redis_reads_without_lease_total", "Operations that changed nothing, answered by an instance without the writer's lease once it had read the log to its end.", true, get(&c.reads)),
            m("cycles_redis_reloads_total", "Times the state was read again from Redis: after a failed append, or found behind a compaction.", true, get(&c.reloads)),
            m("cycles_redis_snapshots_total", "Compactions this instance made: the log's head replaced by a snapshot of the state, its history moved to the history streams.", true, get(&c.snapshots)),
            m("cycles_redis_snapshot_failures_total", "Compactions this instance started that failed (the log keeps its records; another is tried later).", true, get(&c.snapshot_failures)),
            m("cycles_redis_snapshot_version", "The last record of the ledger's snapshot in Redis, as this instance last saw it: the log holds the records after it.", false, get(&self.snapshot_version)),
            m("cycles_redis_snapshot_bytes", "The size of the ledger's snapshot in Redis, as this instance last saw it.", false, get(&self.snapshot_bytes)),
            m("cycles_redis_unavailable", "1 while Redis cannot be used and every operation is refused (the breaker is open).", false, u64::from(self.fault().is_some())),
            m("cycles_redis_lease_held", "1 while this instance holds the writer's lease.", false, u64::from(self.holding.load(Ordering::Relaxed))),
            m("cycles_redis_log_version", "The last record of the ledger's log this instance has applied.", false, get(&self.version)),
            m("cycles_reservations", "Reservations in memory: the ACTIVE ones and those settled too recently to be archived yet.", false, get(&self.reservations)),
            m("cycles_reservations_archived", "Settled reservations archived in the history store (on disk, not in memory).", false, self.projector.history().archived_count()),
            m("cycles_archived_reserve_keys", "Digests of archived reservations' reserve keys kept in memory while their replay windows last (4 bytes each).", false, get(&self.archived_keys)),
            m("cycles_budgets", "Budget ledgers.", false, get(&self.budgets)),
            m("cycles_webhook_deliveries_due", "Webhook deliveries queued or waiting for a retry (in the state).", false, get(&self.deliveries_due)),
            m("cycles_events", "Events in the history store (on disk, not in memory).", false, self.projector.history().event_count()),
            m("cycles_audit_entries", "Audit entries in the history store (on disk, not in memory).", false, self.projector.history().audit_count()),
        ]
    }
}

/// The writer, shared by its thread and by a request that is alone in the server.
///
/// Rounds run on the writer's thread, which wakes for each queued job and wakes its request
/// once the round is in Redis. A request that is alone ([`crate::Load::Alone`]) and finds
/// the writer free, nothing queued and the lease held runs its own round instead, on its
/// own thread: two wake-ups fewer, as the embedded engine's lone write syncs its own
/// journal. Rounds never overlap: each runs under the writer's lock.
pub struct WriterSeat {
    writer: Mutex<Writer>,
    /// Jobs sent to the queue and not yet taken into a round: a request alone does not
    /// pass them.
    queued: AtomicUsize,
}

impl WriterSeat {
    pub fn new(writer: Writer) -> WriterSeat {
        WriterSeat {
            writer: Mutex::new(writer),
            queued: AtomicUsize::new(0),
        }
    }

    /// Sends `job` to the writer's thread, counted as queued until a round takes it.
    pub fn enqueue(
        &self,
        jobs: &SyncSender<Box<dyn Job>>,
        job: Box<dyn Job>,
    ) -> Result<(), StoreError> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        jobs.send(job).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            StoreError::ShuttingDown
        })
    }

    /// Runs `job` in a round of its own on the caller's thread, if that waits for nothing
    /// (see the type's documentation); gives it back otherwise.
    pub fn run_alone(&self, job: Box<dyn Job>) -> Option<Box<dyn Job>> {
        // A poisoned lock (a round panicked) is never used again: the thread stops.
        let Ok(mut writer) = self.writer.try_lock() else {
            return Some(job);
        };
        if self.queued.load(Ordering::Acquire) > 0 || !writer.ready() {
            return Some(job);
        }
        Counters::add(&writer.shared.counters.rounds_alone, 1);
        writer.round(vec![job]);
        writer.publish_gauges();
        None
    }

    /// The writer's thread: runs rounds of queued jobs until the store closes.
    pub fn serve(&self, queue: Receiver<Box<dyn Job>>) {
        loop {
            let first = match queue.recv_timeout(IDLE_CHECK) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let Ok(mut writer) = self.writer.lock() else {
                break;
            };
            let Some(first) = first else {
                if writer.shared.closed() {
                    break;
                }
                writer.idle();
                continue;
            };
            let mut jobs = vec![first];
            while jobs.len() < MAX_ROUND_JOBS {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            // Taken under the lock, so a request alone sees them queued until they run.
            self.queued.fetch_sub(jobs.len(), Ordering::AcqRel);
            writer.round(jobs);
            writer.publish_gauges();
        }
        if let Ok(mut writer) = self.writer.lock() {
            writer.give_up_lease();
            if let Some(compaction) = writer.compaction.take() {
                let _ = compaction.join();
            }
        }
    }
}

/// Why Redis cannot be used now, and when to try again.
struct Broken {
    why: String,
    retry_at: Instant,
}

pub struct Writer {
    durability: RedisDurability,
    lease: Duration,
    timeout: Duration,
    /// Replicas each round waits for (see [`RedisConfig::replicas`]).
    replicas: u32,
    log: Log,
    link: Link,
    state: State,
    /// The last record of the log applied to `state`.
    applied: u64,
    /// The ledger's time never steps back, whichever instance wrote last.
    last_now: Millis,
    /// Whether the ledger's time is Redis's clock (see [`RedisConfig::clock_from_redis`]).
    clock_from_redis: bool,
    /// Redis's clock less this instance's, as last read.
    clock_offset: Millis,
    /// The ledger's marker, once found: a Redis without it is never served again.
    marker: Option<String>,
    /// Whether `state` is the log's up to `applied` (false after a failed append, until
    /// it is read again).
    loaded: bool,
    /// Whether the history keeps its index of reserve keys, as last set (see
    /// `State::archived_keys_need_key_index`).
    key_index: Option<bool>,
    /// Until when the lease is this instance's, by its own clock (a margin before Redis
    /// lets it go).
    lease_until: Option<Instant>,
    held_since: Instant,
    broken: Option<Broken>,
    retry_delay: Duration,
    /// A refusal no retry can lift (the ledger was wiped).
    fatal: Option<String>,
    frames: Vec<u8>,
    shared: Arc<Shared>,
    compactor: Compactor,
    /// Records past the snapshot that start a compaction.
    snapshot_records: u64,
    compaction: Option<JoinHandle<()>>,
    compaction_started: Option<Instant>,
    /// Records and bytes this instance appended: their ratio estimates a record's size.
    appended_records: u64,
    appended_bytes: u64,
    /// Whether this instance hands writes to a peer holding the lease (it has an address
    /// for its peers, [`RedisConfig::advertise`]).
    forwards: bool,
    /// The address of the peer holding the lease, as this round read it (none if nobody,
    /// this instance, or a peer without an address holds it, or this one does not forward).
    peer: Option<Arc<str>>,
    /// When this instance last read the log to its end without the lease.
    caught_up_at: Instant,
    /// Reads of the log to its end, without the lease, that failed since one last did not.
    failed_reads: u32,
}

/// Who this instance is, as its lease names it: an id, then the address its peers reach it
/// at, if it has one.
fn holder_id(advertise: Option<&str>) -> String {
    let id = format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
    match advertise {
        Some(url) => format!("{id} {url}"),
        None => id,
    }
}

/// The address a lease's holder names, unless it is `own` (this instance's name).
fn peer_address(holder: &str, own: &str) -> Option<Arc<str>> {
    if holder == own {
        return None;
    }
    holder.split_once(' ').map(|(_, url)| Arc::from(url))
}

impl Writer {
    pub fn open(config: RedisConfig, shared: Arc<Shared>) -> std::io::Result<(Writer, OpenReport)> {
        let holder = holder_id(config.advertise.as_deref());
        let compactor = Compactor {
            url: config.url.clone(),
            topology: config.topology.clone(),
            keys: super::log::Keys::new(&config.namespace),
            holder: holder.clone(),
            retention: config.retention,
            clock: config.clock.clone(),
            timeout: COMPACTION_TIMEOUT,
            snapshot_records: config.snapshot_records,
            lock_ttl: compaction::LOCK_TTL,
        };
        let mut writer = Writer {
            durability: config.durability,
            lease: config.lease,
            timeout: config.timeout,
            replicas: config.replicas,
            log: Log::new(&config.namespace, holder),
            link: Link::new(config.url, config.topology, config.timeout),
            state: State::new(),
            applied: 0,
            last_now: Millis::MIN,
            clock_from_redis: config.clock_from_redis,
            clock_offset: 0,
            marker: None,
            loaded: false,
            key_index: None,
            lease_until: None,
            held_since: Instant::now(),
            broken: None,
            retry_delay: FIRST_RETRY_DELAY,
            fatal: None,
            frames: Vec::new(),
            shared,
            compactor,
            snapshot_records: config.snapshot_records,
            compaction: None,
            compaction_started: None,
            appended_records: 0,
            appended_bytes: 0,
            forwards: config.advertise.is_some(),
            peer: None,
            caught_up_at: Instant::now(),
            failed_reads: 0,
        };
        let report = match writer.load() {
            Ok(report) => report,
            // Redis is not up yet: served 503 until it is (see `writable`).
            Err(e @ LogError::Redis(_)) => {
                tracing::warn!(error = %e, "redis cannot be reached yet: refusing operations until it can");
                writer.broke(e);
                OpenReport::default()
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        };
        Ok((writer, report))
    }

    /// Whether a round could run now without waiting: the lease is held (so it waits for no
    /// other instance), the state is read and Redis answered the last command. A request
    /// that is alone runs its round on its own thread only then (see [`WriterSeat`]).
    fn ready(&self) -> bool {
        self.fatal.is_none() && self.broken.is_none() && self.loaded && self.lease_held()
    }

    /// Whether this instance holds the lease, by its own clock (which ends it before
    /// Redis does).
    fn lease_held(&self) -> bool {
        self.lease_until.is_some_and(|until| Instant::now() < until)
    }

    /// Connects, checks Redis's settings, finds (or, on first start, creates) the ledger and
    /// reads it into a new state: its snapshot, then the log after it.
    fn load(&mut self) -> Result<OpenReport, LogError> {
        let durability = self.durability;
        let settings = Settings::read(self.link.get()?)?;
        check_settings(&settings, durability)?;
        if self.replicas > 0 {
            // A warning only: a Redis that will not say (an ACL without INFO) still serves.
            let connected = self.log.connected_replicas(self.link.get()?);
            if let Some(connected) = connected.ok().filter(|n| *n < self.replicas) {
                tracing::warn!(
                    connected,
                    asked = self.replicas,
                    "Redis has fewer replicas connected than --redis-replicas asks for: \
                     until they connect, every write is recorded but answered 503 \
                     (outcome unknown)"
                );
            }
        }
        let new_marker = format!(
            "{} {}",
            uuid::Uuid::new_v4().simple(),
            self.shared.clock.now_ms()
        );
        // Only an instance that has never served this ledger may create it: for one that
        // has, an empty Redis is a wiped one.
        let create = self.marker.is_none();
        let (marker, created) = self.log.init(self.link.get()?, &new_marker, create)?;
        let redis_ms = self.log.time(self.link.get()?)?;
        self.set_clock(redis_ms);
        match &self.marker {
            Some(known) if *known != marker => return Err(Refused::Wiped.into()),
            _ => self.marker = Some(marker.clone()),
        }
        if self.shared.peer_secret.get().is_none() {
            let new = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            let secret = self.log.peer_secret(self.link.get()?, &new)?;
            let _ = self.shared.peer_secret.set(secret.into());
        }
        // A compaction between reading the snapshot and the log after it: read again.
        let mut attempts = 0;
        let records = loop {
            attempts += 1;
            match self.load_state() {
                Err(LogError::Compacted(_)) if attempts < 4 => continue,
                result => break result?,
            }
        };
        self.publish_gauges();
        Ok(OpenReport {
            ledger: marker,
            created,
            records,
            settings: Some(settings),
        })
    }

    /// The ledger's time for a round: Redis's clock as last read, run forward by this
    /// instance's, never before a time the ledger has seen.
    fn now(&mut self) -> Millis {
        let now = self
            .shared
            .clock
            .now_ms()
            .saturating_add(self.clock_offset)
            .max(self.last_now);
        self.last_now = now;
        now
    }

    /// Sets the ledger's clock from Redis's, read as `redis_ms` just now.
    fn set_clock(&mut self, redis_ms: Millis) {
        if self.clock_from_redis {
            self.clock_offset = redis_ms - self.shared.clock.now_ms();
        }
    }

    /// Reads the ledger's snapshot and the log after it into a new state, and hands the
    /// history store what it lacks; answers the log's records read.
    fn load_state(&mut self) -> Result<u64, LogError> {
        let projector = &self.shared.projector;
        // What the history was handed is not handed again, written or not: a reload after
        // a failed append does not wait for a history writer that load left behind (it
        // waited up to `CATCH_UP`, with every request queued behind it).
        let held = projector.handed_seq();
        // Loading moves a snapshot's parts and pages of history: its commands get longer
        // than serving's.
        let conn = &mut self.link.separate(self.timeout.max(LOAD_TIMEOUT))?;
        let (mut state, from, mut last_now) = match compaction::load_snapshot(conn, &self.log.keys)?
        {
            Some((pointer, state)) => {
                self.shared
                    .snapshot_version
                    .fetch_max(pointer.version, Ordering::Relaxed);
                self.shared
                    .snapshot_bytes
                    .store(pointer.bytes, Ordering::Relaxed);
                if held < pointer.version {
                    compaction::replay_history(
                        conn,
                        &self.log.keys,
                        projector,
                        held,
                        pointer.version,
                    )?;
                }
                (state, pointer.version, pointer.at_ms)
            }
            None => (State::new(), 0, Millis::MIN),
        };
        let mut replay = Replay::new(&mut state, &mut last_now, projector, held, from);
        let last = self
            .log
            .read_after(conn, from, |record| replay.record(record))?;
        let records = replay.finish(last);
        if held > last {
            // Rounds this instance applied are gone from Redis (it lost acknowledged
            // writes): their history goes too, once written, as the embedded engine cuts a
            // history store found ahead of its journal.
            projector
                .progress()
                .wait_caught_up(crate::history::CATCH_UP);
            let trimmed = projector.history().trim_after(last).unwrap_or(0);
            projector.handed_back_to(last);
            tracing::error!(
                held,
                log = last,
                trimmed,
                "the history this instance keeps was ahead of the ledger's log in Redis"
            );
        }
        // Set when the need changes only: a reload does not wait for the history's writer.
        let key_index = state.archived_keys_need_key_index();
        if self.key_index != Some(key_index) {
            match projector.history().index_keys(key_index) {
                Ok(()) => self.key_index = Some(key_index),
                // Lookups by key still answer without it (by a scan), only slower.
                Err(e) => {
                    tracing::warn!(error = %e, "the history's index of reserve keys was not changed")
                }
            }
        }
        self.state = state;
        self.applied = last;
        self.last_now = last_now;
        self.loaded = true;
        self.lease_until = None;
        Ok(records)
    }

    /// Runs one round (see the module's documentation).
    fn round(&mut self, jobs: Vec<Box<dyn Job>>) {
        let mut jobs = self.read_without_lease(jobs);
        if let Some(peer) = self.peer.clone() {
            jobs = self.forward(jobs, &peer, false);
        }
        if jobs.is_empty() {
            return;
        }
        if let Err(why) = self.writable() {
            self.shared.set_fault(Some(why));
            // Dropped unrun: each is refused with the fault.
            drop(jobs);
            return;
        }
        let now = self.now();
        let base = self.applied;
        let mut seq = base;
        let mut entries = Vec::new();
        let mut finishes = Vec::with_capacity(jobs.len());
        let mut encode_failed = None;
        self.frames.clear();
        for job in jobs {
            let mut ctx = Ctx {
                state: &mut self.state,
                now,
                projector: &self.shared.projector,
                round: &entries,
            };
            let outcome = job.run(&mut ctx);
            Counters::add(&self.shared.counters.commands, 1);
            finishes.extend(outcome.finish);
            if outcome.effects.is_empty() || encode_failed.is_some() {
                continue;
            }
            seq += 1;
            entries.extend(
                outcome
                    .effects
                    .iter()
                    .filter_map(Item::of)
                    .map(|i| (seq, i)),
            );
            let record = JournalRecord {
                seq,
                at_ms: now,
                effects: outcome.effects,
            };
            if let Err(e) = encode_record(&record, &mut self.frames) {
                encode_failed = Some(e.to_string());
            }
        }
        let written = match encode_failed {
            Some(why) => Err(self.failed_append(LogError::Corrupt(why))),
            None if seq == base => Ok(()),
            None => self.append(base, seq, entries),
        };
        for finish in finishes {
            finish(written.clone());
        }
    }

    /// Without the lease: reads the log's version and the lease's holder; when this
    /// instance forwards and a peer holds it, answers the jobs whose requests are meant to
    /// write with the peer's address, untried. Then reads the log to its end and answers
    /// the jobs that change nothing from the state as it ends; gives back those that would
    /// change something (handed on by the round, or waiting for the lease). A holder, a
    /// broken Redis or a state not yet read leave them all to the round.
    fn read_without_lease(&mut self, jobs: Vec<Box<dyn Job>>) -> Vec<Box<dyn Job>> {
        self.peer = None;
        if self.lease_held() || self.fatal.is_some() || self.broken.is_some() || !self.loaded {
            return jobs;
        }
        let read = match self.link.get() {
            Ok(conn) => self.log.version_and_holder(conn),
            Err(e) => Err(e),
        };
        let version = match read {
            Ok((version, holder)) => {
                let peer = holder.and_then(|h| peer_address(&h, &self.log.holder));
                if self.forwards {
                    self.peer = peer;
                    self.shared.set_holder(self.peer.as_ref());
                }
                version
            }
            Err(e) => {
                self.broke(e);
                return jobs;
            }
        };
        // Requests meant to write go to the holder untried: reading its writes first
        // would be for nothing. They are read anyway every so often, so that a read here
        // never has a long way to catch up.
        let jobs = match self.peer.clone() {
            Some(peer) => self.forward(jobs, &peer, true),
            None => jobs,
        };
        if jobs.is_empty() && self.caught_up_at.elapsed() < CATCH_UP_EVERY {
            return jobs;
        }
        if let Err(e) = self.catch_up(version, false) {
            return self.failed_read(e, jobs);
        }
        self.failed_reads = 0;
        self.caught_up_at = Instant::now();
        let now = self.now();
        let mut rest = Vec::new();
        for job in jobs {
            let mut ctx = Ctx {
                state: &mut self.state,
                now,
                projector: &self.shared.projector,
                round: &[],
            };
            match job.read(&mut ctx) {
                Some(job) => rest.push(job),
                None => {
                    let c = &self.shared.counters;
                    Counters::add(&c.commands, 1);
                    Counters::add(&c.reads, 1);
                }
            }
        }
        rest
    }

    /// After a read of the log to its end, without the lease, that failed: `jobs` are the
    /// operations that waited for it. Redis just answered the round's first command, so a
    /// failure to answer this one is most often a reply late on a busy host (three servers,
    /// their clients and Redis sharing two CPUs made one now and then). Such a failure
    /// refuses only `jobs`, untried, and opens no breaker: the connection, which may hold
    /// the rest of a reply, is made anew, and the next round reads on from the records
    /// applied. Only [`FAILED_READS_TO_BREAK`] in a row, or any other failure, open it;
    /// and were Redis down, the next round's first command would open it at once.
    fn failed_read(&mut self, e: LogError, jobs: Vec<Box<dyn Job>>) -> Vec<Box<dyn Job>> {
        self.failed_reads += 1;
        if !matches!(e, LogError::Redis(_))
            || !self.loaded
            || self.failed_reads >= FAILED_READS_TO_BREAK
        {
            self.peer = None;
            self.broke(e);
            return jobs;
        }
        tracing::warn!(
            why = %e,
            refused = jobs.len(),
            "reading the log to its end failed: refused the operations that waited for it; reading on next round"
        );
        Counters::add(&self.shared.counters.failed_reads, 1);
        self.link.reset();
        let why = format!("reading the ledger's log from Redis failed: {e}");
        for job in jobs {
            job.refuse(why.clone());
        }
        Vec::new()
    }

    /// Answers the jobs that may be handed on with the address of `peer`, the lease's
    /// holder (the server sends their requests there); gives back the others, which wait
    /// for the lease. `untried`: before they are tried here (see [`Job::forward`]).
    fn forward(
        &mut self,
        jobs: Vec<Box<dyn Job>>,
        peer: &Arc<str>,
        untried: bool,
    ) -> Vec<Box<dyn Job>> {
        let before = jobs.len();
        let rest: Vec<_> = jobs
            .into_iter()
            .filter_map(|job| job.forward(peer, untried))
            .collect();
        Counters::add(
            &self.shared.counters.forwarded,
            (before - rest.len()) as u64,
        );
        rest
    }

    /// Appends the round's frames (records `base + 1 ..= upto`).
    fn append(
        &mut self,
        base: u64,
        upto: u64,
        entries: Vec<(u64, Item)>,
    ) -> Result<(), StoreError> {
        let sent = Instant::now();
        let lease = self.lease;
        let result = match self.link.get() {
            Ok(conn) => self.log.commit(conn, base, upto, lease, &self.frames),
            Err(e) => Err(e),
        };
        match result {
            Ok(wanted) => {
                let c = &self.shared.counters;
                Counters::add(&c.rounds, 1);
                Counters::add(&c.append_micros, sent.elapsed().as_micros() as u64);
                Counters::add(&c.log_bytes, self.frames.len() as u64);
                self.appended_records += upto - base;
                self.appended_bytes += self.frames.len() as u64;
                self.applied = upto;
                self.lease_until = Some(sent + lease * 3 / 4);
                self.maybe_compact();
                // Handed over before the replies: whoever sees the change acknowledged
                // finds its history on its way.
                if !entries.is_empty() {
                    self.shared.projector.project(upto, entries);
                }
                let replicated = self.replicated();
                if wanted && self.held_since.elapsed() >= HANDOFF_AFTER {
                    Counters::add(&self.shared.counters.handoffs, 1);
                    self.give_up_lease();
                }
                replicated
            }
            Err(e) => Err(self.failed_append(e)),
        }
    }

    /// After an append: waits for the replicas asked for. The round is in the log either
    /// way (the state and `applied` follow it); short of them, its operations are answered
    /// "outcome unknown", since a failover could still lose it, and their retries answer
    /// them from the log.
    fn replicated(&mut self) -> Result<(), StoreError> {
        if self.replicas == 0 {
            return Ok(());
        }
        // Redis answers a WAIT when its own wait ends: half the command timeout, so that
        // a round short of its replicas is answered about as soon as a lost Redis is.
        let (replicas, timeout) = (self.replicas, self.timeout / 2);
        let waited = self.log.wait_replicas(&mut self.link, replicas, timeout);
        let why = match waited {
            Ok(acked) if acked >= replicas => return Ok(()),
            Ok(acked) => format!(
                "recorded by Redis, but {acked} of the {replicas} replicas asked for \
                 acknowledged it in time"
            ),
            Err(e) => {
                let why = format!("recorded by Redis; waiting for its replicas failed: {e}");
                self.broke(e);
                why
            }
        };
        Counters::add(&self.shared.counters.unreplicated, 1);
        Err(StoreError::OutcomeUnknown(why))
    }

    /// After an append that failed: the state is ahead of the log, so it is read again
    /// before anything else is served. Answers the refusal of the round's operations.
    fn failed_append(&mut self, e: LogError) -> StoreError {
        let unknown = e.outcome_unknown();
        self.loaded = false;
        self.lease_until = None;
        let why = e.to_string();
        self.broke(e);
        if unknown {
            StoreError::OutcomeUnknown(why)
        } else {
            StoreError::Unavailable(why)
        }
    }

    /// Records a failure to use Redis: operations are refused at once until the retry.
    fn broke(&mut self, e: LogError) {
        let why = e.to_string();
        if matches!(e, LogError::Refused(Refused::Wiped)) {
            tracing::error!(%why, "refusing every operation until this process is restarted");
            self.fatal = Some(why.clone());
        } else {
            tracing::warn!(%why, "redis failed: refusing operations until it answers again");
        }
        if !matches!(e, LogError::Refused(_)) {
            // A connection that failed may be left mid-reply: a new one is made.
            self.link.reset();
        }
        Counters::add(&self.shared.counters.faults, 1);
        self.lease_until = None;
        self.shared.holding.store(false, Ordering::Relaxed);
        self.broken = Some(Broken {
            why: why.clone(),
            retry_at: Instant::now() + self.retry_delay,
        });
        self.retry_delay = (self.retry_delay * 2).min(MAX_RETRY_DELAY);
        self.failed_reads = 0;
        self.shared.set_fault(Some(why));
    }

    /// Makes sure the round may write: Redis reachable, the state read, the lease held and
    /// the log read to its end.
    fn writable(&mut self) -> Result<(), String> {
        if let Some(why) = &self.fatal {
            return Err(why.clone());
        }
        if let Some(broken) = &self.broken {
            if Instant::now() < broken.retry_at {
                return Err(broken.why.clone());
            }
        }
        if let Err(e) = self.try_writable() {
            let why = e.to_string();
            if !matches!(e, LogError::Refused(Refused::Lease)) {
                self.broke(e);
            }
            return Err(why);
        }
        if self.broken.take().is_some() {
            tracing::info!("redis answers again: serving");
        }
        self.retry_delay = FIRST_RETRY_DELAY;
        self.shared.set_fault(None);
        Ok(())
    }

    fn try_writable(&mut self) -> Result<(), LogError> {
        if !self.loaded {
            Counters::add(&self.shared.counters.reloads, 1);
            self.load()?;
        }
        if self.lease_held() {
            return Ok(());
        }
        let asked = Instant::now();
        let deadline = asked + LEASE_WAIT;
        let waited = |shared: &Shared| {
            Counters::add(
                &shared.counters.lease_wait_micros,
                asked.elapsed().as_micros() as u64,
            )
        };
        loop {
            let sent = Instant::now();
            let lease = self.lease;
            match self.log.acquire(self.link.get()?, lease)? {
                Lease::Held { version, redis_ms } => {
                    self.set_clock(redis_ms);
                    waited(&self.shared);
                    self.catch_up(version, true)?;
                    Counters::add(&self.shared.counters.leases, 1);
                    self.lease_until = Some(sent + lease * 3 / 4);
                    self.held_since = Instant::now();
                    self.shared.holding.store(true, Ordering::Relaxed);
                    // No request goes to a former holder from here on.
                    if self.forwards {
                        self.shared.set_holder(None);
                    }
                    return Ok(());
                }
                Lease::Busy { left_ms, next } => {
                    if Instant::now() >= deadline {
                        waited(&self.shared);
                        return Err(Refused::Lease.into());
                    }
                    Counters::add(&self.shared.counters.lease_waits, 1);
                    let left = Duration::from_millis(left_ms.max(1));
                    // Redis counts a wait in whole milliseconds, and 0 is forever.
                    let block = TURN_BLOCK.min(left);
                    if next && block >= Duration::from_millis(1) {
                        // Woken as the holder gives the lease up; asks again at the latest
                        // as the lease lapses or before its word does.
                        if self.log.await_turn(&mut self.link, block)? {
                            Counters::add(&self.shared.counters.lease_wakes, 1);
                        }
                    } else {
                        std::thread::sleep(LEASE_POLL.min(left));
                    }
                }
            }
        }
    }

    /// Applies the rounds other instances appended, up to `version` at least; `exact`:
    /// exactly (the lease is held, so nobody appends meanwhile).
    fn catch_up(&mut self, version: u64, exact: bool) -> Result<(), LogError> {
        if version == self.applied {
            return Ok(());
        }
        if version < self.applied {
            // Redis lost acknowledged rounds (restarted from an older persistence file):
            // the state is ahead of it and is read again from what it holds.
            tracing::error!(
                redis = version,
                applied = self.applied,
                "the ledger's log in Redis ends before records this instance applied: \
                 Redis lost acknowledged writes; reading the ledger again from it"
            );
            self.loaded = false;
            return Err(LogError::Corrupt(format!(
                "the log went back from record {} to {version}",
                self.applied
            )));
        }
        let Writer {
            log,
            link,
            state,
            last_now,
            shared,
            ..
        } = self;
        let conn = link.get()?;
        let mut replay = Replay::new(state, last_now, &shared.projector, 0, self.applied);
        let read_to = log.read_after(conn, self.applied, |record| replay.record(record));
        let last = match read_to {
            Ok(last) => last,
            Err(LogError::Compacted(_)) => {
                // This instance is behind a compaction: it reads the snapshot.
                drop(replay);
                Counters::add(&self.shared.counters.reloads, 1);
                self.load()?;
                return self.check_caught_up(version, exact);
            }
            Err(e @ LogError::Redis(_)) => {
                // Redis failed between pages (a page is applied only once all of it has
                // arrived): the state is that of the records applied, whole, and the next
                // catch-up goes on after them. Reading the whole ledger again instead
                // kept an instance refusing operations for a second after a slow reply.
                let applied = replay.last;
                let read = replay.finish(applied);
                Counters::add(&shared.counters.records_read, read);
                self.applied = applied;
                return Err(e);
            }
            Err(e) => {
                // A record may be applied in part: the state is read again.
                self.loaded = false;
                return Err(e);
            }
        };
        let read = replay.finish(last);
        Counters::add(&shared.counters.records_read, read);
        self.applied = last;
        self.check_caught_up(version, exact)
    }

    /// After reading the log: whether it ended where it had to.
    fn check_caught_up(&mut self, version: u64, exact: bool) -> Result<(), LogError> {
        let last = self.applied;
        if last < version || (exact && last != version) {
            self.loaded = false;
            return Err(LogError::Corrupt(format!(
                "the log's version is {version} but its records end at {last}"
            )));
        }
        Ok(())
    }

    /// After an append: once the log holds enough records past the snapshot, and at least
    /// the snapshot's size of them, a compactor thread replaces them by a snapshot of the
    /// state as of now (see [`compaction`]).
    fn maybe_compact(&mut self) {
        if self.compaction.as_ref().is_some_and(|c| !c.is_finished()) {
            return;
        }
        if let Some(done) = self.compaction.take() {
            let _ = done.join();
        }
        let known = self.shared.snapshot_version.load(Ordering::Relaxed);
        let spaced = self
            .compaction_started
            .is_none_or(|at| at.elapsed() >= COMPACTION_SPACING);
        let (Some(marker), true) = (self.marker.clone(), spaced) else {
            return;
        };
        // Enough records; and past a small size, a tail at least as large as the snapshot
        // that would replace it: a large state is not rewritten for a short tail (the log
        // is then written to snapshots about once over, and a start replays at most about
        // a snapshot's size of it).
        let tail = self.applied.saturating_sub(known);
        let record_bytes = self.appended_bytes / self.appended_records.max(1);
        let snapshot_bytes = self.shared.snapshot_bytes.load(Ordering::Relaxed);
        let tail_too_short = snapshot_bytes > SMALL_SNAPSHOT_BYTES
            && tail.saturating_mul(record_bytes) < snapshot_bytes;
        if tail < self.snapshot_records || tail_too_short {
            return;
        }
        let (version, at_ms) = (self.applied, self.last_now);
        let source = self.state.snapshot_source();
        let compactor = self.compactor.clone();
        let shared = self.shared.clone();
        self.compaction_started = Some(Instant::now());
        let spawned = thread::Builder::new()
            .name("cycles-redis-compact".into())
            .spawn(move || {
                let started = Instant::now();
                let counters = &shared.counters;
                match compactor.compact(&marker, version, at_ms, &source) {
                    Ok(Compacted::Done { version, bytes }) => {
                        shared.snapshot_version.fetch_max(version, Ordering::Relaxed);
                        shared.snapshot_bytes.store(bytes, Ordering::Relaxed);
                        Counters::add(&counters.snapshots, 1);
                        tracing::info!(
                            version,
                            bytes,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "the ledger's log compacted into a snapshot"
                        );
                    }
                    Ok(Compacted::Skipped(version)) => {
                        shared.snapshot_version.fetch_max(version, Ordering::Relaxed);
                    }
                    Err(e) => {
                        Counters::add(&counters.snapshot_failures, 1);
                        tracing::warn!(error = %e, version, "compacting the ledger's log failed; the log keeps its records");
                    }
                }
            });
        match spawned {
            Ok(handle) => self.compaction = Some(handle),
            Err(e) => tracing::warn!(error = %e, "the compactor thread could not start"),
        }
    }

    /// While no operation comes: gives the lease up to an instance that wants it.
    fn idle(&mut self) {
        if self.lease_until.is_none() || self.broken.is_some() {
            return;
        }
        if self
            .lease_until
            .is_some_and(|until| Instant::now() >= until)
        {
            self.lease_until = None;
            self.shared.holding.store(false, Ordering::Relaxed);
            return;
        }
        let wanted = match self.link.get() {
            Ok(conn) => self.log.wanted(conn),
            Err(e) => Err(e),
        };
        match wanted {
            Ok(true) => {
                Counters::add(&self.shared.counters.handoffs, 1);
                self.give_up_lease();
            }
            Ok(false) => {}
            Err(e) => self.broke(e),
        }
    }

    fn give_up_lease(&mut self) {
        if self.lease_until.take().is_none() {
            return;
        }
        self.shared.holding.store(false, Ordering::Relaxed);
        if let Some(conn) = self.link.open() {
            if let Err(e) = self.log.release(conn) {
                // It lapses by itself.
                tracing::debug!(error = %e, "releasing the writer's lease failed");
            }
        }
    }

    fn publish_gauges(&self) {
        let s = &self.shared;
        s.version.store(self.applied, Ordering::Relaxed);
        s.reservations
            .store(self.state.reservation_count() as u64, Ordering::Relaxed);
        s.budgets
            .store(self.state.budget_count() as u64, Ordering::Relaxed);
        s.deliveries_due
            .store(self.state.deliveries_due() as u64, Ordering::Relaxed);
        s.archived_keys
            .store(self.state.archived_key_count() as u64, Ordering::Relaxed);
    }
}

/// Records read from the log, applied to a state and their history handed to the history
/// store in batches (a whole log's history is never held in memory at once).
struct Replay<'a> {
    state: &'a mut State,
    last_now: &'a mut Millis,
    projector: &'a Projector,
    /// The history store holds the history of records up to this one already.
    held: u64,
    pending: Vec<(u64, Item)>,
    records: u64,
    /// The last record applied.
    last: u64,
}

/// History items handed over at a time while replaying.
const REPLAY_BATCH: usize = 4096;

impl<'a> Replay<'a> {
    /// A replay of the records after record `after`, which `state` holds.
    fn new(
        state: &'a mut State,
        last_now: &'a mut Millis,
        projector: &'a Projector,
        held: u64,
        after: u64,
    ) -> Self {
        Replay {
            state,
            last_now,
            projector,
            held,
            pending: Vec::new(),
            records: 0,
            last: after,
        }
    }

    fn record(&mut self, record: JournalRecord) {
        self.records += 1;
        self.last = record.seq;
        for effect in &record.effects {
            self.state.apply_effect(effect);
        }
        *self.last_now = (*self.last_now).max(record.at_ms);
        if record.seq > self.held {
            let items = record.effects.iter().filter_map(Item::of);
            self.pending.extend(items.map(|item| (record.seq, item)));
        }
        if self.pending.len() >= REPLAY_BATCH {
            self.projector
                .project(record.seq, std::mem::take(&mut self.pending));
        }
    }

    /// Hands the rest over, as of record `last`; answers how many records were read.
    fn finish(self, last: u64) -> u64 {
        if !self.pending.is_empty() {
            self.projector.project(last, self.pending);
        }
        self.records
    }
}

/// Refuses Redis settings under which it would lose budgets without saying so.
fn check_settings(settings: &Settings, durability: RedisDurability) -> Result<(), LogError> {
    if settings.maxmemory_policy != "noeviction" {
        return Err(LogError::Corrupt(format!(
            "Redis's maxmemory-policy is {}: under memory pressure it would delete the \
             ledger's keys; set it to noeviction",
            settings.maxmemory_policy
        )));
    }
    if durability == RedisDurability::Aof && settings.appendonly != "yes" {
        return Err(LogError::Corrupt(
            "Redis keeps no append-only file (appendonly no): a Redis restart would lose the \
             ledger. Turn it on (appendonly yes, appendfsync always for no loss at all), or \
             start with --redis-durability none to accept the loss"
                .into(),
        ));
    }
    Ok(())
}
