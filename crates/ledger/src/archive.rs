//! Settled reservations leave the state (DESIGN §3a): once a reservation has been COMMITTED,
//! RELEASED or EXPIRED for a moment, the sweep archives it. Its journal record carries the
//! reservation with the idempotency records that replay its reserve and its settlements
//! ([`Archived`]); applying it removes them from the state, and the store projects them
//! into its history store, where they stay readable and replayable for their retention.
//!
//! What the state keeps of an archived reservation is one 4-byte digest of its reserve's
//! idempotency key while that key's replay window lasts ([`ArchivedKeys`]), so that a fresh
//! reserve (whose key is new) is told apart from a retry of an archived one without a read
//! of the disk. Anything that names an archived reservation (a commit, release, extension or
//! read by id, a retried reserve whose key is in the digests) is answered in two steps: the
//! operation asks for the archived reservation ([`Applied::needs`](crate::Applied)), the
//! store reads it from its history store outside the ledger lock, and the operation runs
//! again with it ([`crate::apply_with`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashTable;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{IdemKey, IdemRecord, Millis, Reservation};

/// A settled reservation as it leaves the state: the reservation and the idempotency
/// records still held for it (its reserve's, if that record names it, and its commit's,
/// release's and extensions').
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archived {
    pub reservation: Reservation,
    pub records: Vec<(IdemKey, IdemRecord)>,
}

impl Archived {
    /// The record under `key`, if it was archived with the reservation.
    pub fn record(&self, key: &IdemKey) -> Option<&IdemRecord> {
        self.records.iter().find(|(k, _)| k == key).map(|(_, r)| r)
    }
}

/// What an operation needs from the history store before it can be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveLookup {
    /// The reservation with this id (not in the state).
    Reservation(String),
    /// The reservation a reserve of `tenant` with idempotency `key` created.
    CreatedBy { tenant: Arc<str>, key: Arc<str> },
}

/// What the store found for an [`ArchiveLookup`] (`None`: nothing archived).
pub type Found = Option<Arc<Archived>>;

const DAY_MS: Millis = 24 * 3_600_000;

/// The digest of a reserve's idempotency key in the archived-key sets: the first 4 bytes of
/// SHA-256 over the tenant and the key. Stable across versions and processes (the digests
/// are persisted in snapshots; format 4 kept 8 bytes, of which these are the first).
///
/// A filter, not an identity: a fresh key whose digest some archived key shares costs one
/// read of the disk, which finds the other key and answers the reserve as fresh. With N
/// keys in their windows that is N / 2^32 of fresh reserves (0.2 % at ten million a day),
/// and half the memory and snapshot bytes of 8-byte digests, which a restart reads.
pub fn reserve_key_digest(tenant: &str, key: &str) -> u32 {
    let mut hash = Sha256::new();
    hash.update(tenant.as_bytes());
    hash.update([0]);
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    u32::from_be_bytes(
        digest[..4]
            .try_into()
            .expect("a SHA-256 digest has 32 bytes"),
    )
}

/// The digests of archived reserves' keys whose replay window has not ended, by the day it
/// ends: a day's set is dropped whole once the day is over (no per-key expiry to index).
/// Each day's set is shared with snapshots taken meanwhile (copied on its next write), so
/// taking one under the ledger lock copies pointers, not millions of digests.
#[derive(Debug, Clone, Default)]
pub struct ArchivedKeys {
    by_day: BTreeMap<Millis, Arc<DaySet>>,
}

/// One day's digests: those a snapshot brought, sorted ([`SortedDigests`]: loaded as they
/// are read, with no table to build), and those archived since, in a hash table.
#[derive(Debug, Clone, Default)]
struct DaySet {
    loaded: Arc<SortedDigests>,
    added: HashTable<u32>,
}

impl DaySet {
    fn contains(&self, digest: u32) -> bool {
        self.added
            .find(table_hash(digest), |d| *d == digest)
            .is_some()
            || self.loaded.contains(digest)
    }

    fn len(&self) -> usize {
        self.loaded.digests.len() + self.added.len()
    }

