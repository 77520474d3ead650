//! Policies (admin plane) and the `Caps` they supply to runtime decisions.

use crate::extensions::check_unenforced_lists;
use crate::WireName;
use ledger::{PolicyListQuery, PolicyStatus, RateLimits, TtlOverride};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::query::PageSize;
use crate::schema::PolicyStatus as PolicyStatusSchema;
use crate::tenant::check_tenant_id;
use crate::validate::{len_between, max_len, non_negative, nullable, range};
use crate::{format_rfc3339, parse_rfc3339, ApiError, Validate, WirePolicy};

/// `Caps`: soft-landing constraints, present iff the decision is `ALLOW_WITH_CAPS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps_remaining: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_allowlist: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_denylist: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<i64>,
}

impl Caps {
    fn check(&self) -> Result<(), ApiError> {
        for (name, v) in [
            ("caps.max_tokens", self.max_tokens),
            ("caps.max_steps_remaining", self.max_steps_remaining),
            ("caps.cooldown_ms", self.cooldown_ms),
        ] {
            if let Some(v) = v {
                non_negative(name, v)?;
            }
        }
        for (name, list) in [
            ("caps.tool_allowlist[]", &self.tool_allowlist),
            ("caps.tool_denylist[]", &self.tool_denylist),
        ] {
            for item in list.iter().flatten() {
                max_len(name, item, 256)?;
            }
        }
        Ok(())
    }
}

impl From<Caps> for ledger::Caps {
    fn from(c: Caps) -> Self {
        ledger::Caps {
            max_tokens: c.max_tokens,
            max_steps_remaining: c.max_steps_remaining,
            tool_allowlist: c.tool_allowlist,
            tool_denylist: c.tool_denylist,
            cooldown_ms: c.cooldown_ms,
        }
    }
}

impl From<ledger::Caps> for Caps {
    fn from(c: ledger::Caps) -> Self {
        Caps {
            max_tokens: c.max_tokens,
            max_steps_remaining: c.max_steps_remaining,
            tool_allowlist: c.tool_allowlist,
            tool_denylist: c.tool_denylist,
            cooldown_ms: c.cooldown_ms,
        }
    }
}

/// `ReservationTtlOverride`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationTtlOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_extensions: Option<i64>,
}

impl ReservationTtlOverride {
    fn check(&self) -> Result<(), ApiError> {
        if let Some(v) = self.default_ttl_ms {
            range(
                "reservation_ttl_override.default_ttl_ms",
                v,
                1_000,
                86_400_000,
            )?;
        }
        if let Some(v) = self.max_ttl_ms {
            range("reservation_ttl_override.max_ttl_ms", v, 1_000, 86_400_000)?;
        }
        if let Some(v) = self.max_extensions {
            range(
                "reservation_ttl_override.max_extensions",
                v,
                0,
                i64::from(u32::MAX),
            )?;
        }
        Ok(())
    }

    fn domain(self) -> TtlOverride {
        TtlOverride {
            default_ttl_ms: self.default_ttl_ms,
            max_ttl_ms: self.max_ttl_ms,
            max_extensions: self.max_extensions.map(|v| v as u32),
        }
    }
}

/// `RateLimits`: counted per clock minute for the scopes the policy matches; a reserve or
/// commit over them is refused 429 with `Retry-After`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RateLimits)]
pub struct PolicyRateLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reservations_per_minute: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_commits_per_minute: Option<i64>,
}

impl PolicyRateLimits {
    fn check(&self) -> Result<(), ApiError> {
        for (name, v) in [
            (
                "rate_limits.max_reservations_per_minute",
                self.max_reservations_per_minute,
            ),
            (
                "rate_limits.max_commits_per_minute",
                self.max_commits_per_minute,
            ),
        ] {
            if let Some(v) = v {
                range(name, v, 1, i64::MAX)?;
            }
        }
        Ok(())
    }

    fn domain(self) -> RateLimits {
        RateLimits {
            max_reservations_per_minute: self.max_reservations_per_minute,
            max_commits_per_minute: self.max_commits_per_minute,
        }
    }
}

/// The fields a policy create and update share.
fn check_common(
    caps: &Option<Caps>,
    ttl: &Option<ReservationTtlOverride>,
    limits: &Option<PolicyRateLimits>,
    from: &Option<String>,
    until: &Option<String>,
    priority: Option<i64>,
) -> Result<(), ApiError> {
    if let Some(c) = caps {
        c.check()?;
    }
    if let Some(t) = ttl {
        t.check()?;
    }
    if let Some(l) = limits {
        l.check()?;
    }
    if let Some(p) = priority {
        non_negative("priority", p)?;
    }
    let from = time_field("effective_from", from)?;
    let until = time_field("effective_until", until)?;
    if let (Some(f), Some(u)) = (from, until) {
        if f >= u {
            return Err(ApiError::invalid(
                "effective_from must be before effective_until",
            ));
        }
    }
    Ok(())
}

