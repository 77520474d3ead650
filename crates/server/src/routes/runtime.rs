//! The runtime plane: reserve, commit, release, extend, decide, events, reads.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use ledger::{Actor, GetBalances, GetReservation, Operation, SCOPE_LEVELS};
use protocol::listing::{
    encode_list_cursor, parse_list_query, Include, ReservationListResponse, ReservationSummary,
};
use protocol::runtime::{
    check_header_key, BalanceResponse, CommitRequest, CommitResponse, DecisionRequest,
    DecisionResponse, EventCreateRequest, EventCreateResponse, ReleaseRequest, ReleaseResponse,
    ReservationCreateRequest, ReservationCreateResponse, ReservationDetail,
    ReservationExtendRequest, ReservationExtendResponse,
};
use protocol::{
    decode_budget_cursor, parse_body, ApiError, Balance, Plane, Validate, MAX_PAGE_SIZE,
};
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::query::Query;
use crate::reply::{
    budget_position, json, next_cursor, tenant_json, with_date, with_tenant, Answer, Failure,
};

const IDEMPOTENCY_HEADER: &str = "x-idempotency-key";

/// An idempotent request body: its key must match the `X-Idempotency-Key` header.
trait Keyed {
    fn key(&self) -> &str;
}

macro_rules! keyed {
    ($($t:ty),*) => {$(impl Keyed for $t { fn key(&self) -> &str { &self.idempotency_key } })*};
}
keyed!(
    ReservationCreateRequest,
    CommitRequest,
    ReleaseRequest,
    ReservationExtendRequest,
    DecisionRequest,
    EventCreateRequest
);

