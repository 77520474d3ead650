//! Emitting events: an operation stages each event beside its other effects (the outbox),
//! and with it one delivery for every ACTIVE subscription that wants it. A refused
//! operation's staged events are dropped with the rest, so a refusal emits nothing.

use std::sync::Arc;

use serde_json::Value;

use crate::{
    ActorKind, Delivery, DeliveryStatus, Effect, Event, EventActor, EventType, Level,
    WebhookStatus, SYSTEM_TENANT,
};

use super::{Actor, Tx};

/// An event as an operation describes it; [`Tx::emit`] numbers, dates and routes it.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_type: EventType,
    pub tenant_id: String,
    pub scope: Option<String>,
    pub actor: EventActor,
    pub source: &'static str,
    pub data: Value,
    pub correlation_id: Option<String>,
}

/// What moved a budget, for the events its write may fire ([`Tx::threshold_events`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cause<'a> {
    /// A runtime request (reserve, commit, release, event) by this caller.
    Runtime(&'a Actor),
    /// An admin-plane operation by this caller.
    Admin(&'a Actor),
    /// The server on its own: the expiry of a reservation past its grace.
    System,
}

/// Sources as the reference names them.
pub(crate) const ADMIN_SOURCE: &str = "cycles-admin";
pub(crate) const RUNTIME_SOURCE: &str = "cycles-server";
pub(crate) const SWEEP_SOURCE: &str = "expiry-sweeper";
pub(crate) const DISPATCH_SOURCE: &str = "cycles-events";

impl Tx<'_> {
    /// Who an event names as its cause. `on_behalf`: the operation acts on one tenant's
    /// resources, so the admin key acts on that tenant's behalf.
    pub(crate) fn event_actor(&self, actor: &Actor, on_behalf: bool) -> EventActor {
        let (kind, key_id) = match actor {
            Actor::Admin if on_behalf => (ActorKind::AdminOnBehalfOf, None),
            Actor::Admin => (ActorKind::Admin, None),
            Actor::ApiKey(digest) => (
                ActorKind::ApiKey,
                self.state.key_id_by_digest(digest).map(str::to_string),
            ),
        };
        EventActor {
            kind,
            key_id,
            source_ip: self.origin().source_ip.clone(),
        }
    }

    /// The actor of what the server does on its own (the sweep, the dispatcher).
    pub(crate) fn system_actor() -> EventActor {
        EventActor {
            kind: ActorKind::System,
            key_id: None,
            source_ip: None,
        }
    }

    /// The request's id, for correlation ids built from it (empty when there is none).
    pub(crate) fn request_id(&self) -> &str {
        self.origin().request_id.as_deref().unwrap_or_default()
    }

    /// Stages `new` as an event, and a delivery of it to every subscription that wants it.
    /// Returns the event's id.
    pub(crate) fn emit(&mut self, new: NewEvent) -> String {
        // Numbers are the millisecond in the high bits and a counter in the low 16, and
        // always above the last one given out: unique, and increasing with time.
        let floor = (self.now.max(0) as u64) << 16;
        let number = floor.max(self.state.webhooks.last_event + 1) + self.numbered.events;
        self.numbered.events += 1;
        let event = Event {
            event_id: Event::id_of(number),
            event_type: new.event_type,
            timestamp_ms: self.now,
            tenant_id: new.tenant_id,
            scope: new.scope,
            actor: new.actor,
            source: new.source.to_string(),
            data: new.data.to_string(),
            correlation_id: new.correlation_id,
            request_id: self.origin().request_id.clone(),
            trace_id: self.origin().trace_id.clone(),
        };
        self.route(&event);
        let id = event.event_id.clone();
        self.put(Effect::Event(Box::new(event)));
        id
    }

    /// Stages one PENDING delivery of `event` per ACTIVE subscription of its tenant or of
    /// the system that wants it.
    fn route(&mut self, event: &Event) {
        let webhooks = &self.state.webhooks;
        let owners = [event.tenant_id.as_str(), SYSTEM_TENANT];
        let wanted: Vec<String> = owners
            .iter()
            .enumerate()
            // A system event is the system's only once.
            .filter(|(i, owner)| *i == 0 || **owner != event.tenant_id)
            .filter_map(|(_, owner)| webhooks.by_owner.get(*owner))
            .flatten()
            .filter_map(|id| webhooks.subscriptions.get(id))
            .filter(|w| w.status == WebhookStatus::Active && w.wants_event(event))
            .map(|w| w.subscription_id.clone())
            .collect();
        for subscription_id in wanted {
            let delivery = self.new_delivery(event, subscription_id);
            self.put(Effect::PutDelivery(Arc::new(delivery)));
        }
    }

    /// A PENDING delivery of `event` to a subscription, due now.
    pub(crate) fn new_delivery(&mut self, event: &Event, subscription_id: String) -> Delivery {
        let floor = (self.now.max(0) as u64) << 16;
        let number = floor.max(self.state.webhooks.last_delivery + 1) + self.numbered.deliveries;
        self.numbered.deliveries += 1;
        Delivery {
            delivery_id: format!("del_{number:016x}"),
            subscription_id,
            event_id: event.event_id.clone(),
            event_type: event.event_type,
            tenant_id: event.tenant_id.clone(),
            status: DeliveryStatus::Pending,
            created_at_ms: self.now,
            attempted_at_ms: None,
            completed_at_ms: None,
            attempts: 0,
            response_status: None,
            response_time_ms: None,
            error_message: None,
            next_attempt_at_ms: self.now,
            trace_id: event.trace_id.clone(),
        }
    }
}