fn time_field(field: &str, v: &Option<String>) -> Result<Option<i64>, ApiError> {
    v.as_deref()
        .map(|s| {
            parse_rfc3339(s)
                .ok_or_else(|| ApiError::invalid(format!("{field}: not an RFC 3339 date-time")))
        })
        .transpose()
}

/// `PolicyCreateRequest`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyCreateRequest {
    pub tenant_id: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub scope_pattern: String,
    pub priority: Option<i64>,
    pub caps: Option<Caps>,
    pub commit_overage_policy: Option<WirePolicy>,
    pub reservation_ttl_override: Option<ReservationTtlOverride>,
    pub rate_limits: Option<PolicyRateLimits>,
    pub effective_from: Option<String>,
    pub effective_until: Option<String>,
    /// v0.1.26 action quotas: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>, max_items = 0)]
    pub action_quotas: Option<Vec<serde_json::Value>>,
    /// v0.1.26 risk-class quotas: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>, max_items = 0)]
    pub risk_class_quotas: Option<Vec<serde_json::Value>>,
    /// v0.1.26 action-kind allowlist: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>, max_items = 0)]
    pub allowed_action_kinds: Option<Vec<serde_json::Value>>,
    /// v0.1.26 action-kind denylist: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>, max_items = 0)]
    pub denied_action_kinds: Option<Vec<serde_json::Value>>,
}

impl Validate for PolicyCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        check_unenforced_lists([
            ("action_quotas", &self.action_quotas),
            ("risk_class_quotas", &self.risk_class_quotas),
            ("allowed_action_kinds", &self.allowed_action_kinds),
            ("denied_action_kinds", &self.denied_action_kinds),
        ])?;
        if let Some(t) = &self.tenant_id {
            check_tenant_id("tenant_id", t)?;
        }
        len_between("name", &self.name, 1, 256)?;
        if let Some(d) = &self.description {
            max_len("description", d, 1024)?;
        }
        len_between("scope_pattern", &self.scope_pattern, 1, 1024)?;
        check_common(
            &self.caps,
            &self.reservation_ttl_override,
            &self.rate_limits,
            &self.effective_from,
            &self.effective_until,
            self.priority,
        )
    }
}

impl PolicyCreateRequest {
    pub fn into_new(self, policy_id: String) -> ledger::NewPolicy {
        ledger::NewPolicy {
            policy_id,
            tenant_id: self.tenant_id,
            name: self.name,
            description: self.description,
            scope_pattern: self.scope_pattern,
            priority: self.priority.unwrap_or(0),
            caps: self.caps.map(Into::into),
            commit_overage_policy: self.commit_overage_policy.map(Into::into),
            reservation_ttl_override: self
                .reservation_ttl_override
                .map(ReservationTtlOverride::domain),
            rate_limits: self.rate_limits.map(PolicyRateLimits::domain),
            effective_from_ms: self.effective_from.as_deref().and_then(parse_rfc3339),
            effective_until_ms: self.effective_until.as_deref().and_then(parse_rfc3339),
        }
    }
}

/// The body of `PATCH /v1/admin/policies/{policy_id}`. The optional settings may be `null`,
/// which removes them: the policy then no longer caps, overrides or bounds what it did.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdateRequest {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub description: Option<Option<String>>,
    pub priority: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Caps>, nullable)]
    pub caps: Option<Option<Caps>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<WirePolicy>, nullable)]
    pub commit_overage_policy: Option<Option<WirePolicy>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<ReservationTtlOverride>, nullable)]
    pub reservation_ttl_override: Option<Option<ReservationTtlOverride>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<PolicyRateLimits>, nullable)]
    pub rate_limits: Option<Option<PolicyRateLimits>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub effective_from: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub effective_until: Option<Option<String>>,
    #[schema(value_type = Option<crate::schema::PolicyStatus>, inline)]
    pub status: Option<String>,
    /// v0.1.26 action quotas: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>, max_items = 0)]
    pub action_quotas: Option<Vec<serde_json::Value>>,
    /// v0.1.26 risk-class quotas: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>, max_items = 0)]
    pub risk_class_quotas: Option<Vec<serde_json::Value>>,
    /// v0.1.26 action-kind allowlist: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>, max_items = 0)]
    pub allowed_action_kinds: Option<Vec<serde_json::Value>>,
    /// v0.1.26 action-kind denylist: only an empty list is accepted (not supported).
    #[serde(default)]
    #[schema(value_type = Option<Vec<String>>, max_items = 0)]
    pub denied_action_kinds: Option<Vec<serde_json::Value>>,
}

