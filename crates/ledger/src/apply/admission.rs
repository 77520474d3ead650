//! Admission: the checks a reserve, a decision and a direct event share, before any budget
//! arithmetic, and the policy caps an admitted request carries.

use std::sync::Arc;

use crate::{
    admission_refusal, Budget, BudgetKey, Caps, Decision, Rejection, Subject, TenantStatus, Unit,
};

use super::Tx;

/// ALLOW, or ALLOW_WITH_CAPS when a policy supplies caps.
pub(crate) fn decision_with<C>(caps: &Option<C>) -> Decision {
    if caps.is_some() {
        Decision::AllowWithCaps
    } else {
        Decision::Allow
    }
}

/// Why a request cannot be admitted, before any budget arithmetic.
pub(crate) enum Blocked {
    /// An error on every surface (wrong unit, no budget at all on a live request, …).
    Error(Rejection),
    /// A refusal: an error on live requests, a DENY with this reason on evaluations.
    Deny(&'static str, Rejection),
}

impl Tx<'_> {
    /// The caller must be the subject's tenant, when the subject names one.
    pub(crate) fn check_subject_tenant(
        &self,
        subject: &Subject,
        tenant_id: &str,
    ) -> Result<(), Rejection> {
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
    pub(crate) fn tenant_gate(&self, tenant_id: &str) -> Option<Blocked> {
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
    pub(crate) fn admission_budgets(
        &self,
        scopes: &[String],
        unit: Unit,
    ) -> Result<Vec<Budget>, Blocked> {
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
    pub(crate) fn admit(
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

    /// The caps of the policy governing `scope_path`, if any.
    pub(crate) fn caps_for(&self, tenant_id: &str, scope_path: &str) -> Option<Caps> {
        self.governing_policy(tenant_id, scope_path)
            .and_then(|p| p.caps.clone())
    }
}
