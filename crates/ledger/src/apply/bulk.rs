//! Bulk actions (admin spec §5): one lifecycle or funding action applied to every tenant or
//! budget a filter matches, as one operation. Each row is all or nothing ([`Tx::row`]); a
//! failed row is reported and the batch goes on. The whole action is idempotent by its key
//! for 15 minutes, and refused before any write when the filter matches more than
//! [`BULK_LIMIT`] rows or not the `expected_count` the operator previewed.

use std::sync::Arc;

use crate::{
    fund, BudgetFilter, BulkResult, Endpoint, FundingOp, IdemKey, Rejection, RowError, RowFailure,
    TenantFilter, TenantStatus, Unit,
};

use super::emit::upper;
use super::{operation, Actor, Cause, Idempotency, Idempotent, Tx};

/// Most rows one bulk action may change.
pub const BULK_LIMIT: u64 = 500;

/// How long a bulk action's key replays its result.
const BULK_RETENTION_MS: i64 = 15 * 60_000;

/// The tenant namespace of tenant bulk actions' idempotency keys: they belong to no tenant,
/// and no tenant id can contain `_`.
const ADMIN_NAMESPACE: &str = "__admin__";

/// `POST /v1/admin/tenants/bulk-action`: move every matching tenant to `target`
/// (SUSPEND → SUSPENDED, REACTIVATE → ACTIVE, CLOSE → CLOSED with the close cascade).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkTenants {
    pub actor: Actor,
    pub filter: TenantFilter,
    pub target: TenantStatus,
    pub expected_count: Option<u64>,
    pub idem: Idempotency,
}

/// `POST /v1/admin/budgets/bulk-action`: fund every matching budget of one tenant, as
/// `fundBudget` would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkBudgets {
    pub actor: Actor,
    pub tenant_id: String,
    /// Its `tenant_id` is ignored: `tenant_id` above is the one tenant acted on.
    pub filter: BudgetFilter,
    pub operation: FundingOp,
    pub unit: Unit,
    pub amount: i64,
    pub spent: Option<i64>,
    /// The operator's justification, carried by each funding's event.
    pub reason: Option<String>,
    pub expected_count: Option<u64>,
    pub idem: Idempotency,
}

/// `POST /v1/admin/webhooks/bulk-action`: pause, resume or delete every matching
/// subscription (a bulk resume never re-enables a DISABLED one: a single PATCH can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkWebhooks {
    pub actor: Actor,
    pub filter: crate::WebhookFilter,
    pub action: WebhookAction,
    pub expected_count: Option<u64>,
    pub idem: Idempotency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookAction {
    Pause,
    Resume,
    Delete,
}

operation!(BulkTenants => Idempotent<BulkResult>, bulk_tenants);
operation!(BulkWebhooks => Idempotent<BulkResult>, bulk_webhooks);
operation!(BulkBudgets => Idempotent<BulkResult>, bulk_budgets);

/// The rows of a bulk action, sorted into the response's three lists.
#[derive(Default)]
struct Outcomes {
    result: BulkResult,
}

impl Outcomes {
    fn matched(total: usize, expected: Option<u64>) -> Result<Self, Rejection> {
        let matched = total as u64;
        if matched > BULK_LIMIT {
            return Err(Rejection::TooManyMatches {
                matched,
                limit: BULK_LIMIT,
            });
        }
        if let Some(expected) = expected.filter(|e| *e != matched) {
            return Err(Rejection::CountMismatch { matched, expected });
        }
        let mut outcomes = Outcomes::default();
        outcomes.result.total_matched = matched;
        Ok(outcomes)
    }

    fn record(&mut self, id: &str, row: Result<bool, Rejection>) {
        let id = id.to_string();
        match row {
            Ok(true) => self.result.succeeded.push(id),
            Ok(false) => self.result.skipped.push(id),
            Err(rejection) => self.result.failed.push(RowFailure {
                id,
                error: RowError::of(&rejection),
                message: rejection.to_string(),
            }),
        }
    }
}

