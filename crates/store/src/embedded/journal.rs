//! The append-only journal: length-prefixed, CRC32C-checked records of effects.
//!
//! A segment file is a header (`CYCJ`, format version) followed by frames. A frame is the
//! payload length (u32 LE), the CRC32C of the payload (u32 LE), then the payload (a
//! postcard-encoded [`JournalRecord`]).
//!
//! A torn tail — a frame cut short or failing its checksum — is normal after a crash:
//! recovery stops at the first bad frame and truncates there.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ledger::{Effect, Millis};
use serde::{Deserialize, Serialize};

use super::files::{segment_path, sync_dir, FORMAT_VERSION};

const MAGIC: &[u8; 4] = b"CYCJ";
pub const HEADER_LEN: u64 = 8;
const FRAME_HEADER_LEN: usize = 8;
/// No record is larger than this; a length beyond it is a torn or corrupt frame.
pub const MAX_RECORD_BYTES: usize = 64 << 20;

/// What one command changed. Sequence numbers are contiguous across segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalRecord {
    pub seq: u64,
    pub at_ms: Millis,
    pub effects: Vec<Effect>,
}

/// Appends records to the current segment; [`JournalWriter::commit`] makes them durable.
pub struct JournalWriter {
    dir: PathBuf,
    file: File,
    buf: Vec<u8>,
    segment_len: u64,
}

impl JournalWriter {
    /// Starts a new segment whose first record will be `first_seq`.
    pub fn create(dir: &Path, first_seq: u64) -> io::Result<Self> {
        let path = segment_path(dir, first_seq);
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        file.write_all(&header)?;
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(JournalWriter {
            dir: dir.to_path_buf(),
            file,
            buf: Vec::new(),
            segment_len: HEADER_LEN,
        })
    }

    /// Continues an existing segment whose valid content is `len` bytes long.
    pub fn reopen(dir: &Path, path: &Path, len: u64) -> io::Result<Self> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(JournalWriter {
            dir: dir.to_path_buf(),
            file,
            buf: Vec::new(),
            segment_len: len,
        })
    }

    /// Buffers one record. Nothing is durable until `commit`.
    pub fn append(&mut self, record: &JournalRecord) -> io::Result<()> {
        let payload = postcard::to_stdvec(record)
            .map_err(|e| io::Error::other(format!("journal encode: {e}")))?;
        if payload.len() > MAX_RECORD_BYTES {
            return Err(io::Error::other("journal record exceeds the maximum size"));
        }
        let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf
            .extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        self.buf.extend_from_slice(&payload);
        Ok(())
    }

    pub fn has_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    /// One write and one `fdatasync` for everything buffered; returns the bytes written.
    pub fn commit(&mut self, sync: bool) -> io::Result<u64> {
        if self.buf.is_empty() {
            return Ok(0);
        }
        self.file.write_all(&self.buf)?;
        if sync {
            self.file.sync_data()?;
        }
        let written = self.buf.len() as u64;
        self.segment_len += written;
        self.buf.clear();
        Ok(written)
    }

    pub fn segment_len(&self) -> u64 {
        self.segment_len
    }

    /// Closes this segment and starts the next one at `next_seq`.
    pub fn rotate(&mut self, next_seq: u64) -> io::Result<()> {
        debug_assert!(self.buf.is_empty(), "rotate with uncommitted records");
        *self = JournalWriter::create(&self.dir, next_seq)?;
        Ok(())
    }
}

/// How reading a segment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentEnd {
    /// Bytes of valid content (header + whole, checked frames).
    pub valid_len: u64,
    /// The file's length; larger than `valid_len` when the tail was torn or corrupt.
    pub file_len: u64,
}

/// Reads a segment's records in order, calling `each` until it returns `false` (which also
/// marks the end of valid content) or the first torn or corrupt frame.
pub fn read_segment(
    path: &Path,
    mut each: impl FnMut(JournalRecord) -> bool,
) -> io::Result<SegmentEnd> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; HEADER_LEN as usize];
    if reader.read_exact(&mut header).is_err()
        || &header[..4] != MAGIC
        || u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) != FORMAT_VERSION
    {
        return Ok(SegmentEnd {
            valid_len: 0,
            file_len,
        });
    }
    let mut valid_len = HEADER_LEN;
    let mut payload = Vec::new();
    loop {
        let mut frame = [0u8; FRAME_HEADER_LEN];
        if reader.read_exact(&mut frame).is_err() {
            break;
        }
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD_BYTES || valid_len + (FRAME_HEADER_LEN + len) as u64 > file_len {
            break;
        }
        payload.resize(len, 0);
        if reader.read_exact(&mut payload).is_err() || crc32c::crc32c(&payload) != crc {
            break;
        }
        let Ok(record) = postcard::from_bytes::<JournalRecord>(&payload) else {
            break;
        };
        if !each(record) {
            break;
        }
        valid_len += (FRAME_HEADER_LEN + len) as u64;
    }
    Ok(SegmentEnd {
        valid_len,
        file_len,
    })
}

/// Cuts a segment back to its valid content and makes that durable.
pub fn truncate_segment(path: &Path, valid_len: u64) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.set_len(valid_len)?;
    file.seek(SeekFrom::End(0))?;
    file.sync_all()
}
