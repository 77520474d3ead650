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
/// release's and extensions'). They are the state's own allocations, shared, not copies:
/// the sweep that archives them runs under the ledger lock, on the request path. (An `Arc`
/// is encoded as what it holds, so the journal's and the history's bytes are the same.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archived {
    pub reservation: Arc<Reservation>,
    pub records: Vec<(Arc<IdemKey>, Arc<IdemRecord>)>,
}

impl Archived {
    /// The record under `key`, if it was archived with the reservation.
    pub fn record(&self, key: &IdemKey) -> Option<&IdemRecord> {
        self.records
            .iter()
            .find(|(k, _)| **k == *key)
            .map(|(_, r)| &**r)
    }
}

/// What an operation needs from the history store before it can be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveLookup {
    /// The reservation with this id (not in the state).
    Reservation(String),
    /// The reservation a reserve of `tenant` with idempotency `key` created: the newest
    /// archived with that key. `created_at` lists when each archived reservation whose key
    /// shares the key's digest was created (the history store finds a row by its tenant and
    /// creation time, through an index it has anyway); `any_time`, that one of them was
    /// archived before its time was kept (a digest read from a format-4 or -5 snapshot),
    /// and is found by its key alone.
    CreatedBy {
        tenant: Arc<str>,
        key: Arc<str>,
        created_at: Vec<Millis>,
        any_time: bool,
    },
}

impl ArchiveLookup {
    /// Whether `archived` is a reservation this lookup names. A key may name several
    /// archived reservations over time; the lookup's answer is the newest of them.
    pub fn names(&self, archived: &Archived) -> bool {
        let r = &archived.reservation;
        match self {
            ArchiveLookup::Reservation(id) => *r.reservation_id == **id,
            ArchiveLookup::CreatedBy { tenant, key, .. } => {
                r.tenant_id == *tenant && r.idempotency_key == *key
            }
        }
    }
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

/// An archived reserve's key as the sets hold it: its digest, and when the reservation it
/// created was created, as milliseconds before the end of its set's day ([`UNKNOWN_TIME`]:
/// not known). The time is what lets the history store find the row without an index of
/// keys: such an index takes a random page write per archived reservation, where the
/// index by creation time is appended to in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ArchivedKey {
    pub digest: u32,
    pub before_day_end: u32,
}

/// An [`ArchivedKey`]'s time when it is not known: digests read from a format-4 or -5
/// snapshot, or (never in practice: a reserve's record is kept a day or its TTL) a
/// reservation created more than 49 days before its record's window ended.
pub const UNKNOWN_TIME: u32 = u32::MAX;

impl ArchivedKey {
    /// The key of a reservation created at `created_at_ms` in the set of `day`.
    fn new(day: Millis, digest: u32, created_at_ms: Millis) -> Self {
        let before = day_end(day).saturating_sub(created_at_ms);
        let before_day_end = u32::try_from(before)
            .ok()
            .filter(|b| *b != UNKNOWN_TIME)
            .unwrap_or(UNKNOWN_TIME);
        ArchivedKey {
            digest,
            before_day_end,
        }
    }

    /// When its reservation was created, if known (it is in the set of `day`).
    fn created_at(self, day: Millis) -> Option<Millis> {
        (self.before_day_end != UNKNOWN_TIME)
            .then(|| day_end(day) - Millis::from(self.before_day_end))
    }
}

fn day_end(day: Millis) -> Millis {
    day.saturating_add(1).saturating_mul(DAY_MS)
}

/// The archived keys of reserves whose replay window has not ended, by the day it ends: a
/// day's set is dropped whole once the day is over (no per-key expiry to index). Each day's
/// set is shared with snapshots taken meanwhile (copied on its next write), so taking one
/// under the ledger lock copies pointers, not millions of keys.
#[derive(Debug, Clone, Default)]
pub struct ArchivedKeys {
    by_day: BTreeMap<Millis, Arc<DaySet>>,
}

/// One day's keys: those a snapshot brought, sorted ([`SortedKeys`]: loaded as they are
/// read, with no table to build), and those archived since, in a hash table by digest.
#[derive(Debug, Clone, Default)]
struct DaySet {
    loaded: Arc<SortedKeys>,
    added: HashTable<ArchivedKey>,
}

impl DaySet {
    fn contains(&self, digest: u32) -> bool {
        self.added
            .find(table_hash(digest), |k| k.digest == digest)
            .is_some()
            || self.loaded.contains(digest)
    }