impl Tx<'_> {
    fn bulk_tenants(&mut self, op: BulkTenants) -> Result<Idempotent<BulkResult>, Rejection> {
        self.require_admin(&op.actor)?;
        let key = IdemKey {
            tenant_id: Arc::from(ADMIN_NAMESPACE),
            endpoint: Endpoint::TenantsBulk,
            key: op.idem.key.clone(),
        };
        self.once(Some((key, op.idem.fingerprint)), |tx| {
            let state = tx.state;
            let matching: Vec<_> = state
                .tenants
                .values()
                .filter(|t| op.filter.admits(t))
                .collect();
            let mut outcomes = Outcomes::matched(matching.len(), op.expected_count)?;
            for t in matching {
                let row = tx.row(|tx| tx.move_tenant(&op.actor, t, op.target));
                outcomes.record(&t.tenant_id, row);
            }
            Ok((outcomes.result, BULK_RETENTION_MS))
        })
    }

    /// One tenant row: `Ok(false)` when it is already in `target`. A closed tenant moves
    /// nowhere else (INVALID_TRANSITION); closing one again re-runs the cascade, which finds
    /// nothing left to do unless the tenant was closed by an older release that left keys
    /// active.
    fn move_tenant(
        &mut self,
        actor: &Actor,
        t: &crate::Tenant,
        target: TenantStatus,
    ) -> Result<bool, Rejection> {
        match (t.status, target) {
            (TenantStatus::Closed, TenantStatus::Closed) => {
                let before = self.staged_len();
                self.close_cascade(&t.tenant_id, actor)?;
                Ok(self.staged_len() > before)
            }
            (TenantStatus::Closed, _) => Err(Rejection::Conflict(format!(
                "Tenant {} is CLOSED: it cannot move to another state",
                t.tenant_id
            ))),
            (from, to) if from == to => Ok(false),
            _ => {
                let action = match target {
                    TenantStatus::Suspended => "suspend",
                    TenantStatus::Active => "reactivate",
                    TenantStatus::Closed => "close",
                };
                let correlation = format!("tenant_bulk_action:{action}:{}", self.request_id());
                self.restatus_tenant(actor, t, target, correlation)?;
                Ok(true)
            }
        }
    }

    fn bulk_webhooks(&mut self, op: BulkWebhooks) -> Result<Idempotent<BulkResult>, Rejection> {
        self.require_admin(&op.actor)?;
        let key = IdemKey {
            tenant_id: Arc::from(ADMIN_NAMESPACE),
            endpoint: Endpoint::WebhooksBulk,
            key: op.idem.key.clone(),
        };
        self.once(Some((key, op.idem.fingerprint)), |tx| {
            let state = tx.state;
            let matching: Vec<_> = state
                .webhooks
                .subscriptions
                .values()
                .filter(|w| op.filter.admits(w))
                .collect();
            let mut outcomes = Outcomes::matched(matching.len(), op.expected_count)?;
            let name = match op.action {
                WebhookAction::Pause => "pause",
                WebhookAction::Resume => "resume",
                WebhookAction::Delete => "delete",
            };
            let correlation = format!("webhook_bulk_action:{name}:{}", tx.request_id());
            for w in matching {
                let row = tx.row(|tx| tx.webhook_row(&op.actor, w, op.action, &correlation));
                outcomes.record(&w.subscription_id, row);
            }
            Ok((outcomes.result, BULK_RETENTION_MS))
        })
    }

    fn bulk_budgets(&mut self, op: BulkBudgets) -> Result<Idempotent<BulkResult>, Rejection> {
        self.require_admin(&op.actor)?;
        self.existing_tenant(&op.tenant_id)?;
        let key = IdemKey {
            tenant_id: Arc::from(op.tenant_id.as_str()),
            endpoint: Endpoint::BudgetsBulk,
            key: op.idem.key.clone(),
        };
        self.once(Some((key, op.idem.fingerprint)), |tx| {
            let state = tx.state;
            let prefix = op.filter.scope_prefix.as_ref().map(|p| p.to_lowercase());
            let matching: Vec<_> = state
                .budgets
                .values()
                .filter(|b| op.filter.admits(b, Some(&op.tenant_id), prefix.as_deref()))
                .collect();
            let mut outcomes = Outcomes::matched(matching.len(), op.expected_count)?;
            for b in matching {
                let row = tx.row(|tx| {
                    tx.open_tenant(&b.tenant_id)?;
                    if b.unit != op.unit {
                        return Err(Rejection::UnitMismatch {
                            message: format!(
                                "The amount is in {}, the budget in {}",
                                op.unit.as_str(),
                                b.unit.as_str()
                            ),
                            scope: Some(b.scope.to_string()),
                            requested: op.unit,
                            expected: vec![b.unit],
                        });
                    }
                    if op.operation == FundingOp::RepayDebt && b.debt == 0 {
                        return Ok(false);
                    }
                    let funded = fund(b, op.operation, op.amount, op.spent)?;
                    tx.put_budgets(Cause::Admin(&op.actor), vec![funded.clone()])?;
                    let correlation = format!(
                        "budget_bulk_action:{}:{}",
                        upper(op.operation).to_lowercase(),
                        tx.request_id()
                    );
                    let spent_provided = op.spent.is_some();
                    tx.funding_events(
                        &op.actor,
                        (b, &funded),
                        op.operation,
                        spent_provided,
                        op.reason.as_deref(),
                        Some(correlation),
                    );
                    Ok(true)
                });
                outcomes.record(&b.ledger_id, row);
            }
            Ok((outcomes.result, BULK_RETENTION_MS))
        })
    }
}
