//! Property 6: the outbox. A change is seen as exactly the events it implies, each routed
//! to exactly the subscriptions that want it, and a refusal emits nothing of its own.

use std::collections::BTreeSet;

use crate::properties::model::{Command, Outcome};
use ledger::{
    level_of, ActorKind, ApiKeyStatus, Budget, BudgetKey, Delivery, DeliveryStatus, Effect, Event,
    EventType, Level, Millis, WebhookStatus, WebhookSubscription, DEFAULT_UTILIZATION_LEVELS,
    MAX_DELIVERY_AGE_MS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;

use crate::properties::driver::Step;

pub fn check_events(step: &Step) -> Result<(), TestCaseError> {
    let events: Vec<&Event> = step
        .applied
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Event(event) => Some(&**event),
            _ => None,
        })
        .collect();
    let numbers: Vec<u64> = events
        .iter()
        .map(|e| Event::number(&e.event_id).expect("an event id of ours"))
        .collect();
    prop_assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "event ids do not increase: {:?}",
        numbers
    );
    if step.applied.result.is_err() {
        // Only what a refused settlement keeps: the expiry it discovered.
        for e in &events {
            prop_assert!(
                matches!(
                    e.event_type,
                    EventType::ReservationExpired | EventType::BudgetThresholdCrossed
                ) && e.actor.kind == ActorKind::System,
                "{:?} was refused but emitted {:?}",
                step.command,
                e
            );
        }
    }
    let subscriptions = step.before.to_snapshot().webhooks;
    check_routing(step, &events, &subscriptions)?;
    check_threshold_crossings(step, &events, &subscriptions)?;
    check_key_expiry(step, &events)?;
    check_stale_deliveries(step)?;
    check_claims(step)
}

/// A claim takes a due delivery in place: stamped attempted now, still due where it was,
/// nothing else changed; a refused claim changes nothing. A delivery just claimed cannot
/// be claimed again.
fn check_claims(step: &Step) -> Result<(), TestCaseError> {
    let (Command::ClaimDelivery(claim), Ok(Outcome::Claimed(taken))) =
        (step.command, &step.applied.result)
    else {
        return Ok(());
    };
    if !taken {
        prop_assert!(
            step.applied.effects.is_empty(),
            "a refused claim changed something"
        );
        return Ok(());
    }
    let find = |state: &ledger::State| {
        state
            .to_snapshot()
            .deliveries
            .into_iter()
            .find(|d| d.delivery_id == claim.delivery_id)
    };
    let (Some(before), Some(after)) = (find(step.before), find(step.after)) else {
        return Err(TestCaseError::fail(
            "a claimed delivery is not due before and after",
        ));
    };
    prop_assert_eq!(after.attempted_at_ms, Some(step.now));
    prop_assert_eq!(
        Delivery {
            attempted_at_ms: before.attempted_at_ms,
            ..after
        },
        before
    );
    let mut again = step.after.clone();
    let twice = ledger::apply(&mut again, claim.clone(), step.now);
    prop_assert_eq!(twice.result, Ok(false), "claimed twice");
    Ok(())
}

/// Once the dispatcher has asked for everything due, nothing due is over a day old: a
/// stale delivery is failed, not sent. A look that passes over claimed deliveries passes
/// over the rest of their subscriptions' too (they wait for the claim), so those are left
/// for a later look.
fn check_stale_deliveries(step: &Step) -> Result<(), TestCaseError> {
    let (Command::DueDeliveries(ask), Ok(Outcome::Due(n))) = (step.command, &step.applied.result)
    else {
        return Ok(());
    };
    let due = step.after.to_snapshot().deliveries;
    let waiting: BTreeSet<&str> = match ask.hold_ms {
        None => BTreeSet::new(),
        Some(hold_ms) => due
            .iter()
            .filter(|d| {
                d.attempted_at_ms.is_some_and(|at| {
                    at >= d.next_attempt_at_ms && step.now < at.saturating_add(hold_ms as Millis)
                })
            })
            .map(|d| d.subscription_id.as_str())
            .collect(),
    };
    if *n < ask.limit {
        let stale = due.iter().find(|d| {
            d.next_attempt_at_ms <= step.now
                && step.now - d.created_at_ms > MAX_DELIVERY_AGE_MS
                && !waiting.contains(d.subscription_id.as_str())
        });
        prop_assert!(stale.is_none(), "still due, and stale: {:?}", stale);
    }
    Ok(())
}

