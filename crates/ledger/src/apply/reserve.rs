//! Admission: live and dry-run reserves, decide, direct events, and balance reads.

use std::ops::Bound;
use std::sync::Arc;

use crate::{
    admission_refusal, charge_amount, derive_scopes, has_segment, Balance, BalanceQuery, Budget,
    BudgetKey, Caps, DecideCmd, DecideResult, Decision, Effect, Endpoint, EventCmd, EventResult,
    IdemKey, Outcome, Permission, Refusal, Rejection, Reservation, ReservationStatus, ReserveCmd,
    ReserveResult, StoredOutcome, Subject, TenantStatus, Unit,
};

use super::{Tx, DAY_MS};
use crate::intern::Placement;

/// ALLOW, or ALLOW_WITH_CAPS when a policy supplies caps.
fn decision_with<C>(caps: &Option<C>) -> Decision {
    if caps.is_some() {
        Decision::AllowWithCaps
    } else {
        Decision::Allow
    }
}

/// How long a direct event's idempotency record lives.
const EVENT_IDEMPOTENCY_MS: i64 = 7 * DAY_MS;

/// Why a request cannot be admitted, before any budget arithmetic.
enum Blocked {
    /// An error on every surface (wrong unit, no budget at all on a live request, …).
    Error(Rejection),
    /// A refusal: an error on live requests, a DENY with this reason on evaluations.
    Deny(&'static str, Rejection),
}

impl Tx<'_> {
    /// The caller must be the subject's tenant, when the subject names one.
    fn check_subject_tenant(&self, subject: &Subject, tenant_id: &str) -> Result<(), Rejection> {
        match &subject.tenant {
            Some(t) if !t.trim().is_empty() && t.to_lowercase() != tenant_id => {
                Err(Rejection::Forbidden(format!(
                    "subject.tenant '{t}' does not match the API key's tenant '{tenant_id}'"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The closed/suspended tenant guard for spend admission.
    fn tenant_gate(&self, tenant_id: &str) -> Option<Blocked> {
        let tenant = self.state.tenants.get(tenant_id)?;
        match tenant.status {
            TenantStatus::Active => None,
            TenantStatus::Closed => Some(Blocked::Deny(
                "TENANT_CLOSED",
                Rejection::TenantClosed(tenant_id.to_string()),
            )),
            TenantStatus::Suspended => Some(Blocked::Deny(
                "TENANT_SUSPENDED",
                Rejection::Forbidden(format!(
                    "Tenant {tenant_id} is SUSPENDED: new reservations are not accepted"
                )),
            )),
        }
    }

    /// The budgets a request in `unit` would touch, or why there are none.
    fn admission_budgets(&self, scopes: &[String], unit: Unit) -> Result<Vec<Budget>, Blocked> {
        let budgets = self.budgets_for(scopes.iter().map(|s| Arc::from(s.as_str())), unit);
        if !budgets.is_empty() {
            return Ok(budgets);
        }
        for scope in scopes {
            let expected: Vec<Unit> = Unit::ALL
                .into_iter()
                .filter(|u| {
                    self.state.budgets.contains_key(&BudgetKey {
                        scope: scope.as_str().into(),
                        unit: *u,
                    })
                })
                .collect();
            if !expected.is_empty() {
                let names: Vec<&str> = expected.iter().map(|u| u.as_str()).collect();
                return Err(Blocked::Error(Rejection::UnitMismatch {
                    message: format!(
                        "Budget at scope '{scope}' exists but in a different unit (requested: {}, expected: [{}])",
                        unit.as_str(),
                        names.join(", ")
                    ),
                    scope: Some(scope.clone()),
                    requested: unit,
                    expected,
                }));
            }
        }
        let path = scopes.last().map(String::as_str).unwrap_or_default();
        Err(Blocked::Deny(
            "BUDGET_NOT_FOUND",
            Rejection::NotFound(format!("Budget not found for provided scope: {path}")),
        ))
    }

    /// Runs every admission check of a reserve; `Ok` carries the budgets to hold on.
    fn admit(
        &self,
        tenant_id: &str,
        scopes: &[String],
        unit: Unit,
        estimate: i64,
    ) -> Result<Vec<Budget>, Blocked> {
        if let Some(blocked) = self.tenant_gate(tenant_id) {
            return Err(blocked);
        }
        let budgets = self.admission_budgets(scopes, unit)?;
        let refs: Vec<&Budget> = budgets.iter().collect();
        match admission_refusal(&refs, estimate) {
            None => Ok(budgets),
            Some(refusal) => {
                let reason = refusal.reason_code();
                Err(Blocked::Deny(
                    reason,
                    refusal.into_rejection(unit, estimate),
                ))
            }
        }
    }

    pub(crate) fn reserve(&mut self, mut cmd: ReserveCmd) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCreate)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let place = self
            .state
            .placements
            .place(std::mem::take(&mut cmd.subject));
        let idem_key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Reserve,
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Reserve(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            let remaining_ttl_ms = self.replayed_ttl(&result);
            return Ok(Outcome::Reserved {
                result,
                remaining_ttl_ms,
                replayed: true,
            });
        }
        let result = match self.admit(&caller.tenant_id, &place.scopes, cmd.unit, cmd.estimate) {
            Err(Blocked::Error(e)) => return Err(e),
            Err(Blocked::Deny(_, e)) if !cmd.dry_run => return Err(e),
            Err(Blocked::Deny(reason, _)) => ReserveResult {
                decision: Decision::Deny,
                reservation_id: None,
                expires_at_ms: None,
                reserved: None,
                scope_path: place.scope_path,
                affected_scopes: place.scopes,
                balances: Vec::new(),
                reason_code: Some(reason.to_string()),
                caps: None,
            },
            Ok(budgets) if cmd.dry_run => {
                let caps = self
                    .caps_for(&caller.tenant_id, &place.scope_path)
                    .map(Box::new);
                ReserveResult {
                    decision: decision_with(&caps),
                    reservation_id: None,
                    expires_at_ms: None,
                    reserved: Some((cmd.unit, cmd.estimate)),
                    scope_path: place.scope_path,
                    affected_scopes: place.scopes,
                    balances: budgets.iter().map(Balance::from).collect(),
                    reason_code: None,
                    caps,
                }
            }
            Ok(budgets) => self.hold(&caller.tenant_id, &mut cmd, place, budgets)?,
        };
        let retention = match &result.expires_at_ms {
            Some(expires) => (expires - self.now + cmd.grace_period_ms).max(DAY_MS),
            None => DAY_MS,
        };
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Reserve,
            retention,
        );
        let remaining_ttl_ms = result.expires_at_ms.map(|e| (e - self.now).max(0));
        Ok(Outcome::Reserved {
            result,
            remaining_ttl_ms,
            replayed: false,
        })
    }

    /// The caps of the policy governing `scope_path`, if any.
    fn caps_for(&self, tenant_id: &str, scope_path: &str) -> Option<Caps> {
        self.governing_policy(tenant_id, scope_path)
            .and_then(|p| p.caps.clone())
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
        cmd: &mut ReserveCmd,
        place: Placement,
        mut budgets: Vec<Budget>,
    ) -> Result<ReserveResult, Rejection> {
        // Borrowed, not cloned: only a few scalars and the caps are needed.
        let tenant = self.existing_tenant(tenant_id)?;
        let governing = self.governing_policy(tenant_id, &place.scope_path);
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
        let reservation = Reservation {
            reservation_id: Arc::from(cmd.reservation_id.as_str()),
            tenant_id: tenant_id.clone(),
            subject: place.subject,
            action: self.state.actions.action(std::mem::take(&mut cmd.action)),
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
        self.put_budgets(budgets)?;
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

    pub(crate) fn decide(&mut self, cmd: DecideCmd) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCreate)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let scopes = derive_scopes(&cmd.subject);
        let idem_key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Decide,
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Decide(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            return Ok(Outcome::Decided {
                result,
                replayed: true,
            });
        }
        let result = match self.admit(&caller.tenant_id, &scopes, cmd.unit, cmd.estimate) {
            Ok(_) => {
                let path = scopes.last().cloned().unwrap_or_default();
                let caps = self.caps_for(&caller.tenant_id, &path);
                DecideResult {
                    decision: decision_with(&caps),
                    reason_code: None,
                    caps,
                    affected_scopes: scopes,
                }
            }
            Err(Blocked::Deny(reason, _)) => DecideResult {
                decision: Decision::Deny,
                reason_code: Some(reason.to_string()),
                caps: None,
                affected_scopes: scopes,
            },
            Err(Blocked::Error(e)) => return Err(e),
        };
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Decide,
            DAY_MS,
        );
        Ok(Outcome::Decided {
            result,
            replayed: false,
        })
    }

    /// A direct event: spend that already happened, charged under its overage policy.
    /// Events are not blocked by debt or over-limit (runtime spec A-33), only by budget and
    /// tenant status.
    pub(crate) fn event(&mut self, cmd: EventCmd) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCommit)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let scopes = derive_scopes(&cmd.subject);
        let idem_key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Event,
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Event(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            return Ok(Outcome::EventApplied {
                result,
                replayed: true,
            });
        }
        let tenant = self.existing_tenant(&caller.tenant_id)?.clone();
        if tenant.status == TenantStatus::Closed {
            return Err(Rejection::TenantClosed(tenant.tenant_id));
        }
        let budgets = match self.admission_budgets(&scopes, cmd.unit) {
            Ok(b) => b,
            Err(Blocked::Error(e) | Blocked::Deny(_, e)) => return Err(e),
        };
        let refs: Vec<&Budget> = budgets.iter().collect();
        if let Some(refusal @ (Refusal::Frozen(_) | Refusal::Closed(_))) =
            admission_refusal(&refs, 0)
        {
            return Err(refusal.into_rejection(cmd.unit, cmd.actual));
        }
        let policy = cmd
            .overage_policy
            .or_else(|| budgets.last().and_then(|b| b.commit_overage_policy))
            .unwrap_or(tenant.default_commit_overage_policy);
        let charge = charge_amount(&budgets, cmd.actual, policy)?;
        let result = EventResult {
            event_id: cmd.event_id,
            unit: cmd.unit,
            charged: (charge.charged < cmd.actual).then_some(charge.charged),
            balances: charge.budgets.iter().map(Balance::from).collect(),
        };
        self.put_budgets(charge.budgets)?;
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Event,
            EVENT_IDEMPOTENCY_MS,
        );
        Ok(Outcome::EventApplied {
            result,
            replayed: false,
        })
    }

    /// The caller's budgets whose scope contains every filter segment, ordered by
    /// `(scope, unit)`, one page after the cursor.
    pub(crate) fn balances(&mut self, q: BalanceQuery) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&q.actor, Permission::BalancesRead)?;
        if let Some(t) = &q.tenant {
            if *t.to_lowercase() != *caller.tenant_id {
                return Err(Rejection::Forbidden(format!(
                    "tenant '{t}' does not match the API key's tenant"
                )));
            }
        }
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
        let mut page: Vec<Budget> = self
            .state
            .budgets
            .range((start, Bound::Unbounded))
            .map(|(_, b)| b)
            .take_while(|b| b.scope.starts_with(&root))
            .filter(|b| has_segment(&b.scope, &root) && b.scope.split('/').next() == Some(&root))
            .filter(|b| segments.iter().all(|s| has_segment(&b.scope, s)))
            .take(q.limit + 1)
            .map(|b| (**b).clone())
            .collect();
        let has_more = page.len() > q.limit;
        page.truncate(q.limit);
        Ok(Outcome::Balances {
            budgets: page,
            has_more,
        })
    }
}
