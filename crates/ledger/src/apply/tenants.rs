//! Tenants: create, read, list, update, and the close that cascades to reservations,
//! budgets and API keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::tenant;
use crate::{
    ApiKey, ApiKeyStatus, Budget, BudgetKey, BudgetStatus, Effect, ExpiryPolicy, OveragePolicy,
    Position, Rejection, ReservationStatus, SortBy, SortValue, Tenant, TenantStatus, Unit,
};

use super::lifecycle::{released, Returns};
use super::sorted::{matches_search, sorted_page, text, SortedPage, Window};
use super::{operation, Actor, Tx};

/// Why the close cascade revoked a key (`revoked_reason`, as the reference writes it).
pub const TENANT_CLOSED_REASON: &str = "tenant_closed";

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

/// `GET /v1/admin/tenants`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListTenants {
    pub actor: Actor,
    pub query: TenantListQuery,
}

/// The filter and the order of a tenant list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantListQuery {
    pub filter: TenantFilter,
    pub sort_by: TenantSort,
    pub window: Window,
}

/// Which tenants a list or a bulk action takes: all the conditions set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantFilter {
    pub status: Option<TenantStatus>,
    pub parent_tenant_id: Option<String>,
    /// Lower-cased; matched against the id and the name.
    pub search: Option<String>,
}

impl TenantFilter {
    pub(crate) fn admits(&self, t: &Tenant) -> bool {
        self.status.is_none_or(|s| t.status == s)
            && self
                .parent_tenant_id
                .as_ref()
                .is_none_or(|p| t.parent_tenant_id.as_ref() == Some(p))
            && matches_search(self.search.as_deref(), &[&t.tenant_id, &t.name])
    }
}

/// The fields a tenant list can be ordered by (ties by tenant id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantSort {
    TenantId,
    Name,
    /// In lifecycle order: ACTIVE, SUSPENDED, CLOSED.
    Status,
    CreatedAt,
}

impl TenantSort {
    fn position(self, t: &Tenant) -> Position {
        let value = match self {
            TenantSort::TenantId => SortValue::Int(0),
            TenantSort::Name => text(&t.name),
            TenantSort::Status => SortValue::Int(t.status as i64),
            TenantSort::CreatedAt => SortValue::Int(t.created_at_ms),
        };
        (value, t.tenant_id.clone())
    }
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
operation!(ListTenants => SortedPage<Tenant>, list_tenants);
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
            closing = stamp_status(&mut t, status, self.now);
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

    fn list_tenants(&mut self, op: ListTenants) -> Result<SortedPage<Tenant>, Rejection> {
        self.require_admin(&op.actor)?;
        let q = op.query;
        let rows = self.state.tenants.values().filter(|t| q.filter.admits(t));
        Ok(sorted_page(rows, |t| q.sort_by.position(t), &q.window).map(Tenant::clone))
    }

    /// Moves a tenant that is not CLOSED to `status` and stages it, with the close cascade
    /// when that closes it (a bulk action's row).
    pub(crate) fn restatus_tenant(
        &mut self,
        mut t: Tenant,
        status: TenantStatus,
    ) -> Result<(), Rejection> {
        let closing = stamp_status(&mut t, status, self.now);
        t.updated_at_ms = self.now;
        self.put(Effect::PutTenant(t.clone()));
        if closing {
            self.close_cascade(&t.tenant_id)?;
        }
        Ok(())
    }

    /// Closing a tenant is terminal (admin spec §4.2, mode A: one step): its open
    /// reservations are released (their holds return), its budgets closed and its ACTIVE
    /// API keys revoked, in the same step as the status change. Reads of the closed tenant's
    /// objects stay open to the admin key; every mutation is refused with TENANT_CLOSED.
    pub(crate) fn close_cascade(&mut self, tenant_id: &str) -> Result<(), Rejection> {
        self.revoke_tenant_keys(tenant_id);
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

    /// Revokes every ACTIVE key of the tenant (an expired one is left as it is: it is
    /// already unusable, and its record says why).
    fn revoke_tenant_keys(&mut self, tenant_id: &str) {
        let state = self.state;
        let now = self.now;
        for key in state.api_keys.values() {
            if &*key.tenant_id == tenant_id && key.effective_status(now) == ApiKeyStatus::Active {
                self.put(Effect::PutApiKey(ApiKey {
                    status: ApiKeyStatus::Revoked,
                    revoked_at_ms: Some(now),
                    revoked_reason: Some(TENANT_CLOSED_REASON.to_string()),
                    ..key.clone()
                }));
            }
        }
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

/// Sets `t`'s status with its timestamp; true when this closes it. Unchanged when it is
/// already in `status`.
fn stamp_status(t: &mut Tenant, status: TenantStatus, now: crate::Millis) -> bool {
    if status == t.status {
        return false;
    }
    match status {
        TenantStatus::Suspended => t.suspended_at_ms = Some(now),
        TenantStatus::Closed => t.closed_at_ms = Some(now),
        TenantStatus::Active => {}
    }
    t.status = status;
    status == TenantStatus::Closed
}
