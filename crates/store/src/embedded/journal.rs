//! The append-only journal: length-prefixed, CRC32C-checked records of effects.
//!
//! A segment file is a header (`CYCJ`, format version) followed by frames. A frame is the
//! payload length (u32 LE), the CRC32C of the payload (u32 LE), then the payload (a
//! postcard-encoded [`JournalRecord`]).
//!
//! A torn tail — a frame cut short or failing its checksum — is normal after a crash:
//! recovery stops at the first bad frame and truncates there.
//!
//! Segments are preallocated: the writer fills the file with zeros ahead of its records, a
//! chunk at a time, and then overwrites those zeros in place. An `fdatasync` after an
//! overwrite carries no change of the file's size, so the file system has no metadata to
//! commit with it: on the disks measured it is a third cheaper, in time and in CPU, than one
//! after an append (BENCHMARKS.md). Zeros never read as a record (a zero length and checksum
//! decode to nothing), so reading stops where the records end; a segment whose bytes after
//! its last record are all zeros ends cleanly, and anything else there is a torn tail.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ledger::{Effect, Millis};
use serde::{Deserialize, Serialize};

use super::faults::{DiskFaults, DiskOp};
use super::files::{private_file, segment_path, sync_dir, FORMAT_VERSION};

const MAGIC: &[u8; 4] = b"CYCJ";
pub const HEADER_LEN: u64 = 8;
const FRAME_HEADER_LEN: usize = 8;
/// No record is larger than this; a length beyond it is a torn or corrupt frame.
pub const MAX_RECORD_BYTES: usize = 64 << 20;
/// How far ahead of its records a segment is filled with zeros, at least. Extending costs
/// the round that does it one larger write (about once per 1 500 records of this size).
const PREALLOCATE_BYTES: u64 = 1 << 20;

/// What one command changed. Sequence numbers are contiguous across segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalRecord {
    pub seq: u64,
    pub at_ms: Millis,
    pub effects: Vec<Effect>,
}

