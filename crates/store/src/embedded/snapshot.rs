//! Snapshots: a consistent copy of the state, written to a temporary file, synced, then
//! renamed into place (and the directory synced), so a snapshot is either whole or absent.
//!
//! File = `CYCS`, format version (u32 LE), last journal seq covered (u64 LE), payload length
//! (u64 LE), CRC32C of the payload (u32 LE), payload (postcard-encoded [`SnapshotData`]).
//!
//! Version 2 added the webhook state at the end of the payload, version 3 the policies'
//! rate counts after it, version 4 the digests of archived reserves' keys after those,
//! version 5 those digests in 4 bytes, stored as differences, version 6 each with its
//! reservation's creation time; older snapshots are still read (as [`SnapshotV1`], with no
//! webhooks, [`SnapshotV2`], with no rate counts, [`SnapshotV3`], with no archived keys:
//! nothing had been archived, [`SnapshotV4`], whose 8-byte digests begin with today's, and
//! [`SnapshotV5`]; the keys of these two have no time).
//! The journal's format is unchanged: new effects were appended to the enum, so old records
//! decode as they were.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ledger::{SnapshotData, SnapshotV1, SnapshotV2, SnapshotV3, SnapshotV4, SnapshotV5};
use serde::Serialize;

use super::files::{list_segments, list_snapshots, private_file, snapshot_path, sync_dir};

/// The snapshot format written.
const SNAPSHOT_VERSION: u32 = 6;
/// The snapshot format whose archived keys have no time, still read.
const SNAPSHOT_VERSION_5: u32 = 5;
/// The snapshot format with 8-byte digests of archived reserves' keys, still read.
const SNAPSHOT_VERSION_4: u32 = 4;
/// The snapshot format before archived reservations, still read.
const SNAPSHOT_VERSION_3: u32 = 3;
/// The snapshot format before rate counts, still read.
const SNAPSHOT_VERSION_2: u32 = 2;
/// The snapshot format before webhooks, still read.
const SNAPSHOT_VERSION_1: u32 = 1;

const MAGIC: &[u8; 4] = b"CYCS";
/// Magic, version, seq, payload length, payload CRC32C.
const HEADER_LEN: u64 = 4 + 4 + 8 + 8 + 4;

/// Streams a snapshot to disk: the payload is encoded straight into the file (no copy of the
/// state, no buffer of the encoding), its length and checksum are filled into the header
/// afterwards, then the file is synced and renamed into place.
pub fn write_snapshot<T: Serialize>(dir: &Path, seq: u64, data: &T) -> io::Result<PathBuf> {
    let path = snapshot_path(dir, seq);
    let tmp = path.with_extension("tmp");
    let mut file = private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    encode_snapshot_into(&mut file, seq, data)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(path)
}

/// Streams a snapshot's bytes, exactly as its file holds them, into `out` (a file here;
/// the Redis engine's parts in Redis): the header, the payload after it, then the header's
/// length and checksum filled in. Read back with [`parse_snapshot`].
pub fn encode_snapshot_into<W: Write + Seek, T: Serialize>(
    out: &mut W,
    seq: u64,
    data: &T,
) -> io::Result<()> {
    let mut header = Vec::with_capacity(HEADER_LEN as usize);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    header.extend_from_slice(&seq.to_le_bytes());
    header.resize(HEADER_LEN as usize, 0);
    out.write_all(&header)?;
    // The checksum is taken of the buffer's whole chunks as they go out, not of each
    // field's few bytes as the encoder writes them.
    let mut payload = BufWriter::with_capacity(
        1 << 20,
        Checksummed {
            inner: &mut *out,
            len: 0,
            crc: 0,
        },
    );
    postcard::to_io(data, &mut payload)
        .map_err(|e| io::Error::other(format!("snapshot encode: {e}")))?;
    let summed = payload.into_inner().map_err(|e| e.into_error())?;
    let (len, crc) = (summed.len, summed.crc);
    out.seek(SeekFrom::Start(16))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&crc.to_le_bytes())?;
    out.seek(SeekFrom::End(0))?;
    Ok(())
}

