//! Bulk actions (admin plane, spec §5): the request envelopes of the tenant, budget and
//! webhook bulk actions, and the row-by-row response they share.

use ledger::{
    Actor, BudgetFilter, BudgetStatus, BulkBudgets, BulkResult, BulkTenants, BulkWebhooks,
    FundingOp, Idempotency, RowError, TenantFilter, TenantStatus, Unit, WebhookAction,
    WebhookFilter, WebhookStatus,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::schema::{
    BudgetStatus as BudgetStatusSchema, FundingOperation, TenantStatus as TenantStatusSchema,
};
use crate::validate::{len_between, max_len};
use crate::{fingerprint, parse_wire, Amount, ApiError, Validate, WireUnit};

/// What the bulk actions' requests share: the fields the response echoes, and the ledger
/// operation a validated request becomes.
pub trait BulkRequest: serde::de::DeserializeOwned + Validate {
    type Operation;

    /// The `action` and `idempotency_key` the response echoes.
    fn echo(&self) -> (String, String);

    fn into_operation(self, actor: Actor) -> Result<Self::Operation, ApiError>;
}

/// The spec's search bound, for bodies as for queries.
const MAX_SEARCH: usize = 128;

fn idempotency_key(key: &str) -> Result<(), ApiError> {
    len_between("idempotency_key", key, 1, 128)
}

fn search(field: &str, value: &Option<String>) -> Result<Option<String>, ApiError> {
    let Some(term) = value.as_deref().map(str::trim) else {
        return Ok(None);
    };
    if term.chars().count() > MAX_SEARCH {
        return Err(ApiError::invalid(format!(
            "{field}: must be at most {MAX_SEARCH} characters"
        )));
    }
    Ok((!term.is_empty()).then(|| term.to_lowercase()))
}

/// `TenantBulkFilter`: at least one of its conditions (an empty filter would act on every
/// tenant).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantBulkFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TenantStatusSchema>, inline)]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tenant_id: Option<String>,
    /// A v0.1.26 field this server does not implement: accepted and ignored, so it cannot
    /// be a filter's only condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_mode: Option<String>,
    /// Case-insensitive substring of the tenant id or name, at most 128 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub search: Option<String>,
}

/// `TenantBulkActionRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A lifecycle action for every tenant a filter matches.")]
pub struct TenantBulkActionRequest {
    pub filter: TenantBulkFilter,
    /// SUSPEND, REACTIVATE or CLOSE (with the close cascade, per tenant).
    #[schema(pattern = "^(SUSPEND|REACTIVATE|CLOSE)$")]
    pub action: String,
    /// When set, the action is refused (409 COUNT_MISMATCH) unless the filter matches
    /// exactly this many tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub expected_count: Option<u64>,
    /// Replays the first response for 15 minutes.
    #[schema(min_length = 1, max_length = 128)]
    pub idempotency_key: String,
}

fn tenant_target(action: &str) -> Option<TenantStatus> {
    match action {
        "SUSPEND" => Some(TenantStatus::Suspended),
        "REACTIVATE" => Some(TenantStatus::Active),
        "CLOSE" => Some(TenantStatus::Closed),
        _ => None,
    }
}

impl Validate for TenantBulkActionRequest {
    fn validate(&self) -> Result<(), ApiError> {
        tenant_target(&self.action)
            .ok_or_else(|| ApiError::invalid("action: must be SUSPEND, REACTIVATE or CLOSE"))?;
        idempotency_key(&self.idempotency_key)?;
        let f = &self.filter;
        if let Some(s) = &f.status {
            parse_wire::<TenantStatus>("filter.status", s)?;
        }
        search("filter.search", &f.search)?;
        if f.status.is_none() && f.parent_tenant_id.is_none() && search("", &f.search)?.is_none() {
            return Err(ApiError::invalid(
                "filter: must set at least one of status, parent_tenant_id, search",
            ));
        }
        Ok(())
    }
}

impl BulkRequest for TenantBulkActionRequest {
    type Operation = BulkTenants;

    fn echo(&self) -> (String, String) {
        (self.action.clone(), self.idempotency_key.clone())
    }

    fn into_operation(self, actor: Actor) -> Result<BulkTenants, ApiError> {
        let idem = Idempotency {
            key: self.idempotency_key.as_str().into(),
            fingerprint: fingerprint(&self),
        };
        let f = self.filter;
        Ok(BulkTenants {
            actor,
            filter: TenantFilter {
                status: f
                    .status
                    .as_deref()
                    .map(|s| parse_wire::<TenantStatus>("filter.status", s))
                    .transpose()?,
                parent_tenant_id: f.parent_tenant_id,
                search: search("filter.search", &f.search)?,
            },
            target: tenant_target(&self.action)
                .ok_or_else(|| ApiError::invalid("action: unknown value"))?,
            expected_count: self.expected_count,
            idem,
        })
    }
}

