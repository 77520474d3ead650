//! Budgets and their funding (admin plane).

use std::borrow::Cow;

use ledger::{
    Actor, Budget, BudgetFilter, BudgetListQuery, BudgetOrder, BudgetSort, BudgetStatus,
    FundResult, FundingOp, Idempotency, ListBudgets, RolloverPolicy, SortedPage, Unit,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::common::{metadata_text, Metadata};
use crate::cursor::{descending, NextPage, SortedRequest};
use crate::schema::{
    BudgetSortBy, BudgetStatus as BudgetStatusSchema, FundingOperation,
    RolloverPolicy as RolloverSchema, SignedAmount, SortDirection,
};
use crate::tenant::check_tenant_id;
use crate::validate::{idempotency_key, len_between, max_len, nullable, parse_enum, timestamp};
use crate::{
    decode_budget_cursor, encode_budget_cursor, fingerprint, format_rfc3339, parse_rfc3339, Amount,
    ApiError, ClampedLimit, ErrorCode, Search, Validate, WireName, WirePolicy, WireUnit,
};

fn same_unit(field: &str, amount: &Amount, unit: WireUnit) -> Result<(), ApiError> {
    if amount.unit != unit {
        return Err(ApiError::new(
            400,
            ErrorCode::UnitMismatch,
            format!("{field}.unit must equal the budget's unit"),
        ));
    }
    Ok(())
}

const ROLLOVER_POLICIES: &str = "NONE, CARRY_FORWARD, CAP_AT_ALLOCATED";

/// `BudgetCreateRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A new budget at one (scope, unit).")]
pub struct BudgetCreateRequest {
    /// Required with the admin key; must be absent with a tenant key (the key's tenant is used).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 3, max_length = 64, pattern = "^[a-z0-9-]+$")]
    pub tenant_id: Option<String>,
    /// `tenant:<id>[/workspace:<v>[/app:<v>...]]`, levels in order, each at most once.
    #[schema(min_length = 1, max_length = 1024)]
    pub scope: String,
    pub unit: WireUnit,
    /// In `unit`.
    pub allocated: Amount,
    /// In `unit`; defaults to 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overdraft_limit: Option<Amount>,
    /// Defaults to the tenant's `default_commit_overage_policy` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_overage_policy: Option<WirePolicy>,
    /// Defaults to NONE.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RolloverSchema>, inline)]
    pub rollover_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub period_start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub period_end: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for BudgetCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        if let Some(t) = &self.tenant_id {
            check_tenant_id("tenant_id", t)?;
        }
        len_between("scope", &self.scope, 1, 1024)?;
        self.allocated.check("allocated")?;
        same_unit("allocated", &self.allocated, self.unit)?;
        if let Some(o) = &self.overdraft_limit {
            o.check("overdraft_limit")?;
            same_unit("overdraft_limit", o, self.unit)?;
        }
        if let Some(r) = &self.rollover_policy {
            parse_enum(
                "rollover_policy",
                r,
                RolloverPolicy::from_wire_name,
                ROLLOVER_POLICIES,
            )?;
        }
        let start = timestamp("period_start", &self.period_start)?;
        let end = timestamp("period_end", &self.period_end)?;
        if let (Some(s), Some(e)) = (start, end) {
            if s > e {
                return Err(ApiError::invalid(
                    "period_start must not be after period_end",
                ));
            }
        }
        Ok(())
    }
}

impl BudgetCreateRequest {
    /// A request with only the required fields (the budget's unit is `allocated`'s): the
    /// server's defaults apply to the rest.
    pub fn new(tenant_id: Option<String>, scope: String, allocated: Amount) -> Self {
        BudgetCreateRequest {
            tenant_id,
            scope,
            unit: allocated.unit,
            allocated,
            overdraft_limit: None,
            commit_overage_policy: None,
            rollover_policy: None,
            period_start: None,
            period_end: None,
            metadata: None,
        }
    }

    pub fn into_new(self, ledger_id: String) -> ledger::NewBudget {
        ledger::NewBudget {
            ledger_id,
            tenant_id: self.tenant_id,
            scope: self.scope,
            unit: self.unit.into(),
            allocated: self.allocated.amount,
            overdraft_limit: self.overdraft_limit.map_or(0, |o| o.amount),
            commit_overage_policy: self.commit_overage_policy.map(Into::into),
            rollover_policy: self
                .rollover_policy
                .as_deref()
                .and_then(RolloverPolicy::from_wire_name),
            period_start_ms: self.period_start.as_deref().and_then(parse_rfc3339),
            period_end_ms: self.period_end.as_deref().and_then(parse_rfc3339),
            metadata: metadata_text(&self.metadata),
        }
    }
}