/// Appends a record's frame to `out` (the length and checksum are patched in after the
/// payload is encoded in place, so encoding allocates nothing of its own).
pub fn encode_record(record: &JournalRecord, out: &mut Vec<u8>) -> io::Result<()> {
    let frame_start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    if let Err(e) = postcard::to_io(record, &mut *out) {
        out.truncate(frame_start);
        return Err(io::Error::other(format!("journal encode: {e}")));
    }
    let payload_len = out.len() - frame_start - FRAME_HEADER_LEN;
    if payload_len > MAX_RECORD_BYTES {
        out.truncate(frame_start);
        return Err(io::Error::other("journal record exceeds the maximum size"));
    }
    let crc = crc32c::crc32c(&out[frame_start + FRAME_HEADER_LEN..]);
    let len = u32::try_from(payload_len).map_err(io::Error::other)?;
    out[frame_start..frame_start + 4].copy_from_slice(&len.to_le_bytes());
    out[frame_start + 4..frame_start + FRAME_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The end of a segment whose header holds no records (clean only when the file is empty).
fn no_records(file_len: u64) -> SegmentEnd {
    SegmentEnd {
        valid_len: 0,
        file_len,
        clean: file_len == 0,
    }
}

fn unreadable(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!(
        "journal {} holds {what} that this build cannot read (written by a newer version?); \
         refusing to open the data directory",
        path.display()
    ))
}

/// The current segment, open for writing encoded frames after its last record.
pub struct JournalWriter {
    dir: PathBuf,
    /// Positioned at `segment_len`.
    file: File,
    /// The sequence number the segment's first record has (or will have).
    first_seq: u64,
    /// Where the records end.
    segment_len: u64,
    /// The file's length: zeros from `segment_len` to here.
    allocated: u64,
    /// Checked before each write, resize and sync (armed only by tests).
    faults: Arc<DiskFaults>,
}

/// The bytes a segment starts with: its magic and format version.
pub fn segment_header() -> [u8; HEADER_LEN as usize] {
    let mut header = [0u8; HEADER_LEN as usize];
    header[..4].copy_from_slice(MAGIC);
    header[4..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header
}

impl JournalWriter {
    /// Starts a new segment whose first record will be `first_seq`. A segment that cannot
    /// be made whole is removed again: left half-written, it would read as damage once a
    /// later segment exists.
    pub fn create(dir: &Path, first_seq: u64, faults: Arc<DiskFaults>) -> io::Result<Self> {
        let path = segment_path(dir, first_seq);
        faults.check(DiskOp::Write)?;
        let file = private_file().create_new(true).write(true).open(&path)?;
        let mut writer = JournalWriter {
            dir: dir.to_path_buf(),
            file,
            first_seq,
            segment_len: HEADER_LEN,
            allocated: 0,
            faults,
        };
        let made = writer.start_segment();
        if made.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        made.map(|()| writer)
    }

    fn start_segment(&mut self) -> io::Result<()> {
        self.write(&segment_header())?;
        self.allocated = HEADER_LEN;
        self.preallocate(0)?;
        self.sync(true)?;
        sync_dir(&self.dir)
    }

    /// Continues an existing segment, whose first record is `first_seq` and whose records
    /// end at `len` (what follows, if anything, is zeros: recovery cuts anything else off).
    pub fn reopen(
        dir: &Path,
        first_seq: u64,
        len: u64,
        faults: Arc<DiskFaults>,
    ) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .write(true)
            .open(segment_path(dir, first_seq))?;
        let allocated = file.metadata()?.len().max(len);
        file.seek(SeekFrom::Start(len))?;
        Ok(JournalWriter {
            dir: dir.to_path_buf(),
            file,
            first_seq,
            segment_len: len,
            allocated,
            faults,
        })
    }

    /// One write and one `fdatasync` for a run of frames from [`encode_record`]. When the
    /// frames would pass the zeros, more are written first, under the same `fdatasync`.
    /// The records' end moves only when both succeed: after a failure, [`Self::discard_unsynced`]
    /// cuts back to it.
    pub fn write_durable(&mut self, frames: &[u8]) -> io::Result<()> {
        let len = frames.len() as u64;
        if self.segment_len + len > self.allocated {
            self.preallocate(len)?;
        }
        self.write(frames)?;
        self.sync(false)?;
        self.segment_len += len;
        Ok(())
    }

    /// After a failed write or sync: drops everything past the durable records (frames that
    /// may or may not have reached the disk, and must never be read as records) and shows
    /// that the disk takes writes again. The file is cut back to its records, its zeros
    /// written afresh and the whole synced: never a second `fdatasync` over the failed
    /// pages, which the kernel may have marked clean without writing them.
    pub fn discard_unsynced(&mut self) -> io::Result<()> {
        self.faults.check(DiskOp::Resize)?;
        self.file.set_len(self.segment_len)?;
        self.allocated = self.segment_len;
        self.preallocate(0)?;
        self.sync(true)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.faults.check(DiskOp::Write)?;
        self.file.write_all(bytes)
    }

    /// `fdatasync`, or `fsync` with `metadata` (after a change of the file's size).
    fn sync(&self, metadata: bool) -> io::Result<()> {
        self.faults.check(DiskOp::Sync)?;
        if metadata {
            self.file.sync_all()
        } else {
            self.file.sync_data()
        }
    }

    /// Fills the file with zeros to at least [`PREALLOCATE_BYTES`] past the records plus
    /// `room`, and puts the position back at the records' end. Not synced here: the next
    /// `fdatasync` (or `sync_all` at creation) makes the zeros durable with the records.
    fn preallocate(&mut self, room: u64) -> io::Result<()> {
        let target = self.segment_len + room + PREALLOCATE_BYTES;
        self.file.seek(SeekFrom::Start(self.allocated))?;
        let zeros = [0u8; 64 << 10];
        while self.allocated < target {
            let n = (target - self.allocated).min(zeros.len() as u64) as usize;
            self.write(&zeros[..n])?;
            self.allocated += n as u64;
        }
        self.file.seek(SeekFrom::Start(self.segment_len))?;
        Ok(())
    }

    pub fn segment_len(&self) -> u64 {
        self.segment_len
    }

    /// The sequence number of this segment's first record (the one after the snapshot that
    /// started it).
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Closes this segment and starts the next one at `next_seq`.
    pub fn rotate(&mut self, next_seq: u64) -> io::Result<()> {
        *self = JournalWriter::create(&self.dir, next_seq, self.faults.clone())?;
        Ok(())
    }
}

/// How reading a segment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentEnd {
    /// Bytes of valid content (header + whole, checked frames).
    pub valid_len: u64,
    /// The file's length.
    pub file_len: u64,
    /// Whether everything after `valid_len` is zeros (preallocated space, or nothing):
    /// otherwise the tail was torn or corrupt.
    pub clean: bool,
}