/// `BudgetBulkFilter`: one tenant's budgets, narrowed as `listBudgets` narrows them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetBulkFilter {
    /// Required: a bulk action acts within one tenant.
    pub tenant_id: String,
    /// The scope itself and every scope below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<WireUnit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BudgetStatusSchema>, inline)]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_limit: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_debt: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1)]
    pub utilization_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1)]
    pub utilization_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub search: Option<String>,
}

/// `BudgetBulkActionRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A funding operation for every budget of one tenant a filter matches.")]
pub struct BudgetBulkActionRequest {
    pub filter: BudgetBulkFilter,
    #[schema(value_type = FundingOperation, inline)]
    pub action: String,
    /// Applied to every matched budget; a budget in another unit fails its row.
    pub amount: Amount,
    /// RESET_SPENT only: the new spent amount (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512)]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub expected_count: Option<u64>,
    #[schema(min_length = 1, max_length = 128)]
    pub idempotency_key: String,
}

/// A utilization bound of a body: a number in [0, 1], as parts per billion.
fn utilization(field: &str, value: Option<f64>) -> Result<Option<i64>, ApiError> {
    match value {
        None => Ok(None),
        Some(u) if (0.0..=1.0).contains(&u) => Ok(Some((u * 1e9).round() as i64)),
        Some(_) => Err(ApiError::invalid(format!(
            "{field}: must be a number between 0 and 1"
        ))),
    }
}

fn budget_status(field: &str, s: &str) -> Result<BudgetStatus, ApiError> {
    match s {
        "ACTIVE" => Ok(BudgetStatus::Active),
        "FROZEN" => Ok(BudgetStatus::Frozen),
        "CLOSED" => Ok(BudgetStatus::Closed),
        _ => Err(ApiError::invalid(format!(
            "{field}: must be ACTIVE, FROZEN or CLOSED"
        ))),
    }
}

impl Validate for BudgetBulkActionRequest {
    fn validate(&self) -> Result<(), ApiError> {
        let op = parse_wire::<FundingOp>("action", &self.action)?;
        self.amount.check("amount")?;
        if let Some(s) = &self.spent {
            if op != FundingOp::ResetSpent {
                return Err(ApiError::invalid("spent: only allowed with RESET_SPENT"));
            }
            s.check("spent")?;
            if s.unit != self.amount.unit {
                return Err(ApiError::invalid("spent.unit must equal amount.unit"));
            }
        }
        if let Some(r) = &self.reason {
            max_len("reason", r, 512)?;
        }
        idempotency_key(&self.idempotency_key)?;
        let f = &self.filter;
        crate::tenant::check_tenant_id("filter.tenant_id", &f.tenant_id)?;
        if let Some(s) = &f.status {
            budget_status("filter.status", s)?;
        }
        let min = utilization("filter.utilization_min", f.utilization_min)?;
        let max = utilization("filter.utilization_max", f.utilization_max)?;
        if let (Some(min), Some(max)) = (min, max) {
            if min > max {
                return Err(ApiError::invalid(
                    "filter.utilization_min must not be above filter.utilization_max",
                ));
            }
        }
        search("filter.search", &f.search)?;
        Ok(())
    }
}

impl BulkRequest for BudgetBulkActionRequest {
    type Operation = BulkBudgets;

    fn echo(&self) -> (String, String) {
        (self.action.clone(), self.idempotency_key.clone())
    }

    fn into_operation(self, actor: Actor) -> Result<BulkBudgets, ApiError> {
        let idem = Idempotency {
            key: self.idempotency_key.as_str().into(),
            fingerprint: fingerprint(&self),
        };
        let f = self.filter;
        let filter = BudgetFilter {
            tenant_id: None,
            scope_prefix: f.scope_prefix,
            unit: f.unit.map(Unit::from),
            status: f
                .status
                .as_deref()
                .map(|s| budget_status("filter.status", s))
                .transpose()?,
            over_limit: f.over_limit,
            has_debt: f.has_debt,
            utilization_ppb: (
                utilization("filter.utilization_min", f.utilization_min)?,
                utilization("filter.utilization_max", f.utilization_max)?,
            ),
            search: search("filter.search", &f.search)?,
        };
        Ok(BulkBudgets {
            actor,
            tenant_id: f.tenant_id,
            filter,
            operation: parse_wire::<FundingOp>("action", &self.action)?,
            unit: self.amount.unit.into(),
            amount: self.amount.amount,
            spent: self.spent.map(|s| s.amount),
            reason: self.reason,
            expected_count: self.expected_count,
            idem,
        })
    }
}

