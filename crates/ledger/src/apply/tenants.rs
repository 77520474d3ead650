//! Tenants: create, read, list, update, and the close that cascades to reservations,
//! budgets and API keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::tenant;
use crate::{
    ApiKey, ApiKeyStatus, Budget, BudgetKey, BudgetStatus, Effect, EventType, ExpiryPolicy,
    OveragePolicy, Position, Rejection, ReservationStatus, SortBy, SortValue, Tenant, TenantStatus,
    Unit, WebhookStatus, WebhookSubscription,
};

use super::emit::{changed, upper, NewEvent, ADMIN_SOURCE};
use super::lifecycle::{released, Returns};
use super::sorted::{matches_search, sorted_page, text, SortedPage, Window};
use super::{operation, Actor, Cause, Tx};

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
        self.tenant_events(&op.actor, None, &t, None);
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
        let state = self.state;
        let before = state.tenants.get(&op.tenant_id);
        let correlation = closing.then(|| self.cascade_correlation(&t.tenant_id));
        self.tenant_events(&op.actor, before, &t, correlation);
        if closing {
            self.close_cascade(&t.tenant_id, &op.actor)?;
        }
        Ok(t)
    }

    /// `tenant_close_cascade:<tenant>:<request>`: the close and everything it cascades to.
    fn cascade_correlation(&self, tenant_id: &str) -> String {
        format!("tenant_close_cascade:{tenant_id}:{}", self.request_id())
    }

    /// The events of a tenant written from `before` (none: created) to `after`: one for a
    /// status change, one for changed settings (the defaults runtime requests inherit), one
    /// for the rest (name, metadata).
    pub(crate) fn tenant_events(
        &mut self,
        actor: &Actor,
        before: Option<&Tenant>,
        after: &Tenant,
        correlation: Option<String>,
    ) {
        let actor = self.event_actor(actor, false);
        let emit = |tx: &mut Self, event_type, changed_fields: Vec<String>| {
            let mut data = serde_json::json!({
                "tenant_id": after.tenant_id,
                "new_status": upper(after.status),
                "changed_fields": changed_fields,
            });
            if let Some(b) = before {
                data["previous_status"] = upper(b.status).into();
            }
            tx.emit(NewEvent {
                event_type,
                tenant_id: after.tenant_id.clone(),
                scope: None,
                actor: actor.clone(),
                source: ADMIN_SOURCE,
                data,
                correlation_id: correlation.clone(),
            });
        };
        let Some(b) = before else {
            emit(self, EventType::TenantCreated, Vec::new());
            return;
        };
        if b.status != after.status {
            let event_type = match after.status {
                TenantStatus::Suspended => EventType::TenantSuspended,
                TenantStatus::Closed => EventType::TenantClosed,
                TenantStatus::Active => EventType::TenantReactivated,
            };
            emit(self, event_type, Vec::new());
        }
        let settings = changed(&[
            (
                "default_commit_overage_policy",
                b.default_commit_overage_policy != after.default_commit_overage_policy,
            ),
            (
                "default_reservation_ttl_ms",
                b.default_reservation_ttl_ms != after.default_reservation_ttl_ms,
            ),
            (
                "max_reservation_ttl_ms",
                b.max_reservation_ttl_ms != after.max_reservation_ttl_ms,
            ),
            (
                "max_reservation_extensions",
                b.max_reservation_extensions != after.max_reservation_extensions,
            ),
        ]);
        if !settings.is_empty() {
            emit(self, EventType::TenantSettingsChanged, settings);
        }
        let other = changed(&[
            ("name", b.name != after.name),
            ("metadata", b.metadata != after.metadata),
        ]);
        if !other.is_empty() {
            emit(self, EventType::TenantUpdated, other);
        }
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
        actor: &Actor,
        before: &Tenant,
        status: TenantStatus,
        correlation: String,
    ) -> Result<(), Rejection> {
        let mut t = before.clone();
        let closing = stamp_status(&mut t, status, self.now);
        t.updated_at_ms = self.now;
        self.put(Effect::PutTenant(t.clone()));
        self.tenant_events(actor, Some(before), &t, Some(correlation));
        if closing {
            self.close_cascade(&t.tenant_id, actor)?;
        }
        Ok(())
    }

    /// Closing a tenant is terminal (admin spec §4.2, mode A: one step): its open
    /// reservations are released (their holds return), its budgets closed and its ACTIVE
    /// API keys revoked, in the same step as the status change. Reads of the closed tenant's
    /// objects stay open to the admin key; every mutation is refused with TENANT_CLOSED.
    pub(crate) fn close_cascade(
        &mut self,
        tenant_id: &str,
        actor: &Actor,
    ) -> Result<(), Rejection> {
        let cascade = Cascade {
            tenant_id: tenant_id.to_string(),
            actor: self.event_actor(actor, false),
            correlation: self.cascade_correlation(tenant_id),
        };
        self.revoke_tenant_keys(&cascade);
        self.disable_tenant_webhooks(&cascade);
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
        let mut drained: BTreeMap<BudgetKey, i64> = BTreeMap::new();
        for id in active {
            let Some(r) = state.reservation(id) else {
                continue;
            };
            returns.take_back(self, r)?;
            for scope in r.budgeted_scopes.iter() {
                let key = BudgetKey {
                    scope: scope.clone(),
                    unit: r.unit,
                };
                *drained.entry(key).or_default() += r.estimate;
            }
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
        for b in &budgets {
            let prior = state.budget(&b.key()).map(|p| p.status.as_str());
            if let Some(released) = drained.get(&b.key()) {
                let data = serde_json::json!({
                    "ledger_id": &*b.ledger_id, "scope": &*b.scope, "unit": b.unit.as_str(),
                    "released_amount": released, "cascade_reason": "tenant_closed",
                });
                cascade.emit(
                    self,
                    EventType::ReservationReleasedViaTenantCascade,
                    Some(&b.scope),
                    data,
                );
            }
            let data = serde_json::json!({
                "ledger_id": &*b.ledger_id, "scope": &*b.scope, "unit": b.unit.as_str(),
                "prior_status": prior, "new_status": "CLOSED", "cascade_reason": "tenant_closed",
            });
            cascade.emit(
                self,
                EventType::BudgetClosedViaTenantCascade,
                Some(&b.scope),
                data,
            );
        }
        self.put_budgets(Cause::Admin(actor), budgets)
    }

    /// Revokes every ACTIVE key of the tenant (an expired one is left as it is: it is
    /// already unusable, and its record says why).
    fn revoke_tenant_keys(&mut self, cascade: &Cascade) {
        let state = self.state;
        let now = self.now;
        for key in state.api_keys.values() {
            if *key.tenant_id == *cascade.tenant_id
                && key.effective_status(now) == ApiKeyStatus::Active
            {
                self.put(Effect::PutApiKey(ApiKey {
                    status: ApiKeyStatus::Revoked,
                    revoked_at_ms: Some(now),
                    revoked_reason: Some(TENANT_CLOSED_REASON.to_string()),
                    ..key.clone()
                }));
                let data = serde_json::json!({
                    "key_id": key.key_id, "name": key.name, "prior_status": "ACTIVE",
                    "new_status": "REVOKED", "cascade_reason": "tenant_closed",
                });
                cascade.emit(self, EventType::ApiKeyRevokedViaTenantCascade, None, data);
            }
        }
    }

    /// Disables every subscription of the tenant that is not DISABLED already.
    fn disable_tenant_webhooks(&mut self, cascade: &Cascade) {
        let webhooks = &self.state.webhooks;
        let owned: Vec<_> = webhooks
            .by_owner
            .get(&cascade.tenant_id)
            .into_iter()
            .flatten()
            .filter_map(|id| webhooks.subscriptions.get(id))
            .filter(|w| w.status != WebhookStatus::Disabled)
            .cloned()
            .collect();
        for w in owned {
            let data = serde_json::json!({
                "subscription_id": w.subscription_id, "name": w.name,
                "prior_status": upper(w.status), "new_status": "DISABLED",
                "cascade_reason": "tenant_closed",
            });
            self.put(Effect::PutWebhook(std::sync::Arc::new(
                WebhookSubscription {
                    status: WebhookStatus::Disabled,
                    updated_at_ms: self.now,
                    ..(*w).clone()
                },
            )));
            cascade.emit(self, EventType::WebhookDisabledViaTenantCascade, None, data);
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

    /// Refuses `actor`'s change to a tenant's budgets, policies or webhooks: a CLOSED
    /// tenant's by anyone, a SUSPENDED tenant's by its own keys (read-only to them). The
    /// operator may still fund, update and settle a suspended tenant, as the reference
    /// allows; creating anything for it needs it ACTIVE ([`Tx::writable_tenant`]).
    pub(crate) fn writable_by(&self, actor: &Actor, tenant_id: &str) -> Result<(), Rejection> {
        match actor {
            Actor::Admin => self.open_tenant(tenant_id),
            Actor::ApiKey(_) => self.writable_tenant(tenant_id),
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

/// What a tenant's close tells the events of its cascade.
struct Cascade {
    tenant_id: String,
    actor: crate::EventActor,
    correlation: String,
}

impl Cascade {
    fn emit(
        &self,
        tx: &mut Tx<'_>,
        event_type: EventType,
        scope: Option<&str>,
        data: serde_json::Value,
    ) {
        tx.emit(NewEvent {
            event_type,
            tenant_id: self.tenant_id.clone(),
            scope: scope.map(str::to_string),
            actor: self.actor.clone(),
            source: ADMIN_SOURCE,
            data,
            correlation_id: Some(self.correlation.clone()),
        });
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