/// Counts and checksums what passes through.
struct Checksummed<W> {
    inner: W,
    len: u64,
    crc: u32,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads a snapshot; `None` when the file is incomplete, corrupt or of another format.
pub fn read_snapshot(path: &Path) -> io::Result<Option<(u64, SnapshotData)>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    Ok(parse_snapshot(&bytes))
}

/// A snapshot file's sequence number and state; `None` when the bytes are incomplete,
/// corrupt or of another format. Never panics, whatever the bytes (the `snapshots` fuzz
/// target).
pub fn parse_snapshot(bytes: &[u8]) -> Option<(u64, SnapshotData)> {
    const HEADER: usize = HEADER_LEN as usize;
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return None;
    }
    let field = |at: usize, n: usize| &bytes[at..at + n];
    let version = u32::from_le_bytes(field(4, 4).try_into().expect("4 bytes"));
    let seq = u64::from_le_bytes(field(8, 8).try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(field(16, 8).try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(field(24, 4).try_into().expect("4 bytes"));
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len || crc32c::crc32c(payload) != crc {
        return None;
    }
    let data = match version {
        SNAPSHOT_VERSION => postcard::from_bytes(payload).ok(),
        SNAPSHOT_VERSION_5 => postcard::from_bytes::<SnapshotV5>(payload)
            .ok()
            .map(SnapshotData::from),
        SNAPSHOT_VERSION_4 => postcard::from_bytes::<SnapshotV4>(payload)
            .ok()
            .map(SnapshotData::from),
        SNAPSHOT_VERSION_3 => postcard::from_bytes::<SnapshotV3>(payload)
            .ok()
            .map(SnapshotData::from),
        SNAPSHOT_VERSION_2 => postcard::from_bytes::<SnapshotV2>(payload)
            .ok()
            .map(SnapshotData::from),
        SNAPSHOT_VERSION_1 => postcard::from_bytes::<SnapshotV1>(payload)
            .ok()
            .map(SnapshotData::from),
        _ => None,
    };
    data.map(|data| (seq, data))
}

/// Writes a snapshot at `seq`, then deletes what it makes redundant. `history_floor`, asked
/// once the snapshot is written, is the last sequence number the history store holds when it
/// still has records of the journal to take (see [`prune`]). Returns the snapshot's size in
/// bytes.
pub fn write_and_prune<T: Serialize>(
    dir: &Path,
    seq: u64,
    data: &T,
    history_floor: impl FnOnce() -> Option<u64>,
) -> io::Result<u64> {
    let path = write_snapshot(dir, seq, data)?;
    let len = fs::metadata(&path)?.len();
    prune(dir, seq, history_floor())?;
    Ok(len)
}

/// The size of the newest snapshot file in `dir` (0 when there is none).
pub fn newest_len(dir: &Path) -> io::Result<u64> {
    match list_snapshots(dir)?.last() {
        Some((_, path)) => Ok(fs::metadata(path)?.len()),
        None => Ok(0),
    }
}

/// Deletes what a durable snapshot at `seq` makes redundant. The previous snapshot, and the
/// journal after it, are kept: if the newest snapshot is ever unreadable, recovery falls back
/// to the one before it and replays the journal from there. With a `history_floor`, no
/// segment holding a record after it is deleted either: the history store has yet to take
/// those records' entries, and takes them from the journal after a crash.
pub fn prune(dir: &Path, seq: u64, history_floor: Option<u64>) -> io::Result<()> {
    let snapshots = list_snapshots(dir)?;
    let keep_from = snapshots
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| *s < seq)
        .max()
        .unwrap_or(0);
    for (s, path) in &snapshots {
        if *s < keep_from {
            fs::remove_file(path)?;
        }
    }
    let journal_from = history_floor.map_or(keep_from, |floor| floor.min(keep_from));
    let segments = list_segments(dir)?;
    for pair in segments.windows(2) {
        let (_, path) = &pair[0];
        let (next_first, _) = pair[1];
        if journal_from > 0 && next_first <= journal_from + 1 {
            fs::remove_file(path)?;
        }
    }
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "tmp") {
            fs::remove_file(path)?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use ledger::{
        apply, Actor, CreateTenant, Effect, NewTenant, RateCount, RateKey, RateKind, State,
    };

    use super::*;

    /// A snapshot streamed from the shared maps reads back as the state's own copy.
    #[test]
    fn streamed_snapshot_reads_back_as_the_state() {
        let mut state = State::new();
        for i in 0..50 {
            let tenant = NewTenant {
                tenant_id: format!("tenant-{i}"),
                name: format!("Tenant {i}"),
                parent_tenant_id: None,
                default_commit_overage_policy: None,
                default_reservation_ttl_ms: None,
                max_reservation_ttl_ms: None,
                max_reservation_extensions: None,
                reservation_expiry_policy: None,
                metadata: Default::default(),
            };
            let applied = apply(
                &mut state,
                CreateTenant {
                    actor: Actor::Admin,
                    tenant,
                },
                i,
            );
            assert!(applied.result.is_ok());
        }
        let key = RateKey {
            tenant_id: "tenant-1".into(),
            policy_id: "pol_1".into(),
            kind: RateKind::Commit,
        };
        let count = RateCount {
            minute: 3,
            count: 17,
        };
        state.apply_effect(&Effect::PutRateCount(key, count));
        // Archived reserves' keys, in two days (one with no time, as format 5 read them).
        let key = |digest, before_day_end| ledger::ArchivedKey {
            digest,
            before_day_end,
        };
        let mut data = state.to_snapshot();
        data.archived_keys = vec![
            (
                19_700,
                vec![
                    key(3, 9),
                    key(1, 0),
                    key(2, ledger::UNKNOWN_TIME),
                    key(2, 4),
                ],
            ),
            (19_701, vec![key(5, 86_400_000)]),
        ];
        let state = State::from_snapshot(data);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = write_snapshot(dir.path(), 7, &state.snapshot_source()).expect("write");
        let (seq, data) = read_snapshot(&path)
            .expect("read")
            .expect("a whole snapshot");
        assert_eq!(seq, 7);
        assert_eq!(data, state.to_snapshot());
        assert_eq!(data.rate_counts.len(), 1);
        assert_eq!(
            data.archived_keys,
            [
                (
                    19_700,
                    vec![
                        key(1, 0),
                        key(2, 4),
                        key(2, ledger::UNKNOWN_TIME),
                        key(3, 9)
                    ]
                ),
                (19_701, vec![key(5, 86_400_000)])
            ]
        );
        // A damaged byte anywhere in the payload makes the snapshot unreadable, not wrong.
        let mut bytes = fs::read(&path).expect("read bytes");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).expect("write bytes");
        assert!(read_snapshot(&path).expect("read").is_none());
    }

    /// A snapshot file of format `version` with `payload`, at sequence number 9.
    fn framed(version: u32, payload: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&9u64.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        bytes.extend_from_slice(payload);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = snapshot_path(dir.path(), 9);
        fs::write(&path, bytes).expect("write");
        (dir, path)
    }

    /// A format-2 snapshot (before policies' rate counts) reads as its state with none.
    #[test]
    fn a_format_2_snapshot_reads_with_no_rate_counts() {
        let v2 = SnapshotV2 {
            last_event: 41,
            last_delivery: 42,
            ..SnapshotV2::default()
        };
        let payload = postcard::to_allocvec(&v2).expect("encode");
        let (_dir, path) = framed(SNAPSHOT_VERSION_2, &payload);
        let (seq, data) = read_snapshot(&path).expect("read").expect("a v2 snapshot");
        assert_eq!(seq, 9);
        assert_eq!((data.last_event, data.last_delivery), (41, 42));
        assert!(data.rate_counts.is_empty());
        assert_eq!(data, SnapshotData::from(v2));
    }

    /// A format-3 snapshot (before archiving) reads as its state with no archived keys.
    #[test]
    fn a_format_3_snapshot_reads_with_no_archived_keys() {
        let v3 = SnapshotV3 {
            last_event: 7,
            ..SnapshotV3::default()
        };
        let payload = postcard::to_allocvec(&v3).expect("encode");
        let (_dir, path) = framed(SNAPSHOT_VERSION_3, &payload);
        let (_, data) = read_snapshot(&path).expect("read").expect("a v3 snapshot");
        assert_eq!(data.last_event, 7);
        assert!(data.archived_keys.is_empty());
        assert_eq!(data, SnapshotData::from(v3));
        // The current format's payload is longer: read as format 3, it is refused.
        let (_dir, path) = framed(SNAPSHOT_VERSION, &payload);
        assert!(read_snapshot(&path).expect("read").is_none());
    }

    /// A format-4 snapshot reads with the first 4 bytes of its 8-byte digests, which are
    /// today's digests of the same keys: retries of reserves archived before an upgrade are
    /// still told apart from fresh ones.
    #[test]
    fn a_format_4_snapshot_reads_its_digests_as_todays() {
        // Format 4's digest of `acme`'s key `k`: the first 8 bytes of its SHA-256.
        let v4 = SnapshotV4 {
            last_event: 5,
            archived_keys: vec![(19_700, vec![7, 0x8b7a_e2f4_82bc_2a7c])],
            ..SnapshotV4::default()
        };
        let payload = postcard::to_allocvec(&v4).expect("encode");
        let (_dir, path) = framed(SNAPSHOT_VERSION_4, &payload);
        let (_, data) = read_snapshot(&path).expect("read").expect("a v4 snapshot");
        assert_eq!(data.last_event, 5);
        let today = ledger::reserve_key_digest("acme", "k");
        let key = |digest| ledger::ArchivedKey {
            digest,
            before_day_end: ledger::UNKNOWN_TIME,
        };
        assert_eq!(data.archived_keys, [(19_700, vec![key(0), key(today)])]);
        // The current format's payload differs: read as format 4, it is refused.
        let (_dir, path) = framed(SNAPSHOT_VERSION, &payload);
        assert!(read_snapshot(&path).expect("read").is_none());
    }

    /// A format-5 snapshot reads its digests (stored as differences) as keys whose time is
    /// not known: their reserves are looked up by key, and the state says so.
    #[test]
    fn a_format_5_snapshot_reads_its_digests_without_times() {
        // Format 5's payload is today's up to its last field, the days of digests: an
        // empty list (one byte) in this encoding of a state with none.
        let mut payload = postcard::to_allocvec(&SnapshotData {
            last_event: 5,
            ..SnapshotData::default()
        })
        .expect("encode");
        assert_eq!(payload.pop(), Some(0));
        // Day 19 700 with the digests 3 and 7, as differences.
        let days: Vec<(i64, Vec<u32>)> = vec![(19_700, vec![3, 4])];
        payload.extend(postcard::to_allocvec(&days).expect("encode"));
        let (_dir, path) = framed(SNAPSHOT_VERSION_5, &payload);
        let (_, data) = read_snapshot(&path).expect("read").expect("a v5 snapshot");
        assert_eq!(data.last_event, 5);
        let key = |digest| ledger::ArchivedKey {
            digest,
            before_day_end: ledger::UNKNOWN_TIME,
        };
        assert_eq!(data.archived_keys, [(19_700, vec![key(3), key(7)])]);
        let state = ledger::State::from_snapshot(data);
        assert!(state.archived_keys_need_key_index());
        // The current format's payload differs: read as format 5, it is refused.
        let (_dir, path) = framed(SNAPSHOT_VERSION, &payload);
        assert!(read_snapshot(&path).expect("read").is_none());
    }

    /// Pruning after a snapshot at 300 (with one at 200 before it) drops the journal
    /// before 200, except what the history store has yet to take.
    #[test]
    fn prune_keeps_the_journal_the_history_store_still_needs() {
        use crate::embedded::files::{list_segments, segment_path, snapshot_path};
        let segments = |floor: Option<u64>| {
            let dir = tempfile::tempdir().expect("temp dir");
            for first in [1, 101, 201, 301] {
                fs::write(segment_path(dir.path(), first), b"").expect("segment");
            }
            for seq in [200, 300] {
                fs::write(snapshot_path(dir.path(), seq), b"").expect("snapshot");
            }
            prune(dir.path(), 300, floor).expect("prune");
            let left = list_segments(dir.path()).expect("list");
            left.into_iter().map(|(first, _)| first).collect::<Vec<_>>()
        };
        assert_eq!(segments(None), [201, 301]);
        // The history store holds up to 150: the segment from 101 on still has its records.
        assert_eq!(segments(Some(150)), [101, 201, 301]);
        assert_eq!(segments(Some(0)), [1, 101, 201, 301]);
        assert_eq!(segments(Some(250)), [201, 301]);
    }
}