    /// Every digest, sorted.
    fn sorted(&self) -> Vec<u32> {
        let mut added: Vec<u32> = self.added.iter().copied().collect();
        added.sort_unstable();
        let loaded = &self.loaded.digests;
        let mut all = Vec::with_capacity(loaded.len() + added.len());
        let (mut i, mut j) = (0, 0);
        while i < loaded.len() && j < added.len() {
            if loaded[i] <= added[j] {
                all.push(loaded[i]);
                i += 1;
            } else {
                all.push(added[j]);
                j += 1;
            }
        }
        all.extend_from_slice(&loaded[i..]);
        all.extend_from_slice(&added[j..]);
        all
    }
}

/// A digest's hash in a [`DaySet`]'s table: its bits spread over all 64 (a multiply by an
/// odd constant). The table picks a slot by the hash's low bits and tags it with its top 7:
/// a 4-byte digest as it is would tag every slot alike, and each lookup would compare every
/// key it probes.
fn table_hash(digest: u32) -> u64 {
    u64::from(digest).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Sorted digests with a directory of where each run of equal leading bits starts: the
/// digests are uniformly spread (they are SHA-256 prefixes), so a run holds about
/// [`DIGESTS_PER_RUN`] of them, and a lookup is a read of the directory and a search of one
/// short run (two cache misses), where a binary search of millions costs twenty. Building
/// it is one pass: a restart with millions of digests reads them and is done.
#[derive(Debug, Clone, Default)]
struct SortedDigests {
    digests: Vec<u32>,
    /// Digests are grouped by their leading `32 - shift` bits.
    shift: u32,
    /// Where each group starts in `digests`, with the end after the last.
    starts: Vec<u32>,
}

/// About how many digests share a directory entry.
const DIGESTS_PER_RUN: usize = 16;

impl SortedDigests {
    fn new(mut digests: Vec<u32>) -> Self {
        if !digests.is_sorted() {
            digests.sort_unstable();
        }
        digests.dedup();
        digests.shrink_to_fit();
        let bits = (digests.len() / DIGESTS_PER_RUN)
            .checked_ilog2()
            .unwrap_or(0)
            .min(24);
        let shift = 32 - bits;
        let groups = 1usize << bits;
        let mut starts = Vec::with_capacity(groups + 1);
        let mut at = 0;
        for group in 0..groups as u32 {
            while at < digests.len() && Self::group(digests[at], shift) < group {
                at += 1;
            }
            starts.push(at as u32);
        }
        starts.push(digests.len() as u32);
        SortedDigests {
            digests,
            shift,
            starts,
        }
    }

    fn group(digest: u32, shift: u32) -> u32 {
        digest.checked_shr(shift).unwrap_or(0)
    }

    fn contains(&self, digest: u32) -> bool {
        let group = Self::group(digest, self.shift) as usize;
        match (self.starts.get(group), self.starts.get(group + 1)) {
            (Some(&from), Some(&to)) => self.digests[from as usize..to as usize]
                .binary_search(&digest)
                .is_ok(),
            _ => false,
        }
    }
}

impl PartialEq for ArchivedKeys {
    fn eq(&self, other: &Self) -> bool {
        self.days() == other.days()
    }
}

impl Eq for ArchivedKeys {}

impl ArchivedKeys {
    /// Remembers `digest` until the day its record's window ends (`expires_at_ms`) is over.
    pub(crate) fn insert(&mut self, expires_at_ms: Millis, digest: u32) {
        let day = expires_at_ms.div_euclid(DAY_MS);
        let set = self.by_day.entry(day).or_default();
        if !set.contains(digest) {
            Arc::make_mut(set)
                .added
                .insert_unique(table_hash(digest), digest, |d| table_hash(*d));
        }
    }

    /// Whether an archived reserve may have used the key with this digest in a window that
    /// has not ended by `now` (false: it certainly did not).
    pub(crate) fn may_hold(&self, now: Millis, digest: u32) -> bool {
        self.by_day
            .range(now.div_euclid(DAY_MS)..)
            .any(|(_, set)| set.contains(digest))
    }

    /// The first day whose set is over at `now` and can go, if any.
    pub(crate) fn stale_day(&self, now: Millis) -> Option<Millis> {
        let (&day, _) = self.by_day.first_key_value()?;
        (day < now.div_euclid(DAY_MS)).then_some(day)
    }

    pub(crate) fn forget_day(&mut self, day: Millis) {
        self.by_day.remove(&day);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_day.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_day.values().map(|set| set.len()).sum()
    }

    /// The sets as a snapshot stores them: days ascending, each day's digests sorted.
    pub(crate) fn days(&self) -> Vec<(Millis, Vec<u32>)> {
        self.by_day
            .iter()
            .map(|(day, set)| (*day, set.sorted()))
            .collect()
    }

    pub(crate) fn from_days(days: Vec<(Millis, Vec<u32>)>) -> Self {
        let by_day = days
            .into_iter()
            .map(|(day, digests)| {
                let set = DaySet {
                    loaded: Arc::new(SortedDigests::new(digests)),
                    added: HashTable::new(),
                };
                (day, Arc::new(set))
            })
            .collect();
        ArchivedKeys { by_day }
    }
}

/// Digests a snapshot's size hint is trusted for at most: a longer list (or a damaged
/// length) grows as it is read.
const PREALLOCATED_DIGESTS: usize = 1 << 24;

/// Days of sorted digests as a snapshot stores them (format 5): each digest as its
/// difference from the one before, so the encoding's variable-length integers take about two
/// bytes per digest at ten million a day, against four raw or about nine in format 4.
pub(crate) struct SnapshotDays<'a>(pub(crate) &'a [(Millis, Vec<u32>)]);

