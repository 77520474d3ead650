//! Idempotency records: state, not a cache. Written in the same step as the effect.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use imbl::OrdMap;
use serde::{Deserialize, Serialize};

use crate::{Millis, StoredOutcome};

/// The namespace a key lives in. Operations on a reservation include its id, so the same
/// key on two reservations names two independent operations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Endpoint {
    /// Live and dry-run reserves share one namespace.
    Reserve,
    Decide,
    Event,
    /// Keyed per reservation; the id is shared with the reservation.
    Commit(Arc<str>),
    Release(Arc<str>),
    Extend(Arc<str>),
    Fund,
    /// Added after format 1 (appended, so older journals decode unchanged): the bulk
    /// actions, keyed per tenant for budgets and under the admin sentinel for tenants.
    TenantsBulk,
    BudgetsBulk,
    /// The webhook bulk action, under the admin sentinel.
    WebhooksBulk,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdemKey {
    pub tenant_id: Arc<str>,
    pub endpoint: Endpoint,
    pub key: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRecord {
    /// SHA-256 of the request's canonical JSON.
    pub fingerprint: [u8; 32],
    /// The original successful outcome, replayed verbatim.
    pub outcome: StoredOutcome,
    /// When the record may be evicted.
    pub expires_at_ms: Millis,
}

/// The order in which records arrived in this process: a record's place in
/// [`IdemTable`]'s persistent map. Not persisted (a snapshot stores records in this order,
/// and loading numbers them again from zero).
pub(crate) type Arrival = u64;

/// A record with its key, as the snapshot-facing map holds it.
#[derive(Debug, Clone)]
pub(crate) struct IdemEntry {
    pub(crate) key: Arc<IdemKey>,
    pub(crate) record: Arc<IdemRecord>,
}

/// All idempotency records, held by two structures with different jobs: an ordinary hash
/// table answers lookups by key, and a persistent map ordered by arrival holds the records
/// for snapshots (shared with one in O(1), like the rest of the state).
///
/// Why not one persistent hash map: client keys are random, so each lookup and insert walks
/// a random path of a multi-level trie — with a few million records that was ~19 % of the
/// request workers' CPU, mostly cache misses — and while a snapshot shares the trie, every
/// insert copies its path. In arrival order, inserts extend the right edge of the tree and
/// retention removes from the left; the hash table is never shared, so it is never copied.
/// It does grow by doubling: at a few million records, one growth moves its 32-byte slots
/// (the hash is stored, so nothing is rehashed) in tens of milliseconds.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdemTable {
    by_arrival: OrdMap<Arrival, IdemEntry>,
    by_key: HashTable<Slot>,
    hasher: RandomState,
    next_arrival: Arrival,
}

#[derive(Debug, Clone)]
struct Slot {
    /// Stored so growing the table never rehashes keys.
    hash: u64,
    arrival: Arrival,
    key: Arc<IdemKey>,
    /// The same `Arc` as in the ordered map: a lookup needs no walk of that tree.
    record: Arc<IdemRecord>,
}

impl Slot {
    fn is(&self, hash: u64, key: &IdemKey) -> bool {
        self.hash == hash && *self.key == *key
    }
}

impl IdemTable {
    /// Builds a table from records in arrival order (a snapshot's order).
    pub(crate) fn from_records(records: Vec<(IdemKey, IdemRecord)>) -> Self {
        let mut table = IdemTable {
            by_key: HashTable::with_capacity(records.len()),
            ..IdemTable::default()
        };
        for (key, record) in records {
            table.put(&Arc::new(key), &Arc::new(record));
        }
        table
    }

    pub(crate) fn get(&self, key: &IdemKey) -> Option<&Arc<IdemRecord>> {
        self.entry(key).map(|(_, record)| record)
    }

    /// The record under `key`, with the key as the table holds it.
    pub(crate) fn entry(&self, key: &IdemKey) -> Option<(&Arc<IdemKey>, &Arc<IdemRecord>)> {
        let hash = self.hasher.hash_one(key);
        self.by_key
            .find(hash, |s| s.is(hash, key))
            .map(|s| (&s.key, &s.record))
    }

    /// Stores `record` under `key`; returns the record's arrival and the record it replaced
    /// (a replaced record keeps its arrival).
    pub(crate) fn put(
        &mut self,
        key: &Arc<IdemKey>,
        record: &Arc<IdemRecord>,
    ) -> (Arrival, Option<Arc<IdemRecord>>) {
        let hash = self.hasher.hash_one(&**key);
        let (arrival, replaced) = match self.by_key.find_mut(hash, |s| s.is(hash, key)) {
            Some(slot) => (
                slot.arrival,
                Some(std::mem::replace(&mut slot.record, record.clone())),
            ),
            None => {
                let arrival = self.next_arrival;
                self.next_arrival += 1;
                let slot = Slot {
                    hash,
                    arrival,
                    key: key.clone(),
                    record: record.clone(),
                };
                self.by_key.insert_unique(hash, slot, |s| s.hash);
                (arrival, None)
            }
        };
        let entry = IdemEntry {
            key: key.clone(),
            record: record.clone(),
        };
        self.by_arrival.insert(arrival, entry);
        (arrival, replaced)
    }

