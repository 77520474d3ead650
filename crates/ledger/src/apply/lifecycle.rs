//! Settling reservations: commit, release, extend, and expiry (by the sweep, or found on
//! the way by a settlement that comes too late).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{
    settle_commit, state::TERMINAL_RETENTION_MS, ArchiveLookup, Balance, Budget, BudgetKey,
    CommitResult, Effect, Endpoint, EventType, ExtendResult, IdemKey, Permission, RateKind,
    Rejection, ReleaseResult, Reservation, ReservationStatus, State, TenantStatus, Unit,
};

use super::emit::{upper, NewEvent, RUNTIME_SOURCE, SWEEP_SOURCE};
use super::{operation, Actor, Cause, Idempotency, Idempotent, Tx, DAY_MS};

/// `POST /v1/reservations/{id}/commit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub unit: Unit,
    pub actual: i64,
    pub metadata: Option<String>,
}

/// `POST /v1/reservations/{id}/release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub reason: Option<String>,
}

/// `POST /v1/reservations/{id}/extend`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extend {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub extend_by_ms: i64,
}

/// An extension's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extended {
    pub once: Idempotent<ExtendResult>,
    /// Recomputed on every reply, replays included.
    pub remaining_ttl_ms: i64,
}

operation!(
    Commit => Idempotent<CommitResult>, commit,
    archive: |c: &Commit, s, _| archived_by_id(&c.reservation_id, s)
);
operation!(
    Release => Idempotent<ReleaseResult>, release,
    archive: |c: &Release, s, _| archived_by_id(&c.reservation_id, s)
);
operation!(
    Extend => Extended, extend,
    archive: |c: &Extend, s, _| archived_by_id(&c.reservation_id, s)
);

/// The lookup of an operation naming reservation `id`: the archived one, when the state
/// does not hold it (archived once settled, or never created).
pub(crate) fn archived_by_id(id: &str, state: &State) -> Option<ArchiveLookup> {
    (!state.reservations.contains_key(id)).then(|| ArchiveLookup::Reservation(id.to_string()))
}