/// The body of `PATCH /v1/admin/budgets`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    description = "A partial update of a budget: only the fields present change; `commit_overage_policy` or `metadata` sent as null is removed (the budget then takes its tenant's default policy)."
)]
pub struct BudgetUpdateRequest {
    /// In the budget's unit.
    pub overdraft_limit: Option<Amount>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<WirePolicy>, nullable)]
    pub commit_overage_policy: Option<Option<WirePolicy>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>, nullable)]
    pub metadata: Option<Option<Metadata>>,
}

impl Validate for BudgetUpdateRequest {
    const CLEARABLE: &'static [&'static str] = &["commit_overage_policy", "metadata"];

    fn validate(&self) -> Result<(), ApiError> {
        if let Some(o) = &self.overdraft_limit {
            o.check("overdraft_limit")?;
        }
        Ok(())
    }
}

impl BudgetUpdateRequest {
    pub fn into_patch(self, unit: Unit) -> Result<ledger::BudgetPatch, ApiError> {
        if let Some(o) = &self.overdraft_limit {
            same_unit("overdraft_limit", o, unit.into())?;
        }
        Ok(ledger::BudgetPatch {
            overdraft_limit: self.overdraft_limit.map(|o| o.amount),
            commit_overage_policy: self.commit_overage_policy.map(|p| p.map(Into::into)),
            metadata: self.metadata.map(|m| metadata_text(&m)),
        })
    }
}

/// `BudgetStatusTransitionRequest` (freeze / unfreeze; the body is optional).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Why a budget is frozen or unfrozen (validated, not stored).")]
pub struct BudgetStatusTransitionRequest {
    #[schema(max_length = 512)]
    pub reason: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for BudgetStatusTransitionRequest {
    fn validate(&self) -> Result<(), ApiError> {
        if let Some(r) = &self.reason {
            max_len("reason", r, 512)?;
        }
        Ok(())
    }
}

const FUNDING_OPS: &str = "CREDIT, DEBIT, RESET, RESET_SPENT, REPAY_DEBT";

/// `BudgetFundingRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A funding operation on one budget.")]
pub struct BudgetFundingRequest {
    #[schema(value_type = FundingOperation, inline)]
    pub operation: String,
    /// In the budget's unit.
    pub amount: Amount,
    /// RESET_SPENT only: the new `spent` (defaults to 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512)]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for BudgetFundingRequest {
    fn validate(&self) -> Result<(), ApiError> {
        let op = parse_enum(
            "operation",
            &self.operation,
            FundingOp::from_wire_name,
            FUNDING_OPS,
        )?;
        self.amount.check("amount")?;
        if let Some(s) = &self.spent {
            if op != FundingOp::ResetSpent {
                return Err(ApiError::invalid("spent: only allowed with RESET_SPENT"));
            }
            s.check("spent")?;
        }
        if let Some(r) = &self.reason {
            max_len("reason", r, 512)?;
        }
        if let Some(k) = &self.idempotency_key {
            idempotency_key("idempotency_key", k)?;
        }
        Ok(())
    }
}

impl BudgetFundingRequest {
    pub fn into_command(
        self,
        tenant_id: Option<String>,
        scope: String,
        unit: Unit,
    ) -> Result<ledger::Funding, ApiError> {
        same_unit("amount", &self.amount, unit.into())?;
        if let Some(s) = &self.spent {
            same_unit("spent", s, unit.into())?;
        }
        // The key covers the target budget too: the same key on another budget is a mismatch.
        // Scopes are case-insensitive, so the budget is named as it is looked up.
        let idem = self.idempotency_key.as_ref().map(|key| Idempotency {
            key: key.as_str().into(),
            fingerprint: fingerprint(&(&scope.to_lowercase(), unit.as_str(), &self)),
        });
        Ok(ledger::Funding {
            tenant_id,
            operation: FundingOp::from_wire_name(&self.operation)
                .ok_or_else(|| ApiError::invalid("operation: unknown value"))?,
            amount: self.amount.amount,
            spent: self.spent.map(|s| s.amount),
            reason: self.reason,
            idem,
            scope,
            unit,
        })
    }
}

/// `BudgetFundingResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A budget's amounts before and after a funding operation.")]
pub struct BudgetFundingResponse {
    #[schema(value_type = FundingOperation, inline)]
    pub operation: &'static str,
    pub previous_allocated: Amount,
    pub new_allocated: Amount,
    #[schema(value_type = SignedAmount)]
    pub previous_remaining: Amount,
    #[schema(value_type = SignedAmount)]
    pub new_remaining: Amount,
    pub previous_debt: Amount,
    pub new_debt: Amount,
    pub previous_spent: Amount,
    pub new_spent: Amount,
    #[schema(format = DateTime)]
    pub timestamp: String,
}

impl From<&FundResult> for BudgetFundingResponse {
    fn from(r: &FundResult) -> Self {
        let a = |v| Amount::new(r.unit, v);
        BudgetFundingResponse {
            operation: r.operation.wire_name(),
            previous_allocated: a(r.previous.allocated),
            new_allocated: a(r.new.allocated),
            previous_remaining: a(r.previous.remaining),
            new_remaining: a(r.new.remaining),
            previous_debt: a(r.previous.debt),
            new_debt: a(r.new.debt),
            previous_spent: a(r.previous.spent),
            new_spent: a(r.new.spent),
            timestamp: format_rfc3339(r.timestamp_ms),
        }
    }
}

/// `BudgetLedger`. Clients read it too, so its enum strings are `Cow`, as in
/// [`ApiKeyCreateResponse`].
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(
    description = "One budget: `remaining = allocated - spent - reserved - debt` always holds."
)]
pub struct BudgetLedger {
    pub ledger_id: String,
    pub tenant_id: String,
    pub scope: String,
    pub scope_path: String,
    pub unit: WireUnit,
    pub allocated: Amount,
    #[schema(value_type = SignedAmount)]
    pub remaining: Amount,
    pub reserved: Amount,
    pub spent: Amount,
    pub debt: Amount,
    pub overdraft_limit: Amount,
    pub is_over_limit: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_overage_policy: Option<WirePolicy>,
    #[schema(value_type = BudgetStatusSchema, inline)]
    pub status: Cow<'static, str>,
    #[schema(value_type = RolloverSchema, inline)]
    pub rollover_policy: Cow<'static, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub period_start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub period_end: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<Budget> for BudgetLedger {
    fn from(b: Budget) -> Self {
        let a = |v| Amount::new(b.unit, v);
        BudgetLedger {
            allocated: a(b.allocated),
            remaining: a(b.remaining),
            reserved: a(b.reserved),
            spent: a(b.spent),
            debt: a(b.debt),
            overdraft_limit: a(b.overdraft_limit),
            ledger_id: b.ledger_id.to_string(),
            tenant_id: b.tenant_id.to_string(),
            scope_path: b.scope.to_string(),
            scope: b.scope.to_string(),
            unit: b.unit.into(),
            is_over_limit: b.is_over_limit,
            commit_overage_policy: b.commit_overage_policy.map(Into::into),
            status: b.status.as_str().into(),
            rollover_policy: b.rollover_policy.wire_name().into(),
            period_start: b.period_start_ms.map(format_rfc3339),
            period_end: b.period_end_ms.map(format_rfc3339),
            created_at: format_rfc3339(b.created_at_ms),
            updated_at: format_rfc3339(b.updated_at_ms),
        }
    }
}

