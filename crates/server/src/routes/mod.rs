//! The route table: one module per resource. Every operation is declared once, by the
//! `#[utoipa::path]` attribute on its handler, and registered with `routes!`, which routes it
//! by that declaration and adds it to the OpenAPI document (`crate::openapi`).

mod api_keys;
mod auth;
mod balances;
mod body;
mod budgets;
mod decisions;
mod docs;
mod events;
mod health;
mod metrics;
mod overview;
mod policies;
mod reservations;
mod tenants;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::handler::Handler;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use protocol::MAX_BODY_BYTES;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::correlation::{self, Correlation};
use crate::dashboard::{self, Dashboard};
use crate::openapi;
use crate::ratelimit::{self, Limiter, RateLimit};

pub fn router(
    app: Arc<App>,
    rate_limit: Option<RateLimit>,
    dashboard: Option<Dashboard>,
) -> Router {
    let api: Router<Arc<App>> = api_routes().into();
    let api = match rate_limit {
        Some(limit) => api.layer(middleware::from_fn_with_state(
            Arc::new(Limiter::new(limit)),
            ratelimit::layer,
        )),
        None => api,
    };
    let router = Router::from(public_routes())
        .merge(api)
        .merge(openapi::ui());
    // The fallback answers only what no route matched, so the dashboard never shadows the API.
    let router = match dashboard {
        Some(files) => router.fallback_service(dashboard::serve.with_state(files)),
        None => router,
    };
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(app.clone(), every_request))
        .with_state(app)
}

/// Every routed operation, for the OpenAPI document.
pub fn operations() -> OpenApiRouter<Arc<App>> {
    public_routes().merge(api_routes())
}

/// What every response gets: the correlation ids and the error body ([`correlation`]), and
/// the request metrics ([`metrics`]). One middleware, not one per concern: each `from_fn`
/// layer costs every request a boxed service and a boxed future.
async fn every_request(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let correlation = Correlation::of(request.headers());
    let response = metrics::observe(&app, request, next).await;
    correlation::finish(response, correlation)
}

/// Health probes, metrics and the document: no rate limit.
fn public_routes() -> OpenApiRouter<Arc<App>> {
    health::routes()
        .routes(routes!(metrics::metrics))
        .routes(routes!(docs::openapi_json))
}

/// The runtime and admin planes (everything a key is presented to).
fn api_routes() -> OpenApiRouter<Arc<App>> {
    reservations::routes()
        .merge(decisions::routes())
        .merge(events::routes())
        .merge(balances::routes())
        .merge(tenants::routes())
        .merge(api_keys::routes())
        .merge(auth::routes())
        .merge(overview::routes())
        .merge(budgets::routes())
        .merge(policies::routes())
}
