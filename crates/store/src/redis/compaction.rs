//! Compaction: the head of the ledger's log replaced by a snapshot of the state, and the
//! history it carried kept apart, for as long as its retention lasts.
//!
//! Without it the log would grow for as long as the ledger lives, and every instance would
//! replay all of it to start. Once the log holds [`RedisConfig::snapshot_records`] records
//! past the last snapshot, the lease holder hands a frozen view of its state
//! (`State::snapshot_source`, O(1)) to a compactor thread, which, under a lock in Redis so
//! that one instance compacts at a time:
//!
//! 1. copies the history of the records it will remove (audit entries, events, delivery
//!    versions, archived reservations) into one stream per kind (`{ns}:history:<kind>`),
//!    each entry about [`CHUNK_BYTES`] of the records that carry that kind, with only those
//!    effects, its id the last record's sequence number;
//! 2. writes the snapshot (the embedded engine's snapshot bytes, checksummed) in parts of
//!    [`PART_BYTES`] under a name of its own, listed as pending first, so parts a crash
//!    leaves behind are found and deleted by the next compaction;
//! 3. in one script, fenced by the ledger's marker and the lock, points the ledger at the
//!    new snapshot;
//! 4. trims the log's records up to it, a bounded number of entries per command
//!    ([`trim_log`]);
//! 5. deletes the parts of the snapshots replaced, and the history past its retention.
//!
//! The lock lasts [`LOCK_TTL`] unless its holder extends it, which a compaction does as it
//! goes on ([`Lock::keep`]): a compactor that died holds the next one up no longer than
//! that. Every write a compaction makes that another compactor's could meet is fenced by
//! the lock (history appended, parts deleted, the pointer moved), so a compaction that
//! stalled past the lock's time to live fails at its next such write and harms nothing.
//!
//! A snapshot at version `v` is the state of the log's records up to `v`, whoever computes
//! it, so no lease is needed: the script only moves the pointer forward, and only over
//! records the log holds. Readers find the log starting after the snapshot: an instance
//! whose next record was trimmed reads the snapshot again ([`LogError::Compacted`]), and a
//! reader that finds a part gone (replaced meanwhile) reads the pointer again.
//!
//! [`RedisConfig::snapshot_records`]: super::RedisConfig::snapshot_records

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::Script;
use ledger::{Effect, Millis, SnapshotSource, State};

use super::log::{read_frames, Conn, Keys, LogError, Refused, Topology};
use crate::embedded::journal::{encode_record, JournalRecord};
use crate::embedded::snapshot::{encode_snapshot_into, parse_snapshot};
use crate::history::{Cutoffs, Item, Projector, Retention};
use crate::Clock;

/// A snapshot's bytes per key: small enough that one `SET` or `GET` holds Redis up for
/// no more than a moment, and arrives within the command timeout.
pub const PART_BYTES: usize = 1 << 20;
/// How long the compactor's lock lasts unless extended: a compactor that died holds up the
/// next one no longer. Well above the longest a compactor's command may take, since the
/// lock is extended between commands.
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// Snapshot parts deleted per command.
const PARTS_PER_DELETE: usize = 64;
/// Log entries (rounds) read per page while copying history out.
const LOG_PAGE: usize = 32;
/// A history entry's records, at least, before it is appended (so that a page of entries
/// read back arrives within a command's timeout).
const CHUNK_BYTES: usize = 256 << 10;
/// History entries read per page while replaying them.
const HISTORY_PAGE: usize = 8;
/// History entries past their retention deleted per script call, at most.
const TRIM_BATCH: u64 = 256;
/// Log entries (rounds) trimmed per command once the snapshot holds them: a compacted log
/// of 100 000 records freed in one command held Redis up for 17 ms, a third of the other
/// instances' command timeout (50 ms by default), and a log of larger rounds longer.
const TRIM_ENTRIES: u64 = 1_000;
/// History items handed to the history store at a time while replaying.
const REPLAY_BATCH: usize = 4096;

/// The kinds of history, each kept in a stream of its own, for its own retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryKind {
    /// Audit entries of a known caller.
    Audit,
    /// Audit entries of requests refused before their caller was known.
    UnauthenticatedAudit,
    Events,
    Deliveries,
    Archived,
}

