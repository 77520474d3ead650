//! The audit log: `GET /v1/admin/audit/logs`, its query and its entries.

use ledger::{AuditEntry, AuditFilter, AuditPage, AuditQuery, AuditSort, StatusFilter};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::cursor::SortedRequest;
use crate::query::{check_trace_id, time_window};
use crate::schema::{AuditSortBy, SortDirection};
use crate::{format_rfc3339, ApiError, ClampedLimit, NextPage, Search};

/// The query of `GET /v1/admin/audit/logs`. List parameters take a comma-separated list (or
/// the parameter repeated); their values are OR-ed, and every parameter is AND-ed with the
/// others.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditListParams {
    /// A tenant id, or `__admin__` (made with the admin key) or `__unauth__` (refused before
    /// the caller was known).
    pub tenant_id: Option<String>,
    pub key_id: Option<String>,
    pub resource_id: Option<String>,
    /// Operation ids (`createBudget,updateBudget`), at most 25.
    #[serde(default)]
    #[param(explode = false, max_items = 25)]
    pub operation: Vec<String>,
    /// Resource types (`tenant,budget`), at most 25.
    #[serde(default)]
    #[param(explode = false, max_items = 25)]
    pub resource_type: Vec<String>,
    /// Error codes, at most 25; case-sensitive, unknown codes match nothing, and an entry
    /// without an error code (a success) never matches.
    #[serde(default)]
    #[param(explode = false, max_items = 25)]
    pub error_code: Vec<String>,
    /// Error codes to leave out, at most 25; an entry without an error code always passes.
    #[serde(default)]
    #[param(explode = false, max_items = 25)]
    pub error_code_exclude: Vec<String>,
    /// An exact HTTP status; not with `status_min` or `status_max`.
    #[param(value_type = Option<u16>)]
    pub status: Option<String>,
    /// Inclusive lower bound on the status, 100 to 599.
    #[param(value_type = Option<u16>, minimum = 100, maximum = 599)]
    pub status_min: Option<String>,
    /// Inclusive upper bound on the status, 100 to 599.
    #[param(value_type = Option<u16>, minimum = 100, maximum = 599)]
    pub status_max: Option<String>,
    /// Entries at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub from: Option<String>,
    /// Entries at or before this time (RFC 3339).
    #[param(format = DateTime)]
    pub to: Option<String>,
    /// Case-insensitive substring of the resource id, log id, error code or operation, at
    /// most 128 characters; empty means no search.
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// 32 lowercase hex characters.
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: Option<String>,
    pub request_id: Option<String>,
    /// Defaults to timestamp; ties keep the order entries were written in.
    #[param(inline, value_type = Option<AuditSortBy>)]
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

impl AuditListParams {
    /// The query, and what the response issues the next cursor from.
    pub fn into_query(self) -> Result<(AuditQuery, NextPage), ApiError> {
        let status = self.status_filter()?;
        let (from_ms, to_ms) = time_window(&self.from, &self.to)?;
        check_trace_id(&self.trace_id)?;
        let filter = AuditFilter {
            tenant_id: self.tenant_id,
            key_id: self.key_id,
            resource_id: self.resource_id,
            operations: self.operation,
            resource_types: self.resource_type,
            error_codes: self.error_code,
            error_codes_excluded: self.error_code_exclude,
            status,
            from_ms,
            to_ms,
            search: self.search.0,
            trace_id: self.trace_id,
            request_id: self.request_id,
        };
        let order = SortedRequest {
            sort_by: self.sort_by.as_deref(),
            default: AuditSort::Timestamp,
            sort_dir: self.sort_dir.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.unwrap_or_default().0,
            filters: format!("{filter:?}"),
            text: AuditSort::is_text,
        }
        .parse()?;
        Ok((
            AuditQuery {
                filter,
                sort: order.sort_by,
                window: order.window,
            },
            NextPage(Some(order.binding)),
        ))
    }

    fn status_filter(&self) -> Result<StatusFilter, ApiError> {
        let number = |name: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    v.parse::<u16>()
                        .map_err(|_| ApiError::invalid(format!("{name}: must be an HTTP status")))
                })
                .transpose()
        };
        let status = number("status", &self.status)?;
        let min = number("status_min", &self.status_min)?;
        let max = number("status_max", &self.status_max)?;
        for (name, bound) in [("status_min", min), ("status_max", max)] {
            if bound.is_some_and(|b| !(100..=599).contains(&b)) {
                return Err(ApiError::invalid(format!("{name}: must be 100 to 599")));
            }
        }
        match (status, min, max) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(ApiError::invalid(
                "status: cannot be combined with status_min or status_max",
            )),
            (Some(exact), None, None) => Ok(StatusFilter::Exactly(exact)),
            (None, Some(min), Some(max)) if min > max => Err(ApiError::invalid(
                "status_min: must not be greater than status_max",
            )),
            (None, None, None) => Ok(StatusFilter::Any),
            (None, min, max) => Ok(StatusFilter::Between(min, max)),
        }
    }
}

/// `AuditLogEntry`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AuditLogEntry, description = "One audited request: an operator's change, an \
    admin acting on a tenant's behalf, or a refused attempt at either.")]
pub struct AuditLogEntryResponse {
    pub log_id: String,
    pub timestamp: String,
    /// A tenant id, or `__admin__` / `__unauth__`.
    pub tenant_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<String>,
    /// The operation id (`createBudget`).
    pub operation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// `actor_type` (`admin`, `admin_on_behalf_of`, `api_key`, `unauthenticated`), and for
    /// a refusal `error_message`, `method` and `path`; a bulk action's counts and rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Box<RawValue>>,
}

impl From<AuditEntry> for AuditLogEntryResponse {
    fn from(e: AuditEntry) -> Self {
        AuditLogEntryResponse {
            log_id: e.log_id,
            timestamp: format_rfc3339(e.timestamp_ms),
            tenant_id: e.tenant_id,
            key_id: e.key_id,
            user_agent: e.user_agent,
            source_ip: e.source_ip,
            operation: e.operation,
            resource_type: e.resource_type,
            resource_id: e.resource_id,
            request_id: e.request_id,
            trace_id: e.trace_id,
            status: e.status,
            error_code: e.error_code,
            // Written by this server as a JSON object; anything else is left out.
            metadata: e
                .metadata
                .and_then(|m| RawValue::from_string(m).ok())
                .filter(|m| m.get().starts_with('{')),
        }
    }
}

/// `AuditLogListResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AuditLogListResponse, description = "A page of the audit log.")]
pub struct AuditLogListResponse {
    pub logs: Vec<AuditLogEntryResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl AuditLogListResponse {
    pub fn new(next: &NextPage, page: AuditPage) -> Self {
        let next_cursor = next.after(page.next);
        AuditLogListResponse {
            has_more: next_cursor.is_some(),
            logs: page.entries.into_iter().map(Into::into).collect(),
            next_cursor,
        }
    }
}
