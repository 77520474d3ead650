//! Policies: the admin plane's caps, overage and TTL rules for scopes.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use ledger::{CreatePolicy, ListPolicies, Policy, UpdatePolicy};
use protocol::policy::{
    PolicyCreateRequest, PolicyListParams, PolicyListResponse, PolicyPath, PolicyResponse,
    PolicyUpdateRequest,
};
use protocol::{parse_query, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden, NotFound};
use crate::reply::{next_cursor, tenant_json, Answer};
use crate::routes::body::{admin_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_policy, list_policies))
        .routes(routes!(update_policy))
}

fn policy_answer(policy: Policy, status: StatusCode, tenant: Option<Arc<str>>) -> Answer {
    tenant_json(status, &PolicyResponse::from(policy), tenant)
}

#[utoipa::path(
    post, path = "/v1/admin/policies", tag = "Policies", operation_id = "createPolicy",
    summary = "Create a policy for a scope pattern",
    request_body = PolicyCreateRequest,
    responses(
        (status = 201, description = "Created", body = PolicyResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn create_policy(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: PolicyCreateRequest = admin_body(&app, &actor, &bytes).await?;
    let operation = CreatePolicy {
        actor,
        policy: request.into_new(ids::policy_id()),
    };
    let (policy, tenant) = app.mutate(operation, Plane::Admin).await?;
    policy_answer(policy, StatusCode::CREATED, tenant)
}

#[utoipa::path(
    get, path = "/v1/admin/policies", tag = "Policies", operation_id = "listPolicies",
    summary = "List a tenant's policies",
    params(PolicyListParams),
    responses(
        (status = 200, description = "A page of policies", body = PolicyListResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn list_policies(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let parse = || parse_query::<PolicyListParams>(raw.as_deref())?.into_query();
    let operation = |query| ListPolicies {
        actor: actor.clone(),
        query,
    };
    let (page, tenant) = app
        .run_parsed(&actor, Plane::Admin, parse, operation)
        .await?;
    let response = PolicyListResponse {
        next_cursor: next_cursor(page.has_more, &page.items, |p| p.policy_id.clone()),
        policies: page.items.into_iter().map(PolicyResponse::from).collect(),
        has_more: page.has_more,
    };
    tenant_json(StatusCode::OK, &response, tenant)
}

#[utoipa::path(
    patch, path = "/v1/admin/policies/{policy_id}", tag = "Policies",
    operation_id = "updatePolicy",
    summary = "Update a policy",
    params(PolicyPath),
    request_body = PolicyUpdateRequest,
    responses(
        (status = 200, description = "The updated policy", body = PolicyResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn update_policy(
    State(app): State<Arc<App>>,
    Path(PolicyPath { policy_id: id }): Path<PolicyPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: PolicyUpdateRequest = admin_body(&app, &actor, &bytes).await?;
    let operation = UpdatePolicy {
        actor,
        policy_id: id,
        patch: request.into_patch(),
    };
    let (policy, tenant) = app.mutate(operation, Plane::Admin).await?;
    policy_answer(policy, StatusCode::OK, tenant)
}
