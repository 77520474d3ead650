//! Credentials (`/v1/auth`): what a key may do, and whether a secret is a usable key.

use ledger::{ApiKey, InvalidKey, KeyValidation, Permission, Principal};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::schema::Permission as PermissionSchema;
use crate::validate::len_between;
use crate::{format_rfc3339, ApiError, Validate};

/// `AuthIntrospectResponse`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(
    as = AuthIntrospectResponse,
    description = "The authenticated credential's permissions and the capabilities a dashboard gates its pages and actions on."
)]
pub struct IntrospectResponse {
    /// Always true: an unauthenticated request is answered 401.
    pub authenticated: bool,
    /// `admin` for the admin key, `tenant` for a tenant key.
    #[schema(value_type = String, pattern = "^(admin|tenant)$")]
    pub auth_type: String,
    /// `["*"]` for the admin key; a tenant key's permissions.
    pub permissions: Vec<String>,
    pub capabilities: Capabilities,
    /// A tenant key's tenant; absent for the admin key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// A tenant key's scope filter, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<Vec<String>>,
}

/// The capability map (admin spec, `AuthIntrospectResponse.capabilities`). Every flag is
/// always present: the admin key has them all; a tenant key's follow from its permissions by
/// the spec's normative table, and never include the operator-only ones (tenants, API keys,
/// audit, overview).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Capabilities {
    pub view_overview: bool,
    pub view_budgets: bool,
    pub view_events: bool,
    pub view_webhooks: bool,
    pub view_audit: bool,
    pub view_tenants: bool,
    pub view_api_keys: bool,
    pub view_policies: bool,
    pub view_reservations: bool,
    pub manage_budgets: bool,
    pub manage_policies: bool,
    pub manage_webhooks: bool,
    pub manage_tenants: bool,
    pub manage_api_keys: bool,
    pub manage_reservations: bool,
}

impl Capabilities {
    const ADMIN: Capabilities = Capabilities {
        view_overview: true,
        view_budgets: true,
        view_events: true,
        view_webhooks: true,
        view_audit: true,
        view_tenants: true,
        view_api_keys: true,
        view_policies: true,
        view_reservations: true,
        manage_budgets: true,
        manage_policies: true,
        manage_webhooks: true,
        manage_tenants: true,
        manage_api_keys: true,
        manage_reservations: true,
    };

    /// A tenant key's capabilities: each flag is true iff the key holds any of the listed
    /// permissions (the spec's table, exactly: a flag's list is not the wildcard rule of
    /// endpoint checks, e.g. `admin:write` does not give `view_budgets`).
    fn of_tenant(held: &[Permission]) -> Self {
        use Permission::*;
        let any = |ps: &[Permission]| ps.iter().any(|p| held.contains(p));
        let settle = [
            ReservationsCreate,
            ReservationsCommit,
            ReservationsRelease,
            ReservationsExtend,
        ];
        Capabilities {
            view_overview: false,
            view_audit: false,
            view_tenants: false,
            view_api_keys: false,
            manage_tenants: false,
            manage_api_keys: false,
            view_budgets: any(&[BudgetsRead, AdminRead, AdminBudgetsRead]),
            view_policies: any(&[PoliciesRead, AdminRead, AdminPoliciesRead]),
            view_webhooks: any(&[WebhooksRead, AdminRead, AdminWebhooksRead]),
            view_events: any(&[EventsRead, AdminRead, AdminEventsRead]),
            view_reservations: any(&[ReservationsList, AdminRead]) || any(&settle),
            manage_budgets: any(&[BudgetsWrite, AdminWrite, AdminBudgetsWrite]),
            manage_policies: any(&[PoliciesWrite, AdminWrite, AdminPoliciesWrite]),
            manage_webhooks: any(&[WebhooksWrite, AdminWrite, AdminWebhooksWrite]),
            manage_reservations: any(&[AdminWrite]) || any(&settle),
        }
    }
}

impl From<Principal> for IntrospectResponse {
    fn from(principal: Principal) -> Self {
        match principal {
            Principal::Admin => IntrospectResponse {
                authenticated: true,
                auth_type: "admin".into(),
                permissions: vec!["*".into()],
                capabilities: Capabilities::ADMIN,
                tenant_id: None,
                scope_filter: None,
            },
            Principal::Tenant {
                tenant_id,
                permissions,
                scope_filter,
                ..
            } => IntrospectResponse {
                authenticated: true,
                auth_type: "tenant".into(),
                capabilities: Capabilities::of_tenant(&permissions),
                permissions: permissions.iter().map(|p| p.as_str().into()).collect(),
                tenant_id: Some(tenant_id),
                scope_filter: (!scope_filter.is_empty()).then_some(scope_filter),
            },
        }
    }
}

