//! Reserves, live and dry run: admission, then a hold on every budgeted scope.

use std::sync::Arc;

use crate::intern::Placement;
use crate::{
    Action, ArchiveLookup, Balance, Budget, Decision, Effect, Endpoint, IdemKey, Millis,
    OveragePolicy, Permission, RateKind, Rejection, Reservation, ReservationStatus, ReserveResult,
    State, Subject, Unit,
};

use super::admission::{decision_with, Blocked};
use super::{operation, Actor, Cause, Idempotency, Idempotent, Tx, DAY_MS};

/// `POST /v1/reservations` (and its dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    pub actor: Actor,
    pub idem: Idempotency,
    /// The id the reservation gets if one is created.
    pub reservation_id: String,
    pub subject: Subject,
    pub action: Action,
    pub unit: Unit,
    pub estimate: i64,
    pub ttl_ms: Option<i64>,
    pub grace_period_ms: i64,
    pub overage_policy: Option<OveragePolicy>,
    pub dry_run: bool,
    pub metadata: Option<String>,
}

/// A reserve's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub once: Idempotent<ReserveResult>,
    /// Recomputed on every reply, replays included.
    pub remaining_ttl_ms: Option<i64>,
}

operation!(Reserve => Reserved, reserve, archive: retried_archived);

/// A reserve's lookup: the archived reservation its key created, if it may have been
/// archived (see [`State::archived_reserve`]).
fn retried_archived(cmd: &Reserve, state: &State, now: Millis) -> Option<ArchiveLookup> {
    let Actor::ApiKey(digest) = &cmd.actor else {
        return None;
    };
    let tenant = state.tenant_of_key(digest)?;
    state.archived_reserve(tenant, &cmd.idem.key, now)
}