impl HistoryKind {
    pub const ALL: [HistoryKind; 5] = [
        HistoryKind::Audit,
        HistoryKind::UnauthenticatedAudit,
        HistoryKind::Events,
        HistoryKind::Deliveries,
        HistoryKind::Archived,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HistoryKind::Audit => "audit",
            HistoryKind::UnauthenticatedAudit => "audit-unauthenticated",
            HistoryKind::Events => "events",
            HistoryKind::Deliveries => "deliveries",
            HistoryKind::Archived => "archived",
        }
    }

    fn of(effect: &Effect) -> Option<HistoryKind> {
        match effect {
            Effect::Audit(e) if e.tenant_id == ledger::UNAUTH_TENANT => {
                Some(HistoryKind::UnauthenticatedAudit)
            }
            Effect::Audit(_) => Some(HistoryKind::Audit),
            Effect::Event(_) => Some(HistoryKind::Events),
            Effect::PutDelivery(_) => Some(HistoryKind::Deliveries),
            Effect::ArchiveReservation(_) => Some(HistoryKind::Archived),
            _ => None,
        }
    }

    /// Entries whose newest record is older than this are past retention (`None`: kept).
    /// A record is never older than the history it carries, so none goes early.
    fn cutoff(self, cutoffs: &Cutoffs) -> Option<Millis> {
        match self {
            HistoryKind::Audit => cutoffs.authenticated,
            HistoryKind::UnauthenticatedAudit => cutoffs.unauthenticated,
            HistoryKind::Events => cutoffs.events,
            HistoryKind::Deliveries => cutoffs.deliveries,
            HistoryKind::Archived => cutoffs.settled,
        }
    }
}

/// The snapshot the log starts after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    pub name: String,
    /// The last record the snapshot holds.
    pub version: u64,
    pub parts: u64,
    /// The ledger's time as of that record.
    pub at_ms: Millis,
    pub bytes: u64,
}

/// The ledger's snapshot pointer, if it has one.
pub fn pointer(conn: &mut Conn, keys: &Keys) -> Result<Option<Pointer>, LogError> {
    let fields: std::collections::HashMap<String, String> = ::redis::cmd("HGETALL")
        .arg(&keys.snapshot)
        .query(conn.link())?;
    if fields.is_empty() {
        return Ok(None);
    }
    let number = |name: &str| -> Result<i64, LogError> {
        fields
            .get(name)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| LogError::Corrupt(format!("the snapshot pointer's {name} is missing")))
    };
    Ok(Some(Pointer {
        name: fields.get("name").cloned().unwrap_or_default(),
        version: number("version")? as u64,
        parts: number("parts")? as u64,
        at_ms: number("at")?,
        bytes: number("bytes")? as u64,
    }))
}

/// The snapshot the log starts after, and the state it holds (`None`: the log starts at
/// its first record).
pub fn load_snapshot(conn: &mut Conn, keys: &Keys) -> Result<Option<(Pointer, State)>, LogError> {
    // A compaction may replace the snapshot while it is read: its parts then go, and the
    // pointer is read again.
    for _ in 0..8 {
        let Some(pointer) = pointer(conn, keys)? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(pointer.bytes as usize);
        let mut whole = true;
        for i in 0..pointer.parts {
            let part: Option<Vec<u8>> = ::redis::cmd("GET")
                .arg(keys.snapshot_part(&pointer.name, i))
                .query(conn.link())?;
            match part {
                Some(part) => bytes.extend_from_slice(&part),
                None => {
                    whole = false;
                    break;
                }
            }
        }
        if !whole {
            continue;
        }
        let Some((seq, data)) = parse_snapshot(&bytes) else {
            return Err(LogError::Corrupt(format!(
                "the ledger's snapshot at record {} is damaged in Redis",
                pointer.version
            )));
        };
        if seq != pointer.version {
            return Err(LogError::Corrupt(format!(
                "the ledger's snapshot holds records up to {seq}, its pointer says {}",
                pointer.version
            )));
        }
        return Ok(Some((pointer, State::from_snapshot(data))));
    }
    Err(LogError::Corrupt(
        "the ledger's snapshot was replaced every time it was read".into(),
    ))
}

/// Deletes the parts of the snapshot named `name`; with `lock`, only while this instance
/// holds the compactor's lock.
pub fn delete_parts(
    conn: &mut Conn,
    keys: &Keys,
    name: &str,
    lock: Option<&Lock<'_>>,
) -> Result<(), LogError> {
    // Parts are written in order (0 to the last, then 0 again): a batch that finds one
    // missing has passed their end.
    let mut first = 0;
    loop {
        let parts: Vec<String> = (first..first + PARTS_PER_DELETE as u64)
            .map(|i| keys.snapshot_part(name, i))
            .collect();
        let deleted: i64 = match lock {
            Some(lock) => lock.drop_parts(conn, &parts)?,
            None => ::redis::cmd("UNLINK").arg(&parts).query(conn.link())?,
        };
        if deleted < PARTS_PER_DELETE as i64 {
            return Ok(());
        }
        first += PARTS_PER_DELETE as u64;
    }
}

