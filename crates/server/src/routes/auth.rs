//! Credentials (`/v1/auth`): introspect the caller's key, validate a key secret.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use ledger::{Authenticate, ValidateApiKey};
use protocol::auth::{IntrospectResponse, ValidateRequest, ValidationResponse};
use protocol::Plane;
use sha2::{Digest, Sha256};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Errors};
use crate::reply::{json, Answer};
use crate::routes::body::{admin_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(introspect))
        .routes(routes!(validate_api_key))
}

#[utoipa::path(
    get, path = "/v1/auth/introspect", tag = "Dashboard", operation_id = "introspectAuth",
    summary = "The caller's permissions and capabilities",
    description = "With the admin key: every capability. With a tenant key: its permissions, \
        tenant, scope filter and the capabilities they give.",
    responses(
        (status = 200, description = "The credential", body = IntrospectResponse),
        Errors<()>,
    ),
    security(("AdminKeyAuth" = []), ("ApiKeyAuth" = [])),
)]
pub async fn introspect(State(app): State<Arc<App>>, Headers(headers): Headers) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let (principal, _) = app.run(Authenticate(actor), Plane::Admin).await?;
    Ok(json(StatusCode::OK, &IntrospectResponse::from(principal)))
}

#[utoipa::path(
    post, path = "/v1/auth/validate", tag = "Authentication", operation_id = "validateApiKey",
    summary = "Validate an API key secret and resolve its tenant",
    description = "200 for every well-formed request: `valid` says whether the key \
        authenticates now (it exists, is ACTIVE and unexpired, and its tenant is ACTIVE), \
        `reason` why not.",
    request_body = ValidateRequest,
    responses(
        (status = 200, description = "The verdict", body = ValidationResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn validate_api_key(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: ValidateRequest = admin_body(&app, &actor, &bytes).await?;
    let operation = ValidateApiKey {
        actor,
        digest: Sha256::digest(request.key_secret.as_bytes()).into(),
    };
    let (verdict, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &ValidationResponse::from(verdict)))
}
