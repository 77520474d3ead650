//! Settled reservations leave the state (DESIGN §3a): once a reservation has been COMMITTED,
//! RELEASED or EXPIRED for a moment, the sweep archives it. Its journal record carries the
//! reservation with the idempotency records that replay its reserve and its settlements
//! ([`Archived`]); applying it removes them from the state, and the store projects them
//! into its history store, where they stay readable and replayable for their retention.
//!
//! What the state keeps of an archived reservation is one 8-byte digest of its reserve's
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

/// The digest of a reserve's idempotency key in the archived-key sets: the first 8 bytes of
/// SHA-256 over the tenant and the key. Stable across versions and processes (the digests
/// are persisted in snapshots), and wide enough that two keys sharing one only cost a read
/// of the disk that finds the other.
pub fn reserve_key_digest(tenant: &str, key: &str) -> u64 {
    let mut hash = Sha256::new();
    hash.update(tenant.as_bytes());
    hash.update([0]);
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    u64::from_be_bytes(
        digest[..8]
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
    by_day: BTreeMap<Millis, Arc<HashTable<u64>>>,
}

impl PartialEq for ArchivedKeys {
    fn eq(&self, other: &Self) -> bool {
        self.days() == other.days()
    }
}

impl Eq for ArchivedKeys {}

impl ArchivedKeys {
    /// Remembers `digest` until the day its record's window ends (`expires_at_ms`) is over.
    pub(crate) fn insert(&mut self, expires_at_ms: Millis, digest: u64) {
        let day = expires_at_ms.div_euclid(DAY_MS);
        let set = self.by_day.entry(day).or_default();
        if set.find(digest, |d| *d == digest).is_none() {
            Arc::make_mut(set).insert_unique(digest, digest, |d| *d);
        }
    }

    /// Whether an archived reserve may have used the key with this digest in a window that
    /// has not ended by `now` (false: it certainly did not).
    pub(crate) fn may_hold(&self, now: Millis, digest: u64) -> bool {
        self.by_day
            .range(now.div_euclid(DAY_MS)..)
            .any(|(_, set)| set.find(digest, |d| *d == digest).is_some())
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
    pub(crate) fn days(&self) -> Vec<(Millis, Vec<u64>)> {
        self.by_day
            .iter()
            .map(|(day, set)| {
                let mut digests: Vec<u64> = set.iter().copied().collect();
                digests.sort_unstable();
                (*day, digests)
            })
            .collect()
    }

    pub(crate) fn from_days(days: Vec<(Millis, Vec<u64>)>) -> Self {
        let by_day = days
            .into_iter()
            .map(|(day, digests)| {
                let mut set = HashTable::with_capacity(digests.len());
                for d in digests {
                    set.insert_unique(d, d, |d| *d);
                }
                (day, Arc::new(set))
            })
            .collect();
        ArchivedKeys { by_day }
    }
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
        // (The first 8 bytes of `printf 'acme\0k' | sha256sum`.)
        assert_eq!(reserve_key_digest("acme", "k"), 0x8b7a_e2f4_82bc_2a7c);
    }

    #[test]
    fn snapshot_form_round_trips() {
        let mut keys = ArchivedKeys::default();
        for (i, day) in [(1u64, 3), (2, 3), (3, 9)] {
            keys.insert(day * DAY_MS, i);
        }
        assert_eq!(ArchivedKeys::from_days(keys.days()), keys);
        assert_eq!(keys.len(), 3);
    }
}
