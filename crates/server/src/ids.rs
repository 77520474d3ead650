//! Identifiers and secrets. The ledger never invents ids; they are made here.

use rand::distr::{Alphanumeric, SampleString};
use rand::Rng;
use uuid::{Builder, Uuid};

/// A random (version 4) UUID from the thread's CSPRNG: `Uuid::new_v4` would make a
/// `getrandom` system call for every id, and a request makes up to three.
fn uuid_v4() -> Uuid {
    Builder::from_random_bytes(rand::rng().random()).into_uuid()
}

pub fn request_id() -> String {
    uuid_v4().to_string()
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

/// A random W3C trace id (32 lowercase hex, never all zero).
pub fn trace_id() -> String {
    loop {
        let id = uuid_v4().simple().to_string();
        if id.bytes().any(|b| b != b'0') {
            return id;
        }
    }
}
