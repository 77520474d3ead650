//! API keys (admin plane).

use std::borrow::Cow;

use ledger::{
    Actor, ApiKey, ApiKeyListQuery, ApiKeySort, ApiKeyStatus, ListApiKeys, Permission, SortedPage,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::common::{metadata_raw, metadata_text, Metadata};
use crate::cursor::{NextPage, SortedRequest};
use crate::schema::{
    ApiKeySortBy, ApiKeyStatus as KeyStatusSchema, Permission as PermissionSchema, SortDirection,
};
use crate::tenant::check_tenant_id;
use crate::validate::{len_between, max_len, timestamp};
use crate::{
    format_rfc3339, parse_rfc3339, parse_wire, ApiError, ClampedLimit, Search, Validate, Verbatim,
    WireName,
};

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
    /// Scope segments the key may reach (`workspace:eng`, or `agent:*` for a whole kind),
    /// each up to 256 characters: its budget, policy and balance operations are limited to
    /// scopes that contain one of them. Empty or absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<Vec<String>>,
    /// Defaults to 90 days from creation.
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
        check_permissions(&self.permissions)?;
        check_scope_filter(&self.scope_filter)?;
        timestamp("expires_at", &self.expires_at)?;
        Ok(())
    }
}

fn check_permissions(permissions: &Option<Vec<String>>) -> Result<(), ApiError> {
    for p in permissions.iter().flatten() {
        Permission::parse(p).ok_or_else(|| {
            ApiError::invalid(format!("permissions: Unrecognized permission: {p}"))
        })?;
    }
    Ok(())
}

/// Each entry names a scope segment a key is kept to: `level:value`, or `level:*` for any
/// value at that level. Anything else would be stored and then match no scope, leaving
/// the key able to see nothing.
fn check_scope_filter(scope_filter: &Option<Vec<String>>) -> Result<(), ApiError> {
    for f in scope_filter.iter().flatten() {
        max_len("scope_filter[]", f, 256)?;
        let valid = f.split_once(':').is_some_and(|(level, value)| {
            let level = level.to_lowercase();
            ledger::SCOPE_LEVELS.contains(&level.as_str())
                && (value == "*" || ledger::valid_scope_value(value))
        });
        if !valid {
            return Err(ApiError::invalid(format!(
                "scope_filter[]: '{f}' is not one scope segment, level:value or level:* \
                 (e.g. workspace:eng, agent:*; levels: {})",
                ledger::SCOPE_LEVELS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Permission names, as a sorted set (a validated request's names all parse).
fn permission_set(names: Vec<String>) -> Vec<Permission> {
    let mut ps: Vec<Permission> = names.iter().filter_map(|p| Permission::parse(p)).collect();
    ps.sort();
    ps.dedup();
    ps
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
            permissions: self.permissions.map(permission_set),
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
    /// `key` as the ledger returned it: its status is already as of the request's time.
    pub fn new(key: ApiKey) -> Self {
        ApiKeyResponse {
            status: key.status.wire_name(),
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
    /// Why the key is revoked (recorded as `revoked_reason`, as sent).
    #[param(value_type = Option<String>, max_length = 512)]
    pub reason: Option<Verbatim>,
}

impl RevokeParams {
    /// The reason, once checked.
    pub fn into_reason(self) -> Result<Option<String>, ApiError> {
        let reason = self.reason.map(|Verbatim(reason)| reason);
        if let Some(reason) = &reason {
            max_len("reason", reason, 512)?;
        }
        Ok(reason)
    }
}

/// `ApiKeyUpdateRequest`: the body of `PATCH /v1/admin/api-keys/{key_id}`. Only the fields
/// present change; permissions and the scope filter are replaced whole. The tenant, the
/// expiry and the status cannot change (revoke and issue a new key instead).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ApiKeyUpdateRequest, description = "A partial update of an ACTIVE API key.")]
pub struct ApiKeyUpdateRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256)]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<PermissionSchema>>)]
    pub permissions: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for ApiKeyUpdateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        if let Some(n) = &self.name {
            len_between("name", n, 1, 256)?;
        }
        if let Some(d) = &self.description {
            max_len("description", d, 1024)?;
        }
        check_permissions(&self.permissions)?;
        check_scope_filter(&self.scope_filter)
    }
}

impl ApiKeyUpdateRequest {
    pub fn into_patch(self) -> ledger::ApiKeyPatch {
        ledger::ApiKeyPatch {
            metadata: metadata_text(&self.metadata),
            name: self.name,
            description: self.description,
            permissions: self.permissions.map(permission_set),
            scope_filter: self.scope_filter,
        }
    }
}

/// The query of `GET /v1/admin/api-keys`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ApiKeyListParams {
    /// Only this tenant's keys; all tenants' when absent.
    pub tenant_id: Option<String>,
    /// As of now: an ACTIVE key past its expiry is EXPIRED.
    #[param(inline, value_type = Option<KeyStatusSchema>)]
    pub status: Option<String>,
    /// Case-insensitive substring of the key id or name, at most 128 characters; empty
    /// means no search.
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// Defaults to created_at; ties are ordered by key id.
    #[param(inline, value_type = Option<ApiKeySortBy>)]
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

impl ApiKeyListParams {
    /// The list operation, and what its response issues the next cursor from.
    pub fn into_list(self, actor: Actor) -> Result<(ListApiKeys, NextPage), ApiError> {
        let status = self
            .status
            .as_deref()
            .map(|s| parse_wire::<ApiKeyStatus>("status", s))
            .transpose()?;
        let order = SortedRequest {
            sort_by: self.sort_by.as_deref(),
            default: ApiKeySort::CreatedAt,
            sort_dir: self.sort_dir.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.unwrap_or_default().0,
            filters: format!("{:?}|{status:?}|{:?}", self.tenant_id, self.search),
            text: |s| matches!(s, ApiKeySort::Name | ApiKeySort::TenantId),
        }
        .parse()?;
        Ok((
            ListApiKeys {
                actor,
                query: ApiKeyListQuery {
                    tenant_id: self.tenant_id,
                    status,
                    search: self.search.0,
                    sort_by: order.sort_by,
                    window: order.window,
                },
            },
            NextPage(Some(order.binding)),
        ))
    }
}

/// `ApiKeyListResponse` (never a secret or its digest).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ApiKeyListResponse, description = "A page of API keys.")]
pub struct ApiKeyListResponse {
    pub keys: Vec<ApiKeyResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl ApiKeyListResponse {
    pub fn new(next: &NextPage, page: SortedPage<ApiKey>) -> Self {
        let next_cursor = next.sorted(&page);
        ApiKeyListResponse {
            keys: page
                .page
                .items
                .into_iter()
                .map(ApiKeyResponse::new)
                .collect(),
            next_cursor,
            has_more: page.page.has_more,
        }
    }
}
