//! Error codes, HTTP statuses and the error body.

use ledger::Rejection;
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// Which plane a request belongs to: the runtime's error enum is closed, so codes that only
/// the admin plane knows fall back to their runtime equivalent there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    Runtime,
    Admin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[schema(
    description = "Why a request failed. The runtime plane (/v1/reservations, /v1/decide, /v1/events, /v1/balances) uses only the runtime codes; TENANT_NOT_FOUND, BUDGET_NOT_FOUND, INSUFFICIENT_PERMISSIONS, DUPLICATE_RESOURCE and KEY_REVOKED come from the admin plane, as does COUNT_MISMATCH (bulk actions)."
)]
pub enum ErrorCode {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    BudgetExceeded,
    BudgetFrozen,
    BudgetClosed,
    ReservationExpired,
    ReservationFinalized,
    IdempotencyMismatch,
    UnitMismatch,
    OverdraftLimitExceeded,
    DebtOutstanding,
    MaxExtensionsExceeded,
    LimitExceeded,
    TenantClosed,
    InternalError,
    // Admin plane only.
    TenantNotFound,
    BudgetNotFound,
    InsufficientPermissions,
    DuplicateResource,
    KeyRevoked,
    CountMismatch,
    WebhookNotFound,
    WebhookUrlInvalid,
    EventNotFound,
    ReplayInProgress,
}

/// An error answer: status, code, message and optional details. The correlation ids are
/// added when the body is written (see [`ErrorBody`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds after which a retry may succeed: answered as `Retry-After` (and, on a 429,
    /// as `X-RateLimit-Reset`), not in the body.
    pub retry_after_s: Option<u64>,
}

impl ErrorCode {
    /// Whether this is a budget's refusal of a reservation (what a denial rate counts).
    pub fn is_denial(self) -> bool {
        matches!(
            self,
            ErrorCode::BudgetExceeded
                | ErrorCode::BudgetFrozen
                | ErrorCode::BudgetClosed
                | ErrorCode::OverdraftLimitExceeded
                | ErrorCode::DebtOutstanding
        )
    }
}

impl ApiError {
    pub fn new(status: u16, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after_s: None,
        }
    }

    /// This error, answered with `Retry-After: seconds`.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, ErrorCode::InvalidRequest, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, ErrorCode::Unauthorized, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, ErrorCode::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorCode::InternalError, message)
    }

    /// The storage cannot take writes: fail closed, fast.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, ErrorCode::InternalError, message)
    }

    pub fn from_rejection(rejection: Rejection, plane: Plane) -> Self {
        use ErrorCode as C;
        let admin = plane == Plane::Admin;
        let message = rejection.to_string();
        let (status, code) = match &rejection {
            Rejection::InvalidRequest(_) | Rejection::Overflow => (400, C::InvalidRequest),
            Rejection::Unauthorized(_) => (401, C::Unauthorized),
            Rejection::Forbidden(_) => (403, C::Forbidden),
            Rejection::InsufficientPermissions(_) if admin => (403, C::InsufficientPermissions),
            Rejection::InsufficientPermissions(_) => (403, C::Forbidden),
            Rejection::NotFound(_) => (404, C::NotFound),
            Rejection::TenantNotFound(_) if admin => (404, C::TenantNotFound),
            Rejection::BudgetNotFound(_) if admin => (404, C::BudgetNotFound),
            Rejection::WebhookNotFound(_) if admin => (404, C::WebhookNotFound),
            Rejection::WebhookNotFound(_) => (404, C::NotFound),
            Rejection::TenantNotFound(_) | Rejection::BudgetNotFound(_) => (404, C::NotFound),
            Rejection::DuplicateResource(_) => (409, C::DuplicateResource),
            Rejection::BudgetExceeded { .. } => (409, C::BudgetExceeded),
            Rejection::BudgetFrozen { .. } => (409, C::BudgetFrozen),
            Rejection::BudgetClosed { .. } => (409, C::BudgetClosed),
            Rejection::OverdraftLimitExceeded { .. } => (409, C::OverdraftLimitExceeded),
            Rejection::DebtOutstanding { .. } => (409, C::DebtOutstanding),
            Rejection::UnitMismatch { .. } => (400, C::UnitMismatch),
            Rejection::ReservationExpired(_) => (410, C::ReservationExpired),
            Rejection::ReservationFinalized { .. } => (409, C::ReservationFinalized),
            Rejection::IdempotencyMismatch => (409, C::IdempotencyMismatch),
            Rejection::MaxExtensionsExceeded { .. } => (409, C::MaxExtensionsExceeded),
            Rejection::TenantClosed(_) => (409, C::TenantClosed),
            Rejection::Conflict(_) => (409, C::InvalidRequest),
            Rejection::KeyRevoked(_) => (409, C::KeyRevoked),
            Rejection::Internal(_) => (500, C::InternalError),
            Rejection::TooManyMatches { .. } => (400, C::LimitExceeded),
            Rejection::CountMismatch { .. } => (409, C::CountMismatch),
            Rejection::RateLimited { .. } => (429, C::LimitExceeded),
        };
        let retry_after_s = match &rejection {
            // Whole seconds, rounded up: a retry at the instant given is never early.
            Rejection::RateLimited { retry_after_ms, .. } => {
                Some(((*retry_after_ms).max(0) as u64).div_ceil(1000).max(1))
            }
            _ => None,
        };
        let details = match rejection {
            Rejection::UnitMismatch {
                scope: Some(scope),
                requested,
                expected,
                ..
            } => Some(json!({
                "scope": scope,
                "requested_unit": requested.as_str(),
                "expected_units": expected.iter().map(|u| u.as_str()).collect::<Vec<_>>(),
            })),
            Rejection::TooManyMatches { matched, limit } => {
                Some(json!({"total_matched": matched, "limit": limit}))
            }
            Rejection::CountMismatch { matched, expected } => {
                Some(json!({"total_matched": matched, "expected_count": expected}))
            }
            Rejection::RateLimited {
                ref policy_id,
                kind,
                limit,
                ..
            } => Some(
                json!({"policy_id": policy_id, "limit": limit, "per": "minute", "counts": kind}),
            ),
            _ => None,
        };
        ApiError {
            status,
            code,
            message,
            details,
            retry_after_s,
        }
    }
}

/// The error body: exactly `{error, message, request_id, trace_id, details?}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(
    as = ErrorResponse,
    description = "Every error answer. `request_id` and `trace_id` equal the X-Request-Id and X-Cycles-Trace-Id response headers."
)]
pub struct ErrorBody<'a> {
    pub error: ErrorCode,
    pub message: &'a str,
    pub request_id: &'a str,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: &'a str,
    /// Structured context, e.g. `{scope, requested_unit, expected_units}` on UNIT_MISMATCH.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub details: Option<&'a Value>,
}

impl<'a> ErrorBody<'a> {
    pub fn new(error: &'a ApiError, request_id: &'a str, trace_id: &'a str) -> Self {
        ErrorBody {
            error: error.code,
            message: &error.message,
            request_id,
            trace_id,
            details: error.details.as_ref(),
        }
    }
}
