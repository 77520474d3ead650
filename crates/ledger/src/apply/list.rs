//! `GET /v1/reservations`: one tenant's reservations, filtered, in a chosen order.

use std::sync::Arc;

use crate::{
    position, Endpoint, IdemKey, ListQuery, Millis, Outcome, Permission, Rejection, Reservation,
    StoredOutcome,
};

use super::Tx;

/// Rows examined per page at most. A page whose filters match few rows may come back short
/// (with a cursor to continue) rather than hold the ledger for a full scan.
pub const MAX_SCAN_PER_PAGE: usize = 50_000;

fn within((from, to): (Option<Millis>, Option<Millis>), v: Millis) -> bool {
    from.is_none_or(|f| v >= f) && to.is_none_or(|t| v <= t)
}

/// Does `r` (with its status as of `now`) pass every filter of `q`?
fn matches(r: &Reservation, q: &ListQuery, now: Millis) -> bool {
    let subject = r.subject.levels();
    q.status.is_none_or(|s| r.effective_status(now) == s)
        && q.filters.iter().all(|(level, value)| {
            subject
                .iter()
                .any(|(l, v)| l == level && v.is_some_and(|v| v.to_lowercase() == *value))
        })
        && within(q.created, r.created_at_ms)
        && within(q.expires, r.expires_at_ms)
        && (q.finalized == (None, None)
            || r.finalized_at_ms.is_some_and(|f| within(q.finalized, f)))
}

impl Tx<'_> {
    pub(crate) fn list_reservations(&mut self, q: ListQuery) -> Result<Outcome, Rejection> {
        let tenant = match self.admin_or_tenant(&q.actor, Permission::ReservationsList)? {
            Some(caller) => {
                if q.tenant
                    .as_ref()
                    .is_some_and(|t| *t.to_lowercase() != *caller.tenant_id)
                {
                    return Err(Rejection::Forbidden(
                        "tenant does not match the API key's tenant".into(),
                    ));
                }
                caller.tenant_id.to_string()
            }
            None => q.tenant.clone().ok_or_else(|| {
                Rejection::InvalidRequest(
                    "tenant query parameter is required when using admin key authentication".into(),
                )
            })?,
        };
        let now = self.now;
        let view = |r: &Reservation| {
            let mut r = r.clone();
            r.status = r.effective_status(now);
            r
        };
        if let Some(key) = &q.idempotency_key {
            let rows = self
                .created_by_key(&tenant, key)
                .filter(|r| matches(r, &q, now))
                .map(view)
                .into_iter()
                .collect();
            return Ok(Outcome::Reservations { rows, next: None });
        }
        let Some(index) = self.state.list_index.get(&tenant) else {
            return Ok(Outcome::Reservations {
                rows: Vec::new(),
                next: None,
            });
        };
        let ids = index.ids(
            q.sort_by,
            q.descending,
            q.after.as_ref(),
            q.status,
            q.created,
        );
        let mut rows = Vec::with_capacity(q.limit);
        let mut last_scanned = None;
        let mut exhausted = true;
        for (scanned, id) in ids.enumerate() {
            if rows.len() == q.limit || scanned == MAX_SCAN_PER_PAGE {
                exhausted = false;
                break;
            }
            let Some(r) = self.state.reservations.get(id) else {
                continue;
            };
            last_scanned = Some(r);
            if matches(r, &q, now) {
                rows.push(view(r));
            }
        }
        let next = if exhausted {
            None
        } else {
            last_scanned.map(|r| position(r, q.sort_by))
        };
        Ok(Outcome::Reservations { rows, next })
    }

    /// The reservation a live reserve with `key` created, if it is still known.
    fn created_by_key(&self, tenant: &str, key: &str) -> Option<&Reservation> {
        let record = self.state.idempotency.get(&IdemKey {
            tenant_id: Arc::from(tenant),
            endpoint: Endpoint::Reserve,
            key: Arc::from(key),
        })?;
        let StoredOutcome::Reserve(result) = &record.outcome else {
            return None;
        };
        self.state
            .reservation(result.reservation_id.as_ref()?)
            .filter(|r| &*r.tenant_id == tenant && &*r.idempotency_key == key)
    }
}
