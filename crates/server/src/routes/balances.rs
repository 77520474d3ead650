//! Balances: the budgets of the caller's tenant, read.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use protocol::budget::BudgetLedger;
use protocol::runtime::{
    BalanceForm, BalanceListResponse, BalanceParams, BalanceResponse, Balances,
};
use protocol::{parse_query, Balance, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Errors, Forbidden};
use crate::reply::{budget_position, next_cursor, tenant_json, Answer};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(balances))
}

#[utoipa::path(
    get, path = "/v1/balances", tag = "Balances", operation_id = "getBalances",
    summary = "The balances of the key's tenant's budgets",
    description = "With subject levels (`tenant`, `workspace`, …): `Balance` rows (the \
        runtime spec). With `tenant_id`, `scope_prefix` or `unit` instead: whole \
        `BudgetLedger` rows (the admin spec's form).",
    params(BalanceParams),
    responses(
        (status = 200, description = "A page of balances or ledgers", body = Balances,
            headers(("X-Cycles-Tenant" = String))),
        Errors<(BadRequest, Forbidden)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn balances(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::tenant(&headers)?;
    let parse = || parse_query::<BalanceParams>(raw.as_deref())?.into_query(actor.clone());
    let query = app.validated(&actor, Plane::Runtime, parse).await?;
    let (query, form) = query;
    let (page, tenant) = app.run(query, Plane::Runtime).await?;
    let next_cursor = next_cursor(page.has_more, &page.items, budget_position);
    let has_more = page.has_more;
    let amounts: Vec<ledger::Balance>;
    let response = match form {
        BalanceForm::Runtime => {
            amounts = page.items.iter().map(ledger::Balance::from).collect();
            Balances::Runtime(BalanceResponse {
                balances: amounts.iter().map(Balance::from).collect(),
                next_cursor,
                has_more,
            })
        }
        BalanceForm::Ledgers => Balances::Ledgers(BalanceListResponse {
            balances: page.items.into_iter().map(BudgetLedger::from).collect(),
            next_cursor,
            has_more,
        }),
    };
    tenant_json(StatusCode::OK, &response, tenant)
}