    fn holds(&self, key: ArchivedKey) -> bool {
        self.added
            .find(table_hash(key.digest), |k| *k == key)
            .is_some()
            || self.loaded.matching(key.digest).any(|k| k == key)
    }

    /// Every key with `digest` (there may be more than one: a digest is 4 bytes).
    fn matching(&self, digest: u32) -> impl Iterator<Item = ArchivedKey> + '_ {
        let added = self
            .added
            .iter_hash(table_hash(digest))
            .filter(move |k| k.digest == digest)
            .copied();
        added.chain(self.loaded.matching(digest))
    }

    fn len(&self) -> usize {
        self.loaded.keys.len() + self.added.len()
    }

    /// Every key, in order: the loaded ones as they are, merged with a sorted copy of
    /// those added since (a snapshot streams them, with no copy of millions of keys).
    fn in_order(&self) -> impl Iterator<Item = ArchivedKey> + '_ {
        let mut added: Vec<ArchivedKey> = self.added.iter().copied().collect();
        added.sort_unstable();
        let mut added = added.into_iter().peekable();
        let mut loaded = self.loaded.keys.iter().copied().peekable();
        std::iter::from_fn(move || match (loaded.peek(), added.peek()) {
            (Some(l), Some(a)) if a < l => added.next(),
            (Some(_), _) => loaded.next(),
            (None, _) => added.next(),
        })
    }
}

/// A digest's hash in a [`DaySet`]'s table: its bits spread over all 64 (a multiply by an
/// odd constant). The table picks a slot by the hash's low bits and tags it with its top 7:
/// a 4-byte digest as it is would tag every slot alike, and each lookup would compare every
/// key it probes.
fn table_hash(digest: u32) -> u64 {
    u64::from(digest).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Keys sorted by digest (then time), with a directory of where each run of equal leading
/// bits starts: the digests are uniformly spread (they are SHA-256 prefixes),
/// so a run holds about [`DIGESTS_PER_RUN`] of them, and a lookup is a read of the
/// directory and a search of one short run (two cache misses), where a binary search of
/// millions costs twenty. Building it is one pass: a restart with millions of keys reads
/// them and is done.
#[derive(Debug, Clone, Default)]
struct SortedKeys {
    /// As a snapshot is read into them: a restart copies none.
    keys: Vec<ArchivedKey>,
    /// Digests are grouped by their leading `32 - shift` bits.
    shift: u32,
    /// Where each group starts in `digests`, with the end after the last.
    starts: Vec<u32>,
}

/// About how many digests share a directory entry.
const DIGESTS_PER_RUN: usize = 16;

impl SortedKeys {
    fn new(mut keys: Vec<ArchivedKey>) -> Self {
        if !keys.is_sorted() {
            keys.sort_unstable();
        }
        keys.dedup();
        keys.shrink_to_fit();
        let bits = (keys.len() / DIGESTS_PER_RUN)
            .checked_ilog2()
            .unwrap_or(0)
            .min(24);
        let shift = 32 - bits;
        let groups = 1usize << bits;
        let mut starts = Vec::with_capacity(groups + 1);
        let mut at = 0;
        for group in 0..groups as u32 {
            while at < keys.len() && Self::group(keys[at].digest, shift) < group {
                at += 1;
            }
            starts.push(at as u32);
        }
        starts.push(keys.len() as u32);
        SortedKeys {
            keys,
            shift,
            starts,
        }
    }

    fn group(digest: u32, shift: u32) -> u32 {
        digest.checked_shr(shift).unwrap_or(0)
    }

    /// Where the keys with `digest` are.
    fn range(&self, digest: u32) -> std::ops::Range<usize> {
        let group = Self::group(digest, self.shift) as usize;
        let (Some(&from), Some(&to)) = (self.starts.get(group), self.starts.get(group + 1)) else {
            return 0..0;
        };
        let run = &self.keys[from as usize..to as usize];
        let first = run.partition_point(|k| k.digest < digest);
        let end = run.partition_point(|k| k.digest <= digest);
        from as usize + first..from as usize + end
    }

    fn contains(&self, digest: u32) -> bool {
        !self.range(digest).is_empty()
    }

    fn matching(&self, digest: u32) -> impl Iterator<Item = ArchivedKey> + '_ {
        self.keys[self.range(digest)].iter().copied()
    }
}

