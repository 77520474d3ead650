//! The Cycles domain and its rules.
//!
//! Everything here is pure: no I/O, no clock, no randomness. Time and identifiers arrive in
//! the operations ([`Operation`]), and [`apply`] is deterministic — the same [`State`] and
//! operation always give the same [`Applied`] result, bit for bit. Every change to the state is expressed as a
//! list of [`Effect`]s, and [`State::apply_effect`] is the only code that mutates it, both live
//! and when a journal is replayed. (The one exception is not state: the reserve's caches of
//! recent subjects and actions, which only decide which reservations share an allocation.)

mod amount;
mod apikey;
mod apply;
mod archive;
mod budget;
mod error;
mod event;
mod history;
mod idempotency;
mod intern;
mod inventory;
mod listing;
mod policy;
mod reservation;
mod results;
mod scope;
mod state;
pub mod tenant;
mod time;
mod webhook;

pub use amount::{checked_add, checked_sub, Amount, Unit};
pub use apikey::{ApiKey, ApiKeyStatus, Permission};
pub use apply::*;
pub use archive::{reserve_key_digest, ArchiveLookup, Archived, ArchivedKey, Found, UNKNOWN_TIME};
pub use budget::{
    admission_refusal, charge_amount, fund, settle_commit, Budget, BudgetKey, BudgetStatus, Charge,
    FundingOp, OveragePolicy, Refusal, RolloverPolicy,
};
pub use error::Rejection;
pub use event::{
    ActorKind, Event, EventActor, EventCategory, EventFilter, EventPage, EventQuery, EventSort,
    EventType, Origin, SYSTEM_TENANT,
};
pub use history::{
    AuditEntry, AuditFilter, AuditPage, AuditQuery, AuditSort, StatusFilter, ADMIN_TENANT,
    UNAUTH_TENANT,
};
pub use idempotency::{Endpoint, IdemKey, IdemRecord};
pub use inventory::Counts;
pub use listing::{position, Position, SortBy, SortValue};
pub use policy::{
    pattern_matches, Caps, Policy, PolicyStatus, RateCount, RateKey, RateKind, RateLimits,
    TtlOverride, MINUTE_MS,
};
pub use reservation::{Action, Reservation, ReservationStatus};
pub use results::*;
pub use scope::{
    derive_scopes, has_segment, is_within, leaf_segment, names_a_level, scope_tenant, Subject,
    SCOPE_LEVELS,
};
pub use state::{
    Effect, SnapshotData, SnapshotSource, SnapshotV1, SnapshotV2, SnapshotV3, SnapshotV4,
    SnapshotV5, SnapshotWithDigests, State, Violation, TERMINAL_RETENTION_MS,
};
pub use tenant::{ExpiryPolicy, Tenant, TenantStatus};
pub use time::{format_rfc3339, parse_rfc3339};
pub use webhook::{
    level_of, scope_filter_matches, Delivery, DeliveryPage, DeliveryQuery, DeliveryStatus, Level,
    RetryPolicy, WebhookSecurity, WebhookStatus, WebhookSubscription,
    DEFAULT_DISABLE_AFTER_FAILURES, DEFAULT_UTILIZATION_LEVELS, HIGH_LATENCY_WINDOW_S,
    MAX_DELIVERY_AGE_MS,
};

/// Milliseconds since the Unix epoch, as given by the engine's clock.
pub type Millis = i64;
