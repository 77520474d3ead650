//! Request fingerprints for idempotency: SHA-256 of the request's RFC 8785 canonical JSON.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Fingerprints a parsed request. Key order and whitespace in the client's JSON do not
/// matter; the values do.
pub fn fingerprint<T: Serialize>(request: &T) -> [u8; 32] {
    // Serializing a parsed request cannot fail: every field came from JSON.
    let canonical = serde_json_canonicalizer::to_vec(request).unwrap_or_default();
    Sha256::digest(&canonical).into()
}
