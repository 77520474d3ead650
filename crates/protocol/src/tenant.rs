//! Tenants (admin plane).

use crate::WireName;
use std::collections::BTreeMap;

use ledger::{
    Actor, ExpiryPolicy, ListTenants, SortedPage, Tenant, TenantFilter, TenantListQuery,
    TenantSort, TenantStatus,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::cursor::{NextPage, SortedRequest};
use crate::extensions::check_observe_mode;
use crate::schema::{
    ReservationExpiryPolicy, SortDirection, TenantSortBy, TenantStatus as TenantStatusSchema,
};
use crate::validate::{len_between, parse_enum, range};
use crate::{format_rfc3339, parse_wire, ApiError, ClampedLimit, Search, Validate, WirePolicy};

/// Tenant ids: `^[a-z0-9-]+$`, 3–64 characters.
pub fn check_tenant_id(field: &str, id: &str) -> Result<(), ApiError> {
    if id.len() < 3
        || id.len() > 64
        || !id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        return Err(ApiError::invalid(format!(
            "{field}: must be 3-64 characters of [a-z0-9-]"
        )));
    }
    Ok(())
}

fn check_string_map(field: &str, m: &Option<BTreeMap<String, String>>) -> Result<(), ApiError> {
    if m.as_ref().is_some_and(|m| m.len() > 32) {
        return Err(ApiError::invalid(format!("{field}: at most 32 entries")));
    }
    Ok(())
}

const EXPIRY_POLICIES: &str = "AUTO_RELEASE, MANUAL_CLEANUP, GRACE_ONLY";
const TENANT_STATUSES: &str = "ACTIVE, SUSPENDED, CLOSED";

/// `TenantCreateRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    description = "A new tenant. Creating an existing tenant with the same name returns it (200); with another name is DUPLICATE_RESOURCE."
)]
pub struct TenantCreateRequest {
    #[schema(min_length = 3, max_length = 64, pattern = "^[a-z0-9-]+$")]
    pub tenant_id: String,
    #[schema(min_length = 1, max_length = 256)]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 3, max_length = 64, pattern = "^[a-z0-9-]+$")]
    pub parent_tenant_id: Option<String>,
    /// At most 32 entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Defaults to ALLOW_IF_AVAILABLE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_commit_overage_policy: Option<WirePolicy>,
    /// Defaults to 60000.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1_000, maximum = 86_400_000)]
    pub default_reservation_ttl_ms: Option<i64>,
    /// Defaults to 3600000.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1_000, maximum = 86_400_000)]
    pub max_reservation_ttl_ms: Option<i64>,
    /// Defaults to 10.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 4_294_967_295_i64)]
    pub max_reservation_extensions: Option<i64>,
    /// Defaults to AUTO_RELEASE.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ReservationExpiryPolicy>, inline)]
    pub reservation_expiry_policy: Option<String>,
    /// v0.1.26: ENFORCE or DISABLED (the same) are accepted; OBSERVE is not supported.
    #[serde(default, skip_serializing)]
    #[schema(pattern = "^(ENFORCE|DISABLED)$")]
    pub observe_mode: Option<String>,
}

fn check_tenant_settings(
    ttl: Option<i64>,
    max_ttl: Option<i64>,
    max_ext: Option<i64>,
) -> Result<(), ApiError> {
    if let Some(v) = ttl {
        range("default_reservation_ttl_ms", v, 1_000, 86_400_000)?;
    }
    if let Some(v) = max_ttl {
        range("max_reservation_ttl_ms", v, 1_000, 86_400_000)?;
    }
    if let Some(v) = max_ext {
        range("max_reservation_extensions", v, 0, i64::from(u32::MAX))?;
    }
    Ok(())
}

