//! History: what the ledger's changes leave behind and nobody changes again.
//!
//! An audit entry travels in the journal record of the change it describes (as
//! [`crate::Effect::Audit`]), so a crash never keeps one without the other, but it is not
//! state: [`crate::State::apply_effect`] ignores it and the memory never holds it. The store
//! projects it into its history store once the record is durable, and answers
//! [`AuditQuery`]s from there.

use serde::{Deserialize, Serialize};

use crate::{Millis, Position, Window};

/// The tenant of an entry made with the admin key (governance, cross-tenant, admin-plane
/// failures). Underscores cannot occur in a tenant id, so sentinels never collide with one.
pub const ADMIN_TENANT: &str = "__admin__";
/// The tenant of an entry whose request failed before its caller was known.
pub const UNAUTH_TENANT: &str = "__unauth__";

/// One audited request: an operator's change, an admin acting on a tenant's behalf, or a
/// refused attempt at either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub log_id: String,
    pub timestamp_ms: Millis,
    /// A tenant id, [`ADMIN_TENANT`] or [`UNAUTH_TENANT`].
    pub tenant_id: String,
    pub key_id: Option<String>,
    pub user_agent: Option<String>,
    pub source_ip: Option<String>,
    /// The operation's id as the API names it (`createBudget`), or `METHOD:path` for a
    /// request that matched no operation.
    pub operation: String,
    pub resource_type: Option<String>,
    pub resource_id: Option<String>,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
    pub error_code: Option<String>,
    /// A JSON object, as text (the ledger never reads it).
    pub metadata: Option<String>,
}

/// The columns an audit query may sort by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditSort {
    Timestamp,
    Operation,
    ResourceType,
    TenantId,
    KeyId,
    Status,
}

impl AuditSort {
    /// Whether the column sorts as text (else as an integer).
    pub fn is_text(self) -> bool {
        !matches!(self, AuditSort::Timestamp | AuditSort::Status)
    }
}

/// The HTTP status an entry must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusFilter {
    #[default]
    Any,
    Exactly(u16),
    /// Inclusive bounds.
    Between(Option<u16>, Option<u16>),
}

/// A query of the audit log: every filter is AND-ed with the others; a list filter matches
/// any of its values.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditFilter {
    pub tenant_id: Option<String>,
    pub key_id: Option<String>,
    pub resource_id: Option<String>,
    pub operations: Vec<String>,
    pub resource_types: Vec<String>,
    /// An entry without an error code never matches a non-empty list.
    pub error_codes: Vec<String>,
    /// An entry without an error code always passes.
    pub error_codes_excluded: Vec<String>,
    pub status: StatusFilter,
    /// Inclusive bounds on the entry's timestamp.
    pub from_ms: Option<Millis>,
    pub to_ms: Option<Millis>,
    /// A case-insensitive substring of the resource id, log id, error code or operation.
    pub search: Option<String>,
    pub trace_id: Option<String>,
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditQuery {
    pub filter: AuditFilter,
    pub sort: AuditSort,
    /// Positions are the sort column's value and the entry's place in the history (its
    /// `seq`, as text), so ties keep the order entries were written in.
    pub window: Window,
}

/// A page of the audit log, with each entry's position for the next page's cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// The position of the last entry, when more follow.
    pub next: Option<Position>,
}