/// The compactor's lock, while this instance holds it for a compaction.
pub struct Lock<'a> {
    key: &'a str,
    holder: &'a str,
    ttl: Duration,
    scripts: &'a Scripts,
    /// When the lock's time to live last started again, at the latest.
    extended: Instant,
}

impl Lock<'_> {
    /// Extends the lock, once a tenth of its time to live has passed since it last was;
    /// refused if it lapsed meanwhile.
    fn keep(&mut self, conn: &mut Conn) -> Result<(), LogError> {
        if self.extended.elapsed() < self.ttl / 10 {
            return Ok(());
        }
        let asked = Instant::now();
        let held: i64 = self
            .scripts
            .hold
            .key(self.key)
            .arg(self.holder)
            .arg(self.ttl.as_millis() as u64)
            .invoke(conn.link())?;
        if held == 0 {
            return Err(Refused::CompactorLock.into());
        }
        self.extended = asked;
        Ok(())
    }

    /// Deletes `parts` if this instance still holds the lock; answers how many it deleted.
    fn drop_parts(&self, conn: &mut Conn, parts: &[String]) -> Result<i64, LogError> {
        let mut script = self.scripts.drop_parts.key(self.key);
        for part in parts {
            script.key(part);
        }
        let deleted: i64 = script.arg(self.holder).invoke(conn.link())?;
        if deleted < 0 {
            return Err(Refused::CompactorLock.into());
        }
        Ok(deleted)
    }
}

/// Trims the log's entries up to record `version`, which the snapshot now holds, without
/// holding Redis up: whole stream nodes, at most [`TRIM_ENTRIES`] entries a command
/// (`MINID ~ … LIMIT`), then exactly, which leaves at most the node `version` ends in to
/// cut. No lock is needed: every record trimmed is in a snapshot the pointer already names
/// (it only moves forward). A reader meanwhile either reads records still there, which it
/// may replay as well as read from the snapshot, or finds a gap and reads the snapshot
/// ([`LogError::Compacted`]).
fn trim_log(conn: &mut Conn, keys: &Keys, version: u64) -> Result<(), LogError> {
    let first_kept = format!("{}-0", version + 1);
    loop {
        let trimmed: u64 = ::redis::cmd("XTRIM")
            .arg(&keys.log)
            .arg("MINID")
            .arg("~")
            .arg(&first_kept)
            .arg("LIMIT")
            .arg(TRIM_ENTRIES)
            .query(conn.link())?;
        if trimmed == 0 {
            break;
        }
    }
    let _: u64 = ::redis::cmd("XTRIM")
        .arg(&keys.log)
        .arg("MINID")
        .arg(&first_kept)
        .query(conn.link())?;
    Ok(())
}

fn entry_seq(id: &str) -> Result<u64, LogError> {
    id.split('-')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| LogError::Corrupt(format!("a history entry's id is {id:?}")))
}

/// One kind's stream, read forward from a record on, a page at a time.
struct Cursor {
    key: String,
    /// The id of the last entry read.
    after: String,
    records: VecDeque<JournalRecord>,
    done: bool,
}

impl Cursor {
    fn new(key: String, held: u64) -> Cursor {
        Cursor {
            key,
            after: format!("({held}-0"),
            records: VecDeque::new(),
            done: false,
        }
    }

    /// The next record after `held` up to `upto` (`None`: there is none). Records past
    /// `upto` are those a compaction copied but did not finish: the log still has them.
    fn peek_within(
        &mut self,
        conn: &mut Conn,
        held: u64,
        upto: u64,
    ) -> Result<Option<u64>, LogError> {
        while let Some(seq) = self.peek(conn)? {
            if seq > upto {
                self.done = true;
                self.records.clear();
            } else if seq <= held {
                self.records.pop_front();
            } else {
                return Ok(Some(seq));
            }
        }
        Ok(None)
    }

    /// The next record's sequence number (`None`: the stream is read to its end).
    fn peek(&mut self, conn: &mut Conn) -> Result<Option<u64>, LogError> {
        while self.records.is_empty() && !self.done {
            let page: ::redis::streams::StreamRangeReply = ::redis::cmd("XRANGE")
                .arg(&self.key)
                .arg(&self.after)
                .arg("+")
                .arg("COUNT")
                .arg(HISTORY_PAGE)
                .query(conn.link())?;
            if page.ids.len() < HISTORY_PAGE {
                self.done = true;
            }
            for entry in &page.ids {
                let frames: Vec<u8> = entry.get("r").ok_or_else(|| {
                    LogError::Corrupt(format!("history entry {} has no records", entry.id))
                })?;
                read_frames(&frames, "history", |record| {
                    self.records.push_back(record);
                    true
                })?;
                self.after = format!("({}", entry.id);
            }
        }
        Ok(self.records.front().map(|r| r.seq))
    }
}