impl Validate for PolicyUpdateRequest {
    const CLEARABLE: &'static [&'static str] = &[
        "description",
        "caps",
        "commit_overage_policy",
        "reservation_ttl_override",
        "rate_limits",
        "effective_from",
        "effective_until",
    ];

    fn validate(&self) -> Result<(), ApiError> {
        check_unenforced_lists([
            ("action_quotas", &self.action_quotas),
            ("risk_class_quotas", &self.risk_class_quotas),
            ("allowed_action_kinds", &self.allowed_action_kinds),
            ("denied_action_kinds", &self.denied_action_kinds),
        ])?;
        if let Some(n) = &self.name {
            len_between("name", n, 1, 256)?;
        }
        if let Some(Some(d)) = &self.description {
            max_len("description", d, 1024)?;
        }
        if let Some(s) = &self.status {
            PolicyStatus::from_wire_name(s)
                .ok_or_else(|| ApiError::invalid("status: must be ACTIVE or DISABLED"))?;
        }
        check_common(
            &self.caps.clone().flatten(),
            &self.reservation_ttl_override.flatten(),
            &self.rate_limits.flatten(),
            &self.effective_from.clone().flatten(),
            &self.effective_until.clone().flatten(),
            self.priority,
        )
    }
}

impl PolicyUpdateRequest {
    pub fn into_patch(self) -> ledger::PolicyPatch {
        let time = |t: Option<Option<String>>| t.map(|t| t.as_deref().and_then(parse_rfc3339));
        ledger::PolicyPatch {
            name: self.name,
            description: self.description,
            priority: self.priority,
            caps: self.caps.map(|c| c.map(Into::into)),
            commit_overage_policy: self.commit_overage_policy.map(|p| p.map(Into::into)),
            reservation_ttl_override: self
                .reservation_ttl_override
                .map(|t| t.map(ReservationTtlOverride::domain)),
            rate_limits: self.rate_limits.map(|l| l.map(PolicyRateLimits::domain)),
            effective_from_ms: time(self.effective_from),
            effective_until_ms: time(self.effective_until),
            status: self
                .status
                .as_deref()
                .and_then(PolicyStatus::from_wire_name),
        }
    }
}

/// `Policy`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Policy)]
pub struct PolicyResponse {
    pub policy_id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub scope_pattern: String,
    pub priority: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<Caps>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_overage_policy: Option<WirePolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_ttl_override: Option<ReservationTtlOverride>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<PolicyRateLimits>,
    #[schema(value_type = crate::schema::PolicyStatus, inline)]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub effective_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub effective_until: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<ledger::Policy> for PolicyResponse {
    fn from(p: ledger::Policy) -> Self {
        PolicyResponse {
            policy_id: p.policy_id,
            name: p.name,
            description: p.description,
            scope_pattern: p.scope_pattern,
            priority: p.priority,
            caps: p.caps.map(Into::into),
            commit_overage_policy: p.commit_overage_policy.map(Into::into),
            reservation_ttl_override: p.reservation_ttl_override.map(|t| ReservationTtlOverride {
                default_ttl_ms: t.default_ttl_ms,
                max_ttl_ms: t.max_ttl_ms,
                max_extensions: t.max_extensions.map(i64::from),
            }),
            rate_limits: p.rate_limits.map(|r| PolicyRateLimits {
                max_reservations_per_minute: r.max_reservations_per_minute,
                max_commits_per_minute: r.max_commits_per_minute,
            }),
            status: p.status.wire_name(),
            effective_from: p.effective_from_ms.map(format_rfc3339),
            effective_until: p.effective_until_ms.map(format_rfc3339),
            created_at: format_rfc3339(p.created_at_ms),
            updated_at: format_rfc3339(p.updated_at_ms),
        }
    }
}

/// `PolicyListResponse`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyListResponse {
    pub policies: Vec<PolicyResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// The policy an operation's path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PolicyPath {
    pub policy_id: String,
}

/// The query of `GET /v1/admin/policies`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PolicyListParams {
    /// Required with the admin key; a tenant key always sees its own tenant's policies.
    pub tenant_id: Option<String>,
    /// Only policies with exactly this scope pattern.
    pub scope_pattern: Option<String>,
    #[param(inline, value_type = Option<PolicyStatusSchema>)]
    pub status: Option<String>,
    /// From the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1–200; defaults to 50.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    pub limit: Option<PageSize>,
}

impl PolicyListParams {
    pub fn into_query(self) -> Result<PolicyListQuery, ApiError> {
        let status = self
            .status
            .as_deref()
            .map(|s| {
                PolicyStatus::from_wire_name(s)
                    .ok_or_else(|| ApiError::invalid("status: must be ACTIVE or DISABLED"))
            })
            .transpose()?;
        Ok(PolicyListQuery {
            tenant_id: self.tenant_id,
            scope_pattern: self.scope_pattern,
            status,
            limit: self.limit.unwrap_or_default().0,
            after: self.cursor,
        })
    }
}
