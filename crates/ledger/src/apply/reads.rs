//! Reads: one reservation, a tenant's reservations (filtered, in a chosen order), and
//! balances.

use std::ops::Bound;
use std::sync::Arc;

use crate::{
    has_segment, is_within, position, ArchiveLookup, Budget, BudgetKey, Endpoint, IdemKey, Millis,
    Permission, Position, Rejection, Reservation, ReservationStatus, SortBy, State, StoredOutcome,
    Unit,
};

use super::auth::scope_filter_allows;
use super::{operation, Actor, Tx};

/// One page of a list, and whether more follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

impl<T> Page<T> {
    /// The first `limit` of `rows`, looking one further to know whether more follow.
    pub(crate) fn of(rows: impl Iterator<Item = T>, limit: usize) -> Self {
        let mut items: Vec<T> = rows.take(limit + 1).collect();
        let has_more = items.len() > limit;
        items.truncate(limit);
        Page { items, has_more }
    }
}

/// `GET /v1/reservations/{id}`: a reservation as of now (its status already reflects a
/// lapsed grace period).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetReservation {
    pub actor: Actor,
    pub reservation_id: String,
}

/// `GET /v1/reservations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListReservations {
    pub actor: Actor,
    /// With a tenant key: validation only (must be the key's tenant). With the admin key:
    /// required, and the tenant listed.
    pub tenant: Option<String>,
    /// The create idempotency key: at most one row.
    pub idempotency_key: Option<String>,
    pub status: Option<ReservationStatus>,
    /// `(level, lower-cased value)` pairs the subject must match.
    pub filters: Vec<(&'static str, String)>,
    /// Inclusive bounds on `created_at_ms`, `expires_at_ms` and `finalized_at_ms`.
    pub created: (Option<Millis>, Option<Millis>),
    pub expires: (Option<Millis>, Option<Millis>),
    pub finalized: (Option<Millis>, Option<Millis>),
    pub sort_by: SortBy,
    pub descending: bool,
    pub limit: usize,
    pub after: Option<Position>,
}

/// A page of reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationPage {
    pub rows: Vec<Reservation>,
    /// Where the next page starts, when there may be more: every row up to it (in the
    /// listing's order) has been examined.
    pub next: Option<Position>,
    /// The tenant listed (the caller's, or the one an admin named).
    pub tenant: String,
}

impl ListReservations {
    /// Whether `r` (with its status as of `now`) passes every filter: how a history store
    /// filters the archived rows it walks.
    pub fn matches(&self, r: &Reservation, now: Millis) -> bool {
        matches(r, self, now)
    }

    /// The page of this listing made of `state`'s page (the state's rows, read first) and
    /// `archived`'s (the history store's rows after the same cursor, read after): both in
    /// order, a row in both taken from the state. Each side has examined its rows up to its
    /// `next`; the merged page holds only rows up to the nearer of the two, so a row one
    /// side did not reach is never skipped by the next page's cursor.
    pub fn merge(&self, state: ReservationPage, archived: ReservationPage) -> ReservationPage {
        let order = |a: &Position, b: &Position| {
            if self.descending {
                b.cmp(a)
            } else {
                a.cmp(b)
            }
        };
        let frontier = match (state.next, archived.next) {
            (Some(a), Some(b)) => Some(std::cmp::min_by(a, b, order)),
            (a, b) => a.or(b),
        };
        let live: std::collections::HashSet<&str> =
            state.rows.iter().map(|r| &*r.reservation_id).collect();
        let archived_rows: Vec<Reservation> = archived
            .rows
            .into_iter()
            .filter(|r| !live.contains(&*r.reservation_id))
            .collect();
        let mut rows: Vec<(Position, Reservation)> = state
            .rows
            .into_iter()
            .chain(archived_rows)
            .map(|r| (position(&r, self.sort_by), r))
            .filter(|(p, _)| frontier.as_ref().is_none_or(|f| order(p, f).is_le()))
            .collect();
        rows.sort_by(|a, b| order(&a.0, &b.0));
        let next = if rows.len() > self.limit {
            rows.truncate(self.limit);
            rows.last().map(|(p, _)| p.clone())
        } else {
            frontier
        };
        ReservationPage {
            rows: rows.into_iter().map(|(_, r)| r).collect(),
            next,
            tenant: state.tenant,
        }
    }
}

/// `GET /v1/balances`: subject-level filters (lower-cased values), paginated by budget key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetBalances {
    pub actor: Actor,
    /// Validation only: must equal the caller's tenant.
    pub tenant: Option<String>,
    /// `(level, value)` pairs every returned scope must contain as a segment.
    pub filters: Vec<(&'static str, String)>,
    /// Lower-cased: only scopes starting with it (the admin spec's form).
    pub scope_prefix: Option<String>,
    pub unit: Option<Unit>,
    pub limit: usize,
    /// Exclusive lower bound: the last `(scope, unit)` of the previous page.
    pub after: Option<(String, Unit)>,
}

