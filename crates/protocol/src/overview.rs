//! `GET /v1/admin/overview`: the operator's one-request summary.

use std::collections::BTreeMap;

use ledger::{Budget, BudgetStatus, Overview, TenantStatus, Unit};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{format_rfc3339, WireUnit};

/// The window `event_counts` and the recent-event lists cover (the reference's hour).
pub const EVENT_WINDOW_SECONDS: u64 = 3_600;

/// `AdminOverviewResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(
    as = AdminOverviewResponse,
    description = "Counts of tenants and budgets by state, the budgets with the largest debts, \
        and the webhook and event figures of the last `event_window_seconds`. The server \
        records no events or webhooks yet, so those figures are zero and their lists empty."
)]
pub struct OverviewResponse {
    #[schema(format = DateTime)]
    pub as_of: String,
    pub event_window_seconds: u64,
    pub tenant_counts: TenantCounts,
    pub budget_counts: BudgetCounts,
    /// At most 10, largest debt first.
    pub over_limit_scopes: Vec<OverLimitScope>,
    /// At most 10, largest debt first.
    pub debt_scopes: Vec<DebtScope>,
    pub webhook_counts: WebhookCounts,
    /// Always empty until webhooks exist (an array of length 0 by type).
    #[schema(value_type = Vec<Object>)]
    pub failing_webhooks: [(); 0],
    pub event_counts: EventCounts,
    #[schema(value_type = Vec<Object>)]
    pub recent_denials: [(); 0],
    #[schema(value_type = Vec<Object>)]
    pub recent_expiries: [(); 0],
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCounts {
    pub total: usize,
    pub active: usize,
    pub suspended: usize,
    pub closed: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetCounts {
    pub total: usize,
    pub active: usize,
    pub frozen: usize,
    pub closed: usize,
    pub over_limit: usize,
    pub with_debt: usize,
    /// Every unit, with its number of budgets.
    pub by_unit: BTreeMap<WireUnit, usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OverLimitScope {
    pub scope: String,
    pub unit: WireUnit,
    pub allocated: i64,
    pub remaining: i64,
    pub debt: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DebtScope {
    pub scope: String,
    pub unit: WireUnit,
    pub debt: i64,
    pub overdraft_limit: i64,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct WebhookCounts {
    pub total: usize,
    pub active: usize,
    pub disabled: usize,
    pub with_failures: usize,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct EventCounts {
    pub total_recent: usize,
    pub by_category: BTreeMap<String, usize>,
}

impl From<Overview> for OverviewResponse {
    fn from(o: Overview) -> Self {
        let c = o.counts;
        let tenant_counts = TenantCounts {
            active: c.tenants(TenantStatus::Active),
            suspended: c.tenants(TenantStatus::Suspended),
            closed: c.tenants(TenantStatus::Closed),
            total: c.tenants_by_status.iter().sum(),
        };
        let budget_counts = BudgetCounts {
            active: c.budgets(BudgetStatus::Active),
            frozen: c.budgets(BudgetStatus::Frozen),
            closed: c.budgets(BudgetStatus::Closed),
            total: c.budgets_by_status.iter().sum(),
            over_limit: c.budgets_over_limit,
            with_debt: c.budgets_in_debt,
            by_unit: Unit::ALL
                .into_iter()
                .map(|u| (WireUnit::from(u), c.budgets_in(u)))
                .collect(),
        };
        let over_limit = |b: Budget| OverLimitScope {
            unit: b.unit.into(),
            scope: b.scope.to_string(),
            allocated: b.allocated,
            remaining: b.remaining,
            debt: b.debt,
        };
        let in_debt = |b: Budget| DebtScope {
            unit: b.unit.into(),
            scope: b.scope.to_string(),
            debt: b.debt,
            overdraft_limit: b.overdraft_limit,
        };
        OverviewResponse {
            as_of: format_rfc3339(o.as_of_ms),
            event_window_seconds: EVENT_WINDOW_SECONDS,
            tenant_counts,
            budget_counts,
            over_limit_scopes: o.over_limit.into_iter().map(over_limit).collect(),
            debt_scopes: o.in_debt.into_iter().map(in_debt).collect(),
            webhook_counts: WebhookCounts::default(),
            failing_webhooks: [],
            event_counts: EventCounts::default(),
            recent_denials: [],
            recent_expiries: [],
        }
    }
}