/// Hands the history store the history kept apart of the records after `held` up to
/// `upto`, in the records' order, in batches that each end on a whole record (the history
/// store's position is then always a record whose history it holds whole). Answers the
/// items handed over.
pub fn replay_history(
    conn: &mut Conn,
    keys: &Keys,
    projector: &Projector,
    held: u64,
    upto: u64,
) -> Result<u64, LogError> {
    let mut cursors: Vec<Cursor> = HistoryKind::ALL
        .iter()
        .map(|kind| Cursor::new(keys.history(kind.name()), held))
        .collect();
    let mut pending = Vec::new();
    let mut items = 0;
    loop {
        let mut next: Option<u64> = None;
        for cursor in &mut cursors {
            if let Some(seq) = cursor.peek_within(conn, held, upto)? {
                next = Some(next.map_or(seq, |n| n.min(seq)));
            }
        }
        let Some(seq) = next else { break };
        // One record's history, from each stream that holds some of it.
        for cursor in &mut cursors {
            if cursor.records.front().is_some_and(|r| r.seq == seq) {
                let record = cursor.records.pop_front().expect("peeked just above");
                pending.extend(record.effects.iter().filter_map(Item::of).map(|i| (seq, i)));
            }
        }
        if pending.len() >= REPLAY_BATCH {
            items += pending.len() as u64;
            projector.project(seq, std::mem::take(&mut pending));
        }
    }
    items += pending.len() as u64;
    projector.project(upto, pending);
    Ok(items)
}

/// What a compactor needs to know, cloned from the engine's configuration.
#[derive(Clone)]
pub struct Compactor {
    pub url: String,
    pub topology: Topology,
    pub keys: Keys,
    /// Who holds the compactor's lock while this one compacts.
    pub holder: String,
    pub retention: Retention,
    pub clock: Arc<dyn Clock>,
    pub timeout: Duration,
    /// Records past the current snapshot that make a new one worth writing.
    pub snapshot_records: u64,
    /// How long the compactor's lock lasts unless extended ([`LOCK_TTL`]).
    pub lock_ttl: Duration,
}

/// What one compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compacted {
    /// The log now starts after this snapshot.
    Done { version: u64, bytes: u64 },
    /// Another instance compacts, or compacted further already: the pointer's version.
    Skipped(u64),
}

struct Scripts {
    history: Script,
    commit: Script,
    trim: Script,
    hold: Script,
    drop_parts: Script,
    unlock: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            history: Script::new(include_str!("history.lua")),
            commit: Script::new(include_str!("compact.lua")),
            trim: Script::new(include_str!("trim.lua")),
            hold: Script::new(include_str!("hold.lua")),
            drop_parts: Script::new(include_str!("drop_parts.lua")),
            unlock: Script::new(include_str!("unlock.lua")),
        }
    }
}

impl Compactor {
    /// Replaces the log's records up to `version` by `source`, the state as of it (see the
    /// module's documentation). `marker`: the ledger's, which the writes are fenced by.
    pub fn compact(
        &self,
        marker: &str,
        version: u64,
        at_ms: Millis,
        source: &SnapshotSource,
    ) -> Result<Compacted, LogError> {
        let scripts = Scripts::default();
        let mut conn = Conn::open(&self.url, &self.topology, self.timeout)?;
        let locked = self.try_lock(&scripts, &mut conn)?;
        let current = pointer(&mut conn, &self.keys)?.map_or(0, |p| p.version);
        // Another instance may have compacted since this one last looked.
        let mut lock = match locked {
            Some(lock) if version >= current.saturating_add(self.snapshot_records) => lock,
            Some(_) => {
                self.unlock(&scripts, &mut conn);
                return Ok(Compacted::Skipped(current));
            }
            None => return Ok(Compacted::Skipped(current)),
        };
        let result = self.compact_locked(
            &mut lock, &mut conn, marker, current, version, at_ms, source,
        );
        self.unlock(&scripts, &mut conn);
        result
    }

