//! Public health probes (the SDKs' own test suites call them without a key).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use store::Store;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::reply::json;

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(liveness))
        .routes(routes!(readiness))
}

/// A health probe's answer.
#[derive(Serialize, ToSchema)]
pub struct Health {
    status: HealthStatus,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HealthStatus {
    Up,
    Down,
}

#[utoipa::path(
    get, path = "/actuator/health", tag = "Operations", operation_id = "health",
    summary = "Health: UP when the store can take writes",
    responses(
        (status = 200, description = "UP", body = Health),
        (status = 503, description = "DOWN: the store cannot take writes", body = Health),
    ),
)]
pub async fn health(State(app): State<Arc<App>>) -> Response {
    store_health(&app)
}

#[utoipa::path(
    get, path = "/actuator/health/liveness", tag = "Operations", operation_id = "liveness",
    summary = "Liveness: the process answers",
    responses((status = 200, description = "UP", body = Health)),
)]
pub async fn liveness() -> Response {
    json(
        StatusCode::OK,
        &Health {
            status: HealthStatus::Up,
        },
    )
}

#[utoipa::path(
    get, path = "/actuator/health/readiness", tag = "Operations", operation_id = "readiness",
    summary = "Readiness: UP when the store can take writes",
    responses(
        (status = 200, description = "UP", body = Health),
        (status = 503, description = "DOWN: the store cannot take writes", body = Health),
    ),
)]
pub async fn readiness(State(app): State<Arc<App>>) -> Response {
    store_health(&app)
}

/// Health and readiness: UP when the store can take writes.
fn store_health(app: &App) -> Response {
    let (code, status) = if app.store().health().ready {
        (StatusCode::OK, HealthStatus::Up)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Down)
    };
    json(code, &Health { status })
}
