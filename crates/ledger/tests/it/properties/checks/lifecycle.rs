//! Property 1: the ledger's invariants and lifecycle rules.

use std::collections::BTreeSet;

use crate::properties::model::{Command, Outcome};
use ledger::{
    ApiKeyStatus, BudgetStatus, Decision, Effect, Endpoint, Rejection, Reservation,
    ReservationStatus, TenantStatus,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::{
    balance_scopes, balances_are_current, budgeted_scopes, same_reservations, settled_id, texts,
};
use crate::properties::driver::Step;
use crate::properties::MAX_TTL;

pub fn check_invariants(step: &Step) -> Result<(), TestCaseError> {
    let violations = step.after.verify();
    prop_assert!(
        violations.is_empty(),
        "{:?} after {:?} -> {:?}",
        violations,
        step.command,
        step.applied.result
    );
    for b in step.after.budgets() {
        prop_assert!(
            b.debt <= b.overdraft_limit,
            "debt beyond the overdraft limit at {}: {:?}",
            b.scope,
            b
        );
    }
    check_rejection_is_inert(step)?;
    check_settlement_is_accepted(step)?;
    check_reported_balances(step)?;
    check_reservation_transitions(step)?;
    check_tenant_close(step)?;
    check_maintenance(step)
}

/// A refused command changes nothing, except that a settlement finding its reservation past
/// the grace period records the expiry.
fn check_rejection_is_inert(step: &Step) -> Result<(), TestCaseError> {
    if let Err(rejection) = &step.applied.result {
        if !step.applied.effects.is_empty() {
            let id = settled_id(step.command);
            prop_assert!(
                matches!(rejection, Rejection::ReservationExpired(x) if Some(x.as_str()) == id),
                "refusal {:?} of {:?} has effects {:?}",
                rejection,
                step.command,
                step.applied.effects
            );
        }
    }
    if step.applied.effects.is_empty() {
        prop_assert!(
            step.before.budgets().eq(step.after.budgets()),
            "budgets changed without effects: {:?}",
            step.command
        );
        prop_assert!(
            same_reservations(step.before, step.after),
            "reservations changed without effects: {:?}",
            step.command
        );
    }
    Ok(())
}

/// True when charging `actual` would take a budget of `r` past the largest amount: its
/// `spent` can stand above what is allocated after a reset with a `spent` override, so even
/// a commit of the estimate may not fit.
fn charge_overflows(step: &Step, r: &Reservation, actual: i64) -> bool {
    step.before
        .budgets()
        .filter(|b| b.unit == r.unit && r.budgeted_scopes.contains(&b.scope))
        .any(|b| b.spent.checked_add(actual).is_none())
}

/// An ACTIVE reservation within its grace period can be settled: a commit or release is
/// refused only for its own reasons (overage, wrong unit), an extend only within the lease
/// and the extension limit.
fn check_settlement_is_accepted(step: &Step) -> Result<(), TestCaseError> {
    let Err(e) = &step.applied.result else {
        return Ok(());
    };
    let Some(r) = settled_id(step.command).and_then(|id| step.before.reservation(id)) else {
        return Ok(());
    };
    if r.status != ReservationStatus::Active || matches!(e, Rejection::IdempotencyMismatch) {
        return Ok(());
    }
    let accepted = match step.command {
        Command::Commit(c) => {
            step.now > r.settle_deadline()
                || c.unit != r.unit
                || (matches!(e, Rejection::Overflow) && charge_overflows(step, r, c.actual))
                || (c.actual > r.estimate
                    && matches!(
                        e,
                        Rejection::BudgetExceeded { .. }
                            | Rejection::OverdraftLimitExceeded { .. }
                            | Rejection::Overflow
                    ))
        }
        Command::Release(_) => step.now > r.settle_deadline(),
        Command::Extend(_) => {
            step.now > r.expires_at_ms
                || (r.extension_count >= r.max_extensions
                    && matches!(e, Rejection::MaxExtensionsExceeded { .. }))
        }
        _ => true,
    };
    prop_assert!(
        accepted,
        "{:?} refused with {:?} at {} while {:?}",
        step.command,
        e,
        step.now,
        r
    );
    Ok(())
}

/// Balances in fresh outcomes are the budgets as left by the command; a live reserve
/// never leaves a budget it holds on below zero.
fn check_reported_balances(step: &Step) -> Result<(), TestCaseError> {
    let Ok(outcome) = &step.applied.result else {
        return Ok(());
    };
    match (step.command, outcome) {
        (
            Command::Reserve(c),
            Outcome::Reserved {
                result,
                replayed: false,
                ..
            },
        ) if !c.dry_run => {
            prop_assert_eq!(result.decision, Decision::Allow);
            prop_assert_eq!(result.reserved, Some((c.unit, c.estimate)));
            prop_assert_eq!(
                balance_scopes(&result.balances),
                budgeted_scopes(step.before, &c.subject, c.unit)
            );
            for b in &result.balances {
                prop_assert!(b.remaining >= 0, "reserve oversubscribed {:?}", b);
            }
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Commit(c),
            Outcome::Committed {
                result,
                replayed: false,
            },
        ) => {
            let r = step
                .before
                .reservation(&c.reservation_id)
                .expect("committed");
            prop_assert_eq!(balance_scopes(&result.balances), texts(&r.budgeted_scopes));
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Release(c),
            Outcome::Released {
                result,
                replayed: false,
            },
        ) => {
            let r = step
                .before
                .reservation(&c.reservation_id)
                .expect("released");
            prop_assert_eq!(result.released, r.estimate);
            prop_assert_eq!(balance_scopes(&result.balances), texts(&r.budgeted_scopes));
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Extend(_),
            Outcome::Extended {
                result,
                replayed: false,
                ..
            },
        ) => balances_are_current(step.after, &result.balances),
        (
            Command::Event(c),
            Outcome::EventApplied {
                result,
                replayed: false,
            },
        ) => {
            prop_assert_eq!(
                balance_scopes(&result.balances),
                budgeted_scopes(step.before, &c.subject, c.unit)
            );
            balances_are_current(step.after, &result.balances)
        }
        _ => Ok(()),
    }
}

/// Reservations appear, change and disappear only as their lifecycle allows.
fn check_reservation_transitions(step: &Step) -> Result<(), TestCaseError> {
    let ids: BTreeSet<&str> = step
        .before
        .reservations()
        .chain(step.after.reservations())
        .map(|r| &*r.reservation_id)
        .collect();
    let mut expired = 0;
    for id in ids {
        match (step.before.reservation(id), step.after.reservation(id)) {
            (None, Some(new)) => check_created(step, new)?,
            (Some(old), None) => check_archived(step, old)?,
            (Some(old), Some(new)) if old != new => {
                if new.status == ReservationStatus::Expired {
                    expired += 1;
                }
                check_transition(step, old, new)?;
            }
            _ => {}
        }
    }
    if let Ok(Outcome::Maintained { expired: n, .. }) = &step.applied.result {
        prop_assert_eq!(*n, expired);
    }
    Ok(())
}

fn check_created(step: &Step, new: &Reservation) -> Result<(), TestCaseError> {
    let (
        Command::Reserve(c),
        Ok(Outcome::Reserved {
            result, replayed, ..
        }),
    ) = (step.command, &step.applied.result)
    else {
        return Err(TestCaseError::fail(format!(
            "reservation {} created by {:?}",
            new.reservation_id, step.command
        )));
    };
    prop_assert!(
        !c.dry_run && !replayed,
        "dry run or replay created {:?}",
        new
    );
    prop_assert_eq!(&*new.reservation_id, c.reservation_id.as_str());
    prop_assert_eq!(result.reservation_id.as_ref(), Some(&new.reservation_id));
    prop_assert_eq!(result.expires_at_ms, Some(new.expires_at_ms));
    prop_assert_eq!(new.status, ReservationStatus::Active);
    prop_assert_eq!((new.unit, new.estimate), (c.unit, c.estimate));
    prop_assert_eq!(
        texts(&new.budgeted_scopes),
        budgeted_scopes(step.before, &c.subject, c.unit)
    );
    prop_assert_eq!(new.created_at_ms, step.now);
    prop_assert!(
        (step.now..=step.now + MAX_TTL).contains(&new.expires_at_ms),
        "lease beyond the maximum TTL: {:?}",
        new
    );
    Ok(())
}

/// A reservation leaves the state only when a maintenance pass archives it, settled at
/// least its `archive_after_ms` before.
fn check_archived(step: &Step, old: &Reservation) -> Result<(), TestCaseError> {
    let Command::Maintain {
        archive_after_ms, ..
    } = step.command
    else {
        return Err(TestCaseError::fail(format!(
            "{:?} removed reservation {old:?}",
            step.command
        )));
    };
    let at = old.settled_at_ms();
    prop_assert!(
        at.is_some_and(|at| at.saturating_add(*archive_after_ms) <= step.now),
        "archived too soon: {:?} at {}",
        old,
        step.now
    );
    Ok(())
}

fn check_transition(
    step: &Step,
    old: &Reservation,
    new: &Reservation,
) -> Result<(), TestCaseError> {
    let id = &*old.reservation_id;
    let identity = |r: &Reservation| {
        (
            r.tenant_id.clone(),
            r.unit,
            r.estimate,
            r.budgeted_scopes.clone(),
            r.created_at_ms,
            r.grace_period_ms,
            r.overage_policy,
        )
    };
    prop_assert_eq!(identity(old), identity(new));
    prop_assert_eq!(
        old.status,
        ReservationStatus::Active,
        "terminal reservation changed: {:?} -> {:?}",
        old,
        new
    );
    let targeted = settled_id(step.command) == Some(id);
    match (new.status, &step.applied.result) {
        (
            ReservationStatus::Committed,
            Ok(Outcome::Committed {
                result,
                replayed: false,
            }),
        ) if targeted => {
            prop_assert_eq!(new.charged, Some(result.charged));
            prop_assert_eq!(new.finalized_at_ms, Some(step.now));
            prop_assert!(step.now <= old.settle_deadline());
        }
        (
            ReservationStatus::Released,
            Ok(Outcome::Released {
                replayed: false, ..
            }),
        ) if targeted => {
            prop_assert_eq!(new.finalized_at_ms, Some(step.now));
            prop_assert!(step.now <= old.settle_deadline());
        }
        (ReservationStatus::Expired, result)
            if matches!(step.command, Command::Maintain { .. })
                || (targeted
                    && matches!(result, Err(Rejection::ReservationExpired(x)) if x == id)) =>
        {
            prop_assert!(
                step.now > old.settle_deadline(),
                "expired within its grace period: {:?} at {}",
                old,
                step.now
            );
            prop_assert_eq!(new.expired_at_ms, Some(step.now));
        }
        (
            ReservationStatus::Active,
            Ok(Outcome::Extended {
                result,
                replayed: false,
                ..
            }),
        ) if targeted => {
            prop_assert!(
                step.now <= old.expires_at_ms,
                "extended after its lease ended"
            );
            prop_assert_eq!(new.expires_at_ms, result.expires_at_ms);
            prop_assert!(
                new.expires_at_ms >= old.expires_at_ms,
                "extension shrank the lease"
            );
            prop_assert!(
                new.expires_at_ms <= (step.now + MAX_TTL).max(old.expires_at_ms),
                "extension beyond the maximum TTL"
            );
            prop_assert_eq!(new.extension_count, old.extension_count + 1);
            prop_assert!(new.extension_count <= new.max_extensions);
        }
        (ReservationStatus::Released, Ok(_))
            if closes_tenant(step.command)
                && step
                    .after
                    .tenant(&new.tenant_id)
                    .is_some_and(|t| t.status == TenantStatus::Closed) =>
        {
            prop_assert_eq!(new.finalized_at_ms, Some(step.now));
            prop_assert_eq!(new.release_reason.as_deref(), Some("tenant_closed"));
        }
        _ => {
            return Err(TestCaseError::fail(format!(
                "illegal transition {:?} -> {:?} by {:?} -> {:?}",
                old, new, step.command, step.applied.result
            )))
        }
    }
    Ok(())
}

/// Whether `command` asks to close a tenant (itself, or as a bulk action's row).
fn closes_tenant(command: &Command) -> bool {
    match command {
        Command::UpdateTenant { patch, .. } => patch.status == Some(TenantStatus::Closed),
        Command::BulkTenants(b) => b.target == TenantStatus::Closed,
        _ => false,
    }
}

/// The tenants `step` closed or found closed: the one an update names, the rows a bulk
/// close applied to or skipped (already closed, so its cascade re-ran).
fn tenants_closed_by(step: &Step) -> Vec<String> {
    match (step.command, &step.applied.result) {
        (Command::UpdateTenant { tenant_id, .. }, Ok(_)) if closes_tenant(step.command) => {
            vec![tenant_id.clone()]
        }
        (Command::BulkTenants(b), Ok(Outcome::Bulk { result, .. }))
            if b.target == TenantStatus::Closed =>
        {
            result
                .succeeded
                .iter()
                .chain(&result.skipped)
                .cloned()
                .collect()
        }
        _ => Vec::new(),
    }
}

/// A tenant's close releases every reservation it still holds, closes every budget and
/// revokes every key, in the same step; a closed tenant never opens again, whatever asks.
fn check_tenant_close(step: &Step) -> Result<(), TestCaseError> {
    for t in step
        .before
        .tenants()
        .filter(|t| t.status == TenantStatus::Closed)
    {
        prop_assert!(
            step.after
                .tenant(&t.tenant_id)
                .is_some_and(|after| after.status == TenantStatus::Closed),
            "a closed tenant was reopened by {:?}",
            step.command
        );
    }
    for tenant_id in tenants_closed_by(step) {
        let mine = |r: &&Reservation| *r.tenant_id == *tenant_id;
        prop_assert!(
            step.after
                .reservations()
                .filter(mine)
                .all(|r| r.status != ReservationStatus::Active),
            "a reservation stayed ACTIVE after its tenant closed"
        );
        prop_assert!(
            step.after
                .budgets()
                .filter(|b| *b.tenant_id == *tenant_id)
                .all(|b| b.status == BudgetStatus::Closed && b.reserved == 0),
            "a budget stayed open, or kept a hold, after its tenant closed"
        );
        prop_assert!(
            step.after
                .api_keys()
                .filter(|k| *k.tenant_id == *tenant_id)
                .all(|k| k.effective_status(step.now) != ApiKeyStatus::Active),
            "an API key stayed usable after its tenant closed"
        );
    }
    Ok(())
}

/// A maintenance pass expires what is due and evicts what is stale, up to its limit each.
fn check_maintenance(step: &Step) -> Result<(), TestCaseError> {
    let (
        Command::Maintain {
            limit,
            archive_after_ms,
        },
        Ok(Outcome::Maintained {
            expired,
            evicted,
            archived,
            ..
        }),
    ) = (step.command, &step.applied.result)
    else {
        return Ok(());
    };
    let lapsed =
        |r: &&Reservation| r.status == ReservationStatus::Active && r.settle_deadline() < step.now;
    let due = step.before.reservations().filter(lapsed).count();
    prop_assert_eq!(*expired, due.min(*limit));
    if *limit >= due {
        prop_assert_eq!(step.after.reservations().filter(lapsed).count(), 0);
    }
    let snapshot = step.before.to_snapshot();
    let stale_records = snapshot
        .idempotency
        .iter()
        .filter(|(_, rec)| rec.expires_at_ms <= step.now)
        .count();
    prop_assert_eq!(*evicted, stale_records.min(*limit));
    // Settled long enough: archived, oldest first, up to the limit; what was archived is
    // gone from the state with the records of its commit, release and extensions.
    let settled = |r: &&Reservation| {
        r.settled_at_ms()
            .is_some_and(|at| at.saturating_add(*archive_after_ms) <= step.now)
    };
    let due = step.before.reservations().filter(settled).count();
    prop_assert_eq!(*archived, due.min(*limit));
    let gone: Vec<&str> = step
        .applied
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::ArchiveReservation(a) => Some(&*a.reservation.reservation_id),
            _ => None,
        })
        .collect();
    prop_assert_eq!(gone.len(), *archived);
    for id in gone {
        prop_assert!(step.after.reservation(id).is_none());
        let records_left = step.after.to_snapshot().idempotency.into_iter().any(|(k, _)| {
            matches!(&k.endpoint, Endpoint::Commit(r) | Endpoint::Release(r) | Endpoint::Extend(r) if &**r == id)
        });
        prop_assert!(!records_left, "{id}'s settlement records stayed");
    }
    Ok(())
}