operation!(
    GetReservation => Reservation, get_reservation,
    archive: |g: &GetReservation, s, _| super::lifecycle::archived_by_id(&g.reservation_id, s)
);
operation!(ListReservations => ReservationPage, list_reservations, archive: created_archived);

/// A listing by create key: the archived reservation the key created, if it may have been
/// archived (see [`State::archived_reserve`]).
fn created_archived(q: &ListReservations, state: &State, now: Millis) -> Option<ArchiveLookup> {
    let key = q.idempotency_key.as_deref()?;
    let tenant = match &q.actor {
        Actor::Admin => state.tenants.get(q.tenant.as_deref()?)?.tenant_id.as_str(),
        Actor::ApiKey(digest) => state.tenant_of_key(digest)?,
    };
    state.archived_reserve(tenant, key, now)
}
operation!(GetBalances => Page<Budget>, balances);

/// Rows examined per page at most. A page whose filters match few rows may come back short
/// (with a cursor to continue) rather than hold the ledger for a full scan.
pub const MAX_SCAN_PER_PAGE: usize = 50_000;

fn within((from, to): (Option<Millis>, Option<Millis>), v: Millis) -> bool {
    from.is_none_or(|f| v >= f) && to.is_none_or(|t| v <= t)
}

/// Does `r` (with its status as of `now`) pass every filter of `q`?
fn matches(r: &Reservation, q: &ListReservations, now: Millis) -> bool {
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
    fn get_reservation(&mut self, op: GetReservation) -> Result<Reservation, Rejection> {
        let id = op.reservation_id.as_str();
        let caller = self.admin_or_tenant(&op.actor, Permission::ReservationsList)?;
        let mut r = self.owned_reservation(id, caller.as_ref().map(|c| &*c.tenant_id))?;
        r.status = r.effective_status(self.now);
        if r.status == ReservationStatus::Expired {
            return Err(Rejection::ReservationExpired(id.to_string()));
        }
        Ok(r)
    }

    fn list_reservations(&mut self, q: ListReservations) -> Result<ReservationPage, Rejection> {
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
            return Ok(ReservationPage {
                rows,
                next: None,
                tenant,
            });
        }
        let Some(index) = self.state.list_index.get(&tenant) else {
            return Ok(ReservationPage {
                rows: Vec::new(),
                next: None,
                tenant,
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
        Ok(ReservationPage { rows, next, tenant })
    }

    /// The caller's budgets whose scope contains every filter segment, ordered by
    /// `(scope, unit)`, one page after the cursor.
    fn balances(&mut self, q: GetBalances) -> Result<Page<Budget>, Rejection> {
        let caller = self.tenant_caller(&q.actor, Permission::BalancesRead)?;
        if let Some(t) = &q.tenant {
            if *t.to_lowercase() != *caller.tenant_id {
                return Err(Rejection::Forbidden(format!(
                    "tenant '{t}' does not match the API key's tenant"
                )));
            }
        }
        if let Some(p) = &q.scope_prefix {
            self.within_scope_filter(&q.actor, p)?;
        }
        let reach = self.caller_scope_filter(&q.actor);
        let root = format!("tenant:{}", caller.tenant_id);
        let segments: Vec<String> = q.filters.iter().map(|(l, v)| format!("{l}:{v}")).collect();
        let start = match q.after {
            Some((scope, unit)) => Bound::Excluded(BudgetKey {
                scope: scope.into(),
                unit,
            }),
            None => Bound::Included(BudgetKey {
                scope: root.as_str().into(),
                unit: Unit::ALL[0],
            }),
        };
        let page = self
            .state
            .budgets
            .range((start, Bound::Unbounded))
            .map(|(_, b)| b)
            .take_while(|b| b.scope.starts_with(&root))
            .filter(|b| has_segment(&b.scope, &root) && b.scope.split('/').next() == Some(&root))
            .filter(|b| segments.iter().all(|s| has_segment(&b.scope, s)))
            .filter(|b| {
                q.scope_prefix
                    .as_ref()
                    .is_none_or(|p| is_within(&b.scope, p))
            })
            .filter(|b| q.unit.is_none_or(|u| b.unit == u))
            .filter(|b| scope_filter_allows(reach, &b.scope))
            .map(|b| (**b).clone());
        Ok(Page::of(page, q.limit))
    }

    /// The reservation a live reserve with `key` created, if its record still names it (in
    /// the state, or archived with the reservation).
    fn created_by_key(&self, tenant: &str, key: &str) -> Option<&Reservation> {
        let record_key = IdemKey {
            tenant_id: Arc::from(tenant),
            endpoint: Endpoint::Reserve,
            key: Arc::from(key),
        };
        let created = |r: &&Reservation| &*r.tenant_id == tenant && &*r.idempotency_key == key;
        if let Some(record) = self.state.idempotency.get(&record_key) {
            let StoredOutcome::Reserve(result) = &record.outcome else {
                return None;
            };
            return self
                .state
                .reservation(result.reservation_id.as_ref()?)
                .filter(created);
        }
        let archived = self.found()?;
        archived
            .record(&record_key)
            .filter(|record| record.expires_at_ms > self.now)
            .map(|_| &*archived.reservation)
            .filter(created)
    }
}
