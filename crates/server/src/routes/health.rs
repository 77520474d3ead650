//! Public health probes (the SDKs' own test suites call them without a key).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;
use store::Store;

use crate::app::App;
use crate::reply::json;

/// Liveness: the process answers.
pub async fn liveness() -> Response {
    json(StatusCode::OK, &json!({"status": "UP"}))
}

/// Health and readiness: the store can take writes.
pub async fn health(State(app): State<Arc<App>>) -> Response {
    if app.store().health().ready {
        json(StatusCode::OK, &json!({"status": "UP"}))
    } else {
        json(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "DOWN"}))
    }
}