impl Tx<'_> {
    /// The reservation, if it exists and the caller may act on it (`None` caller = admin).
    pub(crate) fn owned_reservation(
        &mut self,
        id: &str,
        caller_tenant: Option<&str>,
    ) -> Result<Reservation, Rejection> {
        let not_found = || Rejection::NotFound(format!("Reservation not found: {id}"));
        let r = match self.state.reservations.get(id) {
            Some(r) => (**r).clone(),
            // Not in the state: archived once settled, or never created.
            None => self
                .archived(ArchiveLookup::Reservation(id.to_string()))?
                .filter(|a| &*a.reservation.reservation_id == id)
                .ok_or_else(not_found)?
                .reservation
                .as_ref()
                .clone(),
        };
        match caller_tenant {
            Some(t) if t != &*r.tenant_id => Err(Rejection::Forbidden(format!(
                "Reservation {id} belongs to another tenant"
            ))),
            _ => Ok(r),
        }
    }

    /// The checks shared by commit, release and extend after replay detection: the owning
    /// tenant must not be CLOSED (this beats the reservation's own state), and the
    /// reservation must still be ACTIVE.
    fn settleable(&self, r: &Reservation) -> Result<(), Rejection> {
        if self
            .state
            .tenants
            .get(&*r.tenant_id)
            .is_some_and(|t| t.status == TenantStatus::Closed)
        {
            return Err(Rejection::TenantClosed(r.tenant_id.to_string()));
        }
        match r.status {
            ReservationStatus::Active => Ok(()),
            ReservationStatus::Expired => {
                Err(Rejection::ReservationExpired(r.reservation_id.to_string()))
            }
            status @ (ReservationStatus::Committed | ReservationStatus::Released) => {
                Err(Rejection::ReservationFinalized {
                    id: r.reservation_id.to_string(),
                    status: status.as_str(),
                })
            }
        }
    }

    /// The budgets a reservation holds on. They cannot disappear (budgets are never deleted),
    /// so a missing one means the state is corrupt.
    fn held_budgets(&self, r: &Reservation) -> Result<Vec<Budget>, Rejection> {
        let budgets = self.budgets_for(r.budgeted_scopes.iter().cloned(), r.unit);
        if budgets.len() != r.budgeted_scopes.len() {
            return Err(Rejection::Internal(format!(
                "reservation {} holds on a budget that does not exist",
                r.reservation_id
            )));
        }
        Ok(budgets)
    }

    /// Gives a reservation's hold back to every budget it was taken from; returns the new
    /// balances.
    fn return_hold(
        &mut self,
        cause: Cause<'_>,
        r: &Reservation,
    ) -> Result<Vec<Balance>, Rejection> {
        let mut budgets = self.held_budgets(r)?;
        for b in &mut budgets {
            b.unhold(r.estimate)?;
        }
        let balances = budgets.iter().map(Balance::from).collect();
        self.put_budgets(cause, budgets)?;
        Ok(balances)
    }

    /// Expires an ACTIVE reservation found past its grace by a request (the sweep had not
    /// reached it yet): its hold returns to every budget it was taken from, and it is a
    /// `reservation.expired` as if the sweep had found it.
    fn expire(&mut self, r: &Reservation) -> Result<(), Rejection> {
        self.return_hold(Cause::System, r)?;
        self.put(Effect::ExpireReservation {
            reservation_id: r.reservation_id.clone(),
            at_ms: self.now,
        });
        self.expired_event(r);
        Ok(())
    }

    /// Refuses a settlement past the grace period, recording the expiry it discovered.
    fn refuse_if_lapsed(&mut self, r: &Reservation) -> Result<(), Rejection> {
        if self.now <= r.settle_deadline() {
            return Ok(());
        }
        let expired = Rejection::ReservationExpired(r.reservation_id.to_string());
        Err(self.lapse(|tx| tx.expire(r), expired))
    }

    /// The idempotency key of a settlement of `r` (`endpoint` names the reservation).
    fn settlement_key(
        r: &Reservation,
        endpoint: fn(Arc<str>) -> Endpoint,
        idem: &Idempotency,
    ) -> Option<(IdemKey, [u8; 32])> {
        let key = IdemKey {
            tenant_id: r.tenant_id.clone(),
            endpoint: endpoint(r.reservation_id.clone()),
            key: idem.key.clone(),
        };
        Some((key, idem.fingerprint))
    }

    fn commit(&mut self, cmd: Commit) -> Result<Idempotent<CommitResult>, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCommit)?;
        let r = self.owned_reservation(&cmd.reservation_id, Some(&caller.tenant_id))?;
        let key = Self::settlement_key(&r, Endpoint::Commit, &cmd.idem);
        self.once(key, |tx| {
            tx.settleable(&r)?;
            if cmd.unit != r.unit {
                return Err(Rejection::UnitMismatch {
                    message: format!(
                        "Commit unit {} does not match the reservation's unit {}",
                        cmd.unit.as_str(),
                        r.unit.as_str()
                    ),
                    scope: None,
                    requested: cmd.unit,
                    expected: vec![r.unit],
                });
            }
            tx.refuse_if_lapsed(&r)?;
            let governing = tx.governing_policy(&r.tenant_id, &r.scope_path);
            tx.count_rate(Self::rate_limit(governing, RateKind::Commit))?;
            let charge = settle_commit(
                &tx.held_budgets(&r)?,
                r.estimate,
                cmd.actual,
                r.overage_policy,
            )?;
            let result = CommitResult {
                unit: r.unit,
                charged: charge.charged,
                released: (charge.charged < r.estimate).then(|| r.estimate - charge.charged),
                balances: charge.budgets.iter().map(Balance::from).collect(),
            };
            if cmd.actual > r.estimate {
                tx.overage_event(&cmd.actor, &r, cmd.actual, &charge.budgets);
            }
            let debt = Some((Some(&*r.reservation_id), r.overage_policy));
            tx.balance_events(&cmd.actor, &charge.budgets, debt);
            tx.put_budgets(Cause::Runtime(&cmd.actor), charge.budgets)?;
            let mut committed = r;
            committed.status = ReservationStatus::Committed;
            committed.charged = Some(charge.charged);
            committed.finalized_at_ms = Some(tx.now);
            committed.committed_metadata = cmd.metadata;
            tx.put(Effect::PutReservation(Arc::new(committed)));
            Ok((result, TERMINAL_RETENTION_MS))
        })
    }

    fn release(&mut self, cmd: Release) -> Result<Idempotent<ReleaseResult>, Rejection> {
        let caller = self.admin_or_tenant(&cmd.actor, Permission::ReservationsRelease)?;
        let r =
            self.owned_reservation(&cmd.reservation_id, caller.as_ref().map(|c| &*c.tenant_id))?;
        let key = Self::settlement_key(&r, Endpoint::Release, &cmd.idem);
        self.once(key, |tx| {
            tx.settleable(&r)?;
            tx.refuse_if_lapsed(&r)?;
            let result = ReleaseResult {
                unit: r.unit,
                released: r.estimate,
                balances: tx.return_hold(Cause::Runtime(&cmd.actor), &r)?,
            };
            tx.put(Effect::PutReservation(Arc::new(released(
                r, tx.now, cmd.reason,
            ))));
            Ok((result, TERMINAL_RETENTION_MS))
        })
    }

    fn extend(&mut self, cmd: Extend) -> Result<Extended, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsExtend)?;
        let r = self.owned_reservation(&cmd.reservation_id, Some(&caller.tenant_id))?;
        let key = Self::settlement_key(&r, Endpoint::Extend, &cmd.idem);
        let once = self.once(key, |tx| tx.extended(&r, cmd.extend_by_ms))?;
        // The extension keeps the reservation ACTIVE, so its remaining time is the same
        // whether computed from the reservation before or after it.
        let remaining_ttl_ms = r.remaining_ttl_ms(once.result.expires_at_ms, self.now);
        Ok(Extended {
            once,
            remaining_ttl_ms,
        })
    }

    /// A fresh extension of `r` by `by_ms`, and how long its record is kept.
    fn extended(&mut self, r: &Reservation, by_ms: i64) -> Result<(ExtendResult, i64), Rejection> {
        self.settleable(r)?;
        self.refuse_if_lapsed(r)?;
        if self.now > r.expires_at_ms {
            // Within grace a commit or release is still accepted, but the lease is over.
            return Err(Rejection::ReservationExpired(r.reservation_id.to_string()));
        }
        if r.extension_count >= r.max_extensions {
            return Err(Rejection::MaxExtensionsExceeded {
                id: r.reservation_id.to_string(),
                max: r.max_extensions,
            });
        }
        let max_ttl = self.existing_tenant(&r.tenant_id)?.max_reservation_ttl_ms;
        // The lease grows from the current expiry, but never further than the tenant's
        // maximum TTL from now (and never shrinks).
        let expires_at_ms = r
            .expires_at_ms
            .saturating_add(by_ms)
            .min(self.now.saturating_add(max_ttl))
            .max(r.expires_at_ms);
        let result = ExtendResult {
            expires_at_ms,
            balances: self.held_budgets(r)?.iter().map(Balance::from).collect(),
        };
        let mut extended = r.clone();
        extended.expires_at_ms = expires_at_ms;
        extended.extension_count += 1;
        let retention = (extended.settle_deadline() - self.now).max(DAY_MS);
        self.put(Effect::PutReservation(Arc::new(extended)));
        Ok((result, retention))
    }
}