impl Tx<'_> {
    fn reserve(&mut self, mut cmd: Reserve) -> Result<Reserved, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCreate)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let place = self
            .state
            .placements
            .borrow_mut()
            .place(std::mem::take(&mut cmd.subject));
        let key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Reserve,
            key: cmd.idem.key.clone(),
        };
        let fingerprint = cmd.idem.fingerprint;
        let once = self.once(Some((key, fingerprint)), |tx| {
            let result = tx.admitted(&caller.tenant_id, &mut cmd, place)?;
            let retention = match &result.expires_at_ms {
                Some(expires) => (expires - tx.now + cmd.grace_period_ms).max(DAY_MS),
                None => DAY_MS,
            };
            Ok((result, retention))
        })?;
        let remaining_ttl_ms = if once.replayed {
            self.replayed_ttl(&once.result)
        } else {
            once.result.expires_at_ms.map(|e| (e - self.now).max(0))
        };
        Ok(Reserved {
            once,
            remaining_ttl_ms,
        })
    }

    /// A fresh reserve's result: a DENY (dry run only), a dry run's ALLOW, or a hold.
    fn admitted(
        &mut self,
        tenant_id: &Arc<str>,
        cmd: &mut Reserve,
        place: Placement,
    ) -> Result<ReserveResult, Rejection> {
        match self.admit(tenant_id, &place.scopes, cmd.unit, cmd.estimate) {
            Err(Blocked::Error(e)) => Err(e),
            Err(Blocked::Deny(_, e)) if !cmd.dry_run => Err(e),
            Err(Blocked::Deny(reason, _)) => {
                let denial = Denial {
                    actor: &cmd.actor,
                    tenant_id,
                    scope: &place.scope_path,
                    unit: cmd.unit,
                    requested: cmd.estimate,
                    reason,
                    action: Some(&cmd.action),
                };
                self.denied_event(denial);
                Ok(ReserveResult {
                    decision: Decision::Deny,
                    reservation_id: None,
                    expires_at_ms: None,
                    reserved: None,
                    scope_path: place.scope_path,
                    affected_scopes: place.scopes,
                    balances: Vec::new(),
                    reason_code: Some(reason.to_string()),
                    caps: None,
                })
            }
            Ok(budgets) if cmd.dry_run => {
                let caps = self.caps_for(tenant_id, &place.scope_path).map(Box::new);
                Ok(ReserveResult {
                    decision: decision_with(&caps),
                    reservation_id: None,
                    expires_at_ms: None,
                    reserved: Some((cmd.unit, cmd.estimate)),
                    scope_path: place.scope_path,
                    affected_scopes: place.scopes,
                    balances: budgets.iter().map(Balance::from).collect(),
                    reason_code: None,
                    caps,
                })
            }
            Ok(budgets) => self.hold(tenant_id, cmd, place, budgets),
        }
    }

    /// `remaining_ttl_ms` for a replayed reserve: recomputed from the original expiry, 0 once
    /// the reservation is no longer ACTIVE, absent on dry runs.
    fn replayed_ttl(&self, result: &ReserveResult) -> Option<i64> {
        let (id, expires) = (result.reservation_id.as_ref()?, result.expires_at_ms?);
        Some(
            self.state
                .reservations
                .get(&**id)
                .map_or(0, |r| r.remaining_ttl_ms(expires, self.now)),
        )
    }

    /// Creates the reservation and holds its estimate on every budgeted scope.
    fn hold(
        &mut self,
        tenant_id: &Arc<str>,
        // Its action and metadata move into the reservation.
        cmd: &mut Reserve,
        place: Placement,
        mut budgets: Vec<Budget>,
    ) -> Result<ReserveResult, Rejection> {
        // Borrowed, not cloned: only a few scalars and the caps are needed.
        let tenant = self.existing_tenant(tenant_id)?;
        let governing = self.governing_policy(tenant_id, &place.scope_path);
        let rate = Self::rate_limit(governing, RateKind::Reserve);
        let limits = governing
            .and_then(|p| p.reservation_ttl_override)
            .unwrap_or_default();
        let ttl = cmd
            .ttl_ms
            .or(limits.default_ttl_ms)
            .unwrap_or(tenant.default_reservation_ttl_ms)
            .min(limits.max_ttl_ms.unwrap_or(tenant.max_reservation_ttl_ms));
        let caps = governing.and_then(|p| p.caps.clone()).map(Box::new);
        // Most specific wins: reservation, policy, budget ledger, tenant default.
        let policy = cmd
            .overage_policy
            .or_else(|| governing.and_then(|p| p.commit_overage_policy))
            .or_else(|| budgets.last().and_then(|b| b.commit_overage_policy))
            .unwrap_or(tenant.default_commit_overage_policy);
        let max_extensions = limits
            .max_extensions
            .unwrap_or(tenant.max_reservation_extensions);
        for b in &mut budgets {
            b.hold(cmd.estimate)?;
        }
        self.count_rate(rate)?;
        let reservation = Reservation {
            reservation_id: Arc::from(cmd.reservation_id.as_str()),
            tenant_id: tenant_id.clone(),
            subject: place.subject,
            action: self
                .state
                .actions
                .borrow_mut()
                .action(std::mem::take(&mut cmd.action)),
            unit: cmd.unit,
            estimate: cmd.estimate,
            scope_path: place.scope_path,
            affected_scopes: place.scopes.clone(),
            budgeted_scopes: budgets.iter().map(|b| b.scope.clone()).collect(),
            created_at_ms: self.now,
            expires_at_ms: self.now.saturating_add(ttl),
            grace_period_ms: cmd.grace_period_ms,
            overage_policy: policy,
            metadata: cmd.metadata.take().map(Arc::from),
            idempotency_key: cmd.idem.key.clone(),
            extension_count: 0,
            max_extensions,
            status: ReservationStatus::Active,
            charged: None,
            finalized_at_ms: None,
            expired_at_ms: None,
            committed_metadata: None,
            release_reason: None,
        };
        if self
            .state
            .reservations
            .contains_key(&*reservation.reservation_id)
        {
            return Err(Rejection::Internal("reservation id collision".into()));
        }
        let balances = budgets.iter().map(Balance::from).collect();
        self.balance_events(&cmd.actor, &budgets, None);
        self.put_budgets(Cause::Runtime(&cmd.actor), budgets)?;
        let result = ReserveResult {
            decision: decision_with(&caps),
            reservation_id: Some(reservation.reservation_id.clone()),
            expires_at_ms: Some(reservation.expires_at_ms),
            reserved: Some((cmd.unit, cmd.estimate)),
            scope_path: reservation.scope_path.clone(),
            affected_scopes: place.scopes,
            balances,
            reason_code: None,
            caps,
        };
        self.put(Effect::PutReservation(Arc::new(reservation)));
        Ok(result)
    }
}

/// A DENY of an evaluation (a dry run or `/v1/decide`): what its event names.
pub(crate) struct Denial<'a> {
    pub(crate) actor: &'a Actor,
    pub(crate) tenant_id: &'a str,
    pub(crate) scope: &'a str,
    pub(crate) unit: crate::Unit,
    pub(crate) requested: i64,
    pub(crate) reason: &'static str,
    pub(crate) action: Option<&'a Action>,
}

impl Tx<'_> {
    /// `reservation.denied`.
    pub(crate) fn denied_event(&mut self, d: Denial<'_>) {
        let mut data = serde_json::json!({
            "scope": d.scope,
            "unit": d.unit.as_str(),
            "reason_code": d.reason,
            "requested_amount": d.requested,
        });
        if let Some(a) = d.action {
            data["action"] = serde_json::json!({ "kind": a.kind, "name": a.name });
        }
        let actor = self.event_actor(d.actor, true);
        self.emit(super::emit::NewEvent {
            event_type: crate::EventType::ReservationDenied,
            tenant_id: d.tenant_id.to_string(),
            scope: Some(d.scope.to_string()),
            actor,
            source: super::emit::RUNTIME_SOURCE,
            data,
            correlation_id: None,
        });
    }
}