impl PartialEq for ArchivedKeys {
    fn eq(&self, other: &Self) -> bool {
        self.days() == other.days()
    }
}

impl Eq for ArchivedKeys {}

/// When archived reserves that may have used a key created their reservations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyTimes {
    pub created_at: Vec<Millis>,
    /// One of them was archived before times were kept.
    pub any_time: bool,
}

impl ArchivedKeys {
    /// Remembers the reserve key with `digest`, whose reservation was created at
    /// `created_at_ms`, until the day its record's window ends (`expires_at_ms`) is over.
    pub(crate) fn insert(&mut self, expires_at_ms: Millis, digest: u32, created_at_ms: Millis) {
        let day = expires_at_ms.div_euclid(DAY_MS);
        let key = ArchivedKey::new(day, digest, created_at_ms);
        let set = self.by_day.entry(day).or_default();
        if !set.holds(key) {
            Arc::make_mut(set)
                .added
                .insert_unique(table_hash(digest), key, |k| table_hash(k.digest));
        }
    }

    /// When archived reserves that may have used the key with this digest, in a window not
    /// over by `now`, created their reservations (`None`: none did, certainly).
    pub(crate) fn times(&self, now: Millis, digest: u32) -> Option<KeyTimes> {
        let mut days = self
            .by_day
            .range(now.div_euclid(DAY_MS)..)
            .filter(|(_, set)| set.contains(digest))
            .peekable();
        days.peek()?;
        let mut times = KeyTimes::default();
        for (day, set) in days {
            for key in set.matching(digest) {
                match key.created_at(*day) {
                    Some(at) => times.created_at.push(at),
                    None => times.any_time = true,
                }
            }
        }
        times.created_at.sort_unstable_by(|a, b| b.cmp(a));
        times.created_at.dedup();
        Some(times)
    }

    /// Whether a key of unknown time is held (see [`UNKNOWN_TIME`]): while one is, its
    /// reserve is found by its key alone, which needs the history store's index of keys.
    pub fn any_unknown_time(&self) -> bool {
        self.by_day.values().any(|set| {
            set.added.iter().any(|k| k.before_day_end == UNKNOWN_TIME)
                || set
                    .loaded
                    .keys
                    .iter()
                    .any(|k| k.before_day_end == UNKNOWN_TIME)
        })
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

    /// The sets as a snapshot stores them: days ascending, each day's keys sorted.
    pub(crate) fn days(&self) -> Vec<(Millis, Vec<ArchivedKey>)> {
        self.by_day
            .iter()
            .map(|(day, set)| (*day, set.in_order().collect()))
            .collect()
    }

    /// The sets as a snapshot stores them ([`SnapshotDays`]), streamed from the sets.
    pub(crate) fn snapshot_form(&self) -> impl Serialize + '_ {
        SnapshotDays(self.by_day.len(), move || {
            self.by_day
                .iter()
                .map(|(day, set)| (*day, set.len(), set.in_order()))
        })
    }

    pub(crate) fn from_days(days: Vec<(Millis, Vec<ArchivedKey>)>) -> Self {
        let by_day = days
            .into_iter()
            .map(|(day, keys)| {
                let set = DaySet {
                    loaded: Arc::new(SortedKeys::new(keys)),
                    added: HashTable::new(),
                };
                (day, Arc::new(set))
            })
            .collect();
        ArchivedKeys { by_day }
    }
}

/// Keys a snapshot's size hint is trusted for at most: a longer list (or a damaged length)
/// grows as it is read.
const PREALLOCATED_KEYS: usize = 1 << 24;

/// Days of sorted keys as a snapshot stores them (format 6): each digest as its difference
/// from the one before, so the encoding's variable-length integers take about two bytes per
/// digest at ten million a day, then its time (four bytes: a day and more of milliseconds).
/// Made of how many days there are and a function that lists each day with its number of
/// keys and the keys in order, so that the state's sets and a [`crate::SnapshotData`]'s
/// vectors are written alike.
struct SnapshotDays<F>(usize, F);

impl<F, D, K> Serialize for SnapshotDays<F>
where
    F: Fn() -> D,
    D: Iterator<Item = (Millis, usize, K)>,
    K: Iterator<Item = ArchivedKey>,
{
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0))?;
        for (day, len, keys) in (self.1)() {
            seq.serialize_element(&(day, Deltas(len, std::cell::Cell::new(Some(keys)))))?;
        }
        seq.end()
    }
}

