//! Background maintenance: expiry of lapsed reservations and eviction past retention.

use std::collections::HashSet;
use std::sync::Arc;

use crate::{state::Evictable, Effect, Outcome, Unit};

use super::Tx;

impl Tx<'_> {
    /// Expires up to `limit` ACTIVE reservations whose grace has passed (returning their
    /// holds) and evicts up to `limit` records whose retention has passed.
    pub(crate) fn maintain(&mut self, limit: usize) -> Outcome {
        let due: Vec<Arc<str>> = self
            .state
            .expiry_index
            .iter()
            .take_while(|(deadline, _)| *deadline < self.now)
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect();
        let mut expired = 0;
        for id in due {
            let Some(r) = self.state.reservations.get(&*id).cloned() else {
                continue;
            };
            // A reservation whose budgets cannot take the hold back stays ACTIVE and is
            // reported by `cycles verify`; it must never be marked EXPIRED without a refund.
            if self.expire(r).is_ok() {
                expired += 1;
            }
        }
        self.coalesce_budget_writes();
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
            let effect = match item {
                Evictable::Reservation(id) => Effect::RemoveReservation(id),
                Evictable::Idempotency(arrival) => match self.state.idempotency.key_at(arrival) {
                    Some(key) => Effect::RemoveIdempotency(key.clone()),
                    None => continue,
                },
            };
            self.put(effect);
        }
        Outcome::Maintained { expired, evicted }
    }

    /// Keeps only the last `PutBudget` of each budget among this command's effects. Each
    /// one writes the whole budget, so a replay keeps the last and the earlier ones change
    /// nothing; a batch of expiries on one shared budget would otherwise journal that
    /// budget once per reservation.
    fn coalesce_budget_writes(&mut self) {
        let mut seen: HashSet<(&str, Unit)> = HashSet::new();
        let keep: Vec<bool> = self
            .effects
            .iter()
            .rev()
            .map(|e| match e {
                Effect::PutBudget(b) => seen.insert((&*b.scope, b.unit)),
                _ => true,
            })
            .collect();
        let mut keep = keep.into_iter().rev();
        self.effects.retain(|_| keep.next().unwrap_or(true));
    }
}
