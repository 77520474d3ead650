//! The admin overview.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use ledger::GetOverview;
use protocol::overview::OverviewResponse;
use protocol::Plane;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::Errors;
use crate::reply::{json, Answer};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(overview))
}

#[utoipa::path(
    get, path = "/v1/admin/overview", tag = "Dashboard", operation_id = "getAdminOverview",
    summary = "Counts and top offenders for the operator's dashboard",
    description = "Kept as tenants and budgets change, so it costs the same at any size.",
    responses(
        (status = 200, description = "The overview", body = OverviewResponse),
        Errors<()>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn overview(State(app): State<Arc<App>>, Headers(headers): Headers) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (overview, _) = app.run(GetOverview { actor }, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &OverviewResponse::from(overview)))
}
