//! The admin plane's provisioning slice: tenants, API keys, budgets and funding.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ledger::{
    ApiKey, Budget, BudgetListQuery, BudgetStatus, ExpiryPolicy, FundResult, FundingOp,
    Idempotency, Permission, RolloverPolicy, Tenant, TenantStatus, Unit,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::common::{metadata_raw, metadata_text, Metadata};
use crate::query::PageSize;
use crate::schema::{
    ApiKeyStatus as KeyStatusSchema, BudgetStatus as BudgetStatusSchema, FundingOperation,
    Permission as PermissionSchema, ReservationExpiryPolicy, RolloverPolicy as RolloverSchema,
    SignedAmount, TenantStatus as TenantStatusSchema,
};
use crate::validate::{idempotency_key, len_between, max_len, range};
use crate::{
    decode_budget_cursor, fingerprint, format_rfc3339, parse_rfc3339, Amount, ApiError, ErrorCode,
    Validate, WirePolicy, WireUnit,
};

fn parse_enum<T>(
    field: &str,
    value: &str,
    parse: impl Fn(&str) -> Option<T>,
    allowed: &str,
) -> Result<T, ApiError> {
    parse(value).ok_or_else(|| {
        ApiError::invalid(format!(
            "{field}: unknown value '{value}' (expected one of {allowed})"
        ))
    })
}

fn timestamp(field: &str, value: &Option<String>) -> Result<Option<i64>, ApiError> {
    value
        .as_deref()
        .map(|v| {
            parse_rfc3339(v)
                .ok_or_else(|| ApiError::invalid(format!("{field}: not an RFC 3339 date-time")))
        })
        .transpose()
}

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
                ExpiryPolicy::parse,
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
                .and_then(ExpiryPolicy::parse),
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
}

impl Validate for TenantUpdateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        if let Some(n) = &self.name {
            len_between("name", n, 1, 256)?;
        }
        if let Some(s) = &self.status {
            parse_enum("status", s, TenantStatus::parse, TENANT_STATUSES)?;
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
            status: self.status.as_deref().and_then(TenantStatus::parse),
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
            status: t.status.as_str(),
            parent_tenant_id: t.parent_tenant_id,
            default_commit_overage_policy: t.default_commit_overage_policy.into(),
            default_reservation_ttl_ms: t.default_reservation_ttl_ms,
            max_reservation_ttl_ms: t.max_reservation_ttl_ms,
            max_reservation_extensions: t.max_reservation_extensions,
            reservation_expiry_policy: t.reservation_expiry_policy.as_str(),
            metadata: t.metadata,
            created_at: format_rfc3339(t.created_at_ms),
            updated_at: format_rfc3339(t.updated_at_ms),
            suspended_at: t.suspended_at_ms.map(format_rfc3339),
            closed_at: t.closed_at_ms.map(format_rfc3339),
        }
    }
}

/// `ApiKeyCreateRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A new API key for an ACTIVE tenant.")]
pub struct ApiKeyCreateRequest {
    #[schema(min_length = 3, max_length = 64, pattern = "^[a-z0-9-]+$")]
    pub tenant_id: String,
    #[schema(min_length = 1, max_length = 256)]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub description: Option<String>,
    /// Defaults to the reservations:*, balances:read, budgets:* and policies:* permissions.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<PermissionSchema>>)]
    pub permissions: Option<Vec<String>>,
    /// Scope prefixes (each up to 256 characters), recorded and reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<Vec<String>>,
    /// Defaults to one year from creation.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for ApiKeyCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        check_tenant_id("tenant_id", &self.tenant_id)?;
        len_between("name", &self.name, 1, 256)?;
        if let Some(d) = &self.description {
            max_len("description", d, 1024)?;
        }
        for p in self.permissions.iter().flatten() {
            Permission::parse(p).ok_or_else(|| {
                ApiError::invalid(format!("permissions: Unrecognized permission: {p}"))
            })?;
        }
        for f in self.scope_filter.iter().flatten() {
            max_len("scope_filter[]", f, 256)?;
        }
        timestamp("expires_at", &self.expires_at)?;
        Ok(())
    }
}

impl ApiKeyCreateRequest {
    /// A request with only the required fields: the server's defaults apply to the rest.
    pub fn new(tenant_id: String, name: String) -> Self {
        ApiKeyCreateRequest {
            tenant_id,
            name,
            description: None,
            permissions: None,
            scope_filter: None,
            expires_at: None,
            metadata: None,
        }
    }

    /// `secret` is the new key's plaintext; only its digest is kept.
    pub fn into_new(self, key_id: String, secret: &str, digest: [u8; 32]) -> ledger::NewApiKey {
        ledger::NewApiKey {
            key_id,
            key_prefix: secret.chars().take(14).collect(),
            digest,
            expires_at_ms: self.expires_at.as_deref().and_then(parse_rfc3339),
            tenant_id: self.tenant_id,
            name: self.name,
            description: self.description,
            permissions: self.permissions.map(|ps| {
                let mut ps: Vec<Permission> =
                    ps.iter().filter_map(|p| Permission::parse(p)).collect();
                ps.sort();
                ps.dedup();
                ps
            }),
            scope_filter: self.scope_filter.unwrap_or_default(),
            metadata: metadata_text(&self.metadata),
        }
    }
}

/// Permission names as the response type holds them (borrowed from the domain enum either way).
fn permission_names<T: From<&'static str>>(ps: &[Permission]) -> Vec<T> {
    ps.iter().map(|p| p.as_str().into()).collect()
}

