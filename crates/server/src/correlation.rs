//! Correlation ids and the error body, for every response.
//!
//! Each request gets a fresh request id and a trace id (from a valid `traceparent`, else a
//! valid `X-Cycles-Trace-Id`, else a new one; malformed headers are ignored, never
//! rejected). Handlers answer errors with an [`ApiError`] in the response extensions; this
//! layer writes the body with both ids, and turns any other error response (unknown route,
//! wrong method, oversized body) into the same shape.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use protocol::{ApiError, ErrorBody, MAX_BODY_BYTES};

use crate::ids;

// Header names as `HeaderName` constants: inserting by `&str` would copy a non-standard
// name into a new allocation on every response.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
pub const TRACE_ID_HEADER: HeaderName = HeaderName::from_static("x-cycles-trace-id");

/// The ids of one request, as the header values they are answered in.
#[derive(Debug)]
pub struct Correlation {
    pub request_id: HeaderValue,
    pub trace_id: HeaderValue,
}

impl Correlation {
    /// A fresh request id, and the inbound trace id or a fresh one.
    pub fn of(headers: &HeaderMap) -> Self {
        Correlation {
            request_id: ids::request_id(),
            trace_id: inbound_trace_id(headers)
                .and_then(|id| HeaderValue::from_str(id).ok())
                .unwrap_or_else(ids::trace_id),
        }
    }
}

/// Writes the error body of an error response and adds both ids to every response. An
/// error response a handler wrote as JSON itself (readiness DOWN) is left as it is; one the
/// framework made (an unknown route, an oversized body) gets the protocol's error body.
pub fn finish(mut response: Response, c: Correlation) -> Response {
    let status = response.status();
    let error = response.extensions_mut().remove::<ApiError>().or_else(|| {
        let framework = (status.is_client_error() || status.is_server_error())
            && response.headers().get(header::CONTENT_TYPE)
                != Some(&HeaderValue::from_static("application/json"));
        framework.then(|| framework_error(status))
    });
    if let Some(error) = error {
        let text = |v: &HeaderValue| v.to_str().unwrap_or_default().to_owned();
        let (request_id, trace_id) = (text(&c.request_id), text(&c.trace_id));
        let body =
            serde_json::to_vec(&ErrorBody::new(&error, &request_id, &trace_id)).unwrap_or_default();
        let status =
            StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (mut parts, _) = response.into_parts();
        parts.status = status;
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response = Response::from_parts(parts, Body::from(body));
    }
    let headers = response.headers_mut();
    headers.insert(REQUEST_ID_HEADER, c.request_id);
    headers.insert(TRACE_ID_HEADER, c.trace_id);
    response
}

/// An error answered by the framework rather than a handler.
pub fn framework_error(status: StatusCode) -> ApiError {
    match status {
        StatusCode::NOT_FOUND => ApiError::not_found("No such endpoint"),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            405,
            protocol::ErrorCode::InvalidRequest,
            "Method not allowed",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::invalid(format!(
            "Request body exceeds the {MAX_BODY_BYTES}-byte limit"
        )),
        s if s.is_client_error() => ApiError::invalid(format!(
            "Invalid request: {}",
            s.canonical_reason().unwrap_or("bad request")
        )),
        _ => ApiError::internal("Internal error"),
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn not_all_zero(s: &str) -> bool {
    s.bytes().any(|b| b != b'0')
}

/// The inbound trace id by the spec's precedence, or `None` to generate one.
pub fn inbound_trace_id(headers: &HeaderMap) -> Option<&str> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(tp) = get("traceparent") {
        let parts: Vec<&str> = tp.trim().split('-').collect();
        if let [version, trace, span, flags] = parts[..] {
            if version == "00"
                && is_lower_hex(trace, 32)
                && not_all_zero(trace)
                && is_lower_hex(span, 16)
                && not_all_zero(span)
                && is_lower_hex(flags, 2)
            {
                return Some(trace);
            }
        }
    }
    get(TRACE_ID_HEADER.as_str())
        .map(str::trim)
        .filter(|t| is_lower_hex(t, 32) && not_all_zero(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn trace_id_precedence() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let x = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            inbound_trace_id(&headers(&[("traceparent", tp), ("x-cycles-trace-id", x)])).unwrap(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let bad_tp = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        assert_eq!(
            inbound_trace_id(&headers(&[
                ("traceparent", bad_tp),
                ("x-cycles-trace-id", x)
            ]))
            .unwrap(),
            x
        );
        assert_eq!(
            inbound_trace_id(&headers(&[(
                "x-cycles-trace-id",
                "0123456789ABCDEF0123456789ABCDEF"
            )])),
            None
        );
        assert_eq!(
            inbound_trace_id(&headers(&[("traceparent", "garbage")])),
            None
        );
    }
}
