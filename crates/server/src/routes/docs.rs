//! `GET /openapi.json`: the document built from the route table's declarations.

use std::sync::LazyLock;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use crate::openapi;
use crate::reply::json;

/// The document, built once, on the first request for it.
static DOCUMENT: LazyLock<Value> =
    LazyLock::new(|| openapi::document(super::operations().into_openapi()));

#[utoipa::path(
    get, path = "/openapi.json", tag = "Operations", operation_id = "openapi",
    summary = "This document",
    description = "Swagger UI for it is served at /swagger-ui/.",
    responses((status = 200, description = "The OpenAPI 3.1 document",
        body = Object, content_type = "application/json")),
)]
pub async fn openapi_json() -> Response {
    json(StatusCode::OK, &*DOCUMENT)
}
