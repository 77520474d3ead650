//! Decisions: would a spend be admitted, without holding anything.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use ledger::Decision;
use protocol::runtime::{DecisionRequest, DecisionResponse, IdempotencyHeader};
use protocol::Plane;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden};
use crate::reply::{tenant_json, Answer};
use crate::routes::body::{keyed_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(decide))
}

#[utoipa::path(
    post, path = "/v1/decide", tag = "Decisions", operation_id = "decide",
    summary = "Would this spend be admitted?",
    description = "Evaluates like a reservation without holding anything: a refusal is a \
        200 DENY with a `reason_code`.",
    params(IdempotencyHeader),
    request_body = DecisionRequest,
    responses(
        (status = 200, description = "The decision", body = DecisionResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, Conflict)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn decide(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(body): RawBody,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let request: DecisionRequest = keyed_body(&app, &actor, &headers, &body).await?;
    let ran = app.run(request.into_command(actor), Plane::Runtime).await;
    app.note_decision(&ran, |d| d.result.decision == Decision::Deny);
    let (decided, tenant) = ran?;
    tenant_json(
        StatusCode::OK,
        &DecisionResponse::from(&*decided.result),
        tenant,
    )
}
