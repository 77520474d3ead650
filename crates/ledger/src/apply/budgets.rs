//! Budgets: create, list, look up, update, freeze, and funding.

use std::ops::Bound;
use std::sync::Arc;

use crate::{
    fund, is_within, scope_tenant, Balance, Budget, BudgetKey, BudgetStatus, Endpoint, EventType,
    FundResult, FundingOp, IdemKey, Millis, OveragePolicy, Permission, Position, Rejection,
    RolloverPolicy, SortValue, Unit, SCOPE_LEVELS,
};

use super::auth::scope_filter_allows;
use super::emit::{budget_lifecycle, upper, NewEvent, ADMIN_SOURCE};
use super::sorted::{matches_search, sorted_page, text, SortedPage, Window};
use super::{operation, Actor, Cause, Idempotency, Idempotent, Page, Tx, DAY_MS};

/// `POST /v1/admin/budgets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateBudget {
    pub actor: Actor,
    pub budget: NewBudget,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBudget {
    pub ledger_id: String,
    /// Required with the admin key, forbidden with a tenant key (the key's tenant is used).
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: Unit,
    pub allocated: i64,
    pub overdraft_limit: i64,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub rollover_policy: Option<RolloverPolicy>,
    pub period_start_ms: Option<Millis>,
    pub period_end_ms: Option<Millis>,
    pub metadata: Option<String>,
}

/// `GET /v1/admin/budgets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListBudgets {
    pub actor: Actor,
    pub query: BudgetListQuery,
}

/// The filter and the order of a budget list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetListQuery {
    pub filter: BudgetFilter,
    pub order: BudgetOrder,
}

/// Which budgets a list or a bulk action takes: all the conditions set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetFilter {
    pub tenant_id: Option<String>,
    pub scope_prefix: Option<String>,
    pub unit: Option<Unit>,
    pub status: Option<BudgetStatus>,
    pub over_limit: Option<bool>,
    /// `true`: debt above zero; `false`: no debt.
    pub has_debt: Option<bool>,
    /// Inclusive bounds on [`utilization_ppb`].
    pub utilization_ppb: (Option<i64>, Option<i64>),
    /// Lower-cased; matched against the tenant id and the scope.
    pub search: Option<String>,
}

/// How a budget list is ordered and where its page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetOrder {
    /// `(scope, unit)` ascending, read straight off the budget map: the order without
    /// `sort_by`.
    Address {
        after: Option<(String, Unit)>,
        limit: usize,
    },
    /// By one field, ties by ledger id.
    Sorted { sort_by: BudgetSort, window: Window },
}

/// The fields a budget list can be sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSort {
    TenantId,
    Scope,
    Unit,
    /// In declaration order: ACTIVE, FROZEN, CLOSED.
    Status,
    /// By the policy's name, as the spec orders it: ALLOW_IF_AVAILABLE,
    /// ALLOW_WITH_OVERDRAFT, REJECT; budgets that inherit their tenant's policy first.
    CommitOveragePolicy,
    Utilization,
    Debt,
}

impl BudgetSort {
    fn position(self, b: &Budget) -> Position {
        let value = match self {
            BudgetSort::TenantId => text(&b.tenant_id),
            BudgetSort::Scope => text(&b.scope),
            BudgetSort::Unit => SortValue::Int(b.unit as i64),
            BudgetSort::Status => SortValue::Int(b.status as i64),
            BudgetSort::CommitOveragePolicy => SortValue::Int(match b.commit_overage_policy {
                None => 0,
                Some(OveragePolicy::AllowIfAvailable) => 1,
                Some(OveragePolicy::AllowWithOverdraft) => 2,
                Some(OveragePolicy::Reject) => 3,
            }),
            BudgetSort::Utilization => SortValue::Int(utilization_ppb(b)),
            BudgetSort::Debt => SortValue::Int(b.debt),
        };
        (value, b.ledger_id.to_string())
    }
}

/// `spent / allocated` in parts per billion (0 when nothing is allocated); above a billion
/// when spending ran past the allocation.
pub fn utilization_ppb(b: &Budget) -> i64 {
    if b.allocated <= 0 {
        return 0;
    }
    let ppb = i128::from(b.spent.max(0)) * 1_000_000_000 / i128::from(b.allocated);
    i64::try_from(ppb).unwrap_or(i64::MAX)
}

