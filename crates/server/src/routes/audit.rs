//! The audit log (admin plane): read from the history store, never through the ledger.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use protocol::audit::{AuditListParams, AuditLogListResponse};
use protocol::parse_query;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Errors};
use crate::reply::{json, Answer};

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(list_audit_logs))
}

#[utoipa::path(
    get, path = "/v1/admin/audit/logs", tag = "Audit", operation_id = "listAuditLogs",
    summary = "Query the audit log",
    description = "One entry per admin-plane write (and per write made with the admin key on \
        the runtime plane), successful or refused, written in the same durable step as the \
        change. Reads are not audited. Entries are kept 400 days (30 for requests refused \
        before the caller was known) unless configured otherwise.",
    params(AuditListParams),
    responses(
        (status = 200, description = "A page of audit entries", body = AuditLogListResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_audit_logs(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    auth::admin(app.admin_key(), &headers)?;
    let (query, next) = parse_query::<AuditListParams>(raw.as_deref())?.into_query()?;
    let page = app.audit_page(query).await?;
    Ok(json(
        StatusCode::OK,
        &AuditLogListResponse::new(&next, page),
    ))
}
