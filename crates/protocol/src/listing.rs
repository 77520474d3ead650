//! `GET /v1/reservations`: its query parameters, bound cursors and the summary rows.

use crate::WireName;
use std::sync::Arc;

use ledger::{Actor, ListReservations, Position, Reservation, ReservationStatus, SortBy};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::common::metadata_raw;
use crate::cursor::{decode_sorted_cursor, descending, encode_sorted_cursor, Binding};
use crate::query::{deserialize_text, level_filters, PageSize, Verbatim, WindowBound, TOKENS};
use crate::schema::{ReservationSortBy, ReservationStatus as StatusSchema, SortDirection};
use crate::{parse_rfc3339, Action, Amount, ApiError, Subject};

fn binding(q: &ListReservations) -> Binding<'static> {
    Binding {
        sort_by: q.sort_by.wire_name(),
        descending: q.descending,
        filters: format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            q.tenant, q.idempotency_key, q.status, q.filters, q.created, q.expires, q.finalized
        ),
    }
}

pub fn encode_list_cursor(q: &ListReservations, position: Position) -> String {
    encode_sorted_cursor(&binding(q), position)
}

/// A window bound's schema: an RFC 3339 date-time, or blank (unset, as the spec's prose
/// requires although its schema says `format: date-time` alone).
fn window_bound_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{AnyOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
    AnyOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^\s*$")),
        )
        .into()
}

/// An inclusive time window from two RFC 3339 parameters, `(name, value)` each; a blank
/// one is unset.
fn window(
    (from, from_value): (&str, &WindowBound),
    (to, to_value): (&str, &WindowBound),
) -> Result<(Option<i64>, Option<i64>), ApiError> {
    let parse = |name: &str, value: &WindowBound| -> Result<Option<i64>, ApiError> {
        value
            .0
            .as_deref()
            .map(|v| {
                parse_rfc3339(v)
                    .ok_or_else(|| ApiError::invalid(format!("{name}: not an ISO-8601 date-time")))
            })
            .transpose()
    };
    let (f, t) = (parse(from, from_value)?, parse(to, to_value)?);
    if let (Some(f), Some(t)) = (f, t) {
        if f > t {
            return Err(ApiError::invalid(format!("{from} must not be after {to}")));
        }
    }
    Ok((f, t))
}

/// The query of `GET /v1/reservations`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReservationListParams {
    /// Required with the admin key. With a tenant key, must be the key's tenant (else 403).
    pub tenant: Option<String>,
    /// Only the reservation created with this idempotency key, exactly as sent (not
    /// trimmed: keys are opaque).
    #[param(value_type = Option<String>, min_length = 1, max_length = 256)]
    pub idempotency_key: Option<Verbatim>,
    /// Only reservations in this state (as of now: a lapsed ACTIVE one is EXPIRED).
    #[param(inline, value_type = Option<StatusSchema>)]
    pub status: Option<String>,
    /// Only reservations whose subject has this workspace (case-insensitive).
    pub workspace: Option<String>,
    /// Only reservations whose subject has this app (case-insensitive).
    pub app: Option<String>,
    /// Only reservations whose subject has this workflow (case-insensitive).
    pub workflow: Option<String>,
    /// Only reservations whose subject has this agent (case-insensitive).
    pub agent: Option<String>,
    /// Only reservations whose subject has this toolset (case-insensitive).
    pub toolset: Option<String>,
    /// Created at or after (RFC 3339).
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub from: WindowBound,
    /// Created at or before (RFC 3339).
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub to: WindowBound,
    /// Expiring at or after (RFC 3339).
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub expires_from: WindowBound,
    /// Expiring at or before (RFC 3339).
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub expires_to: WindowBound,
    /// Finalized at or after (RFC 3339); excludes unfinalized reservations.
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub finalized_from: WindowBound,
    /// Finalized at or before (RFC 3339); excludes unfinalized reservations.
    #[serde(default)]
    #[param(schema_with = window_bound_schema)]
    pub finalized_to: WindowBound,
    /// Defaults to created_at_ms.
    #[param(inline, value_type = Option<ReservationSortBy>)]
    pub sort_by: Option<String>,
    /// Defaults to desc.
    #[param(inline, value_type = Option<SortDirection>)]
    pub sort_dir: Option<String>,
    /// From the previous page's `next_cursor`; valid only with the same sort and filters.
    pub cursor: Option<String>,
    /// Page size, 1–200; defaults to 50.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    pub limit: Option<PageSize>,
    /// Optional projections, comma-separated (repeating the parameter adds more):
    /// `metadata`, `committed_metadata`. Other tokens and empty items are ignored.
    #[serde(default)]
    #[param(value_type = Vec<String>, style = Form, explode = false)]
    pub include: Include,
}

