//! Tenants (admin plane): create, list, read, update.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use ledger::{CreateTenant, GetTenant, Tenant, TenantWritten, UpdateTenant};
use protocol::bulk::{BulkActionResponse, TenantBulkActionRequest};
use protocol::tenant::{
    TenantCreateRequest, TenantListParams, TenantListResponse, TenantPath, TenantResponse,
    TenantUpdateRequest,
};
use protocol::{parse_query, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Conflict, Errors, NotFound};
use crate::reply::{json, Answer};
use crate::routes::body::{admin_body, bulk_action, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_tenant, list_tenants))
        .routes(routes!(bulk_action_tenants))
        .routes(routes!(get_tenant, update_tenant))
}

fn tenant_answer(tenant: Tenant) -> Answer {
    Ok(json(StatusCode::OK, &TenantResponse::from(tenant)))
}

#[utoipa::path(
    post, path = "/v1/admin/tenants", tag = "Tenants", operation_id = "createTenant",
    summary = "Create a tenant",
    request_body = TenantCreateRequest,
    responses(
        (status = 201, description = "Created", body = TenantResponse),
        (status = 200, description = "A tenant with this id and name already exists: it is \
            returned unchanged", body = TenantResponse),
        Errors<(BadRequest, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn create_tenant(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantCreateRequest = admin_body(&app, &actor, &bytes).await?;
    crate::audit::about(&request.tenant_id);
    let operation = CreateTenant {
        actor,
        tenant: request.into_new(),
    };
    let (TenantWritten { tenant, created }, _) = app.mutate(operation, Plane::Admin).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(status, &TenantResponse::from(tenant)))
}

#[utoipa::path(
    get, path = "/v1/admin/tenants", tag = "Tenants", operation_id = "listTenants",
    summary = "List tenants",
    params(TenantListParams),
    responses(
        (status = 200, description = "A page of tenants", body = TenantListResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_tenants(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (operation, next) = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<TenantListParams>(raw.as_deref())?.into_list(actor.clone())
        })
        .await?;
    let (page, _) = app.run(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &TenantListResponse::new(&next, page)))
}

#[utoipa::path(
    get, path = "/v1/admin/tenants/{tenant_id}", tag = "Tenants", operation_id = "getTenant",
    summary = "Read a tenant",
    params(TenantPath),
    responses(
        (status = 200, description = "The tenant", body = TenantResponse),
        Errors<(NotFound,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn get_tenant(
    State(app): State<Arc<App>>,
    Path(TenantPath { tenant_id: id }): Path<TenantPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let operation = GetTenant {
        actor,
        tenant_id: id,
    };
    let (tenant, _) = app.run(operation, Plane::Admin).await?;
    tenant_answer(tenant)
}

#[utoipa::path(
    patch, path = "/v1/admin/tenants/{tenant_id}", tag = "Tenants",
    operation_id = "updateTenant",
    summary = "Update a tenant (status, name, metadata, reservation defaults)",
    params(TenantPath),
    request_body = TenantUpdateRequest,
    responses(
        (status = 200, description = "The updated tenant", body = TenantResponse),
        Errors<(BadRequest, NotFound)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn update_tenant(
    State(app): State<Arc<App>>,
    Path(TenantPath { tenant_id: id }): Path<TenantPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantUpdateRequest = admin_body(&app, &actor, &bytes).await?;
    let operation = UpdateTenant {
        actor,
        tenant_id: id,
        patch: request.into_patch(),
    };
    let (tenant, _) = app.mutate(operation, Plane::Admin).await?;
    tenant_answer(tenant)
}

#[utoipa::path(
    post, path = "/v1/admin/tenants/bulk-action", tag = "Tenants",
    operation_id = "bulkActionTenants",
    summary = "Suspend, reactivate or close every tenant a filter matches",
    description = "At most 500 tenants (else 400 LIMIT_EXCEEDED, nothing changed); with \
        `expected_count`, 409 COUNT_MISMATCH unless the filter matches exactly that many. \
        Each tenant is changed or not on its own; the key replays the response for 15 \
        minutes.",
    request_body = TenantBulkActionRequest,
    responses(
        (status = 200, description = "Row by row", body = BulkActionResponse),
        Errors<(BadRequest, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn bulk_action_tenants(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    bulk_action::<TenantBulkActionRequest>(&app, actor, &bytes).await
}