/// A day's keys, written once (serializing takes the iterator).
struct Deltas<K>(usize, std::cell::Cell<Option<K>>);

impl<K: Iterator<Item = ArchivedKey>> Serialize for Deltas<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0))?;
        let mut previous = 0u32;
        for key in self.1.take().into_iter().flatten() {
            seq.serialize_element(&(key.digest.wrapping_sub(previous), key.before_day_end))?;
            previous = key.digest;
        }
        seq.end()
    }
}

/// `serialize_with` for [`crate::SnapshotData`]: [`SnapshotDays`].
pub(crate) fn serialize_days<S: serde::Serializer>(
    days: &[(Millis, Vec<ArchivedKey>)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let keys = || {
        days.iter()
            .map(|(day, keys)| (*day, keys.len(), keys.iter().copied()))
    };
    SnapshotDays(days.len(), keys).serialize(serializer)
}

/// Reads a sequence of differences (`T`: a digest's, or a digest's and its time) into a
/// vector sized as the snapshot says (serde's own `Vec` reading caps what it reserves and
/// then doubles, which for ten million keys copied them over and over and left the process
/// holding twice their size). Whatever the bytes, this never panics: damage reads as keys
/// that are merely wrong (a snapshot's checksum refuses damage before this).
struct Undelta<T>(Vec<ArchivedKey>, std::marker::PhantomData<T>);

/// One element of a stored day: a digest's difference from the one before, with its time
/// where the format has one.
trait StoredKey: for<'de> Deserialize<'de> {
    fn key(self, previous: u32) -> ArchivedKey;
}

impl StoredKey for u32 {
    fn key(self, previous: u32) -> ArchivedKey {
        ArchivedKey {
            digest: previous.wrapping_add(self),
            before_day_end: UNKNOWN_TIME,
        }
    }
}

impl StoredKey for (u32, u32) {
    fn key(self, previous: u32) -> ArchivedKey {
        ArchivedKey {
            digest: previous.wrapping_add(self.0),
            before_day_end: self.1,
        }
    }
}

impl<'de, T: StoredKey> Deserialize<'de> for Undelta<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: StoredKey> serde::de::Visitor<'de> for Visitor<T> {
            type Value = Undelta<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of archived keys")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let hint = seq.size_hint().unwrap_or(0).min(PREALLOCATED_KEYS);
                let mut keys = Vec::with_capacity(hint);
                let mut previous = 0u32;
                while let Some(stored) = seq.next_element::<T>()? {
                    let key = stored.key(previous);
                    previous = key.digest;
                    keys.push(key);
                }
                Ok(Undelta(keys, std::marker::PhantomData))
            }
        }

        deserializer.deserialize_seq(Visitor(std::marker::PhantomData))
    }
}

fn deserialize_stored<'de, D, T>(
    deserializer: D,
) -> Result<Vec<(Millis, Vec<ArchivedKey>)>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: StoredKey,
{
    let days = Vec::<(Millis, Undelta<T>)>::deserialize(deserializer)?;
    Ok(days.into_iter().map(|(day, keys)| (day, keys.0)).collect())
}

/// `deserialize_with` for [`crate::SnapshotData`]: [`SnapshotDays`].
pub(crate) fn deserialize_days<'de, D>(
    deserializer: D,
) -> Result<Vec<(Millis, Vec<ArchivedKey>)>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    deserialize_stored::<D, (u32, u32)>(deserializer)
}

/// Days of digests as an older snapshot stored them, read as keys with no time.
pub trait UntimedDays {
    fn into_keys(self) -> Vec<(Millis, Vec<ArchivedKey>)>;
}

/// Format 5's days: each digest's difference from the one before, and no times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestsV5(pub Vec<(Millis, Vec<ArchivedKey>)>);

impl<'de> Deserialize<'de> for DigestsV5 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_stored::<D, u32>(deserializer).map(DigestsV5)
    }
}

impl UntimedDays for DigestsV5 {
    fn into_keys(self) -> Vec<(Millis, Vec<ArchivedKey>)> {
        self.0
    }
}

