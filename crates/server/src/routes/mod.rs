//! The route table.

mod admin;
mod health;
mod metrics;
mod policies;
mod runtime;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use protocol::MAX_BODY_BYTES;

use crate::app::App;
use crate::correlation::{self, Correlation};
use crate::openapi;
use crate::ratelimit::{self, Limiter, RateLimit};

pub fn router(app: Arc<App>, rate_limit: Option<RateLimit>) -> Router {
    let api = api_routes();
    let api = match rate_limit {
        Some(limit) => api.layer(middleware::from_fn_with_state(
            Arc::new(Limiter::new(limit)),
            ratelimit::layer,
        )),
        None => api,
    };
    Router::new()
        .route("/actuator/health", get(health::health))
        .route("/actuator/health/liveness", get(health::liveness))
        .route("/actuator/health/readiness", get(health::health))
        .route("/metrics", get(metrics::metrics))
        .merge(openapi::routes())
        .merge(api)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(app.clone(), every_request))
        .with_state(app)
}

/// What every response gets: the correlation ids and the error body ([`correlation`]), and
/// the request metrics ([`metrics`]). One middleware, not one per concern: each `from_fn`
/// layer costs every request a boxed service and a boxed future.
async fn every_request(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let correlation = Correlation::of(request.headers());
    let response = metrics::observe(&app, request, next).await;
    correlation::finish(response, correlation)
}

/// The runtime and admin planes (everything a key is presented to).
fn api_routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            "/v1/reservations",
            post(runtime::create_reservation).get(runtime::list_reservations),
        )
        .route("/v1/reservations/{id}", get(runtime::get_reservation))
        .route("/v1/reservations/{id}/commit", post(runtime::commit))
        .route("/v1/reservations/{id}/release", post(runtime::release))
        .route("/v1/reservations/{id}/extend", post(runtime::extend))
        .route("/v1/decide", post(runtime::decide))
        .route("/v1/events", post(runtime::create_event))
        .route("/v1/balances", get(runtime::balances))
        .route("/v1/admin/tenants", post(admin::create_tenant))
        .route(
            "/v1/admin/tenants/{id}",
            get(admin::get_tenant).patch(admin::update_tenant),
        )
        .route("/v1/admin/api-keys", post(admin::create_api_key))
        .route(
            "/v1/admin/api-keys/{id}",
            axum::routing::delete(admin::revoke_api_key),
        )
        .route(
            "/v1/admin/budgets",
            post(admin::create_budget)
                .get(admin::list_budgets)
                .patch(admin::update_budget),
        )
        .route("/v1/admin/budgets/lookup", get(admin::lookup_budget))
        .route("/v1/admin/budgets/fund", post(admin::fund_budget))
        .route("/v1/admin/budgets/freeze", post(admin::freeze_budget))
        .route("/v1/admin/budgets/unfreeze", post(admin::unfreeze_budget))
        .route(
            "/v1/admin/policies",
            post(policies::create_policy).get(policies::list_policies),
        )
        .route(
            "/v1/admin/policies/{id}",
            axum::routing::patch(policies::update_policy),
        )
}
