//! Requests waiting for their journal records to become durable, ordered by the sequence
//! number each one needs. After a sync only the requests it covered are woken: no waiter is
//! woken for nothing, so the cost of a group commit grows with the requests it answers, not
//! with all that wait.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::task::Waker;

/// Identifies one waiting request: the sequence number it needs, then a unique ticket.
pub type WaitKey = (u64, u64);

#[derive(Default)]
pub struct Waiters {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_ticket: u64,
    by_seq: BTreeMap<WaitKey, Waker>,
}

impl Waiters {
    /// A key for a request that needs record `seq`.
    pub fn key(&self, seq: u64) -> WaitKey {
        let mut inner = self.lock();
        inner.next_ticket += 1;
        (seq, inner.next_ticket)
    }

    /// Registers (or refreshes) the waker of `key`.
    pub fn register(&self, key: WaitKey, waker: &Waker) {
        match self.lock().by_seq.entry(key) {
            Entry::Occupied(e) if e.get().will_wake(waker) => {}
            Entry::Occupied(mut e) => {
                e.insert(waker.clone());
            }
            Entry::Vacant(e) => {
                e.insert(waker.clone());
            }
        }
    }

    /// Requests registered and not yet answered.
    pub fn len(&self) -> usize {
        self.lock().by_seq.len()
    }

    pub fn remove(&self, key: WaitKey) {
        self.lock().by_seq.remove(&key);
    }

    /// Wakes every request whose record is now durable.
    pub fn wake_durable(&self, durable_seq: u64) {
        let done = {
            let mut inner = self.lock();
            let waiting = inner.by_seq.split_off(&(durable_seq.saturating_add(1), 0));
            std::mem::replace(&mut inner.by_seq, waiting)
        };
        done.into_values().for_each(Waker::wake);
    }

    /// Wakes everyone (the store failed or closed: each will find out why).
    pub fn wake_all(&self) {
        let all = std::mem::take(&mut self.lock().by_seq);
        all.into_values().for_each(Waker::wake);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves the map consistent (every operation on it
        // is a single map call), so a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