/// Reads a segment's records from sequence number `from` in order, calling `each` until it
/// returns `false` (which also marks the end of valid content) or the first torn or corrupt
/// frame. A segment of another format version, or a whole (checksummed) record this build
/// cannot decode, is an error: written by a newer version, it must not be mistaken for a
/// torn tail and cut off.
pub fn read_segment(
    path: &Path,
    from: u64,
    each: impl FnMut(JournalRecord) -> bool,
) -> io::Result<SegmentEnd> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    match read_records(&mut reader, file_len, from, each).map_err(|what| unreadable(path, &what))? {
        None => Ok(no_records(file_len)),
        Some(valid_len) => Ok(SegmentEnd {
            valid_len,
            file_len,
            clean: zeros_from(path, valid_len)?,
        }),
    }
}

/// The records of a segment of `len` bytes read from `reader` (see [`read_segment`]):
/// `Ok(None)` when it has no whole header, so no records; `Ok(Some(valid_len))`, the bytes of
/// its header and whole, checked frames; `Err(what)` when it holds something this build
/// cannot read. A record before `from` is checked but not decoded past its sequence number
/// (the record's first field): a restart reads the journal the snapshot already covers only
/// for what the history store lacks. Never panics, whatever the bytes (the
/// `journal_records` fuzz target).
pub fn read_records(
    reader: &mut impl Read,
    len: u64,
    from: u64,
    mut each: impl FnMut(JournalRecord) -> bool,
) -> Result<Option<u64>, String> {
    let mut header = [0u8; HEADER_LEN as usize];
    if reader.read_exact(&mut header).is_err() || &header[..4] != MAGIC {
        // A missing or short header holds no records.
        return Ok(None);
    }
    match u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) {
        FORMAT_VERSION => {}
        // A torn header: the version was not written yet (the rest of the file is zeros).
        0 => return Ok(None),
        // A whole header of another format is no torn write: cutting it off would drop
        // records this build cannot read.
        version => return Err(format!("format version {version}")),
    }
    let mut valid_len = HEADER_LEN;
    let mut payload = Vec::new();
    loop {
        let mut frame = [0u8; FRAME_HEADER_LEN];
        if reader.read_exact(&mut frame).is_err() {
            break;
        }
        let frame_len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        if frame_len > MAX_RECORD_BYTES || valid_len + (FRAME_HEADER_LEN + frame_len) as u64 > len {
            break;
        }
        payload.resize(frame_len, 0);
        if reader.read_exact(&mut payload).is_err() || crc32c::crc32c(&payload) != crc {
            break;
        }
        if frame_len == 0 {
            // Zeros: preallocated space after the last record.
            break;
        }
        let skipped = postcard::take_from_bytes::<u64>(&payload).is_ok_and(|(seq, _)| seq < from);
        if skipped {
            valid_len += (FRAME_HEADER_LEN + frame_len) as u64;
            continue;
        }
        let Ok(record) = postcard::from_bytes::<JournalRecord>(&payload) else {
            // The checksum holds, so the frame was written whole: a record of a newer
            // version, not a torn tail. Refuse rather than cut acknowledged history.
            return Err(format!("a record at byte {valid_len}"));
        };
        if !each(record) {
            break;
        }
        valid_len += (FRAME_HEADER_LEN + frame_len) as u64;
    }
    Ok(Some(valid_len))
}

/// Whether the file holds only zero bytes from `offset` to its end.
fn zeros_from(path: &Path, offset: u64) -> io::Result<bool> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut chunk = [0u8; 64 << 10];
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            return Ok(true);
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Cuts a segment back to its valid content and makes that durable.
pub fn truncate_segment(path: &Path, valid_len: u64) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.set_len(valid_len)?;
    file.seek(SeekFrom::End(0))?;
    file.sync_all()
}
