//! Webhook subscriptions and the server's webhook security configuration.
//!
//! A subscription is live work (it is in the state and its snapshot); the deliveries it
//! receives are history, kept by the store.

use serde::{Deserialize, Serialize};

use crate::event::{EventCategory, EventType, SYSTEM_TENANT};
use crate::Millis;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WebhookStatus {
    Active,
    /// Stopped by an operator: events meanwhile are not queued for it.
    Paused,
    /// Stopped by the server after `disable_after_failures` failed deliveries in a row.
    Disabled,
}

/// `WebhookRetryPolicy`, with the spec's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial_delay_ms: u64,
    /// Thousandths (2.0 is 2000): the state holds no floats, so it compares exactly.
    pub backoff_multiplier_milli: u32,
    pub max_delay_ms: u64,
}

impl Eq for RetryPolicy {}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial_delay_ms: 1_000,
            backoff_multiplier_milli: 2_000,
            max_delay_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// The delay before retry `n` (1-based): `initial × multiplier^(n−1)`, capped.
    pub fn delay_ms(&self, n: u32) -> u64 {
        let mut delay = self.initial_delay_ms as f64;
        let multiplier = f64::from(self.backoff_multiplier_milli) / 1000.0;
        for _ in 1..n {
            delay *= multiplier;
            if delay >= self.max_delay_ms as f64 {
                break;
            }
        }
        (delay as u64).min(self.max_delay_ms)
    }
}

pub const DEFAULT_DISABLE_AFTER_FAILURES: u32 = 10;

/// The window `system.high_latency` is measured over, in seconds.
pub const HIGH_LATENCY_WINDOW_S: u32 = 60;

/// How old a delivery may grow (from its creation, across retries and downtime) before it
/// is failed instead of attempted: 24 hours, as the reference.
pub const MAX_DELIVERY_AGE_MS: Millis = 24 * 3_600_000;

/// A webhook subscription. Its signing secret and custom header values are stored sealed
/// (encrypted by the server before they reach the ledger), so neither the journal nor a
/// snapshot holds them in the clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSubscription {
    pub subscription_id: String,
    /// A tenant id, or [`SYSTEM_TENANT`] for a system-wide subscription.
    pub tenant_id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub url: String,
    pub event_types: Vec<EventType>,
    pub event_categories: Vec<EventCategory>,
    pub scope_filter: Option<String>,
    /// `WebhookThresholdConfig`, as JSON text, as given (validated by the protocol layer).
    /// Its `budget_utilization` levels are read by [`WebhookSubscription::utilization_levels`].
    pub thresholds: Option<String>,
    pub sealed_secret: String,
    /// Custom headers, values sealed.
    pub headers: Vec<(String, String)>,
    pub status: WebhookStatus,
    pub retry_policy: RetryPolicy,
    pub disable_after_failures: u32,
    pub consecutive_failures: u32,
    pub created_at_ms: Millis,
    pub updated_at_ms: Millis,
    pub last_triggered_at_ms: Option<Millis>,
    pub last_success_at_ms: Option<Millis>,
    pub last_failure_at_ms: Option<Millis>,
    /// JSON object text.
    pub metadata: Option<String>,
}

impl WebhookSubscription {
    pub fn is_system(&self) -> bool {
        self.tenant_id == SYSTEM_TENANT
    }

    /// Whether this subscription receives `event_type` at `scope`: its selectors match, its
    /// scope filter matches, and (defence in depth) a tenant-owned subscription never
    /// receives an admin-only event.
    pub fn wants(&self, event_type: EventType, scope: Option<&str>) -> bool {
        let category = event_type.category();
        if !self.is_system() && !category.tenant_accessible() {
            return false;
        }
        let selected =
            self.event_types.contains(&event_type) || self.event_categories.contains(&category);
        selected && scope_filter_matches(self.scope_filter.as_deref(), scope)
    }
}

/// The reference's scope-filter rule: none matches everything (even events without a
/// scope); `*` any scoped event; a trailing `*` a prefix with something after it; anything
/// else exactly. A filter never matches an event without a scope.
/// Utilization levels in millionths (800 000 is 80 %): integers, so that a crossing is
/// decided exactly and a level read back from an event's payload compares equal.
pub type Level = u32;

/// The levels `budget.threshold_crossed` fires at for a subscription that names none
/// (`WebhookThresholdConfig.budget_utilization`'s default: 0.80, 0.95, 1.0). The server
/// always watches these, so the event log has them whatever is subscribed.
pub const DEFAULT_UTILIZATION_LEVELS: [Level; 3] = [800_000, 950_000, 1_000_000];

/// A utilization ratio as a [`Level`] (rounded to the nearest millionth).
pub fn level_of(ratio: f64) -> Level {
    (ratio.clamp(0.0, 1.0) * 1e6).round() as Level
}