impl Serialize for SnapshotDays<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for (day, digests) in self.0 {
            seq.serialize_element(&(day, Deltas(digests)))?;
        }
        seq.end()
    }
}

struct Deltas<'a>(&'a [u32]);

impl Serialize for Deltas<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        let mut previous = 0u32;
        for &digest in self.0 {
            seq.serialize_element(&digest.wrapping_sub(previous))?;
            previous = digest;
        }
        seq.end()
    }
}

/// `serialize_with` for [`crate::SnapshotData`]: [`SnapshotDays`].
pub(crate) fn serialize_days<S: serde::Serializer>(
    days: &[(Millis, Vec<u32>)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    SnapshotDays(days).serialize(serializer)
}

/// Reads a snapshot's digests by day ([`SnapshotDays`]) into vectors sized as the snapshot
/// says (serde's own `Vec` reading caps what it reserves and then doubles, which for ten
/// million digests copied them over and over and left the process holding twice their
/// size). Whatever the bytes, this never panics: damage reads as digests that are merely
/// wrong (a snapshot's checksum refuses damage before this).
pub(crate) fn deserialize_days<'de, D>(deserializer: D) -> Result<Vec<(Millis, Vec<u32>)>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Digests(Vec<u32>);

    impl<'de> Deserialize<'de> for Digests {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_seq(DigestsVisitor)
        }
    }

    struct DigestsVisitor;

    impl<'de> serde::de::Visitor<'de> for DigestsVisitor {
        type Value = Digests;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of digests")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Digests, A::Error> {
            let hint = seq.size_hint().unwrap_or(0).min(PREALLOCATED_DIGESTS);
            let mut digests = Vec::with_capacity(hint);
            let mut previous = 0u32;
            while let Some(delta) = seq.next_element::<u32>()? {
                previous = previous.wrapping_add(delta);
                digests.push(previous);
            }
            Ok(Digests(digests))
        }
    }

    let days = Vec::<(Millis, Digests)>::deserialize(deserializer)?;
    Ok(days.into_iter().map(|(day, d)| (day, d.0)).collect())
}

