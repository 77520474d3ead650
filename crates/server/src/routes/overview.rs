//! The admin overview.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use ledger::{EventFilter, EventQuery, EventSort, EventType, GetOverview, Window, OVERVIEW_ROWS};
use protocol::overview::{OverviewResponse, RecentEvents, EVENT_WINDOW_SECONDS};
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
    description = "Tenant and budget figures are kept as they change, so they cost the same at any size; the event figures are counted on the time index of the last hour's events.",
    responses(
        (status = 200, description = "The overview", body = OverviewResponse),
        Errors<()>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn overview(State(app): State<Arc<App>>, Headers(headers): Headers) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (overview, _) = app.run(GetOverview { actor }, Plane::Admin).await?;
    let since = overview.as_of_ms - EVENT_WINDOW_SECONDS as i64 * 1000;
    let recent = app
        .store_history(move |history| {
            let latest = |event_type| {
                let query = EventQuery {
                    filter: EventFilter {
                        event_type: Some(event_type),
                        from_ms: Some(since),
                        ..EventFilter::default()
                    },
                    sort: EventSort::Timestamp,
                    window: Window {
                        descending: true,
                        after: None,
                        limit: OVERVIEW_ROWS,
                    },
                };
                history.event_page(&query).map(|page| page.events)
            };
            Ok(RecentEvents {
                by_category: history.event_counts(since)?,
                denials: latest(EventType::ReservationDenied)?,
                expiries: latest(EventType::ReservationExpired)?,
            })
        })
        .await?;
    Ok(json(
        StatusCode::OK,
        &OverviewResponse::new(overview, recent),
    ))
}
