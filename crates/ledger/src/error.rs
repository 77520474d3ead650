//! Why a command was refused. Each variant maps to exactly one protocol error code.

use crate::{Permission, Unit};

/// A refusal. Commands that are refused change nothing, except where noted on
/// the variant (a lazily detected expiry is recorded even though the caller gets 410).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("API key lacks required permission: {}", .0.as_str())]
    InsufficientPermissions(Permission),
    #[error("{0}")]
    NotFound(String),
    #[error("Tenant not found: {0}")]
    TenantNotFound(String),
    #[error("Budget not found: {0}")]
    BudgetNotFound(String),
    #[error("Webhook subscription not found: {0}")]
    WebhookNotFound(String),
    #[error("{0}")]
    DuplicateResource(String),
    #[error("{message}")]
    BudgetExceeded { message: String },
    #[error("Budget is frozen at scope {scope}")]
    BudgetFrozen { scope: String },
    #[error("Budget is closed at scope {scope}")]
    BudgetClosed { scope: String },
    #[error("{message}")]
    OverdraftLimitExceeded { message: String },
    #[error("Outstanding debt at scope {scope} blocks new reservations")]
    DebtOutstanding { scope: String },
    /// A wrong unit. `scope` and `expected` are set when a budget exists in another unit.
    #[error("{message}")]
    UnitMismatch {
        message: String,
        scope: Option<String>,
        requested: Unit,
        expected: Vec<Unit>,
    },
    #[error("Reservation expired: {0}")]
    ReservationExpired(String),
    #[error("Reservation already finalized: {id} is {status}")]
    ReservationFinalized { id: String, status: &'static str },
    #[error("Idempotency key was already used with a different payload")]
    IdempotencyMismatch,
    #[error("Reservation {id} has reached its maximum of {max} extensions")]
    MaxExtensionsExceeded { id: String, max: u32 },
    #[error("Tenant {0} is CLOSED")]
    TenantClosed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("API key {0} is already revoked")]
    KeyRevoked(String),
    #[error("Arithmetic overflow: the amount does not fit in a signed 64-bit integer")]
    Overflow,
    #[error("Internal error: {0}")]
    Internal(String),
    /// A policy's `rate_limits` are spent for the current minute.
    #[error("Policy {policy_id} allows {limit} {kind} per minute; retry in {retry_after_ms} ms")]
    RateLimited {
        policy_id: String,
        kind: &'static str,
        limit: i64,
        retry_after_ms: i64,
    },
    /// A bulk action's filter matched more rows than one action may change.
    #[error("The filter matches {matched} rows; a bulk action changes at most {limit}")]
    TooManyMatches { matched: u64, limit: u64 },
    /// A bulk action's `expected_count` is not what its filter matches now.
    #[error("The filter matches {matched} rows, not the {expected} expected")]
    CountMismatch { matched: u64, expected: u64 },
}