/// `BudgetListResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A page of budgets.")]
pub struct BudgetListResponse {
    pub ledgers: Vec<BudgetLedger>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl BudgetListResponse {
    pub fn new(next: &NextPage, page: SortedPage<Budget>) -> Self {
        let next_cursor = match next.0 {
            Some(_) => next.sorted(&page),
            None if page.page.has_more => page
                .page
                .items
                .last()
                .map(|b| encode_budget_cursor(&b.scope, b.unit)),
            None => None,
        };
        BudgetListResponse {
            ledgers: page
                .page
                .items
                .into_iter()
                .map(BudgetLedger::from)
                .collect(),
            next_cursor,
            has_more: page.page.has_more,
        }
    }
}

/// The query of `GET /v1/admin/budgets`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BudgetListParams {
    /// Only this tenant's budgets (admin key; a tenant key always sees its own).
    pub tenant_id: Option<String>,
    /// Only scopes starting with this prefix (case-insensitive).
    pub scope_prefix: Option<String>,
    #[param(inline)]
    pub unit: Option<WireUnit>,
    #[param(inline, value_type = Option<BudgetStatusSchema>)]
    pub status: Option<String>,
    /// Only budgets whose debt is above their overdraft limit (`true`), or not (`false`).
    pub over_limit: Option<bool>,
    /// Only budgets with debt (`true`), or without (`false`).
    pub has_debt: Option<bool>,
    /// Only budgets whose utilization (spent / allocated; 0 when nothing is allocated) is
    /// at least this, between 0 and 1.
    #[param(value_type = Option<f64>, minimum = 0, maximum = 1)]
    pub utilization_min: Option<String>,
    /// Only budgets whose utilization is at most this, between 0 and 1.
    #[param(value_type = Option<f64>, minimum = 0, maximum = 1)]
    pub utilization_max: Option<String>,
    /// Case-insensitive substring of the tenant id or the scope, at most 128 characters;
    /// empty means no search.
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// Without it, budgets come in (scope, unit) order. With it, in this field's order
    /// (statuses in lifecycle order ACTIVE, FROZEN, CLOSED; overage policies by name), ties
    /// by ledger id.
    #[param(inline, value_type = Option<BudgetSortBy>)]
    pub sort_by: Option<String>,
    /// With `sort_by`; defaults to desc.
    #[param(inline, value_type = Option<SortDirection>)]
    pub sort_dir: Option<String>,
    /// From the previous page's `next_cursor`; valid only with the same sort and filters.
    pub cursor: Option<String>,
    /// Page size, at least 1; defaults to 50, values above 100 are treated as 100.
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

/// A utilization bound: a decimal in [0, 1], as parts per billion.
fn utilization_bound(field: &str, value: &Option<String>) -> Result<Option<i64>, ApiError> {
    let Some(text) = value else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(u) if (0.0..=1.0).contains(&u) => Ok(Some((u * 1e9).round() as i64)),
        _ => Err(ApiError::invalid(format!(
            "{field}: must be a number between 0 and 1"
        ))),
    }
}

