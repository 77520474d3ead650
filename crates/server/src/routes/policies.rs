//! Policies: the admin plane's caps, overage and TTL rules for scopes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use ledger::{CreatePolicy, ListPolicies, Policy, PolicyListQuery, PolicyStatus, UpdatePolicy};
use protocol::policy::{
    PolicyCreateRequest, PolicyListResponse, PolicyResponse, PolicyUpdateRequest,
};
use protocol::{parse_body, ApiError, Plane, MAX_PAGE_SIZE};

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::query::Query;
use crate::reply::{next_cursor, tenant_json, Answer};

fn policy_answer(policy: Policy, status: StatusCode, tenant: Option<Arc<str>>) -> Answer {
    tenant_json(status, &PolicyResponse::from(policy), tenant)
}

pub async fn create_policy(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: PolicyCreateRequest = app
        .validated(&actor, Plane::Admin, || parse_body(&bytes))
        .await?;
    let operation = CreatePolicy {
        actor,
        policy: request.into_new(ids::policy_id()),
    };
    let (policy, tenant) = app.run(operation, Plane::Admin).await?;
    policy_answer(policy, StatusCode::CREATED, tenant)
}

fn list_query(q: &Query) -> Result<PolicyListQuery, ApiError> {
    Ok(PolicyListQuery {
        tenant_id: q.get("tenant_id").map(str::to_string),
        scope_pattern: q.get("scope_pattern").map(str::to_string),
        status: q
            .get("status")
            .map(|s| {
                PolicyStatus::parse(s)
                    .ok_or_else(|| ApiError::invalid("status: must be ACTIVE or DISABLED"))
            })
            .transpose()?,
        limit: q.limit(MAX_PAGE_SIZE)?,
        after: q.get("cursor").map(str::to_string),
    })
}

pub async fn list_policies(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let operation = |query| ListPolicies {
        actor: actor.clone(),
        query,
    };
    let (page, tenant) = app
        .run_parsed(&actor, Plane::Admin, || list_query(&q), operation)
        .await?;
    let response = PolicyListResponse {
        next_cursor: next_cursor(page.has_more, &page.items, |p| p.policy_id.clone()),
        policies: page.items.into_iter().map(PolicyResponse::from).collect(),
        has_more: page.has_more,
    };
    tenant_json(StatusCode::OK, &response, tenant)
}

pub async fn update_policy(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: PolicyUpdateRequest = app
        .validated(&actor, Plane::Admin, || parse_body(&bytes))
        .await?;
    let operation = UpdatePolicy {
        actor,
        policy_id: id,
        patch: request.into_patch(),
    };
    let (policy, tenant) = app.run(operation, Plane::Admin).await?;
    policy_answer(policy, StatusCode::OK, tenant)
}