impl ReservationListParams {
    /// The listing these parameters ask `actor`'s view for, and the projections to render
    /// its rows with.
    pub fn into_query(self, actor: Actor) -> Result<(ListReservations, Include), ApiError> {
        if actor == Actor::Admin && self.tenant.is_none() {
            return Err(ApiError::invalid(
                "tenant query parameter is required when using admin key authentication",
            ));
        }
        let status = self
            .status
            .as_deref()
            .map(|s| {
                ReservationStatus::parse(s).ok_or_else(|| {
                    ApiError::invalid("status: must be ACTIVE, COMMITTED, RELEASED or EXPIRED")
                })
            })
            .transpose()?;
        let sort_by = self
            .sort_by
            .as_deref()
            .map(|s| {
                SortBy::from_wire_name(s).ok_or_else(|| {
                    ApiError::invalid("sort_by: must be one of reservation_id, tenant, scope_path, status, reserved, created_at_ms, expires_at_ms")
                })
            })
            .transpose()?
            .unwrap_or(SortBy::CreatedAt);
        let descending = descending(self.sort_dir.as_deref())?;
        let idempotency_key = self.idempotency_key.map(|Verbatim(key)| key);
        if let Some(key) = &idempotency_key {
            crate::validate::idempotency_key("idempotency_key", key)?;
        }
        let mut q = ListReservations {
            filters: level_filters([
                &self.workspace,
                &self.app,
                &self.workflow,
                &self.agent,
                &self.toolset,
            ]),
            created: window(("from", &self.from), ("to", &self.to))?,
            expires: window(
                ("expires_from", &self.expires_from),
                ("expires_to", &self.expires_to),
            )?,
            finalized: window(
                ("finalized_from", &self.finalized_from),
                ("finalized_to", &self.finalized_to),
            )?,
            // Tenant ids are lower case; a tenant key's is matched the same way.
            tenant: self.tenant.map(|t| t.to_lowercase()),
            idempotency_key,
            status,
            sort_by,
            descending,
            limit: self.limit.unwrap_or_default().0,
            after: None,
            actor,
        };
        if let Some(raw) = &self.cursor {
            q.after = Some(decode_sorted_cursor(
                raw,
                &binding(&q),
                q.sort_by.is_text(),
            )?);
        }
        Ok((q, self.include))
    }
}

/// Which optional projections `include` asks for (unknown tokens are ignored).
#[derive(Debug, Default, Clone, Copy)]
pub struct Include {
    pub metadata: bool,
    pub committed_metadata: bool,
}

impl Include {
    /// Every projection (a single reservation's detail).
    pub const ALL: Include = Include {
        metadata: true,
        committed_metadata: true,
    };

    /// The projections comma-separated `tokens` name (unknown and empty tokens are ignored).
    fn of(tokens: &str) -> Self {
        let mut inc = Include::default();
        for token in tokens.split(',') {
            match token.trim() {
                "metadata" => inc.metadata = true,
                "committed_metadata" => inc.committed_metadata = true,
                _ => {}
            }
        }
        inc
    }
}

/// `include`: any number of tokens, every value of the parameter (the spec: unknown and empty
/// tokens are ignored, never refused).
impl<'de> Deserialize<'de> for Include {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_text(
            deserializer,
            TOKENS,
            "comma-separated projections",
            |tokens| Ok(Include::of(tokens)),
        )
    }
}

/// `ReservationSummary`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "One reservation in a listing.")]
pub struct ReservationSummary {
    /// Shared with the stored reservation, like the scopes.
    #[schema(value_type = String)]
    pub reservation_id: Arc<str>,
    #[schema(value_type = StatusSchema)]
    pub status: &'static str,
    pub subject: Subject,
    pub action: Action,
    pub reserved: Amount,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// Shared with the stored reservation (no copy per listed row).
    #[schema(value_type = String)]
    pub scope_path: Arc<str>,
    #[schema(value_type = Vec<String>)]
    pub affected_scopes: Arc<[String]>,
    #[schema(value_type = String)]
    pub idempotency_key: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finalized_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed: Option<Amount>,
    /// Only with `include=metadata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Box<RawValue>>,
    /// Only with `include=committed_metadata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub committed_metadata: Option<Box<RawValue>>,
}

impl ReservationSummary {
    pub fn new(r: &Reservation, include: Include) -> Self {
        ReservationSummary {
            reservation_id: r.reservation_id.clone(),
            status: r.status.as_str(),
            subject: Subject::from(&*r.subject),
            action: Action::from(&*r.action),
            reserved: Amount::new(r.unit, r.estimate),
            created_at_ms: r.created_at_ms,
            expires_at_ms: r.expires_at_ms,
            scope_path: r.scope_path.clone(),
            affected_scopes: r.affected_scopes.clone(),
            idempotency_key: r.idempotency_key.clone(),
            finalized_at_ms: r.finalized_at_ms,
            committed: r.charged.map(|c| Amount::new(r.unit, c)),
            metadata: if include.metadata {
                metadata_raw(r.metadata.as_deref())
            } else {
                None
            },
            committed_metadata: if include.committed_metadata {
                metadata_raw(r.committed_metadata.as_deref())
            } else {
                None
            },
        }
    }
}

/// `ReservationListResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A page of reservations.")]
pub struct ReservationListResponse {
    pub reservations: Vec<ReservationSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}