impl WebhookSubscription {
    /// The levels this subscription's `budget.threshold_crossed` events are at: those its
    /// `thresholds.budget_utilization` lists, or [`DEFAULT_UTILIZATION_LEVELS`].
    pub fn utilization_levels(&self) -> Vec<Level> {
        let listed = self
            .thresholds
            .as_deref()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            .and_then(|t| {
                t.get("budget_utilization")?.as_array().map(|levels| {
                    levels
                        .iter()
                        .filter_map(serde_json::Value::as_f64)
                        .map(level_of)
                        .collect::<Vec<_>>()
                })
            });
        let mut levels = listed.unwrap_or_else(|| DEFAULT_UTILIZATION_LEVELS.to_vec());
        levels.sort_unstable();
        levels.dedup();
        levels
    }

    /// The window (seconds) and threshold this subscription sets for a detected event
    /// type (its `WebhookThresholdConfig`, or the spec's defaults): the burn rate's
    /// multiplier, or the fraction of decisions, settlements or authentications a rate
    /// spike is. `system.high_latency` has no field there: the server's own threshold
    /// applies, over a minute.
    pub fn detector_threshold(&self, event_type: EventType) -> (u32, f64) {
        let config: serde_json::Value = self
            .thresholds
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        let field =
            |name: &str, default: f64| config.get(name).and_then(|v| v.as_f64()).unwrap_or(default);
        let window = |name: &str| {
            config
                .get(name)
                .and_then(|v| v.as_u64())
                .map_or(300, |w| w as u32)
        };
        match event_type {
            EventType::BudgetBurnRateAnomaly => (
                window("burn_rate_window_seconds"),
                field("burn_rate_multiplier", 3.0),
            ),
            EventType::ReservationDenialRateSpike => (
                window("rate_window_seconds"),
                field("denial_rate_threshold", 0.10),
            ),
            EventType::ReservationExpiryRateSpike => (
                window("rate_window_seconds"),
                field("expiry_rate_threshold", 0.05),
            ),
            EventType::ApiKeyAuthFailureRateSpike => (
                window("rate_window_seconds"),
                field("auth_failure_rate_threshold", 0.10),
            ),
            _ => (HIGH_LATENCY_WINDOW_S, 0.0),
        }
    }

    /// True when `event` is for this subscription: its type or category is selected, its
    /// scope passes the filter, a threshold crossing is at one of the subscription's own
    /// levels, and a detected anomaly was measured over the subscription's window and
    /// reached its threshold.
    pub fn wants_event(&self, event: &crate::Event) -> bool {
        if !self.wants(event.event_type, event.scope.as_deref()) {
            return false;
        }
        match event.event_type {
            EventType::BudgetThresholdCrossed => event
                .threshold_level()
                .is_some_and(|level| self.utilization_levels().contains(&level)),
            EventType::SystemHighLatency => true,
            t if crate::apply::DETECTED_TYPES.contains(&t) => {
                let (window, threshold) = self.detector_threshold(t);
                event
                    .measured()
                    .is_some_and(|(w, value)| w == window && value >= threshold)
            }
            _ => true,
        }
    }
}

pub fn scope_filter_matches(filter: Option<&str>, scope: Option<&str>) -> bool {
    let Some(filter) = filter.filter(|f| !f.trim().is_empty()) else {
        return true;
    };
    let Some(scope) = scope.filter(|s| !s.is_empty()) else {
        return false;
    };
    if filter == "*" {
        return true;
    }
    match filter.strip_suffix('*') {
        Some(prefix) => scope.len() > prefix.len() && scope.starts_with(prefix),
        None => scope == filter,
    }
}

/// `WebhookSecurityConfig`: what webhook URLs may be (validated by the server, which can
/// resolve names; the ledger only keeps it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecurity {
    pub blocked_cidr_ranges: Vec<String>,
    pub allowed_url_patterns: Vec<String>,
    pub allow_http: bool,
}