/// Parses an idempotent body and checks it against the header (401 first, then 400).
async fn keyed_body<T: DeserializeOwned + Validate + Keyed>(
    app: &App,
    actor: &Actor,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, Failure> {
    app.validated(actor, Plane::Runtime, || {
        let request: T = parse_body(body)?;
        let header = headers
            .get(IDEMPOTENCY_HEADER)
            .and_then(|v| v.to_str().ok());
        check_header_key(header, request.key())?;
        Ok(request)
    })
    .await
}

fn reservation_path(id: &str) -> Result<String, ApiError> {
    if id.is_empty() || id.chars().count() > 128 {
        return Err(ApiError::invalid(
            "reservation_id: must be 1 to 128 characters",
        ));
    }
    Ok(id.to_string())
}

pub async fn create_reservation(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    body: Bytes,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: ReservationCreateRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let operation = request.into_command(actor, ids::reservation_id());
    let (reserved, tenant) = app.run(operation, Plane::Runtime).await?;
    let response = json(
        StatusCode::OK,
        &ReservationCreateResponse::new(&reserved.once.result, reserved.remaining_ttl_ms),
    );
    Ok(with_date(with_tenant(response, tenant.as_deref())))
}

/// Parses an idempotent body for the reservation named in the path and runs the operation
/// it becomes.
async fn on_reservation<T: DeserializeOwned + Validate + Keyed, O: Operation>(
    app: &App,
    actor: Actor,
    id: &str,
    headers: &HeaderMap,
    body: &Bytes,
    operation: impl FnOnce(T, Actor, String) -> O,
) -> Result<(O::Output, Option<Arc<str>>), Failure> {
    let request: T = keyed_body(app, &actor, headers, body).await?;
    let id = app
        .validated(&actor, Plane::Runtime, || reservation_path(id))
        .await?;
    app.run(operation(request, actor, id), Plane::Runtime).await
}

pub async fn commit(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    body: Bytes,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let (committed, tenant) = on_reservation(
        &app,
        actor,
        &id,
        &headers,
        &body,
        CommitRequest::into_command,
    )
    .await?;
    let response = CommitResponse::from(&*committed.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

pub async fn release(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    body: Bytes,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let (released, tenant) = on_reservation(
        &app,
        actor,
        &id,
        &headers,
        &body,
        ReleaseRequest::into_command,
    )
    .await?;
    let response = ReleaseResponse::from(&*released.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

pub async fn extend(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    body: Bytes,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let (extended, tenant) = on_reservation(
        &app,
        actor,
        &id,
        &headers,
        &body,
        ReservationExtendRequest::into_command,
    )
    .await?;
    let response = ReservationExtendResponse::new(&extended.once.result, extended.remaining_ttl_ms);
    tenant_json(StatusCode::OK, &response, tenant).map(with_date)
}

pub async fn decide(State(app): State<Arc<App>>, Headers(headers): Headers, body: Bytes) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: DecisionRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let (decided, tenant) = app.run(request.into_command(actor), Plane::Runtime).await?;
    tenant_json(
        StatusCode::OK,
        &DecisionResponse::from(&*decided.result),
        tenant,
    )
}

pub async fn create_event(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    body: Bytes,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: EventCreateRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let operation = request.into_command(actor, ids::event_id());
    let (recorded, tenant) = app.run(operation, Plane::Runtime).await?;
    let response = EventCreateResponse::from(&*recorded.result);
    tenant_json(StatusCode::CREATED, &response, tenant)
}

pub async fn get_reservation(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let id = app
        .validated(&actor, Plane::Runtime, || reservation_path(&id))
        .await?;
    let operation = GetReservation {
        actor,
        reservation_id: id,
    };
    let (r, tenant) = app.run(operation, Plane::Runtime).await?;
    tenant_json(StatusCode::OK, &ReservationDetail::from(&r), tenant)
}

/// Parses the balance filters: at least one subject level is required.
fn balance_query(actor: Actor, q: &Query) -> Result<GetBalances, ApiError> {
    let filters: Vec<(&'static str, String)> = SCOPE_LEVELS[1..]
        .iter()
        .filter_map(|level| q.get(level).map(|v| (*level, v.to_lowercase())))
        .collect();
    let tenant = q.get("tenant").map(str::to_string);
    if tenant.is_none() && filters.is_empty() {
        return Err(ApiError::invalid(
            "At least one of tenant, workspace, app, workflow, agent, toolset is required",
        ));
    }
    q.bool("include_children")?;
    Ok(GetBalances {
        actor,
        tenant,
        filters,
        limit: q.limit(MAX_PAGE_SIZE)?,
        after: q.get("cursor").map(decode_budget_cursor).transpose()?,
    })
}

pub async fn balances(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let q = Query::parse(raw.as_deref());
    let parse = || balance_query(actor.clone(), &q);
    let query = app.validated(&actor, Plane::Runtime, parse).await?;
    let (page, tenant) = app.run(query, Plane::Runtime).await?;
    let amounts: Vec<ledger::Balance> = page.items.iter().map(ledger::Balance::from).collect();
    let response = BalanceResponse {
        balances: amounts.iter().map(Balance::from).collect(),
        next_cursor: next_cursor(page.has_more, &page.items, budget_position),
        has_more: page.has_more,
    };
    tenant_json(StatusCode::OK, &response, tenant)
}

pub async fn list_reservations(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let query = app
        .validated(&actor, Plane::Runtime, || {
            let limit = q.limit(MAX_PAGE_SIZE)?;
            parse_list_query(actor.clone(), |name| q.get(name).map(str::to_string), limit)
        })
        .await?;
    let cursor_query = query.clone();
    let (page, tenant) = app.run(query, Plane::Runtime).await?;
    let (rows, next) = (page.rows, page.next);
    let include = Include::parse(q.get("include"));
    let response = ReservationListResponse {
        reservations: rows
            .iter()
            .map(|r| ReservationSummary::new(r, include))
            .collect(),
        has_more: next.is_some(),
        next_cursor: next.map(|p| encode_list_cursor(&cursor_query, p)),
    };
    tenant_json(StatusCode::OK, &response, tenant)
}
