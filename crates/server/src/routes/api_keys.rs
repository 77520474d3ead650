//! API keys (admin plane): issue, list, update and revoke tenants' keys.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use ledger::{CreateApiKey, RevokeApiKey, UpdateApiKey};
use protocol::api_key::{
    ApiKeyCreateRequest, ApiKeyCreateResponse, ApiKeyListParams, ApiKeyListResponse,
    ApiKeyResponse, ApiKeyUpdateRequest, KeyPath, RevokeParams,
};
use protocol::{parse_query, Plane};
use sha2::{Digest, Sha256};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::openapi::{BadRequest, Conflict, Errors, NotFound};
use crate::reply::{json, Answer};
use crate::routes::body::{admin_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_api_key, list_api_keys))
        .routes(routes!(update_api_key, revoke_api_key))
}

#[utoipa::path(
    post, path = "/v1/admin/api-keys", tag = "API Keys", operation_id = "createApiKey",
    summary = "Issue an API key for a tenant",
    request_body = ApiKeyCreateRequest,
    responses(
        (status = 201, description = "Created; `key_secret` is shown only now",
            body = ApiKeyCreateResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn create_api_key(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: ApiKeyCreateRequest = admin_body(&app, &actor, &bytes).await?;
    let secret = ids::new_key_secret();
    let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    let operation = CreateApiKey {
        actor,
        key: request.into_new(ids::key_id(), &secret, digest),
    };
    let (key, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(json(
        StatusCode::CREATED,
        &ApiKeyCreateResponse::new(key, secret),
    ))
}

#[utoipa::path(
    delete, path = "/v1/admin/api-keys/{key_id}", tag = "API Keys",
    operation_id = "revokeApiKey",
    summary = "Revoke an API key",
    params(KeyPath, RevokeParams),
    responses(
        (status = 200, description = "The revoked key", body = ApiKeyResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn revoke_api_key(
    State(app): State<Arc<App>>,
    Path(KeyPath { key_id: id }): Path<KeyPath>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let reason = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<RevokeParams>(raw.as_deref())?.into_reason()
        })
        .await?;
    let operation = RevokeApiKey {
        actor,
        key_id: id,
        reason,
    };
    let (key, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &ApiKeyResponse::new(key)))
}

#[utoipa::path(
    get, path = "/v1/admin/api-keys", tag = "API Keys", operation_id = "listApiKeys",
    summary = "List API keys",
    description = "Every tenant's keys, or one tenant's with `tenant_id`; never a secret.",
    params(ApiKeyListParams),
    responses(
        (status = 200, description = "A page of keys", body = ApiKeyListResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_api_keys(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (operation, next) = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<ApiKeyListParams>(raw.as_deref())?.into_list(actor.clone())
        })
        .await?;
    let (page, _) = app.run(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &ApiKeyListResponse::new(&next, page)))
}

#[utoipa::path(
    patch, path = "/v1/admin/api-keys/{key_id}", tag = "API Keys",
    operation_id = "updateApiKey",
    summary = "Update an API key (name, description, permissions, scope filter, metadata)",
    params(KeyPath),
    request_body = ApiKeyUpdateRequest,
    responses(
        (status = 200, description = "The updated key", body = ApiKeyResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn update_api_key(
    State(app): State<Arc<App>>,
    Path(KeyPath { key_id: id }): Path<KeyPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: ApiKeyUpdateRequest = admin_body(&app, &actor, &bytes).await?;
    let operation = UpdateApiKey {
        actor,
        key_id: id,
        patch: request.into_patch(),
    };
    let (key, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &ApiKeyResponse::new(key)))
}
