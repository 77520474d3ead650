//! The rules each property checks, one family per module, and the helpers they share.

pub mod balances;
pub mod determinism;
pub mod evaluation;
pub mod events;
pub mod idempotency;
pub mod lifecycle;

use std::sync::Arc;

use crate::properties::model::{Command, Outcome};
use ledger::{
    Balance, Budget, BudgetKey, Millis, Rejection, Reservation, SnapshotData, State, StoredOutcome,
    Subject, Unit,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------
// Helpers shared by the checks
// ---------------------------------------------------------------------------------------

pub fn budget_key(scope: &str, unit: Unit) -> BudgetKey {
    BudgetKey {
        scope: scope.into(),
        unit,
    }
}

/// The affected scopes of a subject (only the levels these tests use), lower-cased.
pub fn scopes_of(subject: &Subject) -> Vec<String> {
    let levels = [
        ("tenant", &subject.tenant),
        ("workspace", &subject.workspace),
        ("agent", &subject.agent),
    ];
    let mut path = String::new();
    let mut scopes = Vec::new();
    for (level, value) in levels {
        if let Some(value) = value {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(&format!("{level}:{}", value.to_lowercase()));
            scopes.push(path.clone());
        }
    }
    scopes
}

/// The affected scopes of `subject` that have a budget in `unit`, in hierarchy order.
pub fn budgeted_scopes(state: &State, subject: &Subject, unit: Unit) -> Vec<String> {
    scopes_of(subject)
        .into_iter()
        .filter(|scope| state.budget(&budget_key(scope, unit)).is_some())
        .collect()
}

/// The reservation a commit, release or extend names.
pub fn settled_id(command: &Command) -> Option<&str> {
    match command {
        Command::Commit(c) => Some(&c.reservation_id),
        Command::Release(c) => Some(&c.reservation_id),
        Command::Extend(c) => Some(&c.reservation_id),
        _ => None,
    }
}

/// The replayable part of an idempotent outcome, and whether it was a replay.
pub fn stored_outcome(outcome: &Outcome) -> Option<(StoredOutcome, bool)> {
    Some(match outcome {
        Outcome::Reserved {
            result, replayed, ..
        } => (StoredOutcome::Reserve(result.clone()), *replayed),
        Outcome::Committed { result, replayed } => {
            (StoredOutcome::Commit(result.clone()), *replayed)
        }
        Outcome::Released { result, replayed } => {
            (StoredOutcome::Release(result.clone()), *replayed)
        }
        Outcome::Extended {
            result, replayed, ..
        } => (StoredOutcome::Extend(result.clone()), *replayed),
        Outcome::Decided { result, replayed } => (StoredOutcome::Decide(result.clone()), *replayed),
        Outcome::EventApplied { result, replayed } => {
            (StoredOutcome::Event(result.clone()), *replayed)
        }
        Outcome::Funded { result, replayed } => (StoredOutcome::Fund(result.clone()), *replayed),
        Outcome::Bulk { result, replayed } => (StoredOutcome::Bulk(result.clone()), *replayed),
        _ => return None,
    })
}

/// When a terminal reservation reached its terminal state.
pub fn terminal_at(r: &Reservation) -> Option<Millis> {
    r.finalized_at_ms.or(r.expired_at_ms)
}

pub fn same_reservations(a: &State, b: &State) -> bool {
    a.reservation_count() == b.reservation_count()
        && a.reservations()
            .all(|r| b.reservation(&r.reservation_id) == Some(r))
}

/// Every reported balance equals the budget as it now stands.
pub fn balances_are_current(after: &State, balances: &[Balance]) -> Result<(), TestCaseError> {
    for reported in balances {
        let current = after
            .budget(&budget_key(&reported.scope, reported.unit))
            .map(Balance::from);
        prop_assert_eq!(current.as_ref(), Some(reported));
    }
    Ok(())
}

/// Shared strings as owned ones, to compare with expectations.
pub fn texts(shared: &[Arc<str>]) -> Vec<String> {
    shared.iter().map(|s| s.to_string()).collect()
}

pub fn balance_scopes(balances: &[Balance]) -> Vec<String> {
    balances.iter().map(|b| b.scope.to_string()).collect()
}

/// A snapshot with every list in a canonical order (hash maps iterate arbitrarily).
pub fn normalized(mut s: SnapshotData) -> SnapshotData {
    s.tenants.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
    s.api_keys.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    s.budgets.sort_by_key(Budget::key);
    s.reservations
        .sort_by(|a, b| a.reservation_id.cmp(&b.reservation_id));
    s.idempotency.sort_by(|a, b| a.0.cmp(&b.0));
    s
}

/// The decision reason a live refusal corresponds to on the evaluation surfaces.
pub fn reason_code(rejection: &Rejection) -> Option<&'static str> {
    Some(match rejection {
        Rejection::BudgetFrozen { .. } => "BUDGET_FROZEN",
        Rejection::BudgetClosed { .. } => "BUDGET_CLOSED",
        Rejection::OverdraftLimitExceeded { .. } => "OVERDRAFT_LIMIT_EXCEEDED",
        Rejection::DebtOutstanding { .. } => "DEBT_OUTSTANDING",
        Rejection::BudgetExceeded { .. } => "BUDGET_EXCEEDED",
        Rejection::NotFound(_) => "BUDGET_NOT_FOUND",
        Rejection::TenantClosed(_) => "TENANT_CLOSED",
        // A suspended tenant's live reserve is forbidden; an evaluation denies it.
        Rejection::Forbidden(why) if why.contains("SUSPENDED") => "TENANT_SUSPENDED",
        _ => return None,
    })
}
