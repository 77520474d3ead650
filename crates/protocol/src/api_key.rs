//! API keys (admin plane).

use crate::WireName;
use std::borrow::Cow;

use ledger::{ApiKey, Permission};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::common::{metadata_raw, metadata_text, Metadata};
use crate::schema::{ApiKeyStatus as KeyStatusSchema, Permission as PermissionSchema};
use crate::tenant::check_tenant_id;
use crate::validate::{len_between, max_len, timestamp};
use crate::{format_rfc3339, parse_rfc3339, ApiError, Validate};

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
            status: key.effective_status(now_ms).wire_name(),
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