/// `ApiKeyValidationRequest`: the body of `POST /v1/auth/validate`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ApiKeyValidationRequest, description = "A key secret to validate.")]
pub struct ValidateRequest {
    /// The whole key, as a client presents it in `X-Cycles-API-Key`.
    #[schema(min_length = 1, max_length = 512)]
    pub key_secret: String,
}

impl Validate for ValidateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        len_between("key_secret", &self.key_secret, 1, 512)
    }
}

/// `ApiKeyValidationResponse`: always 200 for a well-formed request; `valid` says whether
/// the key authenticates now, `reason` why not.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = ApiKeyValidationResponse, description = "Whether a key secret authenticates, and as whom.")]
pub struct ValidationResponse {
    pub valid: bool,
    /// The key's tenant; empty when the secret names no key.
    pub tenant_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<PermissionSchema>>)]
    pub permissions: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// Set when not valid: KEY_NOT_FOUND, KEY_REVOKED, KEY_EXPIRED, TENANT_NOT_FOUND,
    /// TENANT_SUSPENDED or TENANT_CLOSED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn reason_name(reason: InvalidKey) -> &'static str {
    match reason {
        InvalidKey::NotFound => "KEY_NOT_FOUND",
        InvalidKey::Revoked => "KEY_REVOKED",
        InvalidKey::Expired => "KEY_EXPIRED",
        InvalidKey::TenantNotFound => "TENANT_NOT_FOUND",
        InvalidKey::TenantSuspended => "TENANT_SUSPENDED",
        InvalidKey::TenantClosed => "TENANT_CLOSED",
    }
}

impl ValidationResponse {
    fn of_key(valid: bool, key: ApiKey) -> Self {
        ValidationResponse {
            valid,
            tenant_id: key.tenant_id.to_string(),
            key_id: Some(key.key_id),
            permissions: Some(key.permissions.iter().map(|p| p.as_str().into()).collect()),
            scope_filter: Some(key.scope_filter),
            expires_at: Some(format_rfc3339(key.expires_at_ms)),
            reason: None,
        }
    }
}

impl From<KeyValidation> for ValidationResponse {
    fn from(v: KeyValidation) -> Self {
        match v {
            KeyValidation::Valid(key) => ValidationResponse::of_key(true, key),
            KeyValidation::Invalid { key, reason } => {
                let mut response = match key {
                    Some(key) => ValidationResponse::of_key(false, key),
                    None => ValidationResponse {
                        valid: false,
                        tenant_id: String::new(),
                        key_id: None,
                        permissions: None,
                        scope_filter: None,
                        expires_at: None,
                        reason: None,
                    },
                };
                response.reason = Some(reason_name(reason).into());
                response
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's normative derivation, row by row, including what the endpoint wildcards
    /// would give but the table does not.
    #[test]
    fn tenant_capabilities_follow_the_table() {
        let none = Capabilities::of_tenant(&[]);
        assert_eq!(
            none,
            Capabilities {
                view_overview: false,
                view_budgets: false,
                view_events: false,
                view_webhooks: false,
                view_audit: false,
                view_tenants: false,
                view_api_keys: false,
                view_policies: false,
                view_reservations: false,
                manage_budgets: false,
                manage_policies: false,
                manage_webhooks: false,
                manage_tenants: false,
                manage_api_keys: false,
                manage_reservations: false,
            }
        );
        let admin_read = Capabilities::of_tenant(&[Permission::AdminRead]);
        assert!(admin_read.view_budgets && admin_read.view_events && admin_read.view_reservations);
        assert!(!admin_read.manage_budgets && !admin_read.view_tenants && !admin_read.view_audit);
        let admin_write = Capabilities::of_tenant(&[Permission::AdminWrite]);
        assert!(admin_write.manage_budgets && admin_write.manage_reservations);
        assert!(!admin_write.view_budgets && !admin_write.manage_tenants);
        let commit = Capabilities::of_tenant(&[Permission::ReservationsCommit]);
        assert!(commit.view_reservations && commit.manage_reservations && !commit.view_budgets);
        let list = Capabilities::of_tenant(&[Permission::ReservationsList]);
        assert!(list.view_reservations && !list.manage_reservations);
        let granular = Capabilities::of_tenant(&[
            Permission::AdminTenantsWrite,
            Permission::AdminApikeysWrite,
            Permission::AdminAuditRead,
            Permission::AdminWebhooksRead,
        ]);
        assert!(granular.view_webhooks);
        assert!(!granular.manage_tenants && !granular.manage_api_keys && !granular.view_audit);
    }
}