/// `r` released at `now` (its hold is returned by the caller).
impl Tx<'_> {
    /// `reservation.commit_overage`: a commit of more than its reservation held.
    fn overage_event(&mut self, actor: &Actor, r: &Reservation, actual: i64, after: &[Budget]) {
        let debt_incurred: i64 = after
            .iter()
            .filter_map(|b| Some(b.debt - self.state.budget(&b.key())?.debt))
            .max()
            .unwrap_or(0)
            .max(0);
        let data = serde_json::json!({
            "reservation_id": &*r.reservation_id,
            "scope": &*r.scope_path,
            "unit": r.unit.as_str(),
            "estimated_amount": r.estimate,
            "actual_amount": actual,
            "overage": actual - r.estimate,
            "overage_policy": upper(r.overage_policy),
            "debt_incurred": debt_incurred,
        });
        let actor = self.event_actor(actor, true);
        self.emit(NewEvent {
            event_type: EventType::ReservationCommitOverage,
            tenant_id: r.tenant_id.to_string(),
            scope: Some(r.scope_path.to_string()),
            actor,
            source: RUNTIME_SOURCE,
            data,
            correlation_id: None,
        });
    }
}

impl Tx<'_> {
    /// `reservation.expired`, by the sweep.
    pub(crate) fn expired_event(&mut self, r: &Reservation) {
        let data = serde_json::json!({
            "reservation_id": &*r.reservation_id,
            "scope": &*r.scope_path,
            "unit": r.unit.as_str(),
            "estimated_amount": r.estimate,
            "created_at": crate::format_rfc3339(r.created_at_ms),
            "expired_at": crate::format_rfc3339(self.now),
            "ttl_ms": r.expires_at_ms - r.created_at_ms,
            "extensions_used": r.extension_count,
        });
        self.emit(NewEvent {
            event_type: EventType::ReservationExpired,
            tenant_id: r.tenant_id.to_string(),
            scope: Some(r.scope_path.to_string()),
            actor: Self::system_actor(),
            source: SWEEP_SOURCE,
            data,
            correlation_id: None,
        });
    }
}

