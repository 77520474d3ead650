//! Tenants: create, read, update, and the close that cascades to reservations and budgets.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::tenant;
use crate::{
    Budget, BudgetKey, BudgetStatus, Effect, ExpiryPolicy, OveragePolicy, Rejection,
    ReservationStatus, SortBy, Tenant, TenantStatus, Unit,
};

use super::lifecycle::{released, Returns};
use super::{operation, Actor, Tx};

/// `POST /v1/admin/tenants`: idempotent for the same id and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTenant {
    pub actor: Actor,
    pub tenant: NewTenant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTenant {
    pub tenant_id: String,
    pub name: String,
    pub parent_tenant_id: Option<String>,
    pub default_commit_overage_policy: Option<OveragePolicy>,
    pub default_reservation_ttl_ms: Option<i64>,
    pub max_reservation_ttl_ms: Option<i64>,
    pub max_reservation_extensions: Option<u32>,
    pub reservation_expiry_policy: Option<ExpiryPolicy>,
    pub metadata: BTreeMap<String, String>,
}

/// A tenant as a create left it, and whether the create made it (or found it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWritten {
    pub tenant: Tenant,
    pub created: bool,
}

/// `GET /v1/admin/tenants/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetTenant {
    pub actor: Actor,
    pub tenant_id: String,
}

/// `PATCH /v1/admin/tenants/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateTenant {
    pub actor: Actor,
    pub tenant_id: String,
    pub patch: TenantPatch,
}

/// Fields of a tenant update; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantPatch {
    pub name: Option<String>,
    pub status: Option<TenantStatus>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub default_commit_overage_policy: Option<OveragePolicy>,
    pub default_reservation_ttl_ms: Option<i64>,
    pub max_reservation_ttl_ms: Option<i64>,
    pub max_reservation_extensions: Option<u32>,
}

operation!(CreateTenant => TenantWritten, create_tenant);
operation!(GetTenant => Tenant, get_tenant);
operation!(UpdateTenant => Tenant, update_tenant);

impl Tx<'_> {
    fn create_tenant(&mut self, op: CreateTenant) -> Result<TenantWritten, Rejection> {
        self.require_admin(&op.actor)?;
        let new = op.tenant;
        if let Some(existing) = self.state.tenants.get(&new.tenant_id) {
            if existing.name != new.name {
                return Err(Rejection::DuplicateResource(format!(
                    "Tenant ID {} conflicts with a different tenant",
                    new.tenant_id
                )));
            }
            return Ok(TenantWritten {
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
        Ok(TenantWritten {
            tenant: t,
            created: true,
        })
    }

    fn get_tenant(&mut self, op: GetTenant) -> Result<Tenant, Rejection> {
        self.require_admin(&op.actor)?;
        Ok(self.existing_tenant(&op.tenant_id)?.clone())
    }

    fn update_tenant(&mut self, op: UpdateTenant) -> Result<Tenant, Rejection> {
        self.require_admin(&op.actor)?;
        let patch = op.patch;
        let mut t = self.existing_tenant(&op.tenant_id)?.clone();
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
        Ok(t)
    }

    /// Closing a tenant is terminal: its open reservations are released (their holds return)
    /// and its budgets are closed, in the same step as the status change. Its API keys keep
    /// authenticating so that replays and reads still work; every mutation is refused with
    /// TENANT_CLOSED by the guard.
    fn close_cascade(&mut self, tenant_id: &str) -> Result<(), Rejection> {
        let state = self.state;
        let active = state
            .list_index
            .get(tenant_id)
            .into_iter()
            .flat_map(|index| {
                index.ids(
                    SortBy::CreatedAt,
                    false,
                    None,
                    Some(ReservationStatus::Active),
                    (None, None),
                )
            });
        let mut returns = Returns::default();
        for id in active {
            let Some(r) = state.reservation(id) else {
                continue;
            };
            returns.take_back(self, r)?;
            let reason = Some("tenant_closed".to_string());
            let r = released(r.clone(), self.now, reason);
            self.put(Effect::PutReservation(Arc::new(r)));
        }
        let root = format!("tenant:{tenant_id}");
        let budgets: Vec<Budget> = state
            .budgets
            .range(
                BudgetKey {
                    scope: root.as_str().into(),
                    unit: Unit::ALL[0],
                }..,
            )
            .map(|(_, b)| returns.current(b))
            .take_while(|b| b.scope.starts_with(&root))
            .filter(|b| &*b.tenant_id == tenant_id && b.status != BudgetStatus::Closed)
            .map(|b| Budget {
                status: BudgetStatus::Closed,
                ..b.clone()
            })
            .collect();
        self.put_budgets(budgets)
    }

    /// Refuses any change to an object owned by a CLOSED tenant (admin spec §4.2, rule 2).
    pub(crate) fn open_tenant(&self, tenant_id: &str) -> Result<(), Rejection> {
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
}
