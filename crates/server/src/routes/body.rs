//! Request bodies, parsed and validated by `protocol` through [`App::validated`]: when a
//! body is refused, the caller's credentials are checked first, so 401 beats 400.

use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, EXPECT};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use ledger::Actor;
use ledger::{BulkResult, Idempotent, Operation};
use protocol::bulk::{BulkActionResponse, BulkRequest};
use protocol::runtime::{
    CommitRequest, DecisionRequest, EventCreateRequest, IdempotencyHeader, ReleaseRequest,
    ReservationCreateRequest, ReservationExtendRequest,
};
use protocol::{parse_body, ApiError, ErrorCode, Plane, Validate, MAX_BODY_BYTES};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::app::App;
use crate::limits::{BodyTimeout, LimitCounters};
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

/// The declared length of the request's body (`Content-Length`), if it has one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
}

/// Whether the request declares a body over the size limit: it is refused before a byte of
/// it is awaited, as the same body read whole would be.
pub fn declared_too_large(headers: &HeaderMap) -> bool {
    declared_length(headers).is_some_and(|length| length > MAX_BODY_BYTES as u64)
}

/// The most of a refused request's body that is read and thrown away.
const DISCARDED_AT_MOST: u64 = 8 * 1024 * 1024;

/// Answers a request refused before its body was read, and closes its connection after
/// the answer (`Connection: close`): the unread body would otherwise be read as the next
/// request, and a client that pooled the connection would find it closed under its next
/// request.
///
/// A client still sending the body reads the answer only if the connection is not closed
/// under it (a close with unread data resets the connection, and the answer with it), so
/// the body is read and discarded in the background, up to [`DISCARDED_AT_MOST`] and within
/// the body timeout. Not when the client waits for `100 Continue`: it sends nothing, and
/// reading would invite it to.
pub fn refused_unread(request: Request, mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    let headers = request.headers();
    let waits_for_continue = headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let drainable = declared_length(headers).is_none_or(|length| length <= DISCARDED_AT_MOST);
    if drainable && !waits_for_continue {
        let mut body = request.into_body();
        tokio::spawn(async move {
            let mut read = 0;
            while read <= DISCARDED_AT_MOST {
                match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len) as u64,
                    _ => break,
                }
            }
        });
    }
    response
}

/// A request's body, read whole, with the failures a client can cause answered as such: a
/// body that did not arrive by its deadline ([`crate::limits::DeadlineBody`]) is 408, one
/// over the size limit is 413 (as a 400 `INVALID_REQUEST`, by the correlation layer), any
/// other failure to read it 400.
pub struct RawBody(pub Bytes);

impl FromRequest<Arc<App>> for RawBody {
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, Response> {
        match Bytes::from_request(request, app).await {
            Ok(bytes) => Ok(RawBody(bytes)),
            Err(rejection) => match timed_out(&rejection) {
                Some(timeout) => {
                    LimitCounters::count(&app.bounds().counters.body_timeouts);
                    let error = ApiError::new(408, ErrorCode::InvalidRequest, timeout.to_string());
                    Err(Failure::from(error).into_response())
                }
                None => Err(rejection.into_response()),
            },
        }
    }
}

/// The deadline a body missed, if that is why it could not be read.
fn timed_out(rejection: &BytesRejection) -> Option<BodyTimeout> {
    let BytesRejection::FailedToBufferBody(failed) = rejection else {
        return None;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(failed);
    while let Some(error) = source {
        if let Some(timeout) = error.downcast_ref::<BodyTimeout>() {
            return Some(*timeout);
        }
        source = error.source();
    }
    None
}
