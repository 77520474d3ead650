//! `GET /v1/admin/overview`: the operator's one-request summary.

use std::collections::BTreeMap;

use ledger::{Budget, BudgetStatus, Event, Overview, TenantStatus, Unit};
use serde::Serialize;
use utoipa::ToSchema;

use crate::webhook::EventResponse;
use crate::{format_rfc3339, WireUnit};

/// The window `event_counts` and the recent-event lists cover (the reference's hour).
pub const EVENT_WINDOW_SECONDS: u64 = 3_600;

/// `AdminOverviewResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(
    as = AdminOverviewResponse,
    description = "Counts of tenants and budgets by state, the budgets with the largest debts, \
        the webhook subscriptions and the ones failing most, and the events of the last \
        `event_window_seconds`: counts by category, the latest denials and expiries."
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
    /// At most 10, most consecutive failures first.
    pub failing_webhooks: Vec<FailingWebhook>,
    pub event_counts: EventCounts,
    /// The latest `reservation.denied` events of the window, at most 10.
    pub recent_denials: Vec<EventResponse>,
    /// The latest `reservation.expired` events of the window, at most 10.
    pub recent_expiries: Vec<EventResponse>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FailingWebhook {
    pub subscription_id: String,
    pub url: String,
    pub consecutive_failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub last_failure_at: Option<String>,
}

/// What the overview reads from the event log.
#[derive(Debug, Default)]
pub struct RecentEvents {
    pub by_category: Vec<(String, u64)>,
    pub denials: Vec<Event>,
    pub expiries: Vec<Event>,
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

impl OverviewResponse {
    pub fn new(o: Overview, recent: RecentEvents) -> Self {
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
            webhook_counts: WebhookCounts {
                total: o.webhooks[0],
                active: o.webhooks[1],
                disabled: o.webhooks[2],
                with_failures: o.webhooks[3],
            },
            failing_webhooks: o
                .failing
                .iter()
                .map(|w| FailingWebhook {
                    subscription_id: w.subscription_id.clone(),
                    url: w.url.clone(),
                    consecutive_failures: w.consecutive_failures,
                    last_failure_at: w.last_failure_at_ms.map(format_rfc3339),
                })
                .collect(),
            event_counts: EventCounts {
                total_recent: recent.by_category.iter().map(|(_, n)| *n as usize).sum(),
                by_category: recent
                    .by_category
                    .into_iter()
                    .map(|(c, n)| (c, n as usize))
                    .collect(),
            },
            recent_denials: recent.denials.into_iter().map(Into::into).collect(),
            recent_expiries: recent.expiries.into_iter().map(Into::into).collect(),
        }
    }
}
