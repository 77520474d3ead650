//! The headers the server reads before any operation: correlation (`traceparent`,
//! `X-Cycles-Trace-Id`), credentials (`X-Cycles-API-Key`, `X-Admin-API-Key`) and
//! `X-Idempotency-Key`. Each input line `name: value` that is a valid header is set; every
//! reader must answer, never panic, and a trace id taken from the input is always 32 lower
//! hex digits, not all zero.

#![no_main]

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use protocol::runtime::IdempotencyHeader;
use server::auth::{self, AdminKey};
use server::correlation::{self, Correlation};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) {
            headers.append(name, value);
        }
    }
    if let Some(trace) = correlation::inbound_trace_id(&headers) {
        assert_eq!(trace.len(), 32, "{trace}");
        assert!(
            trace
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{trace}"
        );
        assert!(trace.bytes().any(|b| b != b'0'), "{trace}");
    }
    let _ = Correlation::of(&headers);
    let key = AdminKey::new("fuzz-admin-key");
    let _ = auth::tenant(&headers);
    let _ = auth::admin(&key, &headers);
    let _ = auth::admin_or_tenant(&key, &headers);
    let idempotency = IdempotencyHeader {
        key: headers
            .get(IdempotencyHeader::NAME)
            .and_then(|v| v.to_str().ok()),
    };
    let _ = idempotency.check("key-1");
});
