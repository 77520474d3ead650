//! `POST /v1/events`: spend that already happened, charged under its overage policy.

use crate::{
    admission_refusal, charge_amount, derive_scopes, Balance, Budget, Endpoint, EventResult,
    IdemKey, OveragePolicy, Permission, Refusal, Rejection, Subject, TenantStatus, Unit,
};

use super::admission::Blocked;
use super::{operation, Actor, Cause, Idempotency, Idempotent, Tx, DAY_MS};

/// How long a direct event's idempotency record lives.
const EVENT_IDEMPOTENCY_MS: i64 = 7 * DAY_MS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEvent {
    pub actor: Actor,
    pub idem: Idempotency,
    /// The id the event gets if it is applied.
    pub event_id: String,
    pub subject: Subject,
    pub unit: Unit,
    pub actual: i64,
    pub overage_policy: Option<OveragePolicy>,
}

operation!(RecordEvent => Idempotent<EventResult>, record_event);

impl Tx<'_> {
    /// Events are not blocked by debt or over-limit (runtime spec A-33), only by budget and
    /// tenant status.
    fn record_event(&mut self, cmd: RecordEvent) -> Result<Idempotent<EventResult>, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCommit)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Event,
            key: cmd.idem.key.clone(),
        };
        self.once(Some((key, cmd.idem.fingerprint)), |tx| {
            let scopes = derive_scopes(&cmd.subject);
            let tenant = tx.existing_tenant(&caller.tenant_id)?;
            if tenant.status == TenantStatus::Closed {
                return Err(Rejection::TenantClosed(tenant.tenant_id.clone()));
            }
            let default_policy = tenant.default_commit_overage_policy;
            let budgets = match tx.admission_budgets(&scopes, cmd.unit) {
                Ok(b) => b,
                Err(Blocked::Error(e) | Blocked::Deny(_, e)) => return Err(e),
            };
            let refs: Vec<&Budget> = budgets.iter().collect();
            if let Some(refusal @ (Refusal::Frozen(_) | Refusal::Closed(_))) =
                admission_refusal(&refs, 0)
            {
                return Err(refusal.into_rejection(cmd.unit, cmd.actual));
            }
            // Most specific wins, as on a reserve: the request, the policy governing its
            // scope, the budget ledger, the tenant's default.
            let scope_path = scopes.last().map_or("", String::as_str);
            let governing = tx
                .governing_policy(&caller.tenant_id, scope_path)
                .and_then(|p| p.commit_overage_policy);
            let policy = cmd
                .overage_policy
                .or(governing)
                .or_else(|| budgets.last().and_then(|b| b.commit_overage_policy))
                .unwrap_or(default_policy);
            let charge = charge_amount(&budgets, cmd.actual, policy)?;
            let result = EventResult {
                event_id: cmd.event_id,
                unit: cmd.unit,
                charged: (charge.charged < cmd.actual).then_some(charge.charged),
                balances: charge.budgets.iter().map(Balance::from).collect(),
            };
            tx.balance_events(&cmd.actor, &charge.budgets, Some((None, policy)));
            tx.put_budgets(Cause::Runtime(&cmd.actor), charge.budgets)?;
            Ok((result, EVENT_IDEMPOTENCY_MS))
        })
    }
}
