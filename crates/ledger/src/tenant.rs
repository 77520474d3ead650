//! Tenants: the isolation boundary, and the runtime defaults they carry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Millis, OveragePolicy};

pub const DEFAULT_TTL_MS: i64 = 60_000;
pub const DEFAULT_MAX_TTL_MS: i64 = 3_600_000;
pub const DEFAULT_MAX_EXTENSIONS: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantStatus {
    Active,
    Suspended,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpiryPolicy {
    AutoRelease,
    ManualCleanup,
    GraceOnly,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub tenant_id: String,
    pub name: String,
    pub status: TenantStatus,
    pub parent_tenant_id: Option<String>,
    pub default_commit_overage_policy: OveragePolicy,
    pub default_reservation_ttl_ms: i64,
    pub max_reservation_ttl_ms: i64,
    pub max_reservation_extensions: u32,
    pub reservation_expiry_policy: ExpiryPolicy,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: Millis,
    pub updated_at_ms: Millis,
    pub suspended_at_ms: Option<Millis>,
    pub closed_at_ms: Option<Millis>,
}
