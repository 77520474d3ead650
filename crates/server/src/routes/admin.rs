//! The admin plane's provisioning slice: tenants, API keys, budgets, funding.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use ledger::{
    Actor, Budget, BudgetListQuery, BudgetStatus, CreateApiKey, CreateBudget, CreateTenant,
    FundBudget, GetTenant, ListBudgets, LookupBudget, RevokeApiKey, SetBudgetFrozen, Tenant,
    TenantWritten, Unit, UpdateBudget, UpdateTenant,
};
use protocol::admin::{
    parse_unit_param, required_param, ApiKeyCreateRequest, ApiKeyCreateResponse, ApiKeyResponse,
    BudgetCreateRequest, BudgetFundingRequest, BudgetFundingResponse, BudgetLedger,
    BudgetListResponse, BudgetStatusTransitionRequest, BudgetUpdateRequest, TenantCreateRequest,
    TenantResponse, TenantUpdateRequest,
};
use protocol::{decode_budget_cursor, parse_body, ApiError, Plane, Validate, MAX_PAGE_SIZE};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::query::Query;
use crate::reply::{budget_position, json, next_cursor, tenant_json, Answer, Failure};

async fn body<T: DeserializeOwned + Validate>(
    app: &App,
    actor: &Actor,
    bytes: &Bytes,
) -> Result<T, Failure> {
    app.validated(actor, Plane::Admin, || parse_body(bytes))
        .await
}

/// An optional body: absent or empty means the default.
async fn optional_body<T: DeserializeOwned + Validate + Default>(
    app: &App,
    actor: &Actor,
    bytes: &Bytes,
) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    body(app, actor, bytes).await
}

fn tenant_answer(tenant: Tenant) -> Answer {
    Ok(json(StatusCode::OK, &TenantResponse::from(tenant)))
}

fn budget_answer(budget: Budget, status: StatusCode, tenant: Option<Arc<str>>) -> Answer {
    tenant_json(status, &BudgetLedger::from(budget), tenant)
}

pub async fn create_tenant(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantCreateRequest = body(&app, &actor, &bytes).await?;
    let operation = CreateTenant {
        actor,
        tenant: request.into_new(),
    };
    let (TenantWritten { tenant, created }, _) = app.run(operation, Plane::Admin).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json(status, &TenantResponse::from(tenant)))
}

