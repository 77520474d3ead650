//! Background maintenance: expiry of lapsed reservations and of keys, and eviction past
//! retention.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{state::Evictable, Effect, Rejection};

use super::lifecycle::Returns;
use super::{operation, Cause, Tx};

/// Expire up to `limit` ACTIVE reservations whose grace has passed (returning their holds)
/// and up to `limit` keys past their expiry, and evict up to `limit` records whose
/// retention has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintain {
    pub limit: usize,
}

/// What a maintenance pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintained {
    pub expired: usize,
    /// The reservations expired, by tenant (for the detector's expiry rates).
    pub expired_by_tenant: Vec<(Arc<str>, usize)>,
    pub keys_expired: usize,
    pub evicted: usize,
}

operation!(Maintain => Maintained, maintain);

impl Tx<'_> {
    fn maintain(&mut self, op: Maintain) -> Result<Maintained, Rejection> {
        let expired_by_tenant = self.expire_due(op.limit)?;
        let keys_expired = self.expire_keys(op.limit);
        let evicted = self.evict_stale(op.limit);
        Ok(Maintained {
            expired: expired_by_tenant.iter().map(|(_, n)| n).sum(),
            expired_by_tenant,
            keys_expired,
            evicted,
        })
    }

    /// Expires the due reservations, staging each changed budget once (a batch of expiries
    /// on one shared budget would otherwise journal that budget once per reservation).
    fn expire_due(&mut self, limit: usize) -> Result<Vec<(Arc<str>, usize)>, Rejection> {
        let (state, now) = (self.state, self.now);
        let due = state
            .expiry_index
            .iter()
            .take_while(|(deadline, _)| *deadline < now)
            .take(limit);
        let mut returns = Returns::default();
        let mut expired: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        for (_, id) in due {
            let Some(r) = state.reservations.get(&**id) else {
                continue;
            };
            // A reservation whose budgets cannot take the hold back stays ACTIVE and is
            // reported by `cycles verify`; it must never be marked EXPIRED without a refund.
            if returns.take_back(self, r).is_ok() {
                self.put(Effect::ExpireReservation {
                    reservation_id: id.clone(),
                    at_ms: now,
                });
                self.expired_event(r);
                *expired.entry(r.tenant_id.clone()).or_default() += 1;
            }
        }
        self.put_budgets(Cause::System, returns.into_budgets())?;
        Ok(expired.into_iter().collect())
    }

    /// Evicts the records whose retention has passed.
    fn evict_stale(&mut self, limit: usize) -> usize {
        let (state, now) = (self.state, self.now);
        let stale = state
            .retention_index
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit);
        let mut evicted = 0;
        for (_, item) in stale {
            let effect = match item {
                Evictable::Reservation(id) => Effect::RemoveReservation(id.clone()),
                Evictable::Idempotency(arrival) => match state.idempotency.key_at(*arrival) {
                    Some(key) => Effect::RemoveIdempotency(key.clone()),
                    None => continue,
                },
            };
            self.put(effect);
            evicted += 1;
        }
        evicted
    }
}
