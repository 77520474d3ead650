//! Identifiers and secrets. The ledger never invents ids; they are made here.

use std::time::{SystemTime, UNIX_EPOCH};

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

/// `rsv_` and a version 7 UUID: a 48-bit millisecond timestamp, then 74 random bits (still
/// unguessable, as the runtime spec asks). Time-ordered ids keep the ledger's indexes local:
/// every listing order breaks ties by id, so with random ids each new reservation landed at
/// a random place in several million-row B-trees (a cache miss per level, per tree), and the
/// sweep, which expires the oldest first, did the same; with ids in creation order both
/// work at the edge of the trees, on nodes that are already in cache.
pub fn reservation_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let id = Builder::from_unix_timestamp_millis(millis, &rand::rng().random()).into_uuid();
    format!("rsv_{}", id.simple())
}

/// An audit entry's id: `log_` and a version 4 UUID.
pub fn log_id() -> String {
    format!("log_{}", uuid_v4().simple())
}

pub fn event_id() -> String {
    format!("evt_{}", uuid_v4().simple())
}

pub fn key_id() -> String {
    format!("key_{}", &uuid_v4().simple().to_string()[..16])
}

/// A webhook subscription's id: `whsub_` and 16 hex digits, as the reference.
pub fn subscription_id() -> String {
    format!("whsub_{}", &uuid_v4().simple().to_string()[..16])
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;

    #[test]
    fn reservation_ids_are_v7_uuids_in_creation_order() {
        let first = reservation_id();
        let same_millisecond = reservation_id();
        std::thread::sleep(Duration::from_millis(2));
        let later = reservation_id();
        assert_ne!(first, same_millisecond, "the random bits differ");
        assert!(first < later && same_millisecond < later);
        for id in [&first, &same_millisecond, &later] {
            let uuid = Uuid::parse_str(id.strip_prefix("rsv_").expect("prefix")).expect("uuid");
            assert_eq!(uuid.get_version_num(), 7);
        }
    }
}