/// Each event has one new delivery per ACTIVE subscription that wants it and may see it,
/// and no other; no new delivery is of an event from elsewhere.
fn check_routing(
    step: &Step,
    events: &[&Event],
    subscriptions: &[WebhookSubscription],
) -> Result<(), TestCaseError> {
    let due_before = step.before.to_snapshot().deliveries;
    let before: BTreeSet<&str> = due_before.iter().map(|d| d.delivery_id.as_str()).collect();
    let created: Vec<&Delivery> = step
        .applied
        .effects
        .iter()
        .filter_map(|e| match e {
            // New ones: a claim puts a delivery that was there already.
            Effect::PutDelivery(d)
                if d.attempts == 0
                    && d.status == DeliveryStatus::Pending
                    && !before.contains(d.delivery_id.as_str()) =>
            {
                Some(&**d)
            }
            _ => None,
        })
        .collect();
    for e in events {
        let expected: BTreeSet<&str> = subscriptions
            .iter()
            .filter(|w| w.status == WebhookStatus::Active && w.wants_event(e))
            .filter(|w| w.is_system() || w.tenant_id == e.tenant_id)
            .map(|w| w.subscription_id.as_str())
            .collect();
        let routed: Vec<&str> = created
            .iter()
            .filter(|d| d.event_id == e.event_id)
            .map(|d| d.subscription_id.as_str())
            .collect();
        prop_assert_eq!(routed.len(), expected.len(), "one delivery each: {:?}", e);
        prop_assert_eq!(routed.into_iter().collect::<BTreeSet<_>>(), expected);
    }
    for d in &created {
        prop_assert!(
            events.iter().any(|e| e.event_id == d.event_id),
            "a delivery of an event not emitted here: {:?}",
            d
        );
    }
    Ok(())
}

/// The levels crossings are watched at: the defaults and every level a subscription to
/// threshold crossings names.
fn watched_levels(subscriptions: &[WebhookSubscription]) -> BTreeSet<Level> {
    let crossing = EventType::BudgetThresholdCrossed;
    subscriptions
        .iter()
        .filter(|w| {
            w.event_types.contains(&crossing) || w.event_categories.contains(&crossing.category())
        })
        .flat_map(WebhookSubscription::utilization_levels)
        .chain(DEFAULT_UTILIZATION_LEVELS)
        .collect()
}

/// Whether a budget's utilization, (spent + reserved) / allocated, is below `level`
/// (`None`: nothing allocated, no utilization).
fn below(b: &Budget, level: Level) -> Option<bool> {
    let used = i128::from(b.spent) + i128::from(b.reserved);
    (b.allocated > 0).then(|| used * 1_000_000 < i128::from(level) * i128::from(b.allocated))
}

/// For every budget the step wrote, one `budget.threshold_crossed` per watched level its
/// utilization crossed, in that direction, with the budget's new balances; none otherwise.
fn check_threshold_crossings(
    step: &Step,
    events: &[&Event],
    subscriptions: &[WebhookSubscription],
) -> Result<(), TestCaseError> {
    let levels = watched_levels(subscriptions);
    let written: BTreeSet<BudgetKey> = step
        .applied
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::PutBudget(b) => Some(b.key()),
            _ => None,
        })
        .collect();
    let mut expected = Vec::new();
    for key in &written {
        let (Some(before), Some(after)) = (step.before.budget(key), step.after.budget(key)) else {
            continue;
        };
        for &level in &levels {
            let direction = match (below(before, level), below(after, level)) {
                (Some(true), Some(false)) => "rising",
                (Some(false), Some(true)) => "falling",
                _ => continue,
            };
            expected.push((after.scope.to_string(), level, direction.to_string()));
        }
    }
    let mut fired = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.event_type == EventType::BudgetThresholdCrossed)
    {
        let data: Value = serde_json::from_str(&e.data).expect("a JSON payload");
        let scope = data["scope"].as_str().unwrap_or_default().to_string();
        let after = step
            .after
            .budgets()
            .find(|b| *b.scope == *scope)
            .expect("the crossed budget");
        prop_assert_eq!(data["remaining"].as_i64(), Some(after.remaining));
        prop_assert_eq!(data["allocated"].as_i64(), Some(after.allocated));
        prop_assert_eq!(e.scope.as_deref(), Some(scope.as_str()));
        let level = level_of(data["threshold"].as_f64().expect("a threshold"));
        let direction = data["direction"].as_str().unwrap_or_default().to_string();
        fired.push((scope, level, direction));
    }
    expected.sort();
    fired.sort();
    prop_assert_eq!(fired, expected, "threshold crossings of {:?}", step.command);
    Ok(())
}

/// A key stored ACTIVE turns EXPIRED only with one `api_key.expired`, and a full sweep
/// leaves no ACTIVE key past its expiry.
fn check_key_expiry(step: &Step, events: &[&Event]) -> Result<(), TestCaseError> {
    let mut turned: Vec<String> = step
        .before
        .api_keys()
        .filter(|k| k.status == ApiKeyStatus::Active)
        .filter(|k| {
            step.after
                .api_keys()
                .any(|a| a.key_id == k.key_id && a.status == ApiKeyStatus::Expired)
        })
        .map(|k| k.key_id.clone())
        .collect();
    let mut announced: Vec<String> = events
        .iter()
        .filter(|e| e.event_type == EventType::ApiKeyExpired)
        .map(|e| {
            let data: Value = serde_json::from_str(&e.data).expect("a JSON payload");
            data["key_id"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    turned.sort();
    announced.sort();
    prop_assert_eq!(announced, turned);
    if matches!(
        step.command,
        Command::Maintain {
            limit: usize::MAX,
            ..
        }
    ) && step.applied.result.is_ok()
    {
        prop_assert!(
            !step
                .after
                .api_keys()
                .any(|k| k.status == ApiKeyStatus::Active && k.expires_at_ms <= step.now),
            "a full sweep left an ACTIVE key past its expiry"
        );
    }
    Ok(())
}