impl Validate for TenantCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        check_tenant_id("tenant_id", &self.tenant_id)?;
        check_observe_mode("observe_mode", &self.observe_mode)?;
        len_between("name", &self.name, 1, 256)?;
        if let Some(p) = &self.parent_tenant_id {
            check_tenant_id("parent_tenant_id", p)?;
        }
        check_string_map("metadata", &self.metadata)?;
        check_tenant_settings(
            self.default_reservation_ttl_ms,
            self.max_reservation_ttl_ms,
            self.max_reservation_extensions,
        )?;
        if let Some(p) = &self.reservation_expiry_policy {
            parse_enum(
                "reservation_expiry_policy",
                p,
                ExpiryPolicy::from_wire_name,
                EXPIRY_POLICIES,
            )?;
        }
        Ok(())
    }
}

impl TenantCreateRequest {
    /// A request with only the required fields: the server's defaults apply to the rest.
    pub fn new(tenant_id: String, name: String) -> Self {
        TenantCreateRequest {
            tenant_id,
            name,
            parent_tenant_id: None,
            metadata: None,
            default_commit_overage_policy: None,
            default_reservation_ttl_ms: None,
            max_reservation_ttl_ms: None,
            max_reservation_extensions: None,
            reservation_expiry_policy: None,
            observe_mode: None,
        }
    }

    pub fn into_new(self) -> ledger::NewTenant {
        ledger::NewTenant {
            tenant_id: self.tenant_id,
            name: self.name,
            parent_tenant_id: self.parent_tenant_id,
            default_commit_overage_policy: self.default_commit_overage_policy.map(Into::into),
            default_reservation_ttl_ms: self.default_reservation_ttl_ms,
            max_reservation_ttl_ms: self.max_reservation_ttl_ms,
            max_reservation_extensions: self.max_reservation_extensions.map(|v| v as u32),
            reservation_expiry_policy: self
                .reservation_expiry_policy
                .as_deref()
                .and_then(ExpiryPolicy::from_wire_name),
            metadata: self.metadata.unwrap_or_default(),
        }
    }
}

/// The body of `PATCH /v1/admin/tenants/{tenant_id}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    description = "A partial update of a tenant: only the fields present change. Setting status to CLOSED is final and closes the tenant's budgets."
)]
pub struct TenantUpdateRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub name: Option<String>,
    #[schema(value_type = Option<TenantStatusSchema>, inline)]
    pub status: Option<String>,
    /// Replaces the metadata; at most 32 entries.
    pub metadata: Option<BTreeMap<String, String>>,
    pub default_commit_overage_policy: Option<WirePolicy>,
    #[schema(minimum = 1_000, maximum = 86_400_000)]
    pub default_reservation_ttl_ms: Option<i64>,
    #[schema(minimum = 1_000, maximum = 86_400_000)]
    pub max_reservation_ttl_ms: Option<i64>,
    #[schema(minimum = 0, maximum = 4_294_967_295_i64)]
    pub max_reservation_extensions: Option<i64>,
    /// v0.1.26: ENFORCE or DISABLED (the same) are accepted; OBSERVE is not supported.
    #[serde(default)]
    #[schema(pattern = "^(ENFORCE|DISABLED)$")]
    pub observe_mode: Option<String>,
}

impl Validate for TenantUpdateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        check_observe_mode("observe_mode", &self.observe_mode)?;
        if let Some(n) = &self.name {
            len_between("name", n, 1, 256)?;
        }
        if let Some(s) = &self.status {
            parse_enum("status", s, TenantStatus::from_wire_name, TENANT_STATUSES)?;
        }
        check_string_map("metadata", &self.metadata)?;
        check_tenant_settings(
            self.default_reservation_ttl_ms,
            self.max_reservation_ttl_ms,
            self.max_reservation_extensions,
        )
    }
}

impl TenantUpdateRequest {
    pub fn into_patch(self) -> ledger::TenantPatch {
        ledger::TenantPatch {
            name: self.name,
            status: self
                .status
                .as_deref()
                .and_then(TenantStatus::from_wire_name),
            metadata: self.metadata,
            default_commit_overage_policy: self.default_commit_overage_policy.map(Into::into),
            default_reservation_ttl_ms: self.default_reservation_ttl_ms,
            max_reservation_ttl_ms: self.max_reservation_ttl_ms,
            max_reservation_extensions: self.max_reservation_extensions.map(|v| v as u32),
        }
    }
}