/// `ApiKeyCreateResponse`: the only time the secret is shown. Clients read it too, so its
/// enum strings are `Cow`: borrowed when the server renders it, owned when a client parses it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(description = "A new API key: the only time its secret is shown.")]
pub struct ApiKeyCreateResponse {
    pub key_id: String,
    pub key_secret: String,
    pub key_prefix: String,
    pub tenant_id: String,
    #[schema(value_type = Vec<PermissionSchema>)]
    pub permissions: Vec<Cow<'static, str>>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub expires_at: String,
}

impl ApiKeyCreateResponse {
    pub fn new(key: ApiKey, secret: String) -> Self {
        ApiKeyCreateResponse {
            permissions: permission_names(&key.permissions),
            key_id: key.key_id,
            key_secret: secret,
            key_prefix: key.key_prefix,
            tenant_id: key.tenant_id.to_string(),
            created_at: format_rfc3339(key.created_at_ms),
            expires_at: format_rfc3339(key.expires_at_ms),
        }
    }
}

/// `ApiKey` (never the secret or its digest).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ApiKey, description = "An API key (never its secret).")]
pub struct ApiKeyResponse {
    pub key_id: String,
    pub tenant_id: String,
    pub key_prefix: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[schema(value_type = Vec<PermissionSchema>)]
    pub permissions: Vec<&'static str>,
    /// Absent when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scope_filter: Vec<String>,
    #[schema(value_type = KeyStatusSchema, inline)]
    pub status: &'static str,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub revoked_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Box<RawValue>>,
}

impl ApiKeyResponse {
    pub fn new(key: ApiKey, now_ms: i64) -> Self {
        ApiKeyResponse {
            status: key.effective_status(now_ms).as_str(),
            permissions: permission_names(&key.permissions),
            metadata: metadata_raw(key.metadata.as_deref()),
            key_id: key.key_id,
            tenant_id: key.tenant_id.to_string(),
            key_prefix: key.key_prefix,
            name: key.name,
            description: key.description,
            scope_filter: key.scope_filter,
            created_at: format_rfc3339(key.created_at_ms),
            expires_at: format_rfc3339(key.expires_at_ms),
            revoked_at: key.revoked_at_ms.map(format_rfc3339),
            revoked_reason: key.revoked_reason,
        }
    }
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
                RolloverPolicy::parse,
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
                .and_then(RolloverPolicy::parse),
            period_start_ms: self.period_start.as_deref().and_then(parse_rfc3339),
            period_end_ms: self.period_end.as_deref().and_then(parse_rfc3339),
            metadata: metadata_text(&self.metadata),
        }
    }
}

/// The body of `PATCH /v1/admin/budgets`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A partial update of a budget: only the fields present change.")]
pub struct BudgetUpdateRequest {
    /// In the budget's unit.
    pub overdraft_limit: Option<Amount>,
    pub commit_overage_policy: Option<WirePolicy>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for BudgetUpdateRequest {
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
            commit_overage_policy: self.commit_overage_policy.map(Into::into),
            metadata: metadata_text(&self.metadata),
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
        let op = parse_enum("operation", &self.operation, FundingOp::parse, FUNDING_OPS)?;
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
        let idem = self.idempotency_key.as_ref().map(|key| Idempotency {
            key: key.as_str().into(),
            fingerprint: fingerprint(&(&scope, unit.as_str(), &self)),
        });
        Ok(ledger::Funding {
            tenant_id,
            operation: FundingOp::parse(&self.operation)
                .ok_or_else(|| ApiError::invalid("operation: unknown value"))?,
            amount: self.amount.amount,
            spent: self.spent.map(|s| s.amount),
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
            operation: r.operation.as_str(),
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
            rollover_policy: b.rollover_policy.as_str().into(),
            period_start: b.period_start_ms.map(format_rfc3339),
            period_end: b.period_end_ms.map(format_rfc3339),
            created_at: format_rfc3339(b.created_at_ms),
            updated_at: format_rfc3339(b.updated_at_ms),
        }
    }
}

/// `BudgetListResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A page of budgets, in (scope, unit) order.")]
pub struct BudgetListResponse {
    pub ledgers: Vec<BudgetLedger>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// The tenant an operation's path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    pub tenant_id: String,
}

/// The API key an operation's path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    pub key_id: String,
}

/// The query of `DELETE /v1/admin/api-keys/{key_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RevokeParams {
    /// Why the key is revoked (recorded as `revoked_reason`).
    #[param(max_length = 512)]
    pub reason: Option<String>,
}

impl RevokeParams {
    /// The reason, once checked.
    pub fn into_reason(self) -> Result<Option<String>, ApiError> {
        if let Some(reason) = &self.reason {
            max_len("reason", reason, 512)?;
        }
        Ok(self.reason)
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
    /// From the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1–200; defaults to 50.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    pub limit: Option<PageSize>,
}

impl BudgetListParams {
    pub fn into_query(self) -> Result<BudgetListQuery, ApiError> {
        let status = match self.status.as_deref() {
            None => None,
            Some("ACTIVE") => Some(BudgetStatus::Active),
            Some("FROZEN") => Some(BudgetStatus::Frozen),
            Some("CLOSED") => Some(BudgetStatus::Closed),
            Some(_) => {
                return Err(ApiError::invalid(
                    "status: must be ACTIVE, FROZEN or CLOSED",
                ))
            }
        };
        Ok(BudgetListQuery {
            tenant_id: self.tenant_id,
            scope_prefix: self.scope_prefix,
            unit: self.unit.map(Unit::from),
            status,
            limit: self.limit.unwrap_or_default().0,
            after: self
                .cursor
                .as_deref()
                .map(decode_budget_cursor)
                .transpose()?,
        })
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
