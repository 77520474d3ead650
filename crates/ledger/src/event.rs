//! Events: what happened, as the protocol's event log and webhooks tell it.
//!
//! An event is an effect of the operation that caused it (the outbox): it travels in that
//! operation's journal record ([`crate::Effect::Event`]), so a crash can neither lose an
//! event of an acknowledged change nor keep one of a change that was not made. Like an
//! audit entry it is history, not state: the store projects it into its history store and
//! answers [`EventQuery`]s from there.
//!
//! Type and category names are part of the value (they are stored, filtered on and matched
//! against subscriptions as text), so this module spells them as the protocol does.

use serde::{Deserialize, Serialize};

use crate::{Millis, Position, Window};

/// The owner of system-wide subscriptions and the tenant of system events.
pub const SYSTEM_TENANT: &str = "__system__";

macro_rules! names {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The protocol's name.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }
    };
}

names!(
    /// `EventCategory`: the prefix of an event type.
    EventCategory {
        Budget => "budget",
        Tenant => "tenant",
        ApiKey => "api_key",
        Policy => "policy",
        Reservation => "reservation",
        System => "system",
        Webhook => "webhook",
    }
);

impl EventCategory {
    /// Whether a tenant may see (and subscribe to) events of this category; the others are
    /// the operator's governance and security telemetry (admin spec §4.1, INVARIANT 2).
    pub fn tenant_accessible(self) -> bool {
        matches!(
            self,
            EventCategory::Budget | EventCategory::Reservation | EventCategory::Tenant
        )
    }
}

names!(
    /// `EventType`: the 51 types of v0.1.25.
    EventType {
        BudgetCreated => "budget.created",
        BudgetUpdated => "budget.updated",
        BudgetFunded => "budget.funded",
        BudgetDebited => "budget.debited",
        BudgetReset => "budget.reset",
        BudgetResetSpent => "budget.reset_spent",
        BudgetDebtRepaid => "budget.debt_repaid",
        BudgetFrozen => "budget.frozen",
        BudgetUnfrozen => "budget.unfrozen",
        BudgetClosed => "budget.closed",
        BudgetClosedViaTenantCascade => "budget.closed_via_tenant_cascade",
        BudgetThresholdCrossed => "budget.threshold_crossed",
        BudgetExhausted => "budget.exhausted",
        BudgetOverLimitEntered => "budget.over_limit_entered",
        BudgetOverLimitExited => "budget.over_limit_exited",
        BudgetDebtIncurred => "budget.debt_incurred",
        BudgetBurnRateAnomaly => "budget.burn_rate_anomaly",
        ReservationDenied => "reservation.denied",
        ReservationDenialRateSpike => "reservation.denial_rate_spike",
        ReservationExpired => "reservation.expired",
        ReservationExpiryRateSpike => "reservation.expiry_rate_spike",
        ReservationCommitOverage => "reservation.commit_overage",
        ReservationReleasedViaTenantCascade => "reservation.released_via_tenant_cascade",
        TenantCreated => "tenant.created",
        TenantUpdated => "tenant.updated",
        TenantSuspended => "tenant.suspended",
        TenantReactivated => "tenant.reactivated",
        TenantClosed => "tenant.closed",
        TenantSettingsChanged => "tenant.settings_changed",
        WebhookCreated => "webhook.created",
        WebhookUpdated => "webhook.updated",
        WebhookPaused => "webhook.paused",
        WebhookResumed => "webhook.resumed",
        WebhookDisabled => "webhook.disabled",
        WebhookDeleted => "webhook.deleted",
        WebhookDisabledViaTenantCascade => "webhook.disabled_via_tenant_cascade",
        ApiKeyCreated => "api_key.created",
        ApiKeyRevoked => "api_key.revoked",
        ApiKeyRevokedViaTenantCascade => "api_key.revoked_via_tenant_cascade",
        ApiKeyExpired => "api_key.expired",
        ApiKeyPermissionsChanged => "api_key.permissions_changed",
        ApiKeyAuthFailed => "api_key.auth_failed",
        ApiKeyAuthFailureRateSpike => "api_key.auth_failure_rate_spike",
        PolicyCreated => "policy.created",
        PolicyUpdated => "policy.updated",
        PolicyDeleted => "policy.deleted",
        SystemStoreConnectionLost => "system.store_connection_lost",
        SystemStoreConnectionRestored => "system.store_connection_restored",
        SystemHighLatency => "system.high_latency",
        SystemWebhookDeliveryFailed => "system.webhook_delivery_failed",
        SystemWebhookTest => "system.webhook_test",
    }
);

impl EventType {
    pub fn category(self) -> EventCategory {
        let prefix = self.name().split('.').next().unwrap_or_default();
        EventCategory::parse(prefix).expect("every type's prefix is a category")
    }
}

