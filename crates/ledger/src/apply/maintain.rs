//! Background maintenance: expiry of lapsed reservations and eviction past retention.

use crate::{state::Evictable, Effect, Outcome};

use super::Tx;

impl Tx<'_> {
    /// Expires up to `limit` ACTIVE reservations whose grace has passed (returning their
    /// holds) and evicts up to `limit` records whose retention has passed.
    pub(crate) fn maintain(&mut self, limit: usize) -> Outcome {
        let due: Vec<String> = self
            .state
            .expiry_index
            .iter()
            .take_while(|(deadline, _)| *deadline < self.now)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect();
        let mut expired = 0;
        for id in due {
            let Some(r) = self.state.reservations.get(&id).cloned() else {
                continue;
            };
            // A reservation whose budgets cannot take the hold back stays ACTIVE and is
            // reported by `cycles verify`; it must never be marked EXPIRED without a refund.
            if self.expire(&r).is_ok() {
                expired += 1;
            }
        }
        let stale: Vec<Evictable> = self
            .state
            .retention_index
            .iter()
            .take_while(|(at, _)| *at <= self.now)
            .take(limit)
            .map(|(_, item)| item.clone())
            .collect();
        let evicted = stale.len();
        for item in stale {
            self.put(match item {
                Evictable::Reservation(id) => Effect::RemoveReservation(id),
                Evictable::Idempotency(key) => Effect::RemoveIdempotency(key),
            });
        }
        Outcome::Maintained { expired, evicted }
    }
}
