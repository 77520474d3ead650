//! Identifiers and secrets. The ledger never invents ids; they are made here.

use axum::http::HeaderValue;
use rand::distr::{Alphanumeric, SampleString};
use rand::Rng;
use uuid::{Builder, Uuid};

/// A random (version 4) UUID from the thread's CSPRNG: `Uuid::new_v4` would make a
/// `getrandom` system call for every id, and a request makes up to three.
fn uuid_v4() -> Uuid {
    Builder::from_random_bytes(rand::rng().random()).into_uuid()
}

/// A request id (hyphenated UUID), made as the response header it is sent in: encoded on
/// the stack, so the header value is its only allocation.
pub fn request_id() -> HeaderValue {
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    header_value(uuid_v4().hyphenated().encode_lower(&mut text))
}

/// `text` (ASCII by construction) as a header value.
fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).expect("ids are ASCII hex and hyphens")
}

pub fn reservation_id() -> String {
    format!("rsv_{}", uuid_v4().simple())
}

pub fn event_id() -> String {
    format!("evt_{}", uuid_v4().simple())
}

pub fn key_id() -> String {
    format!("key_{}", &uuid_v4().simple().to_string()[..16])
}

pub fn policy_id() -> String {
    format!("pol_{}", &uuid_v4().simple().to_string()[..16])
}

pub fn ledger_id() -> String {
    uuid_v4().to_string()
}

/// A new tenant API key: `cyc_live_` + 32 random alphanumeric characters (≈190 bits).
pub fn new_key_secret() -> String {
    format!(
        "cyc_live_{}",
        Alphanumeric.sample_string(&mut rand::rng(), 32)
    )
}

/// A random W3C trace id (32 lowercase hex, never all zero), as a header value.
pub fn trace_id() -> HeaderValue {
    let mut text = [0; uuid::fmt::Simple::LENGTH];
    loop {
        let id = uuid_v4().simple().encode_lower(&mut text);
        if id.bytes().any(|b| b != b'0') {
            return header_value(id);
        }
    }
}