/// Format 4's digests (8 bytes, whole) as today's: their first 4 bytes, still sorted.
pub(crate) fn from_v4_days(days: Vec<(Millis, Vec<u64>)>) -> Vec<(Millis, Vec<u32>)> {
    days.into_iter()
        .map(|(day, digests)| (day, digests.iter().map(|d| (d >> 32) as u32).collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_held_until_its_day_is_over() {
        let mut keys = ArchivedKeys::default();
        let d = reserve_key_digest("acme", "k-1");
        keys.insert(DAY_MS + 5, d);
        assert!(keys.may_hold(0, d));
        assert!(keys.may_hold(2 * DAY_MS - 1, d));
        assert!(!keys.may_hold(2 * DAY_MS, d));
        assert!(!keys.may_hold(0, reserve_key_digest("acme", "k-2")));
        assert_eq!(keys.stale_day(2 * DAY_MS - 1), None);
        assert_eq!(keys.stale_day(2 * DAY_MS), Some(1));
        keys.forget_day(1);
        assert_eq!(keys.len(), 0);
    }

    #[test]
    fn digests_tell_tenants_apart_and_never_change() {
        assert_ne!(
            reserve_key_digest("acme", "corp-k"),
            reserve_key_digest("acme-corp", "k")
        );
        // Persisted in snapshots: a change would make retries of archived reserves fresh.
        // (The first 4 bytes of `printf 'acme\0k' | sha256sum`; format 4 kept 8.)
        assert_eq!(reserve_key_digest("acme", "k"), 0x8b7a_e2f4);
    }

    /// Digests spread as SHA-256 prefixes are, from a fixed seed.
    fn spread(n: u64, seed: u64) -> Vec<u32> {
        (0..n)
            .map(|i| reserve_key_digest("t", &format!("{seed}-{i}")))
            .collect()
    }

    /// [`spread`], sorted as a snapshot holds them.
    fn sorted(n: u64, seed: u64) -> Vec<u32> {
        let mut digests = spread(n, seed);
        digests.sort_unstable();
        digests
    }

    #[test]
    fn sorted_digests_find_exactly_theirs_at_every_size() {
        for n in [0, 1, 2, 15, 16, 17, 100, 4_096, 100_000] {
            let held = spread(n, 1);
            let others = spread(1_000, 2);
            let sorted = SortedDigests::new(held.clone());
            assert_eq!(sorted.digests.len(), held.len(), "{n}");
            assert!(
                held.iter().all(|d| sorted.contains(*d)),
                "{n}: one held is missed"
            );
            assert!(
                others.iter().all(|d| !sorted.contains(*d)),
                "{n}: one other is found"
            );
            // The extremes of the space, whatever group they fall in.
            for edge in [0, 1, u32::MAX - 1, u32::MAX] {
                assert!(!sorted.contains(edge), "{n}: {edge}");
            }
            let mut with_edges = held.clone();
            with_edges.extend([0, u32::MAX]);
            let sorted = SortedDigests::new(with_edges);
            assert!(sorted.contains(0) && sorted.contains(u32::MAX), "{n}");
        }
        // Out of order and repeated (a snapshot is written sorted; this is not relied on).
        let sorted = SortedDigests::new(vec![9, 3, 9, 1]);
        assert_eq!(sorted.digests, [1, 3, 9]);
        assert!(sorted.contains(3) && !sorted.contains(4));
    }

    #[test]
    fn loaded_and_added_digests_answer_and_snapshot_as_one_set() {
        let loaded = spread(1_000, 1);
        let added = spread(500, 2);
        let mut keys = ArchivedKeys::from_days(vec![(1, loaded.clone())]);
        for d in added.iter().chain(&loaded[..10]) {
            keys.insert(DAY_MS + 7, *d);
        }
        assert_eq!(
            keys.len(),
            1_500,
            "a loaded digest added again is held once"
        );
        assert!(loaded
            .iter()
            .chain(&added)
            .all(|d| keys.may_hold(DAY_MS, *d)));
        assert!(spread(100, 3).iter().all(|d| !keys.may_hold(DAY_MS, *d)));
        let mut all: Vec<u32> = loaded.iter().chain(&added).copied().collect();
        all.sort_unstable();
        assert_eq!(keys.days(), vec![(1, all.clone())]);
        assert_eq!(ArchivedKeys::from_days(vec![(1, all)]), keys);
    }

    #[test]
    fn a_snapshot_reads_its_digests_into_vectors_of_their_size() {
        let data = crate::SnapshotData {
            archived_keys: vec![(1, sorted(200_000, 1)), (2, vec![]), (3, sorted(5, 2))],
            ..Default::default()
        };
        let bytes = postcard::to_stdvec(&data).expect("encode");
        // Stored as differences: 200 000 digests spread over 2^32 are ~21 000 apart, three
        // bytes each (five as whole 4-byte varints).
        assert!(bytes.len() < 3 * 200_005 + 64, "{} bytes", bytes.len());
        let read: crate::SnapshotData = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(read, data);
        for (day, digests) in &read.archived_keys {
            assert_eq!(digests.capacity(), digests.len(), "day {day}");
        }
    }

    #[test]
    fn snapshot_form_round_trips() {
        let mut keys = ArchivedKeys::default();
        for (i, day) in [(1u32, 3), (2, 3), (3, 9)] {
            keys.insert(day * DAY_MS, i);
        }
        assert_eq!(ArchivedKeys::from_days(keys.days()), keys);
        assert_eq!(keys.len(), 3);
    }
}
