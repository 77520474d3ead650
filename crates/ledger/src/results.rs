//! The results of the operations that idempotency replays, stored verbatim
//! ([`StoredOutcome`]); volatile values (`remaining_ttl_ms`) are computed beside them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Budget, Caps, FundingOp, Millis, Unit};

/// A point-in-time copy of one ledger, as returned in `balances` arrays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    /// Shared with the budget.
    pub scope: Arc<str>,
    pub unit: Unit,
    pub allocated: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub spent: i64,
    pub debt: i64,
    pub overdraft_limit: i64,
    pub is_over_limit: bool,
}

impl From<&Budget> for Balance {
    fn from(b: &Budget) -> Self {
        Balance {
            scope: b.scope.clone(),
            unit: b.unit,
            allocated: b.allocated,
            remaining: b.remaining,
            reserved: b.reserved,
            spent: b.spent,
            debt: b.debt,
            overdraft_limit: b.overdraft_limit,
            is_over_limit: b.is_over_limit,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    Allow,
    AllowWithCaps,
    Deny,
}

/// A reserve (live or dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveResult {
    pub decision: Decision,
    /// Set on a live reservation only; shared with the reservation.
    pub reservation_id: Option<Arc<str>>,
    /// Set on a live reservation only.
    pub expires_at_ms: Option<Millis>,
    /// The reserved (or, on a dry-run ALLOW, the would-be reserved) amount.
    pub reserved: Option<(Unit, i64)>,
    /// Shared with the reservation.
    pub scope_path: Arc<str>,
    /// Shared with the reservation.
    pub affected_scopes: Arc<[String]>,
    pub balances: Vec<Balance>,
    /// Set on a dry-run DENY.
    pub reason_code: Option<String>,
    /// Set with `ALLOW_WITH_CAPS`. Boxed: rarely set, and every stored reserve result
    /// carries the field (~90 bytes inline).
    pub caps: Option<Box<Caps>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitResult {
    pub unit: Unit,
    pub charged: i64,
    /// `estimate − charged` when positive.
    pub released: Option<i64>,
    pub balances: Vec<Balance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResult {
    pub unit: Unit,
    pub released: i64,
    pub balances: Vec<Balance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtendResult {
    pub expires_at_ms: Millis,
    pub balances: Vec<Balance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecideResult {
    pub decision: Decision,
    pub reason_code: Option<String>,
    /// Set with `ALLOW_WITH_CAPS`.
    pub caps: Option<Caps>,
    pub affected_scopes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventResult {
    pub event_id: String,
    pub unit: Unit,
    /// Set when the policy capped the charge below the actual amount.
    pub charged: Option<i64>,
    pub balances: Vec<Balance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FundResult {
    pub operation: FundingOp,
    pub unit: Unit,
    pub previous: Balance,
    pub new: Balance,
    pub timestamp_ms: Millis,
}

/// What an idempotency record replays. Each result is behind `Arc`, shared with the
/// answer its operation returned (and with every replay): a write stores its result
/// without copying its strings, and the reply is built from the same allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredOutcome {
    Reserve(Arc<ReserveResult>),
    Commit(Arc<CommitResult>),
    Release(Arc<ReleaseResult>),
    Extend(Arc<ExtendResult>),
    Decide(Arc<DecideResult>),
    Event(Arc<EventResult>),
    Fund(Arc<FundResult>),
    /// Added after format 1: appended, so older journals decode unchanged.
    Bulk(Arc<BulkResult>),
}

/// What a bulk action did, row by row (ids: tenant ids or ledger ids). A failed row changed
/// nothing; the batch went on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkResult {
    pub total_matched: u64,
    pub succeeded: Vec<String>,
    pub failed: Vec<RowFailure>,
    /// Rows already in the action's target state.
    pub skipped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowFailure {
    pub id: String,
    pub error: RowError,
    pub message: String,
}

/// Why a row of a bulk action failed (the spec's row-level vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowError {
    InvalidTransition,
    BudgetExceeded,
    TenantClosed,
    Internal,
}

impl RowError {
    /// The row code a refusal of the row's own operation stands for.
    pub fn of(rejection: &crate::Rejection) -> RowError {
        use crate::Rejection as R;
        match rejection {
            R::BudgetFrozen { .. }
            | R::BudgetClosed { .. }
            | R::UnitMismatch { .. }
            | R::Conflict(_) => RowError::InvalidTransition,
            R::BudgetExceeded { .. } | R::OverdraftLimitExceeded { .. } => RowError::BudgetExceeded,
            R::TenantClosed(_) => RowError::TenantClosed,
            _ => RowError::Internal,
        }
    }
}