impl BudgetFilter {
    /// Whether `b` passes, for the tenant the caller may see (`tenant`) and the lower-cased
    /// scope prefix.
    pub(crate) fn admits(&self, b: &Budget, tenant: Option<&str>, prefix: Option<&str>) -> bool {
        let (min, max) = self.utilization_ppb;
        let utilization = utilization_ppb(b);
        tenant.is_none_or(|t| *b.tenant_id == *t)
            && prefix.is_none_or(|p| is_within(&b.scope, p))
            && self.unit.is_none_or(|u| b.unit == u)
            && self.status.is_none_or(|s| b.status == s)
            && self.over_limit.is_none_or(|o| b.is_over_limit == o)
            && self.has_debt.is_none_or(|d| (b.debt > 0) == d)
            && min.is_none_or(|m| utilization >= m)
            && max.is_none_or(|m| utilization <= m)
            && matches_search(self.search.as_deref(), &[&b.tenant_id, &b.scope])
    }
}

/// `GET /v1/admin/budgets/lookup`: one budget by exact `(scope, unit)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupBudget {
    pub actor: Actor,
    pub scope: String,
    pub unit: Unit,
}

/// `POST /v1/admin/budgets/fund`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundBudget {
    pub actor: Actor,
    pub fund: Funding,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Funding {
    /// Required with the admin key; ignored with a tenant key.
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: Unit,
    pub operation: FundingOp,
    pub amount: i64,
    pub spent: Option<i64>,
    /// The operator's justification, carried by the funding's event.
    pub reason: Option<String>,
    pub idem: Option<Idempotency>,
}

/// `PATCH /v1/admin/budgets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateBudget {
    pub actor: Actor,
    pub scope: String,
    pub unit: Unit,
    pub patch: BudgetPatch,
}

/// Fields of a budget update; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetPatch {
    pub overdraft_limit: Option<i64>,
    /// Absent (`None`), removed (`Some(None)`: the tenant's default applies) or set.
    pub commit_overage_policy: Option<Option<OveragePolicy>>,
    /// Absent, removed or set (as JSON text).
    pub metadata: Option<Option<String>>,
}

/// `POST /v1/admin/budgets/freeze` (`frozen`) and `/unfreeze`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetBudgetFrozen {
    pub actor: Actor,
    pub scope: String,
    pub unit: Unit,
    pub frozen: bool,
    /// The operator's reason, carried by the event.
    pub reason: Option<String>,
}

operation!(CreateBudget => Budget, create_budget);
operation!(ListBudgets => SortedPage<Budget>, list_budgets);
operation!(LookupBudget => Budget, lookup_budget);
operation!(FundBudget => Idempotent<FundResult>, fund_budget);
operation!(UpdateBudget => Budget, update_budget);
operation!(SetBudgetFrozen => Budget, set_budget_frozen);

