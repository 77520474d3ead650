//! The route table: one module per resource. Every operation is declared once, by the
//! `#[utoipa::path]` attribute on its handler, and registered with `routes!`, which routes it
//! by that declaration and adds it to the OpenAPI document (`crate::openapi`).

mod api_keys;
mod audit;
mod auth;
mod balances;
mod body;
mod budgets;
mod decisions;
mod docs;
mod event_log;
mod events;
mod health;
mod metrics;
mod overview;
mod policies;
mod reservations;
mod tenants;
mod webhooks;

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};

use axum::extract::{ConnectInfo, DefaultBodyLimit, MatchedPath, RawPathParams, Request, State};
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use protocol::MAX_BODY_BYTES;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::audit::{AuditIds, AuditScope, OperationIndex, Presented, RequestFacts};
use crate::correlation::{self, Correlation};
use crate::dashboard::{self, Dashboard};
use crate::openapi;
use crate::origin::RequestOrigin;
use crate::ratelimit::{self, Limiter, RateLimit};
use crate::reply::{Failure, ForwardTo};

pub fn router(
    app: Arc<App>,
    rate_limit: Option<RateLimit>,
    dashboard: Option<Dashboard>,
) -> Router {
    let api: Router<Arc<App>> = api_routes(Some(&app)).into();
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
    public_routes().merge(api_routes(None))
}

/// What every response gets: the correlation ids and the error body ([`correlation`]), and
/// the request metrics ([`metrics`]). One middleware, not one per concern: each `from_fn`
/// layer costs every request a boxed service and a boxed future.
async fn every_request(State(app): State<Arc<App>>, mut request: Request, next: Next) -> Response {
    let mut correlation = Correlation::of(request.headers());
    let refused = match app.bounds().check_head(&request) {
        Err(refused) => Some(refused),
        Ok(()) if body::declared_too_large(request.headers()) => {
            Some(correlation::framework_error(StatusCode::PAYLOAD_TOO_LARGE))
        }
        Ok(()) => None,
    };
    if let Some(refused) = refused {
        let response = correlation::finish(Failure::from(refused).into_response(), correlation);
        return body::refused_unread(request, response);
    }
    if let Some(forwarder) = app.forwarder() {
        forwarder.accept(&mut request, &mut correlation);
    }
    if crate::audit::applies(request.method(), request.uri().path(), request.headers()) {
        request.extensions_mut().insert(AuditIds {
            request_id: correlation.request_id.clone(),
            trace_id: correlation.trace_id.clone(),
        });
    }
    let origin = RequestOrigin {
        correlation,
        peer: request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip()),
    };
    let (response, correlation) =
        crate::origin::within(origin, metrics::observe(&app, request, next)).await;
    correlation::finish(response, correlation)
}

/// The operations the audit log names, from the route table's declarations.
static OPERATIONS: LazyLock<OperationIndex> =
    LazyLock::new(|| OperationIndex::new(&operations().into_openapi()));

/// The route layer of everything that may be audited (the admin plane, and the runtime's
/// release, the one runtime write the admin key may make): opens the request's
/// [`AuditScope`] and, when the request ends without its entry written by the store (it was
/// refused before its operation ran), writes the entry of its answer.
async fn audited(
    State(app): State<Arc<App>>,
    matched: MatchedPath,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let Some(ids) = request.extensions().get::<AuditIds>().cloned() else {
        return next.run(request).await;
    };
    let Some(operation) = OPERATIONS.get(request.method(), matched.as_str()).cloned() else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let text = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let query_scope = request.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "scope")
            .map(|(_, v)| v.into_owned())
    });
    let facts = RequestFacts {
        ids,
        presented: Presented::of(app.admin_key(), headers),
        user_agent: text(axum::http::header::USER_AGENT),
        source_ip: request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip().to_string()),
        path_resource: params
            .ok()
            .and_then(|p| p.iter().last().map(|(_, v)| v.to_string()))
            .or(query_scope),
        method: request.method().clone(),
        path: request.uri().path().to_string(),
        unauthenticated: app.unauthenticated().clone(),
    };
    let name = operation.operation.clone();
    let scope = Arc::new(AuditScope::new(operation, facts));
    let response = crate::audit::within(scope.clone(), next.run(request)).await;
    let status = response.status();
    // Handed to another instance (`crate::forward`), which writes the entry.
    if scope.written() || response.extensions().get::<ForwardTo>().is_some() {
        return response;
    }
    if status.is_success() {
        // A handler that changes something runs it with `App::mutate`; this is a bug.
        debug_assert!(false, "{name} succeeded without its audit entry");
        tracing::error!(operation = %name, "an audited operation succeeded without its entry");
    } else {
        let error = response
            .extensions()
            .get::<protocol::ApiError>()
            .cloned()
            .unwrap_or_else(|| correlation::framework_error(status));
        if let Some(peer) = app.audit_refusal(scope, error).await {
            let mut response = response;
            response.extensions_mut().insert(ForwardTo(peer));
            return response;
        }
    }
    response
}

/// Health probes, metrics and the document: no rate limit.
fn public_routes() -> OpenApiRouter<Arc<App>> {
    health::routes()
        .routes(routes!(metrics::metrics))
        .routes(routes!(docs::openapi_json))
}

/// The runtime and admin planes (everything a key is presented to). With `app`, the routes
/// that may be audited get the audit layer; only those pay for it, the runtime's hot path
/// does not.
fn api_routes(app: Option<&Arc<App>>) -> OpenApiRouter<Arc<App>> {
    let runtime = reservations::routes()
        .merge(decisions::routes())
        .merge(events::routes())
        .merge(balances::routes());
    let auditable = reservations::release_routes()
        .merge(tenants::routes())
        .merge(api_keys::routes())
        .merge(auth::routes())
        .merge(overview::routes())
        .merge(audit::routes())
        .merge(budgets::routes())
        .merge(policies::routes())
        .merge(webhooks::routes())
        .merge(event_log::routes());
    let auditable = match app {
        Some(app) => auditable.route_layer(middleware::from_fn_with_state(app.clone(), audited)),
        None => auditable,
    };
    runtime.merge(auditable)
}
