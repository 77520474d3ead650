//! Snapshots: a consistent copy of the state, written to a temporary file, synced, then
//! renamed into place (and the directory synced), so a snapshot is either whole or absent.
//!
//! File = `CYCS`, format version (u32 LE), last journal seq covered (u64 LE), payload length
//! (u64 LE), CRC32C of the payload (u32 LE), payload (postcard-encoded [`SnapshotData`]).

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use ledger::SnapshotData;

use super::files::{list_segments, list_snapshots, snapshot_path, sync_dir, FORMAT_VERSION};

const MAGIC: &[u8; 4] = b"CYCS";

pub fn write_snapshot(dir: &Path, seq: u64, data: &SnapshotData) -> io::Result<PathBuf> {
    let payload =
        postcard::to_stdvec(data).map_err(|e| io::Error::other(format!("snapshot encode: {e}")))?;
    let path = snapshot_path(dir, seq);
    let tmp = path.with_extension("tmp");
    {
        let mut w = BufWriter::new(File::create(&tmp)?);
        w.write_all(MAGIC)?;
        w.write_all(&FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&seq.to_le_bytes())?;
        w.write_all(&(payload.len() as u64).to_le_bytes())?;
        w.write_all(&crc32c::crc32c(&payload).to_le_bytes())?;
        w.write_all(&payload)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(path)
}

/// Reads a snapshot; `None` when the file is incomplete, corrupt or of another format.
pub fn read_snapshot(path: &Path) -> io::Result<Option<(u64, SnapshotData)>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    const HEADER: usize = 4 + 4 + 8 + 8 + 4;
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Ok(None);
    }
    let field = |at: usize, n: usize| &bytes[at..at + n];
    let version = u32::from_le_bytes(field(4, 4).try_into().expect("4 bytes"));
    let seq = u64::from_le_bytes(field(8, 8).try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(field(16, 8).try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(field(24, 4).try_into().expect("4 bytes"));
    let payload = &bytes[HEADER..];
    if version != FORMAT_VERSION || payload.len() as u64 != len || crc32c::crc32c(payload) != crc {
        return Ok(None);
    }
    Ok(postcard::from_bytes(payload).ok().map(|data| (seq, data)))
}

/// Deletes what a durable snapshot at `seq` makes redundant. The previous snapshot, and the
/// journal after it, are kept: if the newest snapshot is ever unreadable, recovery falls back
/// to the one before it and replays the journal from there.
pub fn prune(dir: &Path, seq: u64) -> io::Result<()> {
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
    let segments = list_segments(dir)?;
    for pair in segments.windows(2) {
        let (_, path) = &pair[0];
        let (next_first, _) = pair[1];
        if keep_from > 0 && next_first <= keep_from + 1 {
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