    /// Removes the record under `key`; returns its arrival and the record.
    pub(crate) fn remove(&mut self, key: &IdemKey) -> Option<(Arrival, Arc<IdemRecord>)> {
        let hash = self.hasher.hash_one(key);
        let (slot, _) = self
            .by_key
            .find_entry(hash, |s| s.is(hash, key))
            .ok()?
            .remove();
        self.by_arrival.remove(&slot.arrival);
        Some((slot.arrival, slot.record))
    }

    /// The key of the record that arrived at `arrival`, if it is still here.
    pub(crate) fn key_at(&self, arrival: Arrival) -> Option<&Arc<IdemKey>> {
        self.by_arrival.get(&arrival).map(|e| &e.key)
    }

    /// Records in arrival order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (Arrival, &IdemEntry)> {
        self.by_arrival.iter().map(|(arrival, e)| (*arrival, e))
    }

    /// The persistent map, shared in O(1).
    pub(crate) fn shared(&self) -> OrdMap<Arrival, IdemEntry> {
        self.by_arrival.clone()
    }

    /// Whether both structures hold the same records under the same arrivals.
    pub(crate) fn is_consistent(&self) -> bool {
        self.by_arrival.len() == self.by_key.len()
            && self.by_arrival.iter().all(|(arrival, e)| {
                let hash = self.hasher.hash_one(&*e.key);
                self.by_key
                    .find(hash, |s| s.is(hash, &e.key))
                    .is_some_and(|s| s.arrival == *arrival && Arc::ptr_eq(&s.record, &e.record))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExtendResult, StoredOutcome};

    fn key(tenant: &str, key: &str) -> Arc<IdemKey> {
        Arc::new(IdemKey {
            tenant_id: tenant.into(),
            endpoint: Endpoint::Reserve,
            key: key.into(),
        })
    }

    fn record(expires_at_ms: Millis) -> Arc<IdemRecord> {
        Arc::new(IdemRecord {
            fingerprint: [7; 32],
            outcome: StoredOutcome::Extend(Arc::new(ExtendResult {
                expires_at_ms,
                balances: Vec::new(),
            })),
            expires_at_ms,
        })
    }

    fn order(table: &IdemTable) -> Vec<(Arrival, String, Millis)> {
        table
            .entries()
            .map(|(a, e)| (a, e.key.key.to_string(), e.record.expires_at_ms))
            .collect()
    }

    #[test]
    fn records_are_found_by_key_and_kept_in_arrival_order() {
        let mut table = IdemTable::default();
        assert_eq!(table.put(&key("t", "b"), &record(10)), (0, None));
        assert_eq!(table.put(&key("t", "a"), &record(20)), (1, None));
        assert_eq!(table.put(&key("u", "a"), &record(30)), (2, None));
        assert_eq!(table.get(&key("t", "a")).unwrap().expires_at_ms, 20);
        assert_eq!(table.get(&key("u", "a")).unwrap().expires_at_ms, 30);
        assert!(table.get(&key("u", "b")).is_none());
        // Replacing keeps the arrival and returns the old record.
        let (arrival, old) = table.put(&key("t", "b"), &record(40));
        assert_eq!((arrival, old.unwrap().expires_at_ms), (0, 10));
        assert_eq!(
            order(&table),
            vec![
                (0, "b".into(), 40),
                (1, "a".into(), 20),
                (2, "a".into(), 30)
            ]
        );
        assert!(table.is_consistent());
    }

    #[test]
    fn removal_takes_a_record_out_of_both_structures() {
        let mut table = IdemTable::default();
        table.put(&key("t", "a"), &record(1));
        table.put(&key("t", "b"), &record(2));
        let (arrival, removed) = table.remove(&key("t", "a")).unwrap();
        assert_eq!((arrival, removed.expires_at_ms), (0, 1));
        assert!(table.remove(&key("t", "a")).is_none());
        assert!(table.get(&key("t", "a")).is_none());
        assert!(table.key_at(0).is_none());
        assert_eq!(&*table.key_at(1).unwrap().key, "b");
        // A key put again after removal is a new arrival.
        assert_eq!(table.put(&key("t", "a"), &record(3)), (2, None));
        assert!(table.is_consistent());
    }

    #[test]
    fn a_table_rebuilt_from_its_records_keeps_their_order() {
        let mut table = IdemTable::default();
        for (i, k) in ["x", "y", "z"].iter().enumerate() {
            table.put(&key("t", k), &record(i as Millis));
        }
        table.remove(&key("t", "x"));
        let records = table
            .entries()
            .map(|(_, e)| ((*e.key).clone(), (*e.record).clone()))
            .collect();
        let rebuilt = IdemTable::from_records(records);
        let names = |t: &IdemTable| -> Vec<String> {
            t.entries().map(|(_, e)| e.key.key.to_string()).collect()
        };
        assert_eq!(names(&rebuilt), ["y", "z"]);
        assert_eq!(rebuilt.get(&key("t", "z")).unwrap().expires_at_ms, 2);
        assert!(rebuilt.is_consistent());
    }

    #[test]
    fn a_table_whose_structures_disagree_is_reported() {
        let mut table = IdemTable::default();
        table.put(&key("t", "a"), &record(1));
        table.by_arrival.remove(&0);
        assert!(!table.is_consistent());
    }
}
