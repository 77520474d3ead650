//! Commands: everything the state machine can be asked to do. Identifiers and time arrive
//! from outside, so applying a command is deterministic.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{
    budget::FundingOp, ExpiryPolicy, Millis, OveragePolicy, Permission, Subject, TenantStatus, Unit,
};

/// Who is calling, as presented. The ledger resolves it to a [`Principal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// The operator's admin key, already verified by the server against its configuration.
    Admin,
    /// A tenant API key, identified by the SHA-256 digest of its secret.
    ApiKey([u8; 32]),
}

/// Who the caller turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Tenant {
        tenant_id: String,
        key_id: String,
        permissions: Vec<Permission>,
    },
}

/// Fields shared by every idempotent request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// Shared with the idempotency record and, for a reserve, the reservation.
    pub key: Arc<str>,
    /// SHA-256 of the request's canonical JSON.
    pub fingerprint: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    /// The id the reservation gets if one is created.
    pub reservation_id: String,
    pub subject: Subject,
    pub action: crate::Action,
    pub unit: Unit,
    pub estimate: i64,
    pub ttl_ms: Option<i64>,
    pub grace_period_ms: i64,
    pub overage_policy: Option<OveragePolicy>,
    pub dry_run: bool,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub unit: Unit,
    pub actual: i64,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    pub reservation_id: String,
    pub extend_by_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    pub subject: Subject,
    pub unit: Unit,
    pub estimate: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventCmd {
    pub actor: Actor,
    pub idem: Idempotency,
    /// The id the event gets if it is applied.
    pub event_id: String,
    pub subject: Subject,
    pub unit: Unit,
    pub actual: i64,
    pub overage_policy: Option<OveragePolicy>,
}

/// `GET /v1/balances`: subject-level filters (lower-cased values), paginated by budget key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceQuery {
    pub actor: Actor,
    /// Validation only: must equal the caller's tenant.
    pub tenant: Option<String>,
    /// `(level, value)` pairs every returned scope must contain as a segment.
    pub filters: Vec<(&'static str, String)>,
    pub limit: usize,
    /// Exclusive lower bound: the last `(scope, unit)` of the previous page.
    pub after: Option<(String, Unit)>,
}