impl Tx<'_> {
    fn create_budget(&mut self, op: CreateBudget) -> Result<Budget, Rejection> {
        let new = op.budget;
        let tenant_id =
            self.creating_tenant(&op.actor, Permission::BudgetsWrite, new.tenant_id.clone())?;
        self.writable_tenant(&tenant_id)?;
        let scope = canonical_budget_scope(&new.scope, &tenant_id)?;
        self.within_scope_filter(&op.actor, &scope)?;
        let key = BudgetKey {
            scope: scope.as_str().into(),
            unit: new.unit,
        };
        if self.state.budgets.contains_key(&key) {
            return Err(Rejection::DuplicateResource(format!(
                "Budget already exists for scope {scope} in {}",
                new.unit.as_str()
            )));
        }
        let budget = Budget {
            ledger_id: new.ledger_id.into(),
            tenant_id: tenant_id.into(),
            scope: scope.into(),
            unit: new.unit,
            allocated: new.allocated,
            remaining: new.allocated,
            reserved: 0,
            spent: 0,
            debt: 0,
            overdraft_limit: new.overdraft_limit,
            is_over_limit: false,
            commit_overage_policy: new.commit_overage_policy,
            status: BudgetStatus::Active,
            rollover_policy: new.rollover_policy.unwrap_or(RolloverPolicy::None),
            period_start_ms: new.period_start_ms,
            period_end_ms: new.period_end_ms,
            metadata: new.metadata.map(Into::into),
            created_at_ms: self.now,
            updated_at_ms: self.now,
        };
        self.put_budgets(Cause::Admin(&op.actor), vec![budget.clone()])?;
        let data = budget_lifecycle(None, &budget, "CREATE", None);
        self.budget_event(&op.actor, EventType::BudgetCreated, &budget, data, None);
        Ok(budget)
    }

    /// Stages one budget event of `b`.
    pub(crate) fn budget_event(
        &mut self,
        actor: &Actor,
        event_type: EventType,
        b: &Budget,
        data: serde_json::Value,
        correlation_id: Option<String>,
    ) {
        let actor = self.event_actor(actor, true);
        self.emit(NewEvent {
            event_type,
            tenant_id: b.tenant_id.to_string(),
            scope: Some(b.scope.to_string()),
            actor,
            source: ADMIN_SOURCE,
            data,
            correlation_id,
        });
    }

    /// The events of a funding operation from `before` to `after`: its own, and
    /// `over_limit_exited` when it brought the debt back within the overdraft limit.
    pub(crate) fn funding_events(
        &mut self,
        actor: &Actor,
        (before, after): (&Budget, &Budget),
        operation: FundingOp,
        spent_provided: bool,
        reason: Option<&str>,
        correlation_id: Option<String>,
    ) {
        let event_type = match operation {
            FundingOp::Credit => EventType::BudgetFunded,
            FundingOp::Debit => EventType::BudgetDebited,
            FundingOp::Reset => EventType::BudgetReset,
            FundingOp::ResetSpent => EventType::BudgetResetSpent,
            FundingOp::RepayDebt => EventType::BudgetDebtRepaid,
        };
        let mut data = budget_lifecycle(Some(before), after, &upper(operation), reason);
        if operation == FundingOp::ResetSpent {
            data["spent_override_provided"] = spent_provided.into();
        }
        self.budget_event(actor, event_type, after, data, correlation_id.clone());
        if before.is_over_limit && !after.is_over_limit {
            self.over_limit_event(
                actor,
                EventType::BudgetOverLimitExited,
                after,
                correlation_id,
            );
        }
    }

    /// `budget.over_limit_entered` / `_exited` of `b` as it is now.
    pub(crate) fn over_limit_event(
        &mut self,
        actor: &Actor,
        event_type: EventType,
        b: &Budget,
        correlation_id: Option<String>,
    ) {
        let data = serde_json::json!({
            "scope": &*b.scope,
            "unit": b.unit.as_str(),
            "debt": b.debt,
            "overdraft_limit": b.overdraft_limit,
            "is_over_limit": b.is_over_limit,
            "debt_utilization": debt_utilization(b),
        });
        self.budget_event(actor, event_type, b, data, correlation_id);
    }

    fn list_budgets(&mut self, op: ListBudgets) -> Result<SortedPage<Budget>, Rejection> {
        let q = op.query;
        let tenant = match self.admin_or_tenant(&op.actor, Permission::BudgetsRead)? {
            Some(caller) => Some(caller.tenant_id.to_string()),
            None => q.filter.tenant_id.clone(),
        };
        let prefix = q.filter.scope_prefix.as_ref().map(|p| p.to_lowercase());
        if let Some(p) = &prefix {
            self.within_scope_filter(&op.actor, p)?;
        }
        let reach = self.caller_scope_filter(&op.actor);
        let admits = |b: &&Arc<Budget>| {
            q.filter.admits(b, tenant.as_deref(), prefix.as_deref())
                && scope_filter_allows(reach, &b.scope)
        };
        let budgets = &self.state.budgets;
        Ok(match &q.order {
            BudgetOrder::Address { after, limit } => {
                let start = match after {
                    Some((scope, unit)) => Bound::Excluded(BudgetKey {
                        scope: scope.as_str().into(),
                        unit: *unit,
                    }),
                    None => Bound::Unbounded,
                };
                let rows = budgets.range((start, Bound::Unbounded)).map(|(_, b)| b);
                SortedPage {
                    page: Page::of(rows.filter(admits).map(|b| (**b).clone()), *limit),
                    last: None,
                }
            }
            BudgetOrder::Sorted { sort_by, window } => {
                let rows = budgets.values().filter(admits);
                sorted_page(rows, |b| sort_by.position(b), window).map(|b| (**b).clone())
            }
        })
    }

    /// A budget by exact `(scope, unit)`, visible to the admin or to its own tenant's keys.
    fn visible_budget(
        &mut self,
        actor: &Actor,
        permission: Permission,
        scope: &str,
        unit: Unit,
    ) -> Result<Budget, Rejection> {
        let caller = self.admin_or_tenant(actor, permission)?;
        let scope = scope.to_lowercase();
        let not_found = || Rejection::BudgetNotFound(format!("{scope} ({})", unit.as_str()));
        let budget = self
            .state
            .budget(&BudgetKey {
                scope: scope.as_str().into(),
                unit,
            })
            .cloned()
            .ok_or_else(not_found)?;
        match caller {
            Some(c) if *c.tenant_id != *budget.tenant_id => Err(not_found()),
            _ => {
                self.within_scope_filter(actor, &budget.scope)?;
                Ok(budget)
            }
        }
    }

    fn lookup_budget(&mut self, op: LookupBudget) -> Result<Budget, Rejection> {
        self.visible_budget(&op.actor, Permission::BudgetsRead, &op.scope, op.unit)
    }

    fn fund_budget(&mut self, op: FundBudget) -> Result<Idempotent<FundResult>, Rejection> {
        let (actor, cmd) = (op.actor, op.fund);
        let tenant_id =
            self.acting_tenant(&actor, Permission::BudgetsWrite, cmd.tenant_id.clone())?;
        let budget = self.visible_budget(&actor, Permission::BudgetsWrite, &cmd.scope, cmd.unit)?;
        if *budget.tenant_id != *tenant_id {
            return Err(Rejection::BudgetNotFound(format!(
                "{} ({}) for tenant {tenant_id}",
                budget.scope,
                cmd.unit.as_str()
            )));
        }
        let key = cmd.idem.as_ref().map(|i| {
            let key = IdemKey {
                tenant_id: Arc::from(tenant_id.as_str()),
                endpoint: Endpoint::Fund,
                key: i.key.clone(),
            };
            (key, i.fingerprint)
        });
        self.once(key, |tx| {
            tx.writable_by(&actor, &tenant_id)?;
            let funded = fund(&budget, cmd.operation, cmd.amount, cmd.spent)?;
            let result = FundResult {
                operation: cmd.operation,
                unit: cmd.unit,
                previous: Balance::from(&budget),
                new: Balance::from(&funded),
                timestamp_ms: tx.now,
            };
            tx.put_budgets(Cause::Admin(&actor), vec![funded.clone()])?;
            let spent_provided = cmd.spent.is_some();
            tx.funding_events(
                &actor,
                (&budget, &funded),
                cmd.operation,
                spent_provided,
                cmd.reason.as_deref(),
                None,
            );
            Ok((result, DAY_MS))
        })
    }

    fn update_budget(&mut self, op: UpdateBudget) -> Result<Budget, Rejection> {
        self.require_admin(&op.actor)?;
        let patch = op.patch;
        let mut b = self.visible_budget(&op.actor, Permission::BudgetsWrite, &op.scope, op.unit)?;
        let before = b.clone();
        self.open_tenant(&b.tenant_id)?;
        if b.status == BudgetStatus::Closed {
            return Err(Rejection::BudgetClosed {
                scope: b.scope.to_string(),
            });
        }
        if let Some(limit) = patch.overdraft_limit {
            b.overdraft_limit = limit;
            b.is_over_limit = b.debt > limit;
        }
        if let Some(policy) = patch.commit_overage_policy {
            b.commit_overage_policy = policy;
        }
        if let Some(metadata) = patch.metadata {
            b.metadata = metadata.map(Into::into);
        }
        if b == before {
            // Nothing changes: nothing is stamped, stored or announced (admin spec §4.3).
            return Ok(b);
        }
        // `put_budgets` stamps the copy it keeps; the answer is this one.
        b.updated_at_ms = self.now;
        self.put_budgets(Cause::Admin(&op.actor), vec![b.clone()])?;
        let data = budget_lifecycle(Some(&before), &b, "UPDATE", None);
        self.budget_event(&op.actor, EventType::BudgetUpdated, &b, data, None);
        if before.is_over_limit != b.is_over_limit {
            let event_type = if b.is_over_limit {
                EventType::BudgetOverLimitEntered
            } else {
                EventType::BudgetOverLimitExited
            };
            self.over_limit_event(&op.actor, event_type, &b, None);
        }
        Ok(b)
    }

    fn set_budget_frozen(&mut self, op: SetBudgetFrozen) -> Result<Budget, Rejection> {
        self.require_admin(&op.actor)?;
        let frozen = op.frozen;
        let mut b = self.visible_budget(&op.actor, Permission::BudgetsWrite, &op.scope, op.unit)?;
        self.open_tenant(&b.tenant_id)?;
        let (from, to) = if frozen {
            (BudgetStatus::Active, BudgetStatus::Frozen)
        } else {
            (BudgetStatus::Frozen, BudgetStatus::Active)
        };
        if b.status == BudgetStatus::Closed {
            return Err(Rejection::BudgetClosed {
                scope: b.scope.to_string(),
            });
        }
        if b.status != from {
            return Err(Rejection::Conflict(format!(
                "Budget {} is already {}",
                b.scope,
                b.status.as_str()
            )));
        }
        let before = b.clone();
        b.status = to;
        b.updated_at_ms = self.now;
        self.put_budgets(Cause::Admin(&op.actor), vec![b.clone()])?;
        let event_type = if frozen {
            EventType::BudgetFrozen
        } else {
            EventType::BudgetUnfrozen
        };
        let data = budget_lifecycle(Some(&before), &b, "STATUS_CHANGE", op.reason.as_deref());
        self.budget_event(&op.actor, event_type, &b, data, None);
        Ok(b)
    }
}

