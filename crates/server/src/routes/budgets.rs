//! Budgets (admin plane, some with a tenant key too): create, list, read, update, fund,
//! freeze and unfreeze.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use ledger::{Budget, CreateBudget, FundBudget, LookupBudget, SetBudgetFrozen, Unit, UpdateBudget};
use protocol::budget::{
    BudgetAddress, BudgetCreateRequest, BudgetFundingRequest, BudgetFundingResponse, BudgetLedger,
    BudgetListParams, BudgetListResponse, BudgetStatusTransitionRequest, BudgetUpdateRequest,
    FundParams,
};
use protocol::bulk::{BudgetBulkActionRequest, BulkActionResponse};
use protocol::{parse_body, parse_query, ApiError, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::ids;
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden, NotFound};
use crate::reply::{tenant_json, Answer};
use crate::routes::body::{admin_body, bulk_action, optional_admin_body, RawBody};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_budget, list_budgets, update_budget))
        .routes(routes!(lookup_budget))
        .routes(routes!(fund_budget))
        .routes(routes!(freeze_budget))
        .routes(routes!(unfreeze_budget))
        .routes(routes!(bulk_action_budgets))
}

fn budget_answer(budget: Budget, status: StatusCode, tenant: Option<Arc<str>>) -> Answer {
    tenant_json(status, &BudgetLedger::from(budget), tenant)
}

/// The budget the `scope` and `unit` query parameters address.
fn budget_address(raw: &Option<String>) -> Result<(String, Unit), ApiError> {
    let BudgetAddress { scope, unit } = parse_query(raw.as_deref())?;
    Ok((scope, unit.into()))
}

#[utoipa::path(
    post, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "createBudget",
    summary = "Create a budget",
    request_body = BudgetCreateRequest,
    responses(
        (status = 201, description = "Created", body = BudgetLedger,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn create_budget(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let request: BudgetCreateRequest = admin_body(&app, &actor, &bytes).await?;
    crate::audit::about(&request.scope);
    let operation = CreateBudget {
        actor,
        budget: request.into_new(ids::ledger_id()),
    };
    let (budget, tenant) = app.mutate(operation, Plane::Admin).await?;
    budget_answer(budget, StatusCode::CREATED, tenant)
}

#[utoipa::path(
    get, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "listBudgets",
    summary = "List budgets",
    description = "In (scope, unit) order, or by `sort_by`. With the admin key and no \
        `tenant_id`, every tenant's budgets are listed.",
    params(BudgetListParams),
    responses(
        (status = 200, description = "A page of budgets", body = BudgetListResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn list_budgets(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let (operation, next) = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<BudgetListParams>(raw.as_deref())?.into_list(actor.clone())
        })
        .await?;
    let (page, tenant) = app.run(operation, Plane::Admin).await?;
    tenant_json(
        StatusCode::OK,
        &BudgetListResponse::new(&next, page),
        tenant,
    )
}

#[utoipa::path(
    get, path = "/v1/admin/budgets/lookup", tag = "Budgets", operation_id = "lookupBudget",
    summary = "Read one budget by (scope, unit)",
    params(BudgetAddress),
    responses(
        (status = 200, description = "The budget", body = BudgetLedger,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn lookup_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let (scope, unit) = app
        .validated(&actor, Plane::Admin, || budget_address(&raw))
        .await?;
    let (budget, tenant) = app
        .run(LookupBudget { actor, scope, unit }, Plane::Admin)
        .await?;
    budget_answer(budget, StatusCode::OK, tenant)
}

#[utoipa::path(
    post, path = "/v1/admin/budgets/fund", tag = "Budgets", operation_id = "fundBudget",
    summary = "Credit, debit, reset or repay a budget",
    params(FundParams),
    request_body = BudgetFundingRequest,
    responses(
        (status = 200, description = "Funded", body = BudgetFundingResponse,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn fund_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin_or_tenant(app.admin_key(), &headers)?;
    let fund = app
        .validated(&actor, Plane::Admin, || {
            let FundParams {
                tenant_id,
                scope,
                unit,
            } = parse_query(raw.as_deref())?;
            let request: BudgetFundingRequest = parse_body(&bytes)?;
            request.into_command(tenant_id, scope, unit.into())
        })
        .await?;
    let (funded, tenant) = app.mutate(FundBudget { actor, fund }, Plane::Admin).await?;
    let response = BudgetFundingResponse::from(&*funded.result);
    tenant_json(StatusCode::OK, &response, tenant)
}

#[utoipa::path(
    patch, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "updateBudget",
    summary = "Update a budget's overdraft limit, overage policy or metadata",
    params(BudgetAddress),
    request_body = BudgetUpdateRequest,
    responses(
        (status = 200, description = "The updated budget", body = BudgetLedger),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn update_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (scope, unit, patch) = app
        .validated(&actor, Plane::Admin, || {
            let (scope, unit) = budget_address(&raw)?;
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
    let (budget, _) = app.mutate(operation, Plane::Admin).await?;
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
    let (scope, unit) = app
        .validated(&actor, Plane::Admin, || budget_address(&raw))
        .await?;
    let request: BudgetStatusTransitionRequest = optional_admin_body(app, &actor, bytes).await?;
    let operation = SetBudgetFrozen {
        actor,
        scope,
        unit,
        frozen,
        reason: request.reason,
    };
    let (budget, _) = app.mutate(operation, Plane::Admin).await?;
    budget_answer(budget, StatusCode::OK, None)
}

#[utoipa::path(
    post, path = "/v1/admin/budgets/freeze", tag = "Budgets", operation_id = "freezeBudget",
    summary = "Freeze an ACTIVE budget: new reservations on it are refused",
    params(BudgetAddress),
    request_body(content = Option<BudgetStatusTransitionRequest>,
        description = "Optional; may be empty."),
    responses(
        (status = 200, description = "The frozen budget", body = BudgetLedger),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn freeze_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    set_frozen(&app, raw, &headers, &bytes, true).await
}

#[utoipa::path(
    post, path = "/v1/admin/budgets/unfreeze", tag = "Budgets",
    operation_id = "unfreezeBudget",
    summary = "Unfreeze a FROZEN budget",
    params(BudgetAddress),
    request_body(content = Option<BudgetStatusTransitionRequest>,
        description = "Optional; may be empty."),
    responses(
        (status = 200, description = "The active budget", body = BudgetLedger),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn unfreeze_budget(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    set_frozen(&app, raw, &headers, &bytes, false).await
}

#[utoipa::path(
    post, path = "/v1/admin/budgets/bulk-action", tag = "Budgets",
    operation_id = "bulkActionBudgets",
    summary = "Fund every budget of one tenant a filter matches",
    description = "As `fundBudget`, per budget. At most 500 budgets (else 400 \
        LIMIT_EXCEEDED, nothing changed); with `expected_count`, 409 COUNT_MISMATCH unless \
        the filter matches exactly that many. Each budget is changed or not on its own; the \
        key replays the response for 15 minutes.",
    request_body = BudgetBulkActionRequest,
    responses(
        (status = 200, description = "Row by row", body = BulkActionResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn bulk_action_budgets(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    bulk_action::<BudgetBulkActionRequest>(&app, actor, &bytes).await
}