impl BudgetListParams {
    /// The list operation, and what its response issues the next cursor from: sorted lists
    /// bind theirs to the order and filters; the (scope, unit) order's cursor is a position
    /// in the budget map.
    pub fn into_list(self, actor: Actor) -> Result<(ListBudgets, NextPage), ApiError> {
        let status = self.status.as_deref().map(budget_status).transpose()?;
        let min = utilization_bound("utilization_min", &self.utilization_min)?;
        let max = utilization_bound("utilization_max", &self.utilization_max)?;
        if let (Some(min), Some(max)) = (min, max) {
            if min > max {
                return Err(ApiError::invalid(
                    "utilization_min must not be above utilization_max",
                ));
            }
        }
        let limit = self.limit.unwrap_or_default().0;
        let filters = format!(
            "{:?}|{:?}|{:?}|{status:?}|{:?}|{:?}|{min:?}|{max:?}|{:?}",
            self.tenant_id,
            self.scope_prefix,
            self.unit,
            self.over_limit,
            self.has_debt,
            self.search
        );
        let (order, binding) = match self.sort_by.as_deref() {
            None => {
                descending(self.sort_dir.as_deref())?;
                let after = self
                    .cursor
                    .as_deref()
                    .map(decode_budget_cursor)
                    .transpose()?;
                (BudgetOrder::Address { after, limit }, None)
            }
            sort_by => {
                let order = SortedRequest {
                    sort_by,
                    default: BudgetSort::Utilization,
                    sort_dir: self.sort_dir.as_deref(),
                    cursor: self.cursor.as_deref(),
                    limit,
                    filters,
                    text: |s| matches!(s, BudgetSort::TenantId | BudgetSort::Scope),
                }
                .parse()?;
                let (sort_by, window) = (order.sort_by, order.window);
                (BudgetOrder::Sorted { sort_by, window }, Some(order.binding))
            }
        };
        Ok((
            ListBudgets {
                actor,
                query: BudgetListQuery {
                    filter: BudgetFilter {
                        tenant_id: self.tenant_id,
                        scope_prefix: self.scope_prefix,
                        unit: self.unit.map(Unit::from),
                        status,
                        over_limit: self.over_limit,
                        has_debt: self.has_debt,
                        utilization_ppb: (min, max),
                        search: self.search.0,
                    },
                    order,
                },
            },
            NextPage(binding),
        ))
    }
}

fn budget_status(s: &str) -> Result<BudgetStatus, ApiError> {
    match s {
        "ACTIVE" => Ok(BudgetStatus::Active),
        "FROZEN" => Ok(BudgetStatus::Frozen),
        "CLOSED" => Ok(BudgetStatus::Closed),
        _ => Err(ApiError::invalid(
            "status: must be ACTIVE, FROZEN or CLOSED",
        )),
    }
}

/// The `scope` and `unit` query parameters that address one budget.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BudgetAddress {
    /// The budget's scope (case-insensitive).
    pub scope: String,
    #[param(inline)]
    pub unit: WireUnit,
}

/// The query of `POST /v1/admin/budgets/fund`: the budget, and with the admin key its tenant.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FundParams {
    /// Required with the admin key: the tenant the budget belongs to.
    pub tenant_id: Option<String>,
    /// The budget's scope (case-insensitive).
    pub scope: String,
    #[param(inline)]
    pub unit: WireUnit,
}
