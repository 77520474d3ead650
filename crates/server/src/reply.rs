//! Building responses.

use std::io::Write;
use std::sync::Arc;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use protocol::ApiError;
use serde::Serialize;

/// A `HeaderName` constant: inserting by `&str` would allocate a copy of the name per response.
pub const TENANT_HEADER: HeaderName = HeaderName::from_static("x-cycles-tenant");

/// On a response: the request was not run here, and is to be sent to the instance at this
/// base URL (`crate::forward` does, before anything else sees the response).
#[derive(Debug, Clone)]
pub struct ForwardTo(pub Arc<str>);

/// An error answer, with the caller's tenant when it is known.
#[derive(Debug)]
pub struct Failure {
    pub error: ApiError,
    pub tenant: Option<Arc<str>>,
    /// Nothing was run: the request is to be sent to the instance at this base URL, which
    /// holds the Redis engine's lease (`crate::forward`).
    pub forward: Option<Arc<str>>,
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure {
            error,
            tenant: None,
            forward: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = status.into_response();
        if let Some(seconds) = self.error.retry_after_s {
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            if status == StatusCode::TOO_MANY_REQUESTS {
                headers.insert(RATE_LIMIT_RESET, HeaderValue::from(unix_now_s() + seconds));
            }
        }
        // The correlation layer writes the body, with the request's ids.
        response.extensions_mut().insert(self.error);
        if let Some(peer) = self.forward {
            response.extensions_mut().insert(ForwardTo(peer));
        }
        with_tenant(response, self.tenant.as_deref())
    }
}

pub type Answer = Result<Response, Failure>;

/// Seconds since the Unix epoch, now.
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When a throttled client may try again, in Unix seconds (with a 429).
pub const RATE_LIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A JSON success body.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => {
            Failure::from(ApiError::internal(format!("response encoding: {e}"))).into_response()
        }
    }
}

/// A JSON success body with the caller's tenant header.
pub fn tenant_json<T: Serialize>(status: StatusCode, body: &T, tenant: Option<Arc<str>>) -> Answer {
    Ok(with_tenant(json(status, body), tenant.as_deref()))
}

pub fn with_tenant(mut response: Response, tenant: Option<&str>) -> Response {
    if let Some(v) = tenant.and_then(|t| HeaderValue::from_str(t).ok()) {
        response.headers_mut().insert(TENANT_HEADER, v);
    }
    response
}

/// Adds `Date` (documentation only: clients must use `expires_at_ms`, never this). The date
/// is formatted on the stack; the header value is its only allocation.
pub fn with_date(mut response: Response) -> Response {
    let mut text = [0u8; HTTP_DATE_LEN];
    let mut out = &mut text[..];
    let date = httpdate::HttpDate::from(std::time::SystemTime::now());
    if write!(out, "{date}").is_ok() && out.is_empty() {
        if let Ok(v) = HeaderValue::from_bytes(&text) {
            response.headers_mut().insert(header::DATE, v);
        }
    }
    response
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`: an IMF-fixdate is always this long.
const HTTP_DATE_LEN: usize = 29;

/// The cursor of the page after `rows`, when the store said there may be more.
pub fn next_cursor<T>(
    has_more: bool,
    rows: &[T],
    position: impl Fn(&T) -> String,
) -> Option<String> {
    if has_more {
        rows.last().map(position)
    } else {
        None
    }
}

/// The cursor position of a budget in `(scope, unit)` order.
pub fn budget_position(b: &ledger::Budget) -> String {
    protocol::encode_budget_cursor(&b.scope, b.unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_header_is_an_imf_fixdate_of_now() {
        let response = with_date(StatusCode::OK.into_response());
        let text = response.headers()[header::DATE].to_str().expect("ASCII");
        assert_eq!(text.len(), HTTP_DATE_LEN);
        let at = httpdate::parse_http_date(text).expect("an HTTP date");
        let skew = std::time::SystemTime::now()
            .duration_since(at)
            .expect("not in the future");
        assert!(skew.as_secs() <= 2, "{text} is {skew:?} old");
    }
}
