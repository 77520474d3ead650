//! Reservations: holds on budgets with a lease, settled by commit, release or expiry.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Millis, OveragePolicy, Subject, Unit};

/// What the agent is about to do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Action {
    pub kind: String,
    pub name: String,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReservationStatus {
    Active,
    Committed,
    Released,
    Expired,
}

impl ReservationStatus {
    pub const ALL: [ReservationStatus; 4] = [
        ReservationStatus::Active,
        ReservationStatus::Committed,
        ReservationStatus::Released,
        ReservationStatus::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReservationStatus::Active => "ACTIVE",
            ReservationStatus::Committed => "COMMITTED",
            ReservationStatus::Released => "RELEASED",
            ReservationStatus::Expired => "EXPIRED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Shared with the state's map key, its indexes and the reserve's stored result.
    pub reservation_id: Arc<str>,
    /// The tenant the reservation is bound to (the caller's effective tenant at creation).
    pub tenant_id: Arc<str>,
    // What never changes after the reserve is behind `Arc` (serialized as before): a
    // commit, release or extension copies the reservation to change it, and the copy then
    // shares these instead of copying their strings.
    pub subject: Arc<Subject>,
    pub action: Arc<Action>,
    pub unit: Unit,
    pub estimate: i64,
    /// Shared with the reserve's stored result (one allocation, not two copies).
    pub scope_path: Arc<str>,
    /// Shared likewise.
    pub affected_scopes: Arc<[String]>,
    /// The scopes that had a budget in `unit` at reserve time; settlement touches only these.
    /// Shared with the budgets' scopes.
    pub budgeted_scopes: Arc<[Arc<str>]>,
    pub created_at_ms: Millis,
    pub expires_at_ms: Millis,
    pub grace_period_ms: i64,
    pub overage_policy: OveragePolicy,
    /// Opaque JSON object text.
    pub metadata: Option<Arc<str>>,
    /// Shared with the reserve's idempotency record.
    pub idempotency_key: Arc<str>,
    pub extension_count: u32,
    pub max_extensions: u32,
    pub status: ReservationStatus,
    /// The amount charged by the commit.
    pub charged: Option<i64>,
    /// When it was committed or released (never set for EXPIRED).
    pub finalized_at_ms: Option<Millis>,
    /// When the expiry returned its hold.
    pub expired_at_ms: Option<Millis>,
    pub committed_metadata: Option<String>,
    pub release_reason: Option<String>,
}

impl Reservation {
    /// The last instant at which commit and release are still accepted.
    pub fn settle_deadline(&self) -> Millis {
        self.expires_at_ms.saturating_add(self.grace_period_ms)
    }

    /// The status as of `now`: an ACTIVE reservation past its grace reads as EXPIRED even
    /// before the sweep has recorded it.
    pub fn effective_status(&self, now: Millis) -> ReservationStatus {
        if self.status == ReservationStatus::Active && now > self.settle_deadline() {
            ReservationStatus::Expired
        } else {
            self.status
        }
    }

    /// When it reached its final status (`None` while ACTIVE).
    pub fn settled_at_ms(&self) -> Option<Millis> {
        match self.status {
            ReservationStatus::Active => None,
            _ => Some(
                self.finalized_at_ms
                    .or(self.expired_at_ms)
                    .unwrap_or(self.expires_at_ms),
            ),
        }
    }

    /// `max(0, expires_at − now)` while ACTIVE, else 0 (runtime spec §6.8).
    pub fn remaining_ttl_ms(&self, expires_at_ms: Millis, now: Millis) -> i64 {
        if self.effective_status(now) == ReservationStatus::Active {
            expires_at_ms.saturating_sub(now).max(0)
        } else {
            0
        }
    }
}