/// `BulkActionRowOutcome`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = BulkActionRowOutcome, description = "One row of a bulk action.")]
pub struct RowOutcome {
    /// The tenant id, or the budget's ledger id.
    pub id: String,
    /// Failed rows: INVALID_TRANSITION, BUDGET_EXCEEDED, TENANT_CLOSED or INTERNAL_ERROR.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Skipped rows: [`SKIPPED_REASON`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

/// `TenantBulkActionResponse` and `BudgetBulkActionResponse` (the same shape).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = BulkActionResponse, description = "What a bulk action did, row by row.")]
pub struct BulkActionResponse {
    pub action: String,
    pub total_matched: u64,
    pub succeeded: Vec<RowOutcome>,
    pub failed: Vec<RowOutcome>,
    pub skipped: Vec<RowOutcome>,
    pub idempotency_key: String,
}

/// Why a row was skipped: it was already in the action's target state.
pub const SKIPPED_REASON: &str = "ALREADY_IN_TARGET_STATE";

/// The error code a failed row is answered with.
pub fn row_code(error: RowError) -> &'static str {
    match error {
        RowError::InvalidTransition => "INVALID_TRANSITION",
        RowError::BudgetExceeded => "BUDGET_EXCEEDED",
        RowError::TenantClosed => "TENANT_CLOSED",
        RowError::Internal => "INTERNAL_ERROR",
    }
}

impl BulkActionResponse {
    pub fn new(action: String, idempotency_key: String, result: &BulkResult) -> Self {
        let id = |id: &String| RowOutcome {
            id: id.clone(),
            error_code: None,
            message: None,
            reason: None,
        };
        BulkActionResponse {
            action,
            total_matched: result.total_matched,
            succeeded: result.succeeded.iter().map(id).collect(),
            failed: result
                .failed
                .iter()
                .map(|f| RowOutcome {
                    error_code: Some(row_code(f.error)),
                    message: Some(f.message.clone()),
                    ..id(&f.id)
                })
                .collect(),
            skipped: result
                .skipped
                .iter()
                .map(|s| RowOutcome {
                    reason: Some(SKIPPED_REASON),
                    ..id(s)
                })
                .collect(),
            idempotency_key,
        }
    }
}

/// `WebhookBulkFilter`: at least one condition, AND-ed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookBulkFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// `ACTIVE`, `PAUSED` or `DISABLED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Subscriptions listing this event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Case-insensitive substring of the subscription id or URL, at most 128 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub search: Option<String>,
}

/// `WebhookBulkActionRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Pause, resume or delete every subscription a filter matches.")]
pub struct WebhookBulkActionRequest {
    pub filter: WebhookBulkFilter,
    #[schema(pattern = "^(PAUSE|RESUME|DELETE)$")]
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub expected_count: Option<u64>,
    #[schema(min_length = 1, max_length = 128)]
    pub idempotency_key: String,
}

fn webhook_action(action: &str) -> Option<WebhookAction> {
    match action {
        "PAUSE" => Some(WebhookAction::Pause),
        "RESUME" => Some(WebhookAction::Resume),
        "DELETE" => Some(WebhookAction::Delete),
        _ => None,
    }
}

impl WebhookBulkActionRequest {
    fn filter(&self) -> Result<WebhookFilter, ApiError> {
        let f = &self.filter;
        Ok(WebhookFilter {
            tenant_id: f.tenant_id.clone(),
            status: f
                .status
                .as_deref()
                .map(|s| parse_wire::<WebhookStatus>("filter.status", s))
                .transpose()?,
            event_type: f
                .event_type
                .as_deref()
                .map(|t| crate::webhook::parse_event_type("filter.event_type", t))
                .transpose()?,
            search: search("filter.search", &f.search)?,
        })
    }
}

impl Validate for WebhookBulkActionRequest {
    fn validate(&self) -> Result<(), ApiError> {
        webhook_action(&self.action)
            .ok_or_else(|| ApiError::invalid("action: must be PAUSE, RESUME or DELETE"))?;
        idempotency_key(&self.idempotency_key)?;
        let f = self.filter()?;
        if f.tenant_id.is_none()
            && f.status.is_none()
            && f.event_type.is_none()
            && f.search.is_none()
        {
            return Err(ApiError::invalid(
                "filter: must set at least one of tenant_id, status, event_type, search",
            ));
        }
        Ok(())
    }
}

impl BulkRequest for WebhookBulkActionRequest {
    type Operation = BulkWebhooks;

    fn echo(&self) -> (String, String) {
        (self.action.clone(), self.idempotency_key.clone())
    }

    fn into_operation(self, actor: Actor) -> Result<BulkWebhooks, ApiError> {
        let idem = Idempotency {
            key: self.idempotency_key.as_str().into(),
            fingerprint: fingerprint(&self),
        };
        Ok(BulkWebhooks {
            actor,
            filter: self.filter()?,
            action: webhook_action(&self.action)
                .ok_or_else(|| ApiError::invalid("action: unknown value"))?,
            expected_count: self.expected_count,
            idem,
        })
    }
}
