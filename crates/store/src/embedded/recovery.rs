//! Recovery: the newest whole snapshot, then every journal record after it. Zeros after a
//! segment's last record are preallocated space, not damage. A torn or corrupt frame at the
//! end of the last segment is a normal crash artefact and is cut off (with the zeros after
//! it: the writer fills them in again);
//! missing history (a sequence gap, or damage before the last segment) is refused, never
//! papered over.

use std::io;
use std::path::{Path, PathBuf};

use ledger::State;

use crate::history::Item;

use super::files::{list_segments, list_snapshots};
use super::journal::{read_segment, truncate_segment};
use super::snapshot::read_snapshot;

/// What recovery found and did.
#[derive(Debug)]
pub struct Recovered {
    pub state: State,
    /// The last journal sequence number applied (0 for an empty data directory).
    pub last_seq: u64,
    /// The snapshot recovery started from, if any.
    pub snapshot_seq: Option<u64>,
    pub records_replayed: u64,
    /// Bytes cut from a torn or corrupt journal tail (and segments dropped after it).
    pub truncated_bytes: u64,
    /// The segment to keep appending to: the sequence number of its first record, its path
    /// and its valid length.
    pub tail_segment: Option<(u64, PathBuf, u64)>,
}

/// Recovers the state from `dir`. With `repair`, a torn tail is truncated on disk; without
/// it (as `cycles verify` does) the directory is only read.
pub fn recover(dir: &Path, repair: bool) -> io::Result<Recovered> {
    recover_with_history(dir, repair, u64::MAX, |_, _| {})
}

/// The state as of journal record `last` (read-only): what a store whose journal failed
/// rolls back to, the records it made durable. Records after `last` (a failed round's, which
/// may or may not be on the disk) are not read.
pub(crate) fn recover_until(dir: &Path, last: u64) -> io::Result<State> {
    let recovered = recover_bounded(dir, false, u64::MAX, last, |_, _| {})?;
    if recovered.last_seq != last {
        return Err(io::Error::other(format!(
            "the journal holds records up to {} where {last} were made durable",
            recovered.last_seq
        )));
    }
    Ok(recovered.state)
}

/// Recovers the state as [`recover`] does, and hands the history (audit entries, events,
/// deliveries) of the records after `history_held` (the last one the history store holds)
/// to `on_history`, whether or not a
/// snapshot covers them: the journal keeps those records until the history store has them.
pub fn recover_with_history(
    dir: &Path,
    repair: bool,
    history_held: u64,
    on_history: impl FnMut(u64, Item),
) -> io::Result<Recovered> {
    recover_bounded(dir, repair, history_held, u64::MAX, on_history)
}

/// Recovery up to record `last` at most.
fn recover_bounded(
    dir: &Path,
    repair: bool,
    history_held: u64,
    last: u64,
    mut on_history: impl FnMut(u64, Item),
) -> io::Result<Recovered> {
    let loading = std::time::Instant::now();
    let (mut state, snapshot_seq) = latest_snapshot(dir, last)?;
    tracing::debug!(
        ?snapshot_seq,
        elapsed_ms = loading.elapsed().as_millis() as u64,
        "snapshot loaded"
    );
    let mut last_seq = snapshot_seq.unwrap_or(0);
    let mut records_replayed = 0;
    let mut truncated_bytes = 0;
    let mut tail_segment = None;
    // Records up to the snapshot that the history store holds too are not needed again.
    let from = last_seq.min(history_held).saturating_add(1);
    let segments = list_segments(dir)?;
    for (i, (first, path)) in segments.iter().enumerate() {
        let next_first = segments.get(i + 1).map(|(first, _)| *first);
        if next_first.is_some_and(|next| next <= from) {
            // Every record of this segment comes before `from` (a segment kept for the
            // snapshot before the newest, or for the history store): not read at all.
            continue;
        }
        let mut gap = None;
        let end = read_segment(path, from, |record| {
            if record.seq > last {
                return false;
            }
            if record.seq > history_held {
                for item in record.effects.iter().filter_map(Item::of) {
                    on_history(record.seq, item);
                }
            }
            if record.seq <= last_seq {
                return true;
            }
            if record.seq != last_seq + 1 {
                gap = Some(record.seq);
                return false;
            }
            for effect in &record.effects {
                state.apply_effect(effect);
            }
            last_seq = record.seq;
            records_replayed += 1;
            true
        })?;
        if let Some(found) = gap {
            // Records are missing, not torn: a damaged snapshot or a removed segment. Cutting
            // here would silently drop acknowledged history, so refuse instead.
            return Err(io::Error::other(format!(
                "journal {} continues at seq {found} but the history recovered so far ends at \
                 {last_seq}: a snapshot or journal segment is damaged or missing; refusing to \
                 open the data directory (restore it from a backup)",
                path.display()
            )));
        }
        if last_seq == last {
            // Bounded, and the bound is reached: what follows is not read.
            tail_segment = Some((*first, path.clone(), end.valid_len));
            break;
        }
        let torn = !end.clean;
        if torn && i + 1 < segments.len() {
            // Only the last segment is ever being written: damage anywhere else is not a torn
            // tail and the records after it are acknowledged history.
            return Err(io::Error::other(format!(
                "journal {} is damaged at byte {} and later segments exist; refusing to open \
                 the data directory (restore it from a backup)",
                path.display(),
                end.valid_len
            )));
        }
        if torn {
            truncated_bytes = end.file_len - end.valid_len;
            if repair {
                truncate_segment(path, end.valid_len)?;
            }
        }
        tail_segment = Some((*first, path.clone(), end.valid_len));
    }
    Ok(Recovered {
        state,
        last_seq,
        snapshot_seq,
        records_replayed,
        truncated_bytes,
        tail_segment,
    })
}

/// The newest whole snapshot of a record up to `last`.
fn latest_snapshot(dir: &Path, last: u64) -> io::Result<(State, Option<u64>)> {
    for (_, path) in list_snapshots(dir)?.into_iter().rev() {
        if let Some((seq, data)) = read_snapshot(&path)?.filter(|(seq, _)| *seq <= last) {
            return Ok((State::from_snapshot(data), Some(seq)));
        }
        tracing::warn!(path = %path.display(), "skipping an incomplete or corrupt snapshot");
    }
    Ok((State::new(), None))
}
