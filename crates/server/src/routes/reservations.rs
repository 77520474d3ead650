//! Reservations: reserve, commit, release, extend, and the reads of one or a page.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use ledger::{Actor, Decision, GetReservation, Operation};
use protocol::listing::{
    encode_list_cursor, ReservationListParams, ReservationListResponse, ReservationSummary,
};
use protocol::runtime::{
    CommitRequest, CommitResponse, IdempotencyHeader, ReleaseRequest, ReleaseResponse,
    ReservationCreateRequest, ReservationCreateResponse, ReservationDetail,
    ReservationExtendRequest, ReservationExtendResponse, ReservationPath,
};
use protocol::{parse_query, Plane, Validate};
use serde::de::DeserializeOwned;
use serde_json::Map;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::audit::AuditDetail;
use crate::auth::{self, Headers};
use crate::ids;
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden, Gone, NotFound};
use crate::reply::{json, tenant_json, with_date, with_tenant, Answer, Failure};
use crate::routes::body::{keyed_body, Keyed, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_reservation, list_reservations))
        .routes(routes!(get_reservation))
        .routes(routes!(commit))
        .routes(routes!(extend))
}

/// The release, apart: the one runtime write an operator makes with the admin key, so it is
/// audited (see `crate::audit`).
pub fn release_routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(release))
}