impl Default for WebhookSecurity {
    fn default() -> Self {
        WebhookSecurity {
            blocked_cidr_ranges: [
                "10.0.0.0/8",
                "172.16.0.0/12",
                "192.168.0.0/16",
                "127.0.0.0/8",
                "169.254.0.0/16",
                "::1/128",
                "fc00::/7",
            ]
            .map(String::from)
            .to_vec(),
            allowed_url_patterns: Vec::new(),
            allow_http: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeliveryStatus {
    Pending,
    Success,
    Failed,
    Retrying,
}

impl DeliveryStatus {
    pub fn is_final(self) -> bool {
        matches!(self, DeliveryStatus::Success | DeliveryStatus::Failed)
    }
}

/// One event's delivery to one subscription: in the state while it is due (PENDING or
/// RETRYING), in the history store always (every change of it is projected there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub delivery_id: String,
    pub subscription_id: String,
    pub event_id: String,
    pub event_type: EventType,
    /// The event's tenant (a tenant's own deliveries are listed by it).
    pub tenant_id: String,
    pub status: DeliveryStatus,
    pub created_at_ms: Millis,
    pub attempted_at_ms: Option<Millis>,
    pub completed_at_ms: Option<Millis>,
    pub attempts: u32,
    pub response_status: Option<u16>,
    pub response_time_ms: Option<u64>,
    pub error_message: Option<String>,
    /// When it is next due (PENDING: now; RETRYING: the retry).
    pub next_attempt_at_ms: Millis,
    pub trace_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_the_spec() {
        let p = RetryPolicy::default();
        let delays: Vec<u64> = (1..=5).map(|n| p.delay_ms(n)).collect();
        assert_eq!(delays, [1_000, 2_000, 4_000, 8_000, 16_000]);
        assert_eq!(p.delay_ms(10), 60_000, "capped at max_delay_ms");
    }

    fn subscription(event_types: Vec<EventType>, thresholds: Option<&str>) -> WebhookSubscription {
        WebhookSubscription {
            subscription_id: "whsub_1".into(),
            tenant_id: "acme".into(),
            name: None,
            description: None,
            url: "https://hooks.example.com/x".into(),
            event_types,
            event_categories: Vec::new(),
            scope_filter: None,
            thresholds: thresholds.map(str::to_string),
            sealed_secret: String::new(),
            headers: Vec::new(),
            status: WebhookStatus::Active,
            retry_policy: RetryPolicy::default(),
            disable_after_failures: DEFAULT_DISABLE_AFTER_FAILURES,
            consecutive_failures: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            last_triggered_at_ms: None,
            last_success_at_ms: None,
            last_failure_at_ms: None,
            metadata: None,
        }
    }

    fn event(event_type: EventType, data: serde_json::Value) -> crate::Event {
        crate::Event {
            event_id: crate::Event::id_of(1),
            event_type,
            timestamp_ms: 0,
            tenant_id: "acme".into(),
            scope: Some("tenant:acme".into()),
            actor: crate::EventActor {
                kind: crate::ActorKind::System,
                key_id: None,
                source_ip: None,
            },
            source: "anomaly-detector".into(),
            data: data.to_string(),
            correlation_id: None,
            request_id: None,
            trace_id: None,
        }
    }

    #[test]
    fn detected_anomalies_reach_the_windows_and_thresholds_subscribed() {
        let denial = EventType::ReservationDenialRateSpike;
        let spike = |rate: f64, window: u32| {
            event(
                denial,
                serde_json::json!({"current_rate": rate, "window_seconds": window}),
            )
        };
        // The spec's defaults: a 300 s window, 0.10 of decisions.
        let defaults = subscription(vec![denial], None);
        assert_eq!(defaults.detector_threshold(denial), (300, 0.10));
        assert!(defaults.wants_event(&spike(0.10, 300)));
        assert!(
            !defaults.wants_event(&spike(0.09, 300)),
            "under the threshold"
        );
        assert!(!defaults.wants_event(&spike(0.5, 60)), "another window");
        let strict = subscription(
            vec![denial],
            Some(r#"{"denial_rate_threshold": 0.5, "rate_window_seconds": 60}"#),
        );
        assert!(strict.wants_event(&spike(0.5, 60)));
        assert!(!strict.wants_event(&spike(0.4, 60)));
        assert!(!strict.wants_event(&spike(0.9, 300)));

        let burn = EventType::BudgetBurnRateAnomaly;
        let anomaly = |multiplier: f64| {
            event(
                burn,
                serde_json::json!({"multiplier": multiplier, "window_seconds": 300}),
            )
        };
        let watcher = subscription(vec![burn], Some(r#"{"burn_rate_multiplier": 5.0}"#));
        assert_eq!(watcher.detector_threshold(burn), (300, 5.0));
        assert!(watcher.wants_event(&anomaly(5.0)));
        assert!(!watcher.wants_event(&anomaly(4.9)));
        // A payload without its measure reaches nobody who set a threshold on it.
        assert!(!watcher.wants_event(&event(burn, serde_json::json!({}))));
    }

    #[test]
    fn scope_filters_match_as_the_reference() {
        let m = scope_filter_matches;
        assert!(m(None, None));
        assert!(m(Some(" "), Some("tenant:a")));
        assert!(!m(Some("*"), None));
        assert!(m(Some("*"), Some("tenant:a")));
        assert!(m(Some("tenant:a/*"), Some("tenant:a/workspace:w")));
        assert!(!m(Some("tenant:a/*"), Some("tenant:a/")));
        assert!(!m(Some("tenant:a/*"), Some("tenant:a")));
        assert!(m(Some("tenant:a"), Some("tenant:a")));
        assert!(!m(Some("tenant:a"), Some("tenant:A")));
    }
}

/// A page of one subscription's deliveries, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryQuery {
    pub subscription_id: String,
    pub status: Option<DeliveryStatus>,
    /// Inclusive bounds on when the delivery was created.
    pub from_ms: Option<Millis>,
    pub to_ms: Option<Millis>,
    /// The last delivery id of the previous page.
    pub after: Option<String>,
    pub limit: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPage {
    pub deliveries: Vec<Delivery>,
    pub has_more: bool,
}
