//! Background maintenance: expiry of lapsed reservations and of keys, eviction of
//! idempotency records past their retention, and the archiving of settled reservations.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{Archived, Effect, Millis, Rejection};

use super::lifecycle::Returns;
use super::{operation, Cause, Tx};

/// Expire up to `limit` ACTIVE reservations whose grace has passed (returning their holds)
/// and up to `limit` keys past their expiry, evict up to `limit` idempotency records whose
/// retention has passed, and archive up to `limit` reservations settled at least
/// `archive_after_ms` ago (see [`crate::archive`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintain {
    pub limit: usize,
    pub archive_after_ms: Millis,
}

/// What a maintenance pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maintained {
    pub expired: usize,
    /// The reservations expired, by tenant (for the detector's expiry rates).
    pub expired_by_tenant: Vec<(Arc<str>, usize)>,
    pub keys_expired: usize,
    pub evicted: usize,
    pub archived: usize,
}

operation!(Maintain => Maintained, maintain);

impl Tx<'_> {
    fn maintain(&mut self, op: Maintain) -> Result<Maintained, Rejection> {
        let expired_by_tenant = self.expire_due(op.limit)?;
        let keys_expired = self.expire_keys(op.limit);
        let evicted = self.evict_stale(op.limit);
        let archived = self.archive_settled(op.limit, op.archive_after_ms);
        if let Some(day) = self.state.archived_keys.stale_day(self.now) {
            self.put(Effect::ForgetArchivedKeys { day });
        }
        Ok(Maintained {
            expired: expired_by_tenant.iter().map(|(_, n)| n).sum(),
            expired_by_tenant,
            keys_expired,
            evicted,
            archived,
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

    /// Evicts the idempotency records whose retention has passed.
    fn evict_stale(&mut self, limit: usize) -> usize {
        let (state, now) = (self.state, self.now);
        let stale = state
            .retention_index
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit);
        let mut evicted = 0;
        for (_, arrival) in stale {
            if let Some(key) = state.idempotency.key_at(*arrival) {
                self.put(Effect::RemoveIdempotency(key.clone()));
                evicted += 1;
            }
        }
        evicted
    }

    /// Archives the reservations that settled at least `after_ms` ago, oldest first, each
    /// with its records.
    fn archive_settled(&mut self, limit: usize, after_ms: Millis) -> usize {
        let (state, now) = (self.state, self.now);
        let due = state
            .settled_index
            .iter()
            .take_while(|(at, _)| at.saturating_add(after_ms) <= now)
            .take(limit);
        let mut archived = 0;
        for (_, id) in due {
            let Some(r) = state.reservations.get(id) else {
                continue;
            };
            let records = state.records_of(r);
            self.put(Effect::ArchiveReservation(Arc::new(Archived {
                reservation: r.clone(),
                records,
            })));
            archived += 1;
        }
        archived
    }
}