#[utoipa::path(
    post, path = "/v1/reservations", tag = "Reservations", operation_id = "createReservation",
    summary = "Reserve an estimate on every budget the subject names",
    description = "Holds `estimate` on the budget of every scope derived from the subject \
        (tenant › workspace › app › workflow › agent › toolset) that has one in that unit. \
        A refusal is an error (409, or 404 when no budget exists); with `dry_run` it is a \
        200 DENY with a `reason_code`, and nothing is held. Answers carry a `Date` header.",
    params(IdempotencyHeader),
    request_body = ReservationCreateRequest,
    responses(
        (status = 200, description = "Reserved (or, with dry_run, evaluated)",
            body = ReservationCreateResponse, headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn create_reservation(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(body): RawBody,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: ReservationCreateRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let operation = request.into_command(actor, ids::reservation_id());
    let ran = app.run(operation, Plane::Runtime).await;
    app.note_decision(&ran, |r| r.once.result.decision == Decision::Deny);
    let (reserved, tenant) = ran?;
    let response = json(
        StatusCode::OK,
        &ReservationCreateResponse::new(&reserved.once.result, reserved.remaining_ttl_ms),
    );
    Ok(with_date(with_tenant(response, tenant.as_deref())))
}

/// A write on the reservation the path names: its id, the request's headers and its
/// idempotent body, extracted in that order, as the separate extractors would be.
pub struct OnReservation {
    path: ReservationPath,
    headers: HeaderMap,
    body: Bytes,
}

impl FromRequest<Arc<App>> for OnReservation {
    type Rejection = Response;

    async fn from_request(request: Request, state: &Arc<App>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path(path) = Path::<ReservationPath>::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Ok(Headers(headers)) = Headers::from_request_parts(&mut parts, state).await;
        let RawBody(body) = RawBody::from_request(Request::from_parts(parts, body), state).await?;
        Ok(OnReservation {
            path,
            headers,
            body,
        })
    }
}

impl OnReservation {
    /// Parses the body, checks the id, and runs the operation they become for `actor`.
    async fn run<T: DeserializeOwned + Validate + Keyed, O: Operation<Output: AuditDetail>>(
        self,
        app: &App,
        actor: Actor,
        operation: impl FnOnce(T, Actor, String) -> O,
    ) -> Result<(O::Output, Option<Arc<str>>), Failure> {
        let request: T = keyed_body(app, &actor, &self.headers, &self.body).await?;
        let id = app
            .validated(&actor, Plane::Runtime, || self.path.into_id())
            .await?;
        app.mutate(operation(request, actor, id), Plane::Runtime)
            .await
    }
}

#[utoipa::path(
    post, path = "/v1/reservations/{reservation_id}/commit", tag = "Reservations",
    operation_id = "commitReservation",
    summary = "Charge the actual amount; the unused part flows back",
    description = "An actual above the estimate is charged under the reservation's overage \
        policy (REJECT: 409 BUDGET_EXCEEDED; ALLOW_IF_AVAILABLE: up to what is available; \
        ALLOW_WITH_OVERDRAFT: into debt up to the overdraft limit).",
    params(ReservationPath, IdempotencyHeader),
    request_body = CommitRequest,
    responses(
        (status = 200, description = "Committed", body = CommitResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict, Gone)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn commit(State(app): State<Arc<App>>, request: OnReservation) -> Answer {
    let actor = auth::tenant(&request.headers)?;
    let ran = request.run(&app, actor, CommitRequest::into_command).await;
    app.note_settled(&ran);
    let (committed, tenant) = ran?;
    let response = CommitResponse::from(&*committed.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

#[utoipa::path(
    post, path = "/v1/reservations/{reservation_id}/release", tag = "Reservations",
    operation_id = "releaseReservation",
    summary = "Release the whole hold",
    params(ReservationPath, IdempotencyHeader),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "Released", body = ReleaseResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict, Gone)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn release(State(app): State<Arc<App>>, request: OnReservation) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &request.headers)?;
    let ran = request
        .run(&app, actor, |body: ReleaseRequest, actor, id| {
            // An operator's release is audited with its reason, as the reference's is (a
            // tenant's is not audited, and builds nothing here).
            if actor == Actor::Admin {
                let reason = body.reason.clone().unwrap_or_default();
                crate::audit::annotate(Map::from_iter([("reason".into(), reason.into())]), None);
            }
            body.into_command(actor, id)
        })
        .await;
    app.note_settled(&ran);
    let (released, tenant) = ran?;
    let response = ReleaseResponse::from(&*released.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

#[utoipa::path(
    post, path = "/v1/reservations/{reservation_id}/extend", tag = "Reservations",
    operation_id = "extendReservation",
    summary = "Move an active reservation's expiry later",
    description = "At most the tenant's `max_reservation_extensions` times (then 409 \
        MAX_EXTENSIONS_EXCEEDED). Answers carry a `Date` header.",
    params(ReservationPath, IdempotencyHeader),
    request_body = ReservationExtendRequest,
    responses(
        (status = 200, description = "Extended", body = ReservationExtendResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict, Gone)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn extend(State(app): State<Arc<App>>, request: OnReservation) -> Answer {
    let actor = auth::tenant(&request.headers)?;
    let (extended, tenant) = request
        .run(&app, actor, ReservationExtendRequest::into_command)
        .await?;
    let response = ReservationExtendResponse::new(&extended.once.result, extended.remaining_ttl_ms);
    tenant_json(StatusCode::OK, &response, tenant).map(with_date)
}

#[utoipa::path(
    get, path = "/v1/reservations/{reservation_id}", tag = "Reservations",
    operation_id = "getReservation",
    summary = "Read one reservation",
    params(ReservationPath),
    responses(
        (status = 200, description = "The reservation", body = ReservationDetail,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Gone)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn get_reservation(
    State(app): State<Arc<App>>,
    Path(path): Path<ReservationPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let id = app
        .validated(&actor, Plane::Runtime, || path.into_id())
        .await?;
    let operation = GetReservation {
        actor,
        reservation_id: id,
    };
    let (r, tenant) = app.run(operation, Plane::Runtime).await?;
    tenant_json(StatusCode::OK, &ReservationDetail::from(&r), tenant)
}

#[utoipa::path(
    get, path = "/v1/reservations", tag = "Reservations", operation_id = "listReservations",
    summary = "List a tenant's reservations",
    description = "Filtered and ordered; pages continue with `cursor`. A page may come back \
        short, with `has_more`, when few rows match.",
    params(ReservationListParams),
    responses(
        (status = 200, description = "A page of reservations",
            body = ReservationListResponse, headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn list_reservations(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let (query, include) = app
        .validated(&actor, Plane::Runtime, || {
            parse_query::<ReservationListParams>(raw.as_deref())?.into_query(actor.clone())
        })
        .await?;
    let cursor_query = query.clone();
    let (page, tenant) = app.list_reservations(query).await?;
    let (rows, next) = (page.rows, page.next);
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