pub(crate) fn released(mut r: Reservation, now: i64, reason: Option<String>) -> Reservation {
    r.status = ReservationStatus::Released;
    r.finalized_at_ms = Some(now);
    r.release_reason = reason;
    r
}

/// The running budgets of an operation that returns many holds (the expiry sweep, a
/// tenant's close). Its effects are staged, not applied, so it cannot read back what it
/// wrote: it keeps each budget as its earlier returns left it here, and stages each budget
/// once at the end ([`Returns::into_budgets`]).
#[derive(Default)]
pub(crate) struct Returns {
    budgets: BTreeMap<BudgetKey, Budget>,
}

impl Returns {
    /// Returns `r`'s hold to every budget it was taken from: to all of them, or, if any
    /// cannot take it back, to none.
    pub(crate) fn take_back(&mut self, tx: &Tx<'_>, r: &Reservation) -> Result<(), Rejection> {
        let mut held = Vec::with_capacity(r.budgeted_scopes.len());
        for scope in r.budgeted_scopes.iter() {
            let key = BudgetKey {
                scope: scope.clone(),
                unit: r.unit,
            };
            let mut budget = match self.budgets.get(&key) {
                Some(b) => b.clone(),
                None => tx.state.budget(&key).cloned().ok_or_else(|| {
                    Rejection::Internal(format!(
                        "reservation {} holds on a budget that does not exist",
                        r.reservation_id
                    ))
                })?,
            };
            budget.unhold(r.estimate)?;
            budget.check_invariant()?;
            held.push((key, budget));
        }
        self.budgets.extend(held);
        Ok(())
    }

    /// `b` as the returns so far left it.
    pub(crate) fn current<'b>(&'b self, b: &'b Budget) -> &'b Budget {
        self.budgets
            .get(&BudgetKey {
                scope: b.scope.clone(),
                unit: b.unit,
            })
            .unwrap_or(b)
    }

    /// Every budget a return changed, in key order (so the effects are deterministic).
    pub(crate) fn into_budgets(self) -> Vec<Budget> {
        self.budgets.into_values().collect()
    }
}
