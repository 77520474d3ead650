//! The event log: `GET /v1/admin/events` (every event), `GET /v1/admin/events/{id}`, and
//! `GET /v1/events` (a tenant key's own tenant, tenant-accessible categories only). Read from
//! the history store, never through the ledger.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use ledger::{Authenticate, Permission, Principal};
use protocol::webhook::{
    EventListParams, EventListResponse, EventPath, EventResponse, TenantEventListParams,
};
use protocol::{parse_query, ApiError, ErrorCode, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Errors, Forbidden, NotFound};
use crate::reply::{json, Answer};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(get_event))
        .routes(routes!(list_tenant_events))
}

#[utoipa::path(
    get, path = "/v1/admin/events", tag = "Events", operation_id = "listEvents",
    summary = "Query the event log",
    description = "Every event the server emitted, written in the same durable step as the \
        change that caused it. Kept 90 days unless configured otherwise.",
    params(EventListParams),
    responses(
        (status = 200, description = "A page of events", body = EventListResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_events(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (query, next) = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<EventListParams>(raw.as_deref())?.into_query(None)
        })
        .await?;
    let page = app
        .store_history(move |history| history.event_page(&query))
        .await?;
    Ok(json(StatusCode::OK, &EventListResponse::new(&next, page)))
}

#[utoipa::path(
    get, path = "/v1/admin/events/{event_id}", tag = "Events", operation_id = "getEvent",
    summary = "Get one event",
    params(EventPath),
    responses(
        (status = 200, description = "The event", body = EventResponse),
        Errors<(NotFound,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn get_event(
    State(app): State<Arc<App>>,
    Path(EventPath { event_id }): Path<EventPath>,
    Headers(headers): Headers,
) -> Answer {
    auth::admin(app.admin_key(), &headers)?;
    let id = event_id.clone();
    let event = app.store_history(move |history| history.event(&id)).await?;
    match event {
        Some(event) => Ok(json(StatusCode::OK, &EventResponse::from(event))),
        None => Err(ApiError::new(
            404,
            ErrorCode::EventNotFound,
            format!("Event not found: {event_id}"),
        )
        .into()),
    }
}

#[utoipa::path(
    get, path = "/v1/events", tag = "Events", operation_id = "listTenantEvents",
    summary = "The caller's tenant's events",
    description = "Only the tenant-accessible categories (budget, reservation, tenant). Needs \
        `events:read`.",
    params(TenantEventListParams),
    responses(
        (status = 200, description = "A page of events", body = EventListResponse),
        Errors<(BadRequest, Forbidden)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn list_tenant_events(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let (principal, _) = app.run(Authenticate(actor), Plane::Admin).await?;
    let tenant = match principal {
        Principal::Tenant {
            tenant_id,
            permissions,
            ..
        } => {
            if !Permission::EventsRead.granted_by(&permissions) {
                return Err(ApiError::new(
                    403,
                    ErrorCode::InsufficientPermissions,
                    "API key lacks required permission: events:read",
                )
                .into());
            }
            tenant_id
        }
        Principal::Admin => {
            return Err(ApiError::unauthorized("A tenant API key is required").into())
        }
    };
    let (query, next) = parse_query::<TenantEventListParams>(raw.as_deref())
        .map(EventListParams::from)?
        .into_query(Some(tenant))?;
    let page = app
        .store_history(move |history| history.event_page(&query))
        .await?;
    Ok(json(StatusCode::OK, &EventListResponse::new(&next, page)))
}
