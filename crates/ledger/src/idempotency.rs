//! Idempotency records: state, not a cache. Written in the same step as the effect.

use serde::{Deserialize, Serialize};

use crate::{Millis, StoredOutcome};

/// The namespace a key lives in. Operations on a reservation include its id, so the same
/// key on two reservations names two independent operations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Endpoint {
    /// Live and dry-run reserves share one namespace.
    Reserve,
    Decide,
    Event,
    Commit(String),
    Release(String),
    Extend(String),
    Fund,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdemKey {
    pub tenant_id: String,
    pub endpoint: Endpoint,
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRecord {
    /// SHA-256 of the request's canonical JSON.
    pub fingerprint: [u8; 32],
    /// The original successful outcome, replayed verbatim.
    pub outcome: StoredOutcome,
    /// When the record may be evicted.
    pub expires_at_ms: Millis,
}