    /// Takes the compactor's lock, unless another instance holds it.
    fn try_lock<'a>(
        &'a self,
        scripts: &'a Scripts,
        conn: &mut Conn,
    ) -> Result<Option<Lock<'a>>, LogError> {
        let asked = Instant::now();
        let locked: Option<String> = ::redis::cmd("SET")
            .arg(&self.keys.compacting)
            .arg(&self.holder)
            .arg("NX")
            .arg("PX")
            .arg(self.lock_ttl.as_millis() as u64)
            .query(conn.link())?;
        Ok(locked.map(|_| Lock {
            key: &self.keys.compacting,
            holder: &self.holder,
            ttl: self.lock_ttl,
            scripts,
            extended: asked,
        }))
    }

    fn unlock(&self, scripts: &Scripts, conn: &mut Conn) {
        let unlocked: Result<i64, _> = scripts
            .unlock
            .key(&self.keys.compacting)
            .arg(&self.holder)
            .invoke(conn.link());
        if let Err(e) = unlocked {
            // It lapses by itself.
            tracing::debug!(error = %e, "releasing the compactor's lock failed");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn compact_locked(
        &self,
        lock: &mut Lock<'_>,
        conn: &mut Conn,
        marker: &str,
        from: u64,
        version: u64,
        at_ms: Millis,
        source: &SnapshotSource,
    ) -> Result<Compacted, LogError> {
        let k = &self.keys;
        self.delete_pending(conn, lock, None)?;
        self.copy_history(lock, conn, marker, from, version)?;
        let name = format!("{version}.{}", uuid::Uuid::new_v4().simple());
        let _: i64 = ::redis::cmd("SADD")
            .arg(&k.pending)
            .arg(&name)
            .query(conn.link())?;
        let (parts, bytes) = write_snapshot(conn, k, lock, &name, version, source)?;
        let status: String = lock
            .scripts
            .commit
            .key(&k.marker)
            .key(&k.version)
            .key(&k.snapshot)
            .key(&k.log)
            .key(&k.pending)
            .key(&k.compacting)
            .arg(marker)
            .arg(&self.holder)
            .arg(&name)
            .arg(version)
            .arg(parts)
            .arg(at_ms)
            .arg(bytes)
            .invoke(conn.link())?;
        match status.as_str() {
            "OK" => {}
            "WIPED" => return Err(Refused::Wiped.into()),
            // Its parts are pending: the compaction that holds the lock now deletes them.
            "LOCK" => return Err(Refused::CompactorLock.into()),
            other => {
                // Its parts are pending: the next compaction deletes them, or this one now.
                self.delete_pending(conn, lock, None)?;
                return Err(LogError::Corrupt(format!(
                    "compaction to record {version} refused: {other}"
                )));
            }
        }
        trim_log(conn, k, version)?;
        self.delete_pending(conn, lock, Some(&name))?;
        self.trim_history(lock, conn)?;
        Ok(Compacted::Done { version, bytes })
    }

    /// Deletes the parts of every pending snapshot but `keep` (the current one).
    fn delete_pending(
        &self,
        conn: &mut Conn,
        lock: &mut Lock<'_>,
        keep: Option<&str>,
    ) -> Result<(), LogError> {
        let k = &self.keys;
        let current = pointer(conn, k)?.map(|p| p.name);
        let names: Vec<String> = ::redis::cmd("SMEMBERS")
            .arg(&k.pending)
            .query(conn.link())?;
        for name in names {
            if Some(name.as_str()) == keep || current.as_deref() == Some(name.as_str()) {
                let _: i64 = ::redis::cmd("SREM")
                    .arg(&k.pending)
                    .arg(&name)
                    .query(conn.link())?;
                continue;
            }
            delete_parts(conn, k, &name, Some(lock))?;
            let _: i64 = ::redis::cmd("SREM")
                .arg(&k.pending)
                .arg(&name)
                .query(conn.link())?;
        }
        Ok(())
    }

    /// Copies the history of the log's records after `from` up to `version` into the
    /// history streams, continuing where each stream ends (a compaction that failed may
    /// have copied some already).
    fn copy_history(
        &self,
        lock: &mut Lock<'_>,
        conn: &mut Conn,
        marker: &str,
        from: u64,
        version: u64,
    ) -> Result<(), LogError> {
        let k = &self.keys;
        let mut copied = [0u64; 5];
        for (i, kind) in HistoryKind::ALL.iter().enumerate() {
            let last: ::redis::streams::StreamRangeReply = ::redis::cmd("XREVRANGE")
                .arg(k.history(kind.name()))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query(conn.link())?;
            copied[i] = match last.ids.first() {
                Some(entry) => entry_seq(&entry.id)?.max(from),
                None => from,
            };
        }
        let mut after = copied.iter().copied().min().unwrap_or(from);
        let mut chunks: [Chunk; 5] = Default::default();
        while after < version {
            lock.keep(conn)?;
            let page: ::redis::streams::StreamRangeReply = ::redis::cmd("XRANGE")
                .arg(&k.log)
                .arg(format!("({after}-0"))
                .arg(format!("{version}-0"))
                .arg("COUNT")
                .arg(LOG_PAGE)
                .query(conn.link())?;
            let Some(last) = page.ids.last() else {
                return Err(LogError::Corrupt(format!(
                    "the log ends at record {after}, before the snapshot's {version}"
                )));
            };
            let page_end = entry_seq(&last.id)?;
            for entry in &page.ids {
                let frames: Vec<u8> = entry.get("r").ok_or_else(|| {
                    LogError::Corrupt(format!("log entry {} has no records", entry.id))
                })?;
                let mut encoded = Ok(());
                read_frames(&frames, "log", |record| {
                    encoded = split_history(record, &copied, &mut chunks);
                    encoded.is_ok()
                })?;
                encoded?;
                for (i, chunk) in chunks.iter_mut().enumerate() {
                    if chunk.frames.len() >= CHUNK_BYTES {
                        self.append_history(lock, conn, marker, HistoryKind::ALL[i], chunk)?;
                    }
                }
            }
            after = page_end;
        }
        for (i, chunk) in chunks.iter_mut().enumerate() {
            if !chunk.frames.is_empty() {
                self.append_history(lock, conn, marker, HistoryKind::ALL[i], chunk)?;
            }
        }
        Ok(())
    }

    /// Appends `chunk` to its kind's stream (fenced by the marker and the lock), and
    /// empties it.
    fn append_history(
        &self,
        lock: &mut Lock<'_>,
        conn: &mut Conn,
        marker: &str,
        kind: HistoryKind,
        chunk: &mut Chunk,
    ) -> Result<(), LogError> {
        let k = &self.keys;
        lock.keep(conn)?;
        let status: String = lock
            .scripts
            .history
            .key(&k.marker)
            .key(&k.compacting)
            .key(k.history(kind.name()))
            .arg(marker)
            .arg(&self.holder)
            .arg(format!("{}-0", chunk.last))
            .arg(chunk.at)
            .arg(&chunk.frames)
            .invoke(conn.link())?;
        *chunk = Chunk::default();
        match status.as_str() {
            "OK" => Ok(()),
            "WIPED" => Err(Refused::Wiped.into()),
            "LOCK" => Err(Refused::CompactorLock.into()),
            other => Err(LogError::Corrupt(format!(
                "copying history refused: {other}"
            ))),
        }
    }

    /// Deletes history entries past their retention, oldest first.
    fn trim_history(&self, lock: &mut Lock<'_>, conn: &mut Conn) -> Result<(), LogError> {
        let cutoffs = self.retention.cutoffs(self.clock.now_ms());
        for kind in HistoryKind::ALL {
            let Some(cutoff) = kind.cutoff(&cutoffs) else {
                continue;
            };
            loop {
                lock.keep(conn)?;
                let deleted: u64 = lock
                    .scripts
                    .trim
                    .key(self.keys.history(kind.name()))
                    .arg(cutoff)
                    .arg(TRIM_BATCH)
                    .invoke(conn.link())?;
                if deleted < TRIM_BATCH {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Streams the snapshot of `source` at `version` into the parts of the snapshot `name`, in
/// order, never holding more than two parts of it; answers how many parts and bytes.
fn write_snapshot(
    conn: &mut Conn,
    keys: &Keys,
    lock: &mut Lock<'_>,
    name: &str,
    version: u64,
    source: &SnapshotSource,
) -> Result<(u64, u64), LogError> {
    let mut parts = Parts {
        conn,
        keys,
        lock,
        name,
        first: Vec::with_capacity(PART_BYTES),
        current: Vec::new(),
        written: 0,
        len: 0,
        at: 0,
    };
    encode_snapshot_into(&mut parts, version, source).map_err(|e| {
        match e.downcast::<LogError>() {
            Ok(e) => e,
            Err(e) => LogError::Corrupt(format!("encoding the snapshot: {e}")),
        }
    })?;
    parts.finish()?;
    Ok((parts.written, parts.len))
}

/// A snapshot's bytes on their way to Redis, a part at a time. The first part stays in
/// memory to the end (its header's length and checksum are filled in last) and is written
/// again then; every other goes once full.
struct Parts<'a, 'l> {
    conn: &'a mut Conn,
    keys: &'a Keys,
    lock: &'a mut Lock<'l>,
    name: &'a str,
    first: Vec<u8>,
    current: Vec<u8>,
    /// Parts written so far.
    written: u64,
    len: u64,
    /// Where the next write goes.
    at: u64,
}

impl Parts<'_, '_> {
    fn set(&mut self, index: u64, bytes: &[u8]) -> Result<(), LogError> {
        self.lock.keep(self.conn)?;
        let _: () = ::redis::cmd("SET")
            .arg(self.keys.snapshot_part(self.name, index))
            .arg(bytes)
            .query(self.conn.link())?;
        Ok(())
    }

    /// Writes the full first part (once: parts go in order, so a crash leaves no gap),
    /// or a full later one.
    fn flush_full(&mut self) -> Result<(), LogError> {
        if self.written == 0 && self.first.len() == PART_BYTES {
            let first = std::mem::take(&mut self.first);
            self.set(0, &first)?;
            self.first = first;
            self.written = 1;
        }
        if self.current.len() == PART_BYTES {
            let current = std::mem::take(&mut self.current);
            self.set(self.written, &current)?;
            self.written += 1;
        }
        Ok(())
    }

    /// Writes the last part, then the first again, as it ends.
    fn finish(&mut self) -> Result<(), LogError> {
        if self.written == 0 {
            self.written = 1;
        } else if !self.current.is_empty() {
            let current = std::mem::take(&mut self.current);
            self.set(self.written, &current)?;
            self.written += 1;
        }
        let first = std::mem::take(&mut self.first);
        self.set(0, &first)
    }
}

impl std::io::Write for Parts<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.at < self.len {
            // A patch of the header, in the first part.
            let at = self.at as usize;
            let end = at + buf.len();
            if end > self.first.len() {
                return Err(std::io::Error::other(
                    "a snapshot is patched only in its header",
                ));
            }
            self.first[at..end].copy_from_slice(buf);
            self.at = end as u64;
            return Ok(buf.len());
        }
        let into = if self.written == 0 {
            &mut self.first
        } else {
            &mut self.current
        };
        let n = buf.len().min(PART_BYTES - into.len());
        into.extend_from_slice(&buf[..n]);
        self.len += n as u64;
        self.at = self.len;
        self.flush_full().map_err(std::io::Error::other)?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::io::Seek for Parts<'_, '_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.at = match to {
            std::io::SeekFrom::Start(n) => n,
            std::io::SeekFrom::End(d) => self.len.saturating_add_signed(d),
            std::io::SeekFrom::Current(d) => self.at.saturating_add_signed(d),
        };
        Ok(self.at)
    }
}

/// One kind's records on their way to its stream.
#[derive(Default)]
struct Chunk {
    /// The records, encoded as the log holds them (with only that kind's effects).
    frames: Vec<u8>,
    /// The last record's sequence number: the entry's id.
    last: u64,
    /// The newest record's time: the entry's `at`, which retention goes by.
    at: Millis,
}

/// Adds the history `record` carries to each kind's chunk, unless that kind's stream has it.
fn split_history(
    record: JournalRecord,
    copied: &[u64; 5],
    chunks: &mut [Chunk; 5],
) -> Result<(), LogError> {
    let mut split: [Vec<Effect>; 5] = Default::default();
    for effect in record.effects {
        if let Some(kind) = HistoryKind::of(&effect) {
            let i = HistoryKind::ALL
                .iter()
                .position(|k| *k == kind)
                .expect("every kind is listed");
            if record.seq > copied[i] {
                split[i].push(effect);
            }
        }
    }
    for (chunk, effects) in chunks.iter_mut().zip(split) {
        if effects.is_empty() {
            continue;
        }
        let part = JournalRecord {
            seq: record.seq,
            at_ms: record.at_ms,
            effects,
        };
        encode_record(&part, &mut chunk.frames)
            .map_err(|e| LogError::Corrupt(format!("encoding history: {e}")))?;
        chunk.last = record.seq;
        chunk.at = chunk.at.max(record.at_ms);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::history::Retention;
    use crate::SystemClock;

    /// A compactor of its own ledger on the test Redis, its lock lasting `lock_ttl`.
    fn compactor(url: &str, namespace: &str, holder: &str, lock_ttl: Duration) -> Compactor {
        Compactor {
            url: url.to_string(),
            topology: Topology::Single,
            keys: Keys::new(namespace),
            holder: holder.to_string(),
            retention: Retention::default(),
            clock: Arc::new(SystemClock),
            timeout: Duration::from_secs(5),
            snapshot_records: 1,
            lock_ttl,
        }
    }

    /// Two compactors of one new ledger on the test Redis (none without one), their locks
    /// lasting `ttl`, and a connection.
    struct Pair {
        first: Compactor,
        second: Compactor,
        conn: Conn,
        /// Last, so it is deleted after the compactors and the connection are gone.
        _ledger: super::super::ScratchLedger,
    }

    impl Pair {
        fn new(ttl: Duration, names: [&str; 2]) -> Option<Pair> {
            let url = std::env::var("CYCLES_TEST_REDIS_URL").ok()?;
            let ledger = super::super::ScratchLedger::new(&url, Topology::Single, "compactor-lock");
            let first = compactor(&url, &ledger.namespace, names[0], ttl);
            let second = compactor(&url, &ledger.namespace, names[1], ttl);
            let conn = Conn::open(&url, &Topology::Single, first.timeout).expect("connect");
            Some(Pair {
                first,
                second,
                conn,
                _ledger: ledger,
            })
        }
    }

    fn lock_holder(conn: &mut Conn, keys: &Keys) -> Option<String> {
        ::redis::cmd("GET")
            .arg(&keys.compacting)
            .query(conn.link())
            .expect("GET the lock")
    }

    #[test]
    fn a_kept_lock_outlasts_its_time_to_live_and_a_lapsed_one_is_refused() {
        let ttl = Duration::from_millis(300);
        let Some(mut pair) = Pair::new(ttl, ["first", "second"]) else {
            return;
        };
        let (first, second, conn) = (&pair.first, &pair.second, &mut pair.conn);
        let scripts = Scripts::default();

        let mut lock = first.try_lock(&scripts, conn).expect("lock").expect("free");
        assert!(second.try_lock(&scripts, conn).expect("lock").is_none());
        // Kept for four times its time to live, it is still this compactor's.
        let kept = Instant::now();
        while kept.elapsed() < ttl * 4 {
            lock.keep(conn).expect("kept");
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(lock_holder(conn, &first.keys).as_deref(), Some("first"));
        assert!(second.try_lock(&scripts, conn).expect("lock").is_none());

        // Left alone, it lapses; another takes it, and the first is refused from then on.
        thread::sleep(ttl + Duration::from_millis(100));
        let taken = second.try_lock(&scripts, conn).expect("lock");
        assert!(taken.is_some(), "the lapsed lock could not be taken");
        assert!(matches!(
            lock.keep(conn),
            Err(LogError::Refused(Refused::CompactorLock))
        ));
        // Giving it up is only for its holder.
        first.unlock(&scripts, conn);
        assert_eq!(lock_holder(conn, &first.keys).as_deref(), Some("second"));
        second.unlock(&scripts, conn);
        assert_eq!(lock_holder(conn, &first.keys), None);
    }

    #[test]
    fn a_compactor_whose_lock_lapsed_deletes_no_snapshot_parts() {
        let ttl = Duration::from_millis(200);
        let Some(mut pair) = Pair::new(ttl, ["stalled", "next"]) else {
            return;
        };
        let (stalled, next, conn) = (&pair.first, &pair.second, &mut pair.conn);
        let scripts = Scripts::default();
        let keys = &stalled.keys;
        // The next compactor's snapshot, half written: more parts than one command deletes.
        let parts = PARTS_PER_DELETE as u64 + 3;
        let _: i64 = ::redis::cmd("SADD")
            .arg(&keys.pending)
            .arg("next-snapshot")
            .query(conn.link())
            .expect("SADD");
        for i in 0..parts {
            let _: () = ::redis::cmd("SET")
                .arg(keys.snapshot_part("next-snapshot", i))
                .arg(i)
                .query(conn.link())
                .expect("SET a part");
        }
        let count_parts = |conn: &mut Conn| -> i64 {
            let mut exists = ::redis::cmd("EXISTS");
            for i in 0..parts {
                exists.arg(keys.snapshot_part("next-snapshot", i));
            }
            exists.query(conn.link()).expect("EXISTS")
        };

        let mut lock = stalled
            .try_lock(&scripts, conn)
            .expect("lock")
            .expect("free");
        thread::sleep(ttl + Duration::from_millis(100));
        let mut next_lock = next
            .try_lock(&scripts, conn)
            .expect("lock")
            .expect("lapsed");
        let refused = stalled.delete_pending(conn, &mut lock, None);
        assert!(
            matches!(refused, Err(LogError::Refused(Refused::CompactorLock))),
            "{refused:?}"
        );
        assert_eq!(count_parts(conn), parts as i64);

        // The lock's holder deletes them all, and the pending list with them.
        next.delete_pending(conn, &mut next_lock, None)
            .expect("deleted");
        assert_eq!(count_parts(conn), 0);
        let pending: Vec<String> = ::redis::cmd("SMEMBERS")
            .arg(&keys.pending)
            .query(conn.link())
            .expect("SMEMBERS");
        assert!(pending.is_empty(), "{pending:?}");
        next.unlock(&scripts, conn);
    }
}
