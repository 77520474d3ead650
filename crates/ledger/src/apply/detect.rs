//! What the anomaly detector (the server's `detector`) reads and writes. The detector keeps
//! its rolling windows outside the ledger: they are measurements, not state, and a restart
//! starts them afresh. What it finds comes back here as events, emitted like any other:
//! routed to the subscriptions that want them and journaled with their deliveries.

use std::sync::Arc;

use imbl::OrdMap;
use serde_json::Value;

use crate::{Budget, BudgetKey, EventType, Millis, Rejection, WebhookStatus, SYSTEM_TENANT};

use super::emit::NewEvent;
use super::{operation, Tx};

/// The event types the detector produces.
pub const DETECTED_TYPES: [EventType; 5] = [
    EventType::BudgetBurnRateAnomaly,
    EventType::ReservationDenialRateSpike,
    EventType::ReservationExpiryRateSpike,
    EventType::ApiKeyAuthFailureRateSpike,
    EventType::SystemHighLatency,
];

/// The source detected events name, as the spec's example does.
const DETECTOR_SOURCE: &str = "anomaly-detector";

/// What the detector should watch now: read at every one of its ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchAnomalies;

/// One window a subscriber asks the detector to watch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watch {
    pub event_type: EventType,
    pub window_s: u32,
    /// The lowest threshold any subscriber with this window asks for (a multiplier for the
    /// burn rate, a fraction for the rates); a subscription with a higher one is only sent
    /// the events that reach it (`WebhookSubscription::wants_event`).
    pub threshold: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnomalyWatch {
    /// The ledger's time: the detector's windows are measured in it.
    pub now_ms: Millis,
    /// One per detected type and window that an ACTIVE subscription selects (none: nobody
    /// listens, and the detector records nothing).
    pub watches: Vec<Watch>,
    /// Every budget, when a burn rate is watched: a copy of the state's map, made in O(1),
    /// that the detector reads outside the ledger lock.
    pub budgets: Option<OrdMap<BudgetKey, Arc<Budget>>>,
}

/// Events the detector found.
#[derive(Debug, Clone, PartialEq)]
pub struct EmitAnomalies {
    pub anomalies: Vec<Anomaly>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Anomaly {
    pub event_type: EventType,
    /// A tenant, or [`SYSTEM_TENANT`] for the server's own measures.
    pub tenant_id: String,
    pub scope: Option<String>,
    /// The event's payload (`EventDataBurnRateAnomaly`, `EventDataRateSpike` or
    /// `EventDataSystem`).
    pub data: Value,
}

operation!(WatchAnomalies => AnomalyWatch, watch_anomalies);
operation!(EmitAnomalies => usize, emit_anomalies);

impl Tx<'_> {
    fn watch_anomalies(&mut self, _: WatchAnomalies) -> Result<AnomalyWatch, Rejection> {
        let mut watches: Vec<Watch> = Vec::new();
        let active = self
            .state
            .webhooks
            .subscriptions
            .values()
            .filter(|w| w.status == WebhookStatus::Active);
        for w in active {
            for event_type in DETECTED_TYPES {
                let category = event_type.category();
                let selected =
                    w.event_types.contains(&event_type) || w.event_categories.contains(&category);
                // A tenant's subscription never receives an admin-only event.
                if !selected || !(w.is_system() || category.tenant_accessible()) {
                    continue;
                }
                let (window_s, threshold) = w.detector_threshold(event_type);
                match watches
                    .iter_mut()
                    .find(|x| x.event_type == event_type && x.window_s == window_s)
                {
                    Some(watch) => watch.threshold = watch.threshold.min(threshold),
                    None => watches.push(Watch {
                        event_type,
                        window_s,
                        threshold,
                    }),
                }
            }
        }
        let burn = watches
            .iter()
            .any(|w| w.event_type == EventType::BudgetBurnRateAnomaly);
        Ok(AnomalyWatch {
            now_ms: self.now,
            watches,
            budgets: burn.then(|| self.state.budgets.clone()),
        })
    }

    fn emit_anomalies(&mut self, op: EmitAnomalies) -> Result<usize, Rejection> {
        for a in &op.anomalies {
            if !DETECTED_TYPES.contains(&a.event_type) {
                return Err(Rejection::InvalidRequest(format!(
                    "{} is not a detected event type",
                    a.event_type.name()
                )));
            }
            if a.tenant_id != SYSTEM_TENANT && self.state.tenant(&a.tenant_id).is_none() {
                return Err(Rejection::InvalidRequest(format!(
                    "no tenant {}",
                    a.tenant_id
                )));
            }
        }
        let emitted = op.anomalies.len();
        for a in op.anomalies {
            self.emit(NewEvent {
                event_type: a.event_type,
                tenant_id: a.tenant_id,
                scope: a.scope,
                actor: Self::system_actor(),
                source: DETECTOR_SOURCE,
                data: a.data,
                correlation_id: None,
            });
        }
        Ok(emitted)
    }
}
