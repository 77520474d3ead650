//! Tenant API keys and their permissions.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Millis;

/// The permissions of the admin spec's `Permission` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    ReservationsCreate,
    ReservationsCommit,
    ReservationsRelease,
    ReservationsExtend,
    ReservationsList,
    BalancesRead,
    BudgetsRead,
    BudgetsWrite,
    PoliciesRead,
    PoliciesWrite,
    WebhooksRead,
    WebhooksWrite,
    EventsRead,
    AdminRead,
    AdminWrite,
    AdminTenantsRead,
    AdminTenantsWrite,
    AdminBudgetsRead,
    AdminBudgetsWrite,
    AdminPoliciesRead,
    AdminPoliciesWrite,
    AdminApikeysRead,
    AdminApikeysWrite,
    AdminWebhooksRead,
    AdminWebhooksWrite,
    AdminEventsRead,
    AdminAuditRead,
    ActionQuotasRead,
}

impl Permission {
    pub const ALL: [Permission; 28] = [
        Permission::ReservationsCreate,
        Permission::ReservationsCommit,
        Permission::ReservationsRelease,
        Permission::ReservationsExtend,
        Permission::ReservationsList,
        Permission::BalancesRead,
        Permission::BudgetsRead,
        Permission::BudgetsWrite,
        Permission::PoliciesRead,
        Permission::PoliciesWrite,
        Permission::WebhooksRead,
        Permission::WebhooksWrite,
        Permission::EventsRead,
        Permission::AdminRead,
        Permission::AdminWrite,
        Permission::AdminTenantsRead,
        Permission::AdminTenantsWrite,
        Permission::AdminBudgetsRead,
        Permission::AdminBudgetsWrite,
        Permission::AdminPoliciesRead,
        Permission::AdminPoliciesWrite,
        Permission::AdminApikeysRead,
        Permission::AdminApikeysWrite,
        Permission::AdminWebhooksRead,
        Permission::AdminWebhooksWrite,
        Permission::AdminEventsRead,
        Permission::AdminAuditRead,
        Permission::ActionQuotasRead,
    ];

    /// Granted to a new key when its request names no permissions (admin spec §2.4).
    pub const DEFAULTS: [Permission; 10] = [
        Permission::ReservationsCreate,
        Permission::ReservationsCommit,
        Permission::ReservationsRelease,
        Permission::ReservationsExtend,
        Permission::ReservationsList,
        Permission::BalancesRead,
        Permission::BudgetsRead,
        Permission::BudgetsWrite,
        Permission::PoliciesRead,
        Permission::PoliciesWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::ReservationsCreate => "reservations:create",
            Permission::ReservationsCommit => "reservations:commit",
            Permission::ReservationsRelease => "reservations:release",
            Permission::ReservationsExtend => "reservations:extend",
            Permission::ReservationsList => "reservations:list",
            Permission::BalancesRead => "balances:read",
            Permission::BudgetsRead => "budgets:read",
            Permission::BudgetsWrite => "budgets:write",
            Permission::PoliciesRead => "policies:read",
            Permission::PoliciesWrite => "policies:write",
            Permission::WebhooksRead => "webhooks:read",
            Permission::WebhooksWrite => "webhooks:write",
            Permission::EventsRead => "events:read",
            Permission::AdminRead => "admin:read",
            Permission::AdminWrite => "admin:write",
            Permission::AdminTenantsRead => "admin:tenants:read",
            Permission::AdminTenantsWrite => "admin:tenants:write",
            Permission::AdminBudgetsRead => "admin:budgets:read",
            Permission::AdminBudgetsWrite => "admin:budgets:write",
            Permission::AdminPoliciesRead => "admin:policies:read",
            Permission::AdminPoliciesWrite => "admin:policies:write",
            Permission::AdminApikeysRead => "admin:apikeys:read",
            Permission::AdminApikeysWrite => "admin:apikeys:write",
            Permission::AdminWebhooksRead => "admin:webhooks:read",
            Permission::AdminWebhooksWrite => "admin:webhooks:write",
            Permission::AdminEventsRead => "admin:events:read",
            Permission::AdminAuditRead => "admin:audit:read",
            Permission::ActionQuotasRead => "action_quotas:read",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// True when a key holding `held` may do what needs `self`: an exact grant, or the
    /// admin wildcards (`admin:read` satisfies any `*:read`, `admin:write` any `*:write`).
    pub fn granted_by(self, held: &[Permission]) -> bool {
        let name = self.as_str();
        held.iter().any(|&p| {
            p == self
                || (p == Permission::AdminRead && name.ends_with(":read"))
                || (p == Permission::AdminWrite && name.ends_with(":write"))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiKeyStatus {
    Active,
    Revoked,
    Expired,
}

/// A tenant key. The secret itself is never stored: only its SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub key_id: String,
    /// Shared with every request it authenticates: the caller, the reservations and the
    /// idempotency records it creates hold this allocation, not copies.
    pub tenant_id: Arc<str>,
    pub key_prefix: String,
    pub digest: [u8; 32],
    pub name: String,
    pub description: Option<String>,
    pub permissions: Vec<Permission>,
    pub scope_filter: Vec<String>,
    pub status: ApiKeyStatus,
    pub created_at_ms: Millis,
    pub expires_at_ms: Millis,
    pub revoked_at_ms: Option<Millis>,
    pub revoked_reason: Option<String>,
    pub metadata: Option<String>,
}

impl ApiKey {
    /// The status as of `now`: an ACTIVE key past its expiry reads as EXPIRED.
    pub fn effective_status(&self, now: Millis) -> ApiKeyStatus {
        if self.status == ApiKeyStatus::Active && now >= self.expires_at_ms {
            ApiKeyStatus::Expired
        } else {
            self.status
        }
    }

    /// A copy whose `status` is [`ApiKey::effective_status`] at `now`: what reads return.
    pub fn as_of(&self, now: Millis) -> ApiKey {
        ApiKey {
            status: self.effective_status(now),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_reads_and_writes_only() {
        assert!(Permission::BudgetsWrite.granted_by(&[Permission::AdminWrite]));
        assert!(Permission::BalancesRead.granted_by(&[Permission::AdminRead]));
        assert!(!Permission::BudgetsWrite.granted_by(&[Permission::AdminRead]));
        assert!(!Permission::ReservationsCreate.granted_by(&[Permission::AdminWrite]));
        for p in Permission::ALL {
            assert_eq!(Permission::parse(p.as_str()), Some(p));
        }
    }
}