/// Format 4's days: 8-byte digests, whole; today's are their first 4 bytes, still sorted.
impl UntimedDays for Vec<(Millis, Vec<u64>)> {
    fn into_keys(self) -> Vec<(Millis, Vec<ArchivedKey>)> {
        self.into_iter()
            .map(|(day, digests)| {
                let keys = digests.iter().map(|d| ArchivedKey {
                    digest: (d >> 32) as u32,
                    before_day_end: UNKNOWN_TIME,
                });
                (day, keys.collect())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `keys` may hold `digest` at `now`.
    fn may_hold(keys: &ArchivedKeys, now: Millis, digest: u32) -> bool {
        keys.times(now, digest).is_some()
    }

    #[test]
    fn a_digest_is_held_until_its_day_is_over() {
        let mut keys = ArchivedKeys::default();
        let d = reserve_key_digest("acme", "k-1");
        keys.insert(DAY_MS + 5, d, 3);
        assert!(may_hold(&keys, 0, d));
        assert!(may_hold(&keys, 2 * DAY_MS - 1, d));
        assert!(!may_hold(&keys, 2 * DAY_MS, d));
        assert!(!may_hold(&keys, 0, reserve_key_digest("acme", "k-2")));
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

    /// A key's time is the creation of its reservation, whichever of its sets holds it;
    /// two keys that share a digest are both answered, newest first.
    #[test]
    fn keys_that_share_a_digest_answer_every_time() {
        // Two of `acme`'s keys with one digest (found by search; asserted below).
        let (a, b) = ("k-22714", "k-38362");
        let digest = reserve_key_digest("acme", a);
        assert_eq!(digest, reserve_key_digest("acme", b));
        let mut keys = ArchivedKeys::default();
        let window_end = 3 * DAY_MS + 17;
        keys.insert(window_end, digest, window_end - DAY_MS);
        keys.insert(window_end, digest, window_end - DAY_MS + 250);
        keys.insert(window_end + DAY_MS, digest, window_end + 9);
        // Held once, however often it is archived again (a replay).
        keys.insert(window_end, digest, window_end - DAY_MS);
        assert_eq!(keys.len(), 3);
        let times = keys.times(0, digest).expect("held");
        assert_eq!(
            times.created_at,
            [
                window_end + 9,
                window_end - DAY_MS + 250,
                window_end - DAY_MS
            ]
        );
        assert!(!times.any_time);
        // As a snapshot keeps them, and read back.
        let read = ArchivedKeys::from_days(keys.days());
        assert_eq!(read.times(0, digest), Some(times));
        assert!(!read.any_unknown_time());
        // Once the first day is over, only the second day's key is left to find.
        let later = keys.times(4 * DAY_MS, digest).expect("held");
        assert_eq!(later.created_at, [window_end + 9]);
    }

    /// A time that does not fit (never in practice) is kept as unknown: the key is found by
    /// itself, and the history store keeps the index that needs.
    #[test]
    fn a_time_too_far_back_is_unknown() {
        let mut keys = ArchivedKeys::default();
        keys.insert(60 * DAY_MS, 7, 0);
        let times = keys.times(0, 7).expect("held");
        assert!(times.created_at.is_empty() && times.any_time);
        assert!(keys.any_unknown_time());
    }

    /// Digests spread as SHA-256 prefixes are, from a fixed seed.
    fn spread(n: u64, seed: u64) -> Vec<u32> {
        (0..n)
            .map(|i| reserve_key_digest("t", &format!("{seed}-{i}")))
            .collect()
    }

    /// Keys of [`spread`] digests with times from `seed`, sorted as a snapshot holds them.
    fn keyed(digests: &[u32], seed: u32) -> Vec<ArchivedKey> {
        let mut keys: Vec<ArchivedKey> = digests
            .iter()
            .enumerate()
            .map(|(i, d)| ArchivedKey {
                digest: *d,
                before_day_end: seed.wrapping_mul(7_919).wrapping_add(i as u32 * 13) % 90_000_000,
            })
            .collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn sorted_keys_find_exactly_theirs_at_every_size() {
        for n in [0, 1, 2, 15, 16, 17, 100, 4_096, 100_000] {
            let held = keyed(&spread(n, 1), 1);
            let others = spread(1_000, 2);
            let sorted = SortedKeys::new(held.clone());
            assert_eq!(sorted.keys.len(), held.len(), "{n}");
            assert!(
                held.iter()
                    .all(|k| sorted.matching(k.digest).any(|m| m == *k)),
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
            with_edges.extend(keyed(&[0, u32::MAX], 2));
            let sorted = SortedKeys::new(with_edges);
            assert!(sorted.contains(0) && sorted.contains(u32::MAX), "{n}");
        }
        // Out of order and repeated (a snapshot is written sorted; this is not relied on).
        let key = |digest, before_day_end| ArchivedKey {
            digest,
            before_day_end,
        };
        let sorted = SortedKeys::new(vec![key(9, 1), key(3, 5), key(9, 1), key(1, 2), key(9, 0)]);
        assert_eq!(sorted.keys, [key(1, 2), key(3, 5), key(9, 0), key(9, 1)]);
        assert_eq!(sorted.matching(9).count(), 2);
        assert!(sorted.contains(3) && !sorted.contains(4));
    }

    #[test]
    fn loaded_and_added_keys_answer_and_snapshot_as_one_set() {
        let loaded = keyed(&spread(1_000, 1), 1);
        let added = keyed(&spread(500, 2), 2);
        let mut keys = ArchivedKeys::from_days(vec![(1, loaded.clone())]);
        for k in added.iter().chain(&loaded[..10]) {
            keys.insert(
                DAY_MS + 7,
                k.digest,
                2 * DAY_MS - Millis::from(k.before_day_end),
            );
        }
        assert_eq!(keys.len(), 1_500, "a loaded key added again is held once");
        for k in loaded.iter().chain(&added) {
            let times = keys.times(DAY_MS, k.digest).expect("held");
            assert!(times
                .created_at
                .contains(&(2 * DAY_MS - Millis::from(k.before_day_end))));
        }
        assert!(spread(100, 3).iter().all(|d| !may_hold(&keys, DAY_MS, *d)));
        let mut all: Vec<ArchivedKey> = loaded.iter().chain(&added).copied().collect();
        all.sort_unstable();
        assert_eq!(keys.days(), vec![(1, all.clone())]);
        assert_eq!(ArchivedKeys::from_days(vec![(1, all)]), keys);
    }

    #[test]
    fn a_snapshot_reads_its_keys_into_vectors_of_their_size() {
        let data = crate::SnapshotData {
            archived_keys: vec![
                (1, keyed(&spread(200_000, 1), 1)),
                (2, vec![]),
                (3, keyed(&spread(5, 2), 2)),
            ],
            ..Default::default()
        };
        let bytes = postcard::to_stdvec(&data).expect("encode");
        // Digests stored as differences: 200 000 spread over 2^32 are ~21 000 apart, three
        // bytes each (five as whole 4-byte varints); times under 2^28, four bytes.
        assert!(bytes.len() < 7 * 200_005 + 64, "{} bytes", bytes.len());
        let read: crate::SnapshotData = postcard::from_bytes(&bytes).expect("decode");
        assert_eq!(read, data);
        for (day, keys) in &read.archived_keys {
            assert_eq!(keys.capacity(), keys.len(), "day {day}");
        }
    }

    /// The state's sets stream into the bytes a snapshot's vectors of the same keys write.
    #[test]
    fn the_sets_stream_as_their_days_are_written() {
        let mut keys = ArchivedKeys::from_days(vec![
            (1, keyed(&spread(1_000, 1), 1)),
            (4, keyed(&spread(10, 5), 5)),
        ]);
        for k in keyed(&spread(300, 2), 2) {
            keys.insert(
                DAY_MS + 7,
                k.digest,
                2 * DAY_MS - Millis::from(k.before_day_end),
            );
        }
        keys.insert(9 * DAY_MS, 77, 9 * DAY_MS - 5);
        struct Written(Vec<(Millis, Vec<ArchivedKey>)>);
        impl Serialize for Written {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize_days(&self.0, s)
            }
        }
        let streamed = postcard::to_stdvec(&keys.snapshot_form()).expect("encode");
        let written = postcard::to_stdvec(&Written(keys.days())).expect("encode");
        assert_eq!(streamed, written);
        assert_eq!(
            keys.days().iter().map(|(_, k)| k.len()).sum::<usize>(),
            1_311
        );
    }

    #[test]
    fn snapshot_form_round_trips() {
        let mut keys = ArchivedKeys::default();
        for (i, day) in [(1u32, 3), (2, 3), (3, 9)] {
            keys.insert(day * DAY_MS, i, day * DAY_MS - 40);
        }
        assert_eq!(ArchivedKeys::from_days(keys.days()), keys);
        assert_eq!(keys.len(), 3);
    }
}
