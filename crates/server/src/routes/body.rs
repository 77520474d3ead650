//! Request bodies, parsed and validated by `protocol` through [`App::validated`]: when a
//! body is refused, the caller's credentials are checked first, so 401 beats 400.

use axum::body::Bytes;
use axum::http::HeaderMap;
use ledger::Actor;
use ledger::{BulkResult, Idempotent, Operation};
use protocol::bulk::{BulkActionResponse, BulkRequest};
use protocol::runtime::{
    CommitRequest, DecisionRequest, EventCreateRequest, IdempotencyHeader, ReleaseRequest,
    ReservationCreateRequest, ReservationExtendRequest,
};
use protocol::{parse_body, Plane, Validate};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::app::App;
use crate::reply::{json, Answer, Failure};

/// An admin-plane body.
pub async fn admin_body<T: DeserializeOwned + Validate>(
    app: &App,
    actor: &Actor,
    bytes: &Bytes,
) -> Result<T, Failure> {
    app.validated(actor, Plane::Admin, || parse_body(bytes))
        .await
}

/// An optional admin-plane body: absent or empty means the default.
pub async fn optional_admin_body<T: DeserializeOwned + Validate + Default>(
    app: &App,
    actor: &Actor,
    bytes: &Bytes,
) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    admin_body(app, actor, bytes).await
}

/// An idempotent request body: its key must match the `X-Idempotency-Key` header.
pub trait Keyed {
    fn key(&self) -> &str;
}

macro_rules! keyed {
    ($($t:ty),*) => {$(impl Keyed for $t { fn key(&self) -> &str { &self.idempotency_key } })*};
}
keyed!(
    ReservationCreateRequest,
    CommitRequest,
    ReleaseRequest,
    ReservationExtendRequest,
    DecisionRequest,
    EventCreateRequest
);

/// An idempotent runtime body, checked against the `X-Idempotency-Key` header.
pub async fn keyed_body<T: DeserializeOwned + Validate + Keyed>(
    app: &App,
    actor: &Actor,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, Failure> {
    app.validated(actor, Plane::Runtime, || {
        let request: T = parse_body(body)?;
        let header = IdempotencyHeader {
            key: headers
                .get(IdempotencyHeader::NAME)
                .and_then(|v| v.to_str().ok()),
        };
        header.check(request.key())?;
        Ok(request)
    })
    .await
}

/// A bulk action (tenants or budgets): parse and validate the body, run its operation,
/// answer its rows with the request's action and key echoed (a replay echoes the same).
pub async fn bulk_action<R>(app: &App, actor: Actor, bytes: &Bytes) -> Answer
where
    R: BulkRequest,
    R::Operation: Operation<Output = Idempotent<BulkResult>>,
{
    let ((action, key), operation) = app
        .validated(&actor, Plane::Admin, || {
            let request: R = parse_body(bytes)?;
            Ok((request.echo(), request.into_operation(actor.clone())?))
        })
        .await?;
    // The entry names the action, its filter as sent and its key (and, for budgets, the
    // tenant the filter names), as the dashboard's bulk-action detail shows them.
    let filter =
        serde_json::from_slice::<Value>(bytes).map_or(Value::Null, |mut v| v["filter"].take());
    let tenant = filter["tenant_id"].as_str().map(str::to_string);
    let notes = Map::from_iter([
        ("action".to_string(), Value::from(action.clone())),
        ("filter".to_string(), filter),
        ("idempotency_key".to_string(), Value::from(key.clone())),
    ]);
    crate::audit::annotate(notes, tenant);
    let (done, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(json(
        axum::http::StatusCode::OK,
        &BulkActionResponse::new(action, key, &done.result),
    ))
}