/// `GET /v1/reservations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub actor: Actor,
    /// With a tenant key: validation only (must be the key's tenant). With the admin key:
    /// required, and the tenant listed.
    pub tenant: Option<String>,
    /// The create idempotency key: at most one row.
    pub idempotency_key: Option<String>,
    pub status: Option<crate::ReservationStatus>,
    /// `(level, lower-cased value)` pairs the subject must match.
    pub filters: Vec<(&'static str, String)>,
    /// Inclusive bounds on `created_at_ms`, `expires_at_ms` and `finalized_at_ms`.
    pub created: (Option<Millis>, Option<Millis>),
    pub expires: (Option<Millis>, Option<Millis>),
    pub finalized: (Option<Millis>, Option<Millis>),
    pub sort_by: crate::SortBy,
    pub descending: bool,
    pub limit: usize,
    pub after: Option<crate::Position>,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    pub key_id: String,
    pub tenant_id: String,
    pub key_prefix: String,
    pub digest: [u8; 32],
    pub name: String,
    pub description: Option<String>,
    pub permissions: Option<Vec<Permission>>,
    pub scope_filter: Vec<String>,
    pub expires_at_ms: Option<Millis>,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBudget {
    pub ledger_id: String,
    /// Required with the admin key, forbidden with a tenant key (the key's tenant is used).
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: Unit,
    pub allocated: i64,
    pub overdraft_limit: i64,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub rollover_policy: Option<crate::RolloverPolicy>,
    pub period_start_ms: Option<Millis>,
    pub period_end_ms: Option<Millis>,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetListQuery {
    pub tenant_id: Option<String>,
    pub scope_prefix: Option<String>,
    pub unit: Option<Unit>,
    pub status: Option<crate::BudgetStatus>,
    pub limit: usize,
    pub after: Option<(String, Unit)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FundCmd {
    /// Required with the admin key; ignored with a tenant key.
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: Unit,
    pub operation: FundingOp,
    pub amount: i64,
    pub spent: Option<i64>,
    pub idem: Option<Idempotency>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPolicy {
    pub policy_id: String,
    /// Required with the admin key, forbidden with a tenant key.
    pub tenant_id: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub scope_pattern: String,
    pub priority: i64,
    pub caps: Option<crate::Caps>,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub reservation_ttl_override: Option<crate::TtlOverride>,
    pub rate_limits: Option<crate::RateLimits>,
    pub effective_from_ms: Option<Millis>,
    pub effective_until_ms: Option<Millis>,
}

/// Fields of a policy update; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyPatch {
    pub name: Option<String>,
    pub description: Option<String>,
    pub priority: Option<i64>,
    pub caps: Option<crate::Caps>,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub reservation_ttl_override: Option<crate::TtlOverride>,
    pub rate_limits: Option<crate::RateLimits>,
    pub effective_from_ms: Option<Millis>,
    pub effective_until_ms: Option<Millis>,
    pub status: Option<crate::PolicyStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyListQuery {
    /// Required with the admin key; ignored with a tenant key.
    pub tenant_id: Option<String>,
    pub scope_pattern: Option<String>,
    pub status: Option<crate::PolicyStatus>,
    pub limit: usize,
    /// Exclusive lower bound: the last policy id of the previous page.
    pub after: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetPatch {
    pub overdraft_limit: Option<i64>,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Resolve an actor without doing anything else (used to order 401 before 400).
    Authenticate(Actor),
    Reserve(ReserveCmd),
    Commit(CommitCmd),
    Release(ReleaseCmd),
    Extend(ExtendCmd),
    Decide(DecideCmd),
    Event(EventCmd),
    GetReservation {
        actor: Actor,
        reservation_id: String,
    },
    Balances(BalanceQuery),
    ListReservations(ListQuery),
    CreateTenant {
        actor: Actor,
        tenant: NewTenant,
    },
    GetTenant {
        actor: Actor,
        tenant_id: String,
    },
    UpdateTenant {
        actor: Actor,
        tenant_id: String,
        patch: TenantPatch,
    },
    CreateApiKey {
        actor: Actor,
        key: NewApiKey,
    },
    RevokeApiKey {
        actor: Actor,
        key_id: String,
        reason: Option<String>,
    },
    CreateBudget {
        actor: Actor,
        budget: NewBudget,
    },
    ListBudgets {
        actor: Actor,
        query: BudgetListQuery,
    },
    LookupBudget {
        actor: Actor,
        scope: String,
        unit: Unit,
    },
    FundBudget {
        actor: Actor,
        fund: FundCmd,
    },
    UpdateBudget {
        actor: Actor,
        scope: String,
        unit: Unit,
        patch: BudgetPatch,
    },
    SetBudgetFrozen {
        actor: Actor,
        scope: String,
        unit: Unit,
        frozen: bool,
    },
    CreatePolicy {
        actor: Actor,
        policy: NewPolicy,
    },
    ListPolicies {
        actor: Actor,
        query: PolicyListQuery,
    },
    UpdatePolicy {
        actor: Actor,
        policy_id: String,
        patch: PolicyPatch,
    },
    /// Background maintenance: expire reservations past their grace and evict records past
    /// their retention, at most `limit` of each.
    Maintain {
        limit: usize,
    },
}

impl Command {
    /// True for commands that never change state (the engine may skip the fsync for them).
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            Command::Authenticate(_)
                | Command::GetReservation { .. }
                | Command::Balances(_)
                | Command::ListReservations(_)
                | Command::GetTenant { .. }
                | Command::ListBudgets { .. }
                | Command::LookupBudget { .. }
                | Command::ListPolicies { .. }
        )
    }
}
