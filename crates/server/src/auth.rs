//! Credentials from headers. The admin key is checked here against the operator's
//! [`AdminKey`]; a tenant key becomes the SHA-256 digest of its secret, which the ledger
//! looks up.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use ledger::Actor;
use protocol::ApiError;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub const API_KEY_HEADER: &str = "x-cycles-api-key";
pub const ADMIN_KEY_HEADER: &str = "x-admin-api-key";

/// The operator's admin key, kept as its SHA-256 digest: compared in constant time, never
/// kept in plain text.
pub struct AdminKey([u8; 32]);

impl AdminKey {
    pub fn new(key: &str) -> Self {
        AdminKey(Sha256::digest(key.as_bytes()).into())
    }

    /// Whether `presented` is the admin key.
    pub fn verify(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest.ct_eq(&self.0).into()
    }
}

/// The request's headers, moved out of it. axum's `HeaderMap` extractor clones the map (two
/// allocations and a reference count per value, on every request); each handler reads the
/// headers once, before the body, and nothing after the handlers' extractors needs them (the
/// middleware read theirs before).
pub struct Headers(pub HeaderMap);

impl<S: Send + Sync> FromRequestParts<S> for Headers {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Headers(std::mem::take(&mut parts.headers)))
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
}

/// A tenant key is required (`X-Cycles-API-Key`).
pub fn tenant(headers: &HeaderMap) -> Result<Actor, ApiError> {
    let secret = header(headers, API_KEY_HEADER)
        .ok_or_else(|| ApiError::unauthorized("Missing API key (X-Cycles-API-Key)"))?;
    Ok(Actor::ApiKey(Sha256::digest(secret.as_bytes()).into()))
}

/// The admin key is required (`X-Admin-API-Key`).
pub fn admin(key: &AdminKey, headers: &HeaderMap) -> Result<Actor, ApiError> {
    match header(headers, ADMIN_KEY_HEADER) {
        Some(presented) if key.verify(presented) => Ok(Actor::Admin),
        Some(_) => Err(ApiError::unauthorized("Invalid admin API key")),
        None => Err(ApiError::unauthorized(
            "Missing admin API key (X-Admin-API-Key)",
        )),
    }
}

/// Either key: the admin key when it is presented (and then it must be right), otherwise a
/// tenant key.
pub fn admin_or_tenant(key: &AdminKey, headers: &HeaderMap) -> Result<Actor, ApiError> {
    if header(headers, ADMIN_KEY_HEADER).is_some() {
        admin(key, headers)
    } else {
        tenant(headers)
    }
}
