//! The admin plane's provisioning: tenants, API keys, budgets and funding.

use std::ops::Bound;
use std::sync::Arc;

use crate::{
    fund, scope_tenant, tenant, Actor, ApiKey, ApiKeyStatus, Balance, Budget, BudgetKey,
    BudgetListQuery, BudgetPatch, BudgetStatus, Effect, Endpoint, ExpiryPolicy, FundCmd,
    FundResult, IdemKey, NewApiKey, NewBudget, NewTenant, Outcome, OveragePolicy, Permission,
    Rejection, ReservationStatus, RolloverPolicy, SortBy, StoredOutcome, Tenant, TenantPatch,
    TenantStatus, Unit, SCOPE_LEVELS,
};

use super::{Tx, DAY_MS};

/// Default lifetime of an API key created without `expires_at` (admin reference: 90 days).
const DEFAULT_KEY_LIFETIME_MS: i64 = 90 * DAY_MS;

impl Tx<'_> {
    pub(crate) fn create_tenant(
        &mut self,
        actor: &Actor,
        new: NewTenant,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        if let Some(existing) = self.state.tenants.get(&new.tenant_id) {
            if existing.name != new.name {
                return Err(Rejection::DuplicateResource(format!(
                    "Tenant ID {} conflicts with a different tenant",
                    new.tenant_id
                )));
            }
            return Ok(Outcome::Tenant {
                tenant: existing.clone(),
                created: false,
            });
        }
        let ttl = new
            .default_reservation_ttl_ms
            .unwrap_or(tenant::DEFAULT_TTL_MS);
        let max_ttl = new
            .max_reservation_ttl_ms
            .unwrap_or(tenant::DEFAULT_MAX_TTL_MS);
        let t = Tenant {
            tenant_id: new.tenant_id,
            name: new.name,
            status: TenantStatus::Active,
            parent_tenant_id: new.parent_tenant_id,
            default_commit_overage_policy: new
                .default_commit_overage_policy
                .unwrap_or(OveragePolicy::AllowIfAvailable),
            default_reservation_ttl_ms: ttl,
            max_reservation_ttl_ms: max_ttl,
            max_reservation_extensions: new
                .max_reservation_extensions
                .unwrap_or(tenant::DEFAULT_MAX_EXTENSIONS),
            reservation_expiry_policy: new
                .reservation_expiry_policy
                .unwrap_or(ExpiryPolicy::AutoRelease),
            metadata: new.metadata,
            created_at_ms: self.now,
            updated_at_ms: self.now,
            suspended_at_ms: None,
            closed_at_ms: None,
        };
        self.put(Effect::PutTenant(t.clone()));
        Ok(Outcome::Tenant {
            tenant: t,
            created: true,
        })
    }

    pub(crate) fn get_tenant(&mut self, actor: &Actor, id: &str) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        Ok(Outcome::Tenant {
            tenant: self.existing_tenant(id)?.clone(),
            created: false,
        })
    }

    pub(crate) fn update_tenant(
        &mut self,
        actor: &Actor,
        id: &str,
        patch: TenantPatch,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        let mut t = self.existing_tenant(id)?.clone();
        let mut closing = false;
        if let Some(status) = patch.status {
            if t.status == TenantStatus::Closed && status != TenantStatus::Closed {
                return Err(Rejection::InvalidRequest(
                    "Cannot transition from CLOSED".into(),
                ));
            }
            if status != t.status {
                closing = status == TenantStatus::Closed;
                match status {
                    TenantStatus::Suspended => t.suspended_at_ms = Some(self.now),
                    TenantStatus::Closed => t.closed_at_ms = Some(self.now),
                    TenantStatus::Active => {}
                }
                t.status = status;
            }
        }
        if let Some(name) = patch.name {
            t.name = name;
        }
        if let Some(metadata) = patch.metadata {
            t.metadata = metadata;
        }
        if let Some(p) = patch.default_commit_overage_policy {
            t.default_commit_overage_policy = p;
        }
        if let Some(v) = patch.default_reservation_ttl_ms {
            t.default_reservation_ttl_ms = v;
        }
        if let Some(v) = patch.max_reservation_ttl_ms {
            t.max_reservation_ttl_ms = v;
        }
        if let Some(v) = patch.max_reservation_extensions {
            t.max_reservation_extensions = v;
        }
        t.updated_at_ms = self.now;
        self.put(Effect::PutTenant(t.clone()));
        if closing {
            self.close_cascade(&t.tenant_id)?;
        }
        Ok(Outcome::Tenant {
            tenant: t,
            created: false,
        })
    }

    /// Closing a tenant is terminal: its open reservations are released (their holds return)
    /// and its budgets are closed, in the same step as the status change. Its API keys keep
    /// authenticating so that replays and reads still work; every mutation is refused with
    /// TENANT_CLOSED by the guard.
    fn close_cascade(&mut self, tenant_id: &str) -> Result<(), Rejection> {
        let active: Vec<String> = self
            .state
            .list_index
            .get(tenant_id)
            .map(|index| {
                index
                    .ids(
                        SortBy::CreatedAt,
                        false,
                        None,
                        Some(ReservationStatus::Active),
                        (None, None),
                    )
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        for id in active {
            let Some(r) = self.state.reservation(&id).cloned() else {
                continue;
            };
            self.release_hold(r, Some("tenant_closed".into()))?;
        }
        let root = format!("tenant:{tenant_id}");
        let budgets: Vec<Budget> = self
            .state
            .budgets
            .range(
                BudgetKey {
                    scope: root.as_str().into(),
                    unit: Unit::ALL[0],
                }..,
            )
            .map(|(_, b)| b)
            .take_while(|b| b.scope.starts_with(&root))
            .filter(|b| &*b.tenant_id == tenant_id && b.status != BudgetStatus::Closed)
            .map(|b| Budget {
                status: BudgetStatus::Closed,
                ..(**b).clone()
            })
            .collect();
        self.put_budgets(budgets)
    }

    /// Refuses any change to an object owned by a CLOSED tenant (admin spec §4.2, rule 2).
    fn open_tenant(&self, tenant_id: &str) -> Result<(), Rejection> {
        match self.state.tenants.get(tenant_id) {
            Some(t) if t.status == TenantStatus::Closed => {
                Err(Rejection::TenantClosed(tenant_id.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// Refuses writes on behalf of a tenant that is not ACTIVE.
    pub(crate) fn writable_tenant(&self, tenant_id: &str) -> Result<(), Rejection> {
        match self.existing_tenant(tenant_id)?.status {
            TenantStatus::Active => Ok(()),
            TenantStatus::Closed => Err(Rejection::TenantClosed(tenant_id.to_string())),
            TenantStatus::Suspended => Err(Rejection::InvalidRequest(format!(
                "Tenant is SUSPENDED: {tenant_id}"
            ))),
        }
    }

    pub(crate) fn create_api_key(
        &mut self,
        actor: &Actor,
        new: NewApiKey,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        self.writable_tenant(&new.tenant_id)?;
        if self.state.key_by_digest.contains_key(&new.digest)
            || self.state.api_keys.contains_key(&new.key_id)
        {
            return Err(Rejection::Internal("API key collision; retry".into()));
        }
        let key = ApiKey {
            key_id: new.key_id,
            tenant_id: new.tenant_id.into(),
            key_prefix: new.key_prefix,
            digest: new.digest,
            name: new.name,
            description: new.description,
            permissions: new
                .permissions
                .unwrap_or_else(|| Permission::DEFAULTS.to_vec()),
            scope_filter: new.scope_filter,
            status: ApiKeyStatus::Active,
            created_at_ms: self.now,
            expires_at_ms: new
                .expires_at_ms
                .unwrap_or(self.now.saturating_add(DEFAULT_KEY_LIFETIME_MS)),
            revoked_at_ms: None,
            revoked_reason: None,
            metadata: new.metadata,
        };
        self.put(Effect::PutApiKey(key.clone()));
        Ok(Outcome::ApiKey(key))
    }

    pub(crate) fn revoke_api_key(
        &mut self,
        actor: &Actor,
        key_id: &str,
        reason: Option<String>,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        let mut key = self
            .state
            .api_keys
            .get(key_id)
            .cloned()
            .ok_or_else(|| Rejection::NotFound(format!("API key not found: {key_id}")))?;
        self.open_tenant(&key.tenant_id)?;
        if key.status == ApiKeyStatus::Revoked {
            return Err(Rejection::KeyRevoked(key_id.to_string()));
        }
        key.status = ApiKeyStatus::Revoked;
        key.revoked_at_ms = Some(self.now);
        key.revoked_reason = reason;
        self.put(Effect::PutApiKey(key.clone()));
        Ok(Outcome::ApiKey(key))
    }

    /// The tenant a budget operation acts for: the key's tenant, or with the admin key the
    /// `tenant_id` the request names (required).
    pub(crate) fn acting_tenant(
        &mut self,
        actor: &Actor,
        permission: Permission,
        named: Option<String>,
    ) -> Result<String, Rejection> {
        match self.admin_or_tenant(actor, permission)? {
            Some(caller) => Ok(caller.tenant_id.to_string()),
            None => named.ok_or_else(|| {
                Rejection::InvalidRequest(
                    "tenant_id is required when using admin key authentication".into(),
                )
            }),
        }
    }

    /// The tenant a create request acts for: the key's own, or with the admin key the body's
    /// `tenant_id` (required there, and refused with a tenant key).
    pub(crate) fn creating_tenant(
        &mut self,
        actor: &Actor,
        permission: Permission,
        named: Option<String>,
    ) -> Result<String, Rejection> {
        if matches!(actor, Actor::ApiKey(_)) && named.is_some() {
            self.authenticate(actor)?;
            return Err(Rejection::InvalidRequest(
                "tenant_id must not be set when using a tenant API key".into(),
            ));
        }
        self.acting_tenant(actor, permission, named)
    }

    pub(crate) fn create_budget(
        &mut self,
        actor: &Actor,
        new: NewBudget,
    ) -> Result<Outcome, Rejection> {
        let tenant_id =
            self.creating_tenant(actor, Permission::BudgetsWrite, new.tenant_id.clone())?;
        self.writable_tenant(&tenant_id)?;
        let scope = canonical_budget_scope(&new.scope, &tenant_id)?;
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
        self.put_budgets(vec![budget.clone()])?;
        Ok(Outcome::Budget(budget))
    }

    pub(crate) fn list_budgets(
        &mut self,
        actor: &Actor,
        q: BudgetListQuery,
    ) -> Result<Outcome, Rejection> {
        let tenant = match self.admin_or_tenant(actor, Permission::BudgetsRead)? {
            Some(caller) => Some(caller.tenant_id.to_string()),
            None => q.tenant_id.clone(),
        };
        let start = match q.after {
            Some((scope, unit)) => Bound::Excluded(BudgetKey {
                scope: scope.into(),
                unit,
            }),
            None => Bound::Unbounded,
        };
        let prefix = q.scope_prefix.map(|p| p.to_lowercase());
        let mut page: Vec<Budget> = self
            .state
            .budgets
            .range((start, Bound::Unbounded))
            .map(|(_, b)| b)
            .filter(|b| tenant.as_ref().is_none_or(|t| *b.tenant_id == **t))
            .filter(|b| {
                prefix
                    .as_ref()
                    .is_none_or(|p| b.scope.starts_with(p.as_str()))
            })
            .filter(|b| q.unit.is_none_or(|u| b.unit == u))
            .filter(|b| q.status.is_none_or(|s| b.status == s))
            .take(q.limit + 1)
            .map(|b| (**b).clone())
            .collect();
        let has_more = page.len() > q.limit;
        page.truncate(q.limit);
        Ok(Outcome::Budgets {
            budgets: page,
            has_more,
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
            _ => Ok(budget),
        }
    }

    pub(crate) fn lookup_budget(
        &mut self,
        actor: &Actor,
        scope: &str,
        unit: Unit,
    ) -> Result<Outcome, Rejection> {
        self.visible_budget(actor, Permission::BudgetsRead, scope, unit)
            .map(Outcome::Budget)
    }

    pub(crate) fn fund_budget(
        &mut self,
        actor: &Actor,
        cmd: FundCmd,
    ) -> Result<Outcome, Rejection> {
        let tenant_id =
            self.acting_tenant(actor, Permission::BudgetsWrite, cmd.tenant_id.clone())?;
        let budget = self.visible_budget(actor, Permission::BudgetsWrite, &cmd.scope, cmd.unit)?;
        if *budget.tenant_id != *tenant_id {
            return Err(Rejection::BudgetNotFound(format!(
                "{} ({}) for tenant {tenant_id}",
                budget.scope,
                cmd.unit.as_str()
            )));
        }
        let idem_key = cmd.idem.as_ref().map(|i| IdemKey {
            tenant_id: Arc::from(tenant_id.as_str()),
            endpoint: Endpoint::Fund,
            key: i.key.clone(),
        });
        if let (Some(key), Some(idem)) = (&idem_key, &cmd.idem) {
            if let Some(stored) = self.replay(key, &idem.fingerprint)? {
                let StoredOutcome::Fund(result) = stored else {
                    return Err(Rejection::IdempotencyMismatch);
                };
                return Ok(Outcome::Funded {
                    result,
                    replayed: true,
                });
            }
        }
        self.writable_tenant(&tenant_id)?;
        let funded = fund(&budget, cmd.operation, cmd.amount, cmd.spent)?;
        let result = FundResult {
            operation: cmd.operation,
            unit: cmd.unit,
            previous: Balance::from(&budget),
            new: Balance::from(&funded),
            timestamp_ms: self.now,
        };
        self.put_budgets(vec![funded])?;
        let result = Arc::new(result);
        if let (Some(key), Some(idem)) = (idem_key, cmd.idem) {
            self.remember(
                key,
                idem.fingerprint,
                StoredOutcome::Fund(result.clone()),
                DAY_MS,
            );
        }
        Ok(Outcome::Funded {
            result,
            replayed: false,
        })
    }

    pub(crate) fn update_budget(
        &mut self,
        actor: &Actor,
        scope: &str,
        unit: Unit,
        patch: BudgetPatch,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        let mut b = self.visible_budget(actor, Permission::BudgetsWrite, scope, unit)?;
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
            b.commit_overage_policy = Some(policy);
        }
        if let Some(metadata) = patch.metadata {
            b.metadata = Some(metadata.into());
        }
        self.put_budgets(vec![b.clone()])?;
        Ok(Outcome::Budget(b))
    }

    pub(crate) fn set_budget_frozen(
        &mut self,
        actor: &Actor,
        scope: &str,
        unit: Unit,
        frozen: bool,
    ) -> Result<Outcome, Rejection> {
        self.require_admin(actor)?;
        let mut b = self.visible_budget(actor, Permission::BudgetsWrite, scope, unit)?;
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
        b.status = to;
        self.put_budgets(vec![b.clone()])?;
        Ok(Outcome::Budget(b))
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
        if value.is_empty()
            || value.len() > 128
            || !value
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
        {
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
