//! `GET /v1/reservations`: query parameters, bound cursors and the summary rows.

use std::sync::Arc;

use ledger::{
    Actor, ListReservations, Position, Reservation, ReservationStatus, SortBy, SortValue,
    SCOPE_LEVELS,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::common::metadata_raw;
use crate::schema::ReservationStatus as StatusSchema;
use crate::{parse_rfc3339, Action, Amount, ApiError, Subject};

/// A cursor is valid only for the same order and filters it was issued under.
#[derive(Serialize, Deserialize)]
struct Cursor {
    /// Sort field and direction.
    s: String,
    d: bool,
    /// Hash of the filters.
    f: String,
    v: SortValue,
    i: String,
}

fn filter_hash(q: &ListReservations) -> String {
    let canonical = format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        q.tenant, q.idempotency_key, q.status, q.filters, q.created, q.expires, q.finalized
    );
    hex::encode(&Sha256::digest(canonical.as_bytes())[..12])
}

pub fn encode_list_cursor(q: &ListReservations, (value, id): Position) -> String {
    let cursor = Cursor {
        s: q.sort_by.as_str().into(),
        d: q.descending,
        f: filter_hash(q),
        v: value,
        i: id,
    };
    hex::encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

fn decode_list_cursor(raw: &str, q: &ListReservations) -> Result<Position, ApiError> {
    let invalid = |why: &str| {
        ApiError::invalid(format!(
            "cursor: {why}; restart pagination without a cursor"
        ))
    };
    let bytes = hex::decode(raw).map_err(|_| invalid("malformed"))?;
    let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| invalid("malformed"))?;
    if c.s != q.sort_by.as_str() || c.d != q.descending || c.f != filter_hash(q) {
        return Err(invalid("issued for a different sort or filters"));
    }
    if matches!(c.v, SortValue::Text(_)) != q.sort_by.is_text() {
        return Err(invalid("malformed"));
    }
    Ok((c.v, c.i))
}

fn window(
    get: &impl Fn(&str) -> Option<String>,
    from: &str,
    to: &str,
) -> Result<(Option<i64>, Option<i64>), ApiError> {
    let parse = |name: &str| -> Result<Option<i64>, ApiError> {
        get(name)
            .map(|v| {
                parse_rfc3339(&v)
                    .ok_or_else(|| ApiError::invalid(format!("{name}: not an ISO-8601 date-time")))
            })
            .transpose()
    };
    let (f, t) = (parse(from)?, parse(to)?);
    if let (Some(f), Some(t)) = (f, t) {
        if f > t {
            return Err(ApiError::invalid(format!("{from} must not be after {to}")));
        }
    }
    Ok((f, t))
}

/// Parses the list parameters. `get` returns a parameter's value, blank counted as absent.
pub fn parse_list_query(
    actor: Actor,
    get: impl Fn(&str) -> Option<String>,
    limit: usize,
) -> Result<ListReservations, ApiError> {
    if actor == Actor::Admin && get("tenant").is_none() {
        return Err(ApiError::invalid(
            "tenant query parameter is required when using admin key authentication",
        ));
    }
    let status = get("status")
        .map(|s| {
            ReservationStatus::parse(&s).ok_or_else(|| {
                ApiError::invalid("status: must be ACTIVE, COMMITTED, RELEASED or EXPIRED")
            })
        })
        .transpose()?;
    let sort_by = get("sort_by")
        .map(|s| {
            SortBy::parse(&s).ok_or_else(|| {
                ApiError::invalid("sort_by: must be one of reservation_id, tenant, scope_path, status, reserved, created_at_ms, expires_at_ms")
            })
        })
        .transpose()?
        .unwrap_or(SortBy::CreatedAt);
    let descending = match get("sort_dir").as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(_) => return Err(ApiError::invalid("sort_dir: must be asc or desc")),
    };
    if let Some(key) = get("idempotency_key") {
        crate::validate::idempotency_key("idempotency_key", &key)?;
    }
    let mut q = ListReservations {
        tenant: get("tenant"),
        idempotency_key: get("idempotency_key"),
        status,
        filters: SCOPE_LEVELS[1..]
            .iter()
            .filter_map(|level| get(level).map(|v| (*level, v.to_lowercase())))
            .collect(),
        created: window(&get, "from", "to")?,
        expires: window(&get, "expires_from", "expires_to")?,
        finalized: window(&get, "finalized_from", "finalized_to")?,
        sort_by,
        descending,
        limit,
        after: None,
        actor,
    };
    if let Some(raw) = get("cursor") {
        q.after = Some(decode_list_cursor(&raw, &q)?);
    }
    Ok(q)
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

    pub fn parse(raw: Option<&str>) -> Self {
        let mut inc = Include::default();
        for token in raw.unwrap_or_default().split(',').map(str::trim) {
            match token {
                "metadata" => inc.metadata = true,
                "committed_metadata" => inc.committed_metadata = true,
                _ => {}
            }
        }
        inc
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