names!(
    /// Who or what caused an event (`Event.actor.type`).
    ActorKind {
        Admin => "admin",
        ApiKey => "api_key",
        AdminOnBehalfOf => "admin_on_behalf_of",
        System => "system",
        Scheduler => "scheduler",
    }
);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventActor {
    pub kind: ActorKind,
    pub key_id: Option<String>,
    pub source_ip: Option<String>,
}

/// What the request that caused an operation tells its events: correlation ids and the
/// caller's address. The ledger cannot know them; the server hands them over with the
/// operation (empty for the background sweep).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
    pub source_ip: Option<String>,
}

/// One event, as stored and delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `evt_` and 16 hex digits: the event's [`Event::number`], unique and increasing.
    pub event_id: String,
    pub event_type: EventType,
    pub timestamp_ms: Millis,
    /// A tenant id, or [`SYSTEM_TENANT`].
    pub tenant_id: String,
    pub scope: Option<String>,
    pub actor: EventActor,
    /// The emitting component (`cycles-server`, `cycles-admin`, `expiry-sweeper`, …).
    pub source: String,
    /// The type's payload: a JSON object, as text.
    pub data: String,
    pub correlation_id: Option<String>,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
}

impl Event {
    /// The level a `budget.threshold_crossed` event was fired at (its payload's
    /// `threshold`); `None` for any other event.
    pub fn threshold_level(&self) -> Option<crate::webhook::Level> {
        if self.event_type != EventType::BudgetThresholdCrossed {
            return None;
        }
        let data: serde_json::Value = serde_json::from_str(&self.data).ok()?;
        data.get("threshold")?
            .as_f64()
            .map(crate::webhook::level_of)
    }

    /// What a detected anomaly measured: its payload's `window_seconds` and the value its
    /// subscribers' thresholds compare with (`multiplier` for a burn rate, `current_rate`
    /// for a rate spike). `None` for any other event.
    pub fn measured(&self) -> Option<(u32, f64)> {
        let field = match self.event_type {
            EventType::BudgetBurnRateAnomaly => "multiplier",
            EventType::ReservationDenialRateSpike
            | EventType::ReservationExpiryRateSpike
            | EventType::ApiKeyAuthFailureRateSpike => "current_rate",
            _ => return None,
        };
        let data: serde_json::Value = serde_json::from_str(&self.data).ok()?;
        let window = u32::try_from(data.get("window_seconds")?.as_u64()?).ok()?;
        Some((window, data.get(field)?.as_f64()?))
    }

    /// The event id of number `n`.
    pub fn id_of(n: u64) -> String {
        format!("evt_{n:016x}")
    }

    /// The number an event id was made from (`None`: not one of ours).
    pub fn number(event_id: &str) -> Option<u64> {
        let hex = event_id.strip_prefix("evt_")?;
        (hex.len() == 16)
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
    }

    pub fn category(&self) -> EventCategory {
        self.event_type.category()
    }
}

/// The columns an event query may sort by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventSort {
    Timestamp,
    EventType,
    Category,
    Scope,
    TenantId,
}

impl EventSort {
    pub fn is_text(self) -> bool {
        !matches!(self, EventSort::Timestamp)
    }
}

/// A query of the event log: every filter is AND-ed with the others.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventFilter {
    pub tenant_id: Option<String>,
    pub event_type: Option<EventType>,
    pub category: Option<EventCategory>,
    /// Only tenant-accessible categories (a tenant key's view).
    pub tenant_accessible_only: bool,
    /// A prefix of the event's scope.
    pub scope_prefix: Option<String>,
    pub correlation_id: Option<String>,
    pub trace_id: Option<String>,
    pub request_id: Option<String>,
    /// Inclusive bounds on the timestamp.
    pub from_ms: Option<Millis>,
    pub to_ms: Option<Millis>,
    /// A case-insensitive substring of the correlation id or the scope.
    pub search: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub filter: EventFilter,
    pub sort: EventSort,
    /// Positions are the sort column's value and the event's number (as text).
    pub window: Window,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    pub events: Vec<Event>,
    pub next: Option<Position>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_category_and_reads_back() {
        assert_eq!(EventType::ALL.len(), 51);
        let accessible = EventType::ALL
            .iter()
            .filter(|t| t.category().tenant_accessible())
            .count();
        assert_eq!(accessible, 29, "the spec's tenant-accessible types");
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.name()), Some(*t));
        }
        assert_eq!(EventType::parse("budget.nope"), None);
    }

    #[test]
    fn ids_read_back_and_sort_as_their_numbers() {
        let (a, b) = (Event::id_of(0x1_0000), Event::id_of(0x2_0001));
        assert_eq!(Event::number(&a), Some(0x1_0000));
        assert!(a < b);
        assert_eq!(Event::number("evt_xyz"), None);
        assert_eq!(Event::number("del_0000000000000001"), None);
    }
}