pub async fn get_tenant(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
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

pub async fn update_tenant(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantUpdateRequest = body(&app, &actor, &bytes).await?;
    let operation = UpdateTenant {
        actor,
        tenant_id: id,
        patch: request.into_patch(),
    };
    let (tenant, _) = app.run(operation, Plane::Admin).await?;
    tenant_answer(tenant)
}

pub async fn create_api_key(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: ApiKeyCreateRequest = body(&app, &actor, &bytes).await?;
    let secret = ids::new_key_secret();
    let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    let operation = CreateApiKey {
        actor,
        key: request.into_new(ids::key_id(), &secret, digest),
    };
    let (key, _) = app.run(operation, Plane::Admin).await?;
    Ok(json(
        StatusCode::CREATED,
        &ApiKeyCreateResponse::new(key, secret),
    ))
}

pub async fn revoke_api_key(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let reason = Query::parse(raw.as_deref())
        .get("reason")
        .map(str::to_string);
    if reason.as_ref().is_some_and(|r| r.chars().count() > 512) {
        return Err(ApiError::invalid("reason: must be at most 512 characters").into());
    }
    let operation = RevokeApiKey {
        actor,
        key_id: id,
        reason,
    };
    let (key, _) = app.run(operation, Plane::Admin).await?;
    let now = key.revoked_at_ms.unwrap_or(key.created_at_ms);
    Ok(json(StatusCode::OK, &ApiKeyResponse::new(key, now)))
}

pub async fn create_budget(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: BudgetCreateRequest = body(&app, &actor, &bytes).await?;
    let operation = CreateBudget {
        actor,
        budget: request.into_new(ids::ledger_id()),
    };
    let (budget, tenant) = app.run(operation, Plane::Admin).await?;
    budget_answer(budget, StatusCode::CREATED, tenant)
}

fn list_query(q: &Query) -> Result<BudgetListQuery, ApiError> {
    Ok(BudgetListQuery {
        tenant_id: q.get("tenant_id").map(str::to_string),
        scope_prefix: q.get("scope_prefix").map(str::to_string),
        unit: q
            .get("unit")
            .map(|u| parse_unit_param("unit", u))
            .transpose()?,
        status: q
            .get("status")
            .map(|s| match s {
                "ACTIVE" => Ok(BudgetStatus::Active),
                "FROZEN" => Ok(BudgetStatus::Frozen),
                "CLOSED" => Ok(BudgetStatus::Closed),
                _ => Err(ApiError::invalid(
                    "status: must be ACTIVE, FROZEN or CLOSED",
                )),
            })
            .transpose()?,
        limit: q.limit(MAX_PAGE_SIZE)?,
        after: q.get("cursor").map(decode_budget_cursor).transpose()?,
    })
}

pub async fn list_budgets(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let operation = |query| ListBudgets {
        actor: actor.clone(),
        query,
    };
    let (page, tenant) = app
        .run_parsed(&actor, Plane::Admin, || list_query(&q), operation)
        .await?;
    let response = BudgetListResponse {
        next_cursor: next_cursor(page.has_more, &page.items, budget_position),
        ledgers: page.items.into_iter().map(BudgetLedger::from).collect(),
        has_more: page.has_more,
    };
    tenant_json(StatusCode::OK, &response, tenant)
}

/// The `scope` and `unit` query parameters that address one budget.
fn budget_address(q: &Query) -> Result<(String, Unit), ApiError> {
    let scope = required_param("scope", q.get("scope"))?.to_string();
    let unit = parse_unit_param("unit", required_param("unit", q.get("unit"))?)?;
    Ok((scope, unit))
}

pub async fn lookup_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let (scope, unit) = app
        .validated(&actor, Plane::Admin, || budget_address(&q))
        .await?;
    let (budget, tenant) = app
        .run(LookupBudget { actor, scope, unit }, Plane::Admin)
        .await?;
    budget_answer(budget, StatusCode::OK, tenant)
}

pub async fn fund_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let fund = app
        .validated(&actor, Plane::Admin, || {
            let (scope, unit) = budget_address(&q)?;
            let request: BudgetFundingRequest = parse_body(&bytes)?;
            request.into_command(q.get("tenant_id").map(str::to_string), scope, unit)
        })
        .await?;
    let (funded, tenant) = app.run(FundBudget { actor, fund }, Plane::Admin).await?;
    let response = BudgetFundingResponse::from(&*funded.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

pub async fn update_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let q = Query::parse(raw.as_deref());
    let (scope, unit, patch) = app
        .validated(&actor, Plane::Admin, || {
            let (scope, unit) = budget_address(&q)?;
            let request: BudgetUpdateRequest = parse_body(&bytes)?;
            Ok((scope, unit, request.into_patch(unit)?))
        })
        .await?;
    let operation = UpdateBudget {
        actor,
        scope,
        unit,
        patch,
    };
    let (budget, _) = app.run(operation, Plane::Admin).await?;
    budget_answer(budget, StatusCode::OK, None)
}

async fn set_frozen(
    app: &App,
    raw: Option<String>,
    headers: &HeaderMap,
    bytes: &Bytes,
    frozen: bool,
) -> Answer {
    let actor = auth::admin(app.admin_key(), headers)?;
    let q = Query::parse(raw.as_deref());
    let (scope, unit) = app
        .validated(&actor, Plane::Admin, || budget_address(&q))
        .await?;
    let _: BudgetStatusTransitionRequest = optional_body(app, &actor, bytes).await?;
    let operation = SetBudgetFrozen {
        actor,
        scope,
        unit,
        frozen,
    };
    let (budget, _) = app.run(operation, Plane::Admin).await?;
    budget_answer(budget, StatusCode::OK, None)
}

pub async fn freeze_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    set_frozen(&app, raw, &headers, &bytes, true).await
}

pub async fn unfreeze_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    set_frozen(&app, raw, &headers, &bytes, false).await
}