/// Validates and lower-cases a budget scope: `tenant:<id>` first, then levels in canonical
/// order (gaps allowed, no repeats), each value 1–128 chars of `[A-Za-z0-9_.-]`, the same
/// charset subjects use, so every subject value can have a budget.
pub(crate) fn canonical_budget_scope(scope: &str, tenant_id: &str) -> Result<String, Rejection> {
    let invalid = |why: &str| Rejection::InvalidRequest(format!("Invalid scope '{scope}': {why}"));
    let lower = scope.to_lowercase();
    let mut last_level: Option<usize> = None;
    for (i, segment) in lower.split('/').enumerate() {
        let (level, value) = segment
            .split_once(':')
            .ok_or_else(|| invalid("each segment must be level:value"))?;
        let pos = SCOPE_LEVELS
            .iter()
            .position(|l| *l == level)
            .ok_or_else(|| invalid("unknown level"))?;
        if i == 0 && pos != 0 {
            return Err(invalid("the first segment must be tenant:<id>"));
        }
        if last_level.is_some_and(|l| pos <= l) {
            return Err(invalid("levels must follow tenant/workspace/app/workflow/agent/toolset order without repeats"));
        }
        last_level = Some(pos);
        if !valid_scope_value(value) {
            return Err(invalid("values must be 1-128 characters of [A-Za-z0-9_.-]"));
        }
    }
    if scope_tenant(&lower) != Some(tenant_id) {
        return Err(Rejection::Forbidden(format!(
            "Scope '{scope}' does not belong to tenant {tenant_id}"
        )));
    }
    Ok(lower)
}

/// Whether `value` may be a scope segment's value: 1-128 characters of `[A-Za-z0-9_.-]`.
pub fn valid_scope_value(value: &str) -> bool {
    (1..=128).contains(&value.len())
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// `debt / overdraft_limit` (0 without a limit).
pub(crate) fn debt_utilization(b: &Budget) -> f64 {
    if b.overdraft_limit > 0 {
        b.debt as f64 / b.overdraft_limit as f64
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::canonical_budget_scope;

    #[test]
    fn budget_scopes() {
        assert_eq!(
            canonical_budget_scope("tenant:Acme/agent:Bot", "acme").unwrap(),
            "tenant:acme/agent:bot"
        );
        assert!(canonical_budget_scope("agent:bot", "acme").is_err());
        assert!(canonical_budget_scope("tenant:acme/agent:a/app:b", "acme").is_err());
        assert!(canonical_budget_scope("tenant:acme/agent:a b", "acme").is_err());
        assert!(canonical_budget_scope("tenant:other", "acme").is_err());
        assert!(canonical_budget_scope("tenant:acme/", "acme").is_err());
    }
}