/// `Tenant`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Tenant, description = "A tenant.")]
pub struct TenantResponse {
    pub tenant_id: String,
    pub name: String,
    #[schema(value_type = TenantStatusSchema, inline)]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_tenant_id: Option<String>,
    pub default_commit_overage_policy: WirePolicy,
    pub default_reservation_ttl_ms: i64,
    pub max_reservation_ttl_ms: i64,
    pub max_reservation_extensions: u32,
    #[schema(value_type = ReservationExpiryPolicy, inline)]
    pub reservation_expiry_policy: &'static str,
    /// Absent when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub suspended_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub closed_at: Option<String>,
}

impl From<Tenant> for TenantResponse {
    fn from(t: Tenant) -> Self {
        TenantResponse {
            tenant_id: t.tenant_id,
            name: t.name,
            status: t.status.wire_name(),
            parent_tenant_id: t.parent_tenant_id,
            default_commit_overage_policy: t.default_commit_overage_policy.into(),
            default_reservation_ttl_ms: t.default_reservation_ttl_ms,
            max_reservation_ttl_ms: t.max_reservation_ttl_ms,
            max_reservation_extensions: t.max_reservation_extensions,
            reservation_expiry_policy: t.reservation_expiry_policy.wire_name(),
            metadata: t.metadata,
            created_at: format_rfc3339(t.created_at_ms),
            updated_at: format_rfc3339(t.updated_at_ms),
            suspended_at: t.suspended_at_ms.map(format_rfc3339),
            closed_at: t.closed_at_ms.map(format_rfc3339),
        }
    }
}

/// The tenant an operation's path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    pub tenant_id: String,
}

/// The query of `GET /v1/admin/tenants`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantListParams {
    #[param(inline, value_type = Option<TenantStatusSchema>)]
    pub status: Option<String>,
    /// Only the children of this tenant.
    pub parent_tenant_id: Option<String>,
    /// Case-insensitive substring of the tenant id or name, at most 128 characters; empty
    /// means no search.
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// Defaults to created_at; ties are ordered by tenant id.
    #[param(inline, value_type = Option<TenantSortBy>)]
    pub sort_by: Option<String>,
    /// Defaults to desc.
    #[param(inline, value_type = Option<SortDirection>)]
    pub sort_dir: Option<String>,
    /// From the previous page's `next_cursor`; valid only with the same sort and filters.
    pub cursor: Option<String>,
    /// Page size, at least 1; defaults to 50, values above 100 are treated as 100.
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

impl TenantListParams {
    /// The list operation, and what its response issues the next cursor from.
    pub fn into_list(self, actor: Actor) -> Result<(ListTenants, NextPage), ApiError> {
        let status = self
            .status
            .as_deref()
            .map(|s| parse_wire::<TenantStatus>("status", s))
            .transpose()?;
        let order = SortedRequest {
            sort_by: self.sort_by.as_deref(),
            default: TenantSort::CreatedAt,
            sort_dir: self.sort_dir.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.unwrap_or_default().0,
            filters: format!("{status:?}|{:?}|{:?}", self.parent_tenant_id, self.search),
            text: |s| s == TenantSort::Name,
        }
        .parse()?;
        Ok((
            ListTenants {
                actor,
                query: TenantListQuery {
                    filter: TenantFilter {
                        status,
                        parent_tenant_id: self.parent_tenant_id,
                        search: self.search.0,
                    },
                    sort_by: order.sort_by,
                    window: order.window,
                },
            },
            NextPage(Some(order.binding)),
        ))
    }
}

/// `TenantListResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = TenantListResponse, description = "A page of tenants.")]
pub struct TenantListResponse {
    pub tenants: Vec<TenantResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl TenantListResponse {
    pub fn new(next: &NextPage, page: SortedPage<Tenant>) -> Self {
        let next_cursor = next.sorted(&page);
        TenantListResponse {
            tenants: page
                .page
                .items
                .into_iter()
                .map(TenantResponse::from)
                .collect(),
            next_cursor,
            has_more: page.page.has_more,
        }
    }
}