/// The protocol's name of an upper-case enum value (`AllowIfAvailable` is
/// `ALLOW_IF_AVAILABLE`): the wire names of the statuses, policies and funding operations
/// events carry are their variants' names in upper snake case.
pub(crate) fn upper(value: impl std::fmt::Debug) -> String {
    let camel = format!("{value:?}");
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// A budget's balances, as `previous_state` / `new_state` of a budget lifecycle event.
pub(crate) fn budget_state(b: &crate::Budget) -> Value {
    serde_json::json!({
        "allocated": b.allocated,
        "remaining": b.remaining,
        "debt": b.debt,
        "spent": b.spent,
        "reserved": b.reserved,
        "status": b.status.as_str(),
    })
}

/// `EventDataBudgetLifecycle`.
pub(crate) fn budget_lifecycle(
    before: Option<&crate::Budget>,
    after: &crate::Budget,
    operation: &str,
    reason: Option<&str>,
) -> Value {
    let mut data = serde_json::json!({
        "ledger_id": &*after.ledger_id,
        "scope": &*after.scope,
        "unit": after.unit.as_str(),
        "operation": operation,
        "new_state": budget_state(after),
    });
    if let Some(before) = before {
        data["previous_state"] = budget_state(before);
    }
    if let Some(reason) = reason {
        data["reason"] = reason.into();
    }
    data
}

/// What a budget's utilization counts as used.
fn used(b: &crate::Budget) -> i128 {
    i128::from(b.spent) + i128::from(b.reserved)
}

/// Whether a budget's utilization is below `level` (exactly, in integers); `None` when it
/// has no utilization (nothing allocated).
fn below(b: &crate::Budget, level: Level) -> Option<bool> {
    (b.allocated > 0).then(|| used(b) * 1_000_000 < i128::from(level) * i128::from(b.allocated))
}

/// The fields that differ between two values of a record, by name.
pub(crate) fn changed(fields: &[(&str, bool)]) -> Vec<String> {
    fields
        .iter()
        .filter(|(_, differs)| *differs)
        .map(|(name, _)| name.to_string())
        .collect()
}

impl Tx<'_> {
    /// The runtime's balance events (reference-behaviour §16.1, transition-based) of budgets
    /// about to be written as `after`, against their values before this operation:
    /// `budget.exhausted` when the remaining reached 0 (or went below it: the reference
    /// only fires on exactly 0, and misses an overdraft charge that passes zero),
    /// `budget.over_limit_entered` when the
    /// budget went over its limit, and with `debt` (a charge's reservation and overage
    /// policy) `budget.debt_incurred` where it added debt. The common case (none of these)
    /// costs a few comparisons.
    pub(crate) fn balance_events(
        &mut self,
        actor: &Actor,
        after: &[crate::Budget],
        debt: Option<(Option<&str>, crate::OveragePolicy)>,
    ) {
        for b in after {
            if b.remaining > 0 && !b.is_over_limit && b.debt == 0 {
                continue;
            }
            let Some(before) = self.state.budget(&b.key()).cloned() else {
                continue;
            };
            let source = RUNTIME_SOURCE;
            // Reaching zero, or passing it into debt under an overdraft policy.
            if before.remaining > 0 && b.remaining <= 0 {
                let used = b.spent.saturating_add(b.reserved);
                let utilization = if b.allocated > 0 {
                    used as f64 / b.allocated as f64
                } else {
                    1.0
                };
                let data = serde_json::json!({
                    "scope": &*b.scope, "unit": b.unit.as_str(), "threshold": 1.0,
                    "utilization": utilization, "allocated": b.allocated, "remaining": b.remaining,
                    "spent": b.spent, "reserved": b.reserved, "direction": "rising",
                });
                self.runtime_event(actor, EventType::BudgetExhausted, b, data, source);
            }
            if !before.is_over_limit && b.is_over_limit {
                let data = serde_json::json!({
                    "scope": &*b.scope, "unit": b.unit.as_str(), "debt": b.debt,
                    "overdraft_limit": b.overdraft_limit, "is_over_limit": true,
                    "debt_utilization": super::budgets::debt_utilization(b),
                });
                self.runtime_event(actor, EventType::BudgetOverLimitEntered, b, data, source);
            }
            let incurred = b.debt.saturating_sub(before.debt);
            if let (Some((reservation_id, policy)), true) = (debt, incurred > 0) {
                let data = serde_json::json!({
                    "scope": &*b.scope, "unit": b.unit.as_str(),
                    "reservation_id": reservation_id, "debt_incurred": incurred,
                    "total_debt": b.debt, "overdraft_limit": b.overdraft_limit,
                    "overage_policy": upper(policy),
                });
                self.runtime_event(actor, EventType::BudgetDebtIncurred, b, data, source);
            }
        }
    }

    /// `budget.threshold_crossed`, once per watched utilization level that a budget write
    /// crossed, in the direction it crossed it: rising when the utilization
    /// ((spent + reserved) / allocated) went from below the level to at or above it,
    /// falling the other way. A budget that stays on one side fires nothing, so an alert
    /// fires once per crossing, not once per request above the level. The common case (the
    /// used amount and the allocation unchanged, or no level between the two values) costs
    /// one lookup and a few integer comparisons.
    pub(crate) fn threshold_events(&mut self, cause: Cause<'_>, after: &[crate::Budget]) {
        let state = self.state;
        for b in after {
            let Some(before) = state.budget(&b.key()) else {
                continue;
            };
            if used(before) == used(b) && before.allocated == b.allocated {
                continue;
            }
            for level in state.webhooks.watched_levels() {
                let direction = match (below(before, level), below(b, level)) {
                    (Some(true), Some(false)) => "rising",
                    (Some(false), Some(true)) => "falling",
                    _ => continue,
                };
                let data = serde_json::json!({
                    "scope": &*b.scope, "unit": b.unit.as_str(),
                    "threshold": f64::from(level) / 1e6,
                    "utilization": used(b) as f64 / b.allocated as f64,
                    "allocated": b.allocated, "remaining": b.remaining,
                    "spent": b.spent, "reserved": b.reserved, "direction": direction,
                });
                let (actor, source) = match cause {
                    Cause::Runtime(actor) => (self.event_actor(actor, true), RUNTIME_SOURCE),
                    Cause::Admin(actor) => (self.event_actor(actor, true), ADMIN_SOURCE),
                    Cause::System => (Self::system_actor(), SWEEP_SOURCE),
                };
                self.emit(NewEvent {
                    event_type: EventType::BudgetThresholdCrossed,
                    tenant_id: b.tenant_id.to_string(),
                    scope: Some(b.scope.to_string()),
                    actor,
                    source,
                    data,
                    correlation_id: None,
                });
            }
        }
    }

    /// Stages one event about budget `b` caused by a runtime request.
    pub(crate) fn runtime_event(
        &mut self,
        actor: &Actor,
        event_type: EventType,
        b: &crate::Budget,
        data: Value,
        source: &'static str,
    ) {
        let actor = self.event_actor(actor, true);
        self.emit(NewEvent {
            event_type,
            tenant_id: b.tenant_id.to_string(),
            scope: Some(b.scope.to_string()),
            actor,
            source,
            data,
            correlation_id: None,
        });
    }
}
