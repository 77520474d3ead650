//! The admin plane's provisioning slice: tenants, API keys, budgets, funding.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use ledger::{Actor, BudgetListQuery, BudgetStatus, Command, Outcome, Unit};
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
use crate::reply::{budget_position, json, next_cursor, tenant_json, unexpected, Answer, Failure};

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

fn tenant_answer(outcome: Outcome, created_status: StatusCode) -> Answer {
    let Outcome::Tenant { tenant, created } = outcome else {
        return Err(unexpected(&outcome));
    };
    let status = if created {
        created_status
    } else {
        StatusCode::OK
    };
    Ok(json(status, &TenantResponse::from(tenant)))
}

fn budget_answer(outcome: Outcome, status: StatusCode, tenant: Option<Arc<str>>) -> Answer {
    let Outcome::Budget(budget) = outcome else {
        return Err(unexpected(&outcome));
    };
    tenant_json(status, &BudgetLedger::from(budget), tenant)
}

pub async fn create_tenant(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantCreateRequest = body(&app, &actor, &bytes).await?;
    let command = Command::CreateTenant {
        actor,
        tenant: request.into_new(),
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    tenant_answer(outcome, StatusCode::CREATED)
}

pub async fn get_tenant(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (outcome, _) = app
        .run(
            Command::GetTenant {
                actor,
                tenant_id: id,
            },
            Plane::Admin,
        )
        .await?;
    tenant_answer(outcome, StatusCode::OK)
}

pub async fn update_tenant(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    bytes: Bytes,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: TenantUpdateRequest = body(&app, &actor, &bytes).await?;
    let command = Command::UpdateTenant {
        actor,
        tenant_id: id,
        patch: request.into_patch(),
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    tenant_answer(outcome, StatusCode::OK)
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
    let command = Command::CreateApiKey {
        actor,
        key: request.into_new(ids::key_id(), &secret, digest),
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    let Outcome::ApiKey(key) = outcome else {
        return Err(unexpected(&outcome));
    };
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
    let command = Command::RevokeApiKey {
        actor,
        key_id: id,
        reason,
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    let Outcome::ApiKey(key) = outcome else {
        return Err(unexpected(&outcome));
    };
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
    let command = Command::CreateBudget {
        actor,
        budget: request.into_new(ids::ledger_id()),
    };
    let (outcome, tenant) = app.run(command, Plane::Admin).await?;
    budget_answer(outcome, StatusCode::CREATED, tenant)
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
    let command = |query| Command::ListBudgets {
        actor: actor.clone(),
        query,
    };
    let (outcome, tenant) = app
        .run_parsed(&actor, Plane::Admin, || list_query(&q), command)
        .await?;
    let Outcome::Budgets { budgets, has_more } = outcome else {
        return Err(unexpected(&outcome));
    };
    let response = BudgetListResponse {
        next_cursor: next_cursor(has_more, &budgets, budget_position),
        ledgers: budgets.into_iter().map(BudgetLedger::from).collect(),
        has_more,
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
    let (outcome, tenant) = app
        .run(Command::LookupBudget { actor, scope, unit }, Plane::Admin)
        .await?;
    budget_answer(outcome, StatusCode::OK, tenant)
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
    let (outcome, tenant) = app
        .run(Command::FundBudget { actor, fund }, Plane::Admin)
        .await?;
    let Outcome::Funded { result, .. } = outcome else {
        return Err(unexpected(&outcome));
    };
    tenant_json(
        StatusCode::OK,
        &BudgetFundingResponse::from(&*result),
        tenant,
    )
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
    let command = Command::UpdateBudget {
        actor,
        scope,
        unit,
        patch,
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    budget_answer(outcome, StatusCode::OK, None)
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
    let command = Command::SetBudgetFrozen {
        actor,
        scope,
        unit,
        frozen,
    };
    let (outcome, _) = app.run(command, Plane::Admin).await?;
    budget_answer(outcome, StatusCode::OK, None)
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
