//! Events: spend that already happened.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use protocol::runtime::{EventCreateRequest, EventCreateResponse, IdempotencyHeader};
use protocol::Plane;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden, NotFound};
use crate::reply::{tenant_json, Answer};
use crate::routes::body::{keyed_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(create_event))
}

#[utoipa::path(
    post, path = "/v1/events", tag = "Events", operation_id = "createEvent",
    summary = "Charge spend that already happened",
    description = "Charged under `overage_policy` like a commit without a reservation; not \
        blocked by debt or an over-limit budget.",
    params(IdempotencyHeader),
    request_body = EventCreateRequest,
    responses(
        (status = 201, description = "Applied", body = EventCreateResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn create_event(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(body): RawBody,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: EventCreateRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let operation = request.into_command(actor, ids::event_id());
    let (recorded, tenant) = app.run(operation, Plane::Runtime).await?;
    let response = EventCreateResponse::from(&*recorded.result);
    tenant_json(StatusCode::CREATED, &response, tenant)
}
