//! Property 2: balances move only as the outcomes say.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use crate::properties::model::{Command, Outcome};
use ledger::{
    Balance, Budget, BulkBudgets, BulkResult, Funding, FundingOp, OveragePolicy, Rejection,
    ReservationStatus, State,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::{budget_key, budgeted_scopes, texts};
use crate::properties::driver::Step;

/// What one command implies for one budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Delta {
    reserved: i128,
    /// Added to `spent + debt`.
    charged: i128,
}

/// Tracks, from successful outcomes only, what every budget must hold.
#[derive(Default)]
pub struct Accounts {
    /// Sum of what commits and events charged, per scope.
    charged: BTreeMap<String, i128>,
    /// `allocated` when the budget was created.
    allocated: BTreeMap<String, i64>,
    /// Scopes a funding operation has changed (their totals are no longer implied).
    funded: BTreeSet<String>,
    /// Scopes a RESET or RESET_SPENT has changed (they may be legitimately oversubscribed).
    reset: BTreeSet<String>,
}

impl Accounts {
    pub fn check(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let implied = implied_changes(step);
        let funded = self.check_funding(step)?;
        check_charges(step)?;
        for b in step.after.budgets() {
            let d = implied.get(&*b.scope).copied().unwrap_or_default();
            match step.before.budget(&b.key()) {
                None => {
                    prop_assert!(
                        matches!(step.command, Command::CreateBudget { .. }),
                        "{:?} created budget {}",
                        step.command,
                        b.scope
                    );
                    prop_assert_eq!((b.spent, b.reserved, b.debt), (0, 0, 0));
                    prop_assert_eq!(b.remaining, b.allocated);
                    self.allocated.insert(b.scope.to_string(), b.allocated);
                }
                Some(_) if funded.contains(&*b.scope) => {}
                Some(old) => {
                    let spent_and_debt = |b: &Budget| i128::from(b.spent) + i128::from(b.debt);
                    let actual = Delta {
                        reserved: i128::from(b.reserved) - i128::from(old.reserved),
                        charged: spent_and_debt(b) - spent_and_debt(old),
                    };
                    prop_assert_eq!(
                        actual,
                        d,
                        "{} moved unlike {:?} -> {:?} implies",
                        &b.scope,
                        step.command,
                        step.applied.result
                    );
                    prop_assert_eq!(b.allocated, old.allocated);
                }
            }
            *self.charged.entry(b.scope.to_string()).or_default() += d.charged;
        }
        self.check_totals(step.after)
    }

    /// Budgets no funding operation touched hold exactly what the outcomes charged, and
    /// budgets never reset are never oversubscribed.
    fn check_totals(&self, state: &State) -> Result<(), TestCaseError> {
        for b in state.budgets() {
            if !self.funded.contains(&*b.scope) {
                prop_assert_eq!(
                    i128::from(b.spent) + i128::from(b.debt),
                    self.charged[&*b.scope],
                    "{} spent + debt differs from what outcomes charged",
                    &b.scope
                );
                prop_assert_eq!(Some(&b.allocated), self.allocated.get(&*b.scope));
            }
            if !self.reset.contains(&*b.scope) {
                prop_assert!(
                    i128::from(b.spent) + i128::from(b.reserved) <= i128::from(b.allocated),
                    "oversubscribed: {:?}",
                    b
                );
            }
        }
        Ok(())
    }

    /// A fresh funding outcome changes exactly its budget, exactly as the operation says;
    /// a fresh bulk funding changes each row it reports succeeded that way and no other.
    /// Returns the funded scopes.
    fn check_funding(&mut self, step: &Step) -> Result<BTreeSet<String>, TestCaseError> {
        if let (
            Command::BulkBudgets(bulk),
            Ok(Outcome::Bulk {
                result,
                replayed: false,
            }),
        ) = (step.command, &step.applied.result)
        {
            return self.check_bulk_funding(step, bulk, result);
        }
        let (
            Command::FundBudget { fund, .. },
            Ok(Outcome::Funded {
                result,
                replayed: false,
            }),
        ) = (step.command, &step.applied.result)
        else {
            return Ok(BTreeSet::new());
        };
        let key = budget_key(&fund.scope, fund.unit);
        let old = step.before.budget(&key).expect("funded budget existed");
        let new = step.after.budget(&key).expect("funded budget exists");
        if fund.operation == FundingOp::Debit {
            prop_assert!(old.remaining >= fund.amount, "debit below zero remaining");
        }
        prop_assert_eq!(Balance::from(new), expected_funding(old, fund));
        prop_assert_eq!(&result.previous, &Balance::from(old));
        prop_assert_eq!(&result.new, &Balance::from(new));
        self.funded.insert(new.scope.to_string());
        if matches!(fund.operation, FundingOp::Reset | FundingOp::ResetSpent) {
            self.reset.insert(new.scope.to_string());
        }
        Ok(BTreeSet::from([new.scope.to_string()]))
    }

    fn check_bulk_funding(
        &mut self,
        step: &Step,
        bulk: &BulkBudgets,
        result: &BulkResult,
    ) -> Result<BTreeSet<String>, TestCaseError> {
        let mut funded = BTreeSet::new();
        for old in step.before.budgets() {
            let succeeded = result.succeeded.iter().any(|id| **id == *old.ledger_id);
            let new = step
                .after
                .budget(&old.key())
                .expect("a row is never removed");
            if !succeeded {
                prop_assert_eq!(
                    Balance::from(new),
                    Balance::from(old),
                    "{} not a success",
                    &old.scope
                );
                continue;
            }
            prop_assert!(
                bulk.filter
                    .scope_prefix
                    .as_deref()
                    .is_some_and(|p| *old.scope == *p || old.scope.starts_with(&format!("{p}/"))),
                "{} is outside the filter",
                &old.scope
            );
            let fund = Funding {
                tenant_id: Some(bulk.tenant_id.clone()),
                scope: old.scope.to_string(),
                unit: bulk.unit,
                operation: bulk.operation,
                amount: bulk.amount,
                spent: bulk.spent,
                reason: bulk.reason.clone(),
                idem: None,
            };
            if fund.operation == FundingOp::Debit {
                prop_assert!(old.remaining >= fund.amount, "debit below zero remaining");
            }
            prop_assert_eq!(Balance::from(new), expected_funding(old, &fund));
            self.funded.insert(new.scope.to_string());
            if matches!(fund.operation, FundingOp::Reset | FundingOp::ResetSpent) {
                self.reset.insert(new.scope.to_string());
            }
            funded.insert(new.scope.to_string());
        }
        Ok(funded)
    }
}

/// A budget after a funding operation, per the admin spec.
fn expected_funding(old: &Budget, fund: &Funding) -> Balance {
    let mut b = Balance::from(old);
    let amount = fund.amount;
    match fund.operation {
        FundingOp::Credit => b.allocated += amount,
        FundingOp::Debit => b.allocated -= amount,
        FundingOp::Reset => b.allocated = amount,
        FundingOp::ResetSpent => {
            b.allocated = amount;
            b.spent = fund.spent.unwrap_or(0);
        }
        FundingOp::RepayDebt => {
            let repaid = amount.min(b.debt);
            b.debt -= repaid;
            b.allocated += amount - repaid;
        }
    }
    b.remaining = b.allocated - b.spent - b.reserved - b.debt;
    b.is_over_limit = b.debt > b.overdraft_limit;
    b
}

/// Per scope, what the outcome of one command (and any expiry it caused) implies.
fn implied_changes(step: &Step) -> BTreeMap<String, Delta> {
    let mut deltas: BTreeMap<String, Delta> = BTreeMap::new();
    let mut add = |scopes: &[String], reserved: i64, charged: i64| {
        for scope in scopes {
            let d = deltas.entry(scope.clone()).or_default();
            d.reserved += i128::from(reserved);
            d.charged += i128::from(charged);
        }
    };
    // An expiry returns the hold, and so does a tenant's close, which releases every
    // reservation the tenant holds.
    let closing = matches!(
        step.command,
        Command::UpdateTenant { .. } | Command::BulkTenants(_)
    );
    for old in step.before.reservations() {
        let returned = step
            .after
            .reservation(&old.reservation_id)
            .is_some_and(|r| {
                r.status == ReservationStatus::Expired
                    || (closing && r.status == ReservationStatus::Released)
            });
        if old.status == ReservationStatus::Active && returned {
            add(&texts(&old.budgeted_scopes), -old.estimate, 0);
        }
    }
    let reservation = |id: &str| {
        step.before
            .reservation(id)
            .expect("settled reservation existed")
    };
    match (step.command, &step.applied.result) {
        (
            Command::Reserve(c),
            Ok(Outcome::Reserved {
                replayed: false, ..
            }),
        ) if !c.dry_run => {
            add(
                &budgeted_scopes(step.before, &c.subject, c.unit),
                c.estimate,
                0,
            );
        }
        (
            Command::Commit(c),
            Ok(Outcome::Committed {
                result,
                replayed: false,
            }),
        ) => {
            let r = reservation(&c.reservation_id);
            add(&texts(&r.budgeted_scopes), -r.estimate, result.charged);
        }
        (
            Command::Release(c),
            Ok(Outcome::Released {
                replayed: false, ..
            }),
        ) => {
            let r = reservation(&c.reservation_id);
            add(&texts(&r.budgeted_scopes), -r.estimate, 0);
        }
        (
            Command::Event(c),
            Ok(Outcome::EventApplied {
                result,
                replayed: false,
            }),
        ) => {
            let charged = result.charged.unwrap_or(c.actual);
            add(
                &budgeted_scopes(step.before, &c.subject, c.unit),
                0,
                charged,
            );
        }
        _ => {}
    }
    deltas
}

/// True when no budget's debt changed.
fn debt_unchanged(step: &Step) -> bool {
    step.before
        .budgets()
        .zip(step.after.budgets())
        .all(|(a, b)| a.debt == b.debt)
}

/// Charges respect the overage policies.
fn check_charges(step: &Step) -> Result<(), TestCaseError> {
    match (step.command, &step.applied.result) {
        (
            Command::Commit(c),
            Ok(Outcome::Committed {
                result,
                replayed: false,
            }),
        ) => {
            let r = step
                .before
                .reservation(&c.reservation_id)
                .expect("committed");
            if c.actual <= r.estimate {
                prop_assert_eq!(result.charged, c.actual);
            } else {
                prop_assert_ne!(r.overage_policy, OveragePolicy::Reject);
                prop_assert!((r.estimate..=c.actual).contains(&result.charged));
            }
            let released = (result.charged < r.estimate).then(|| r.estimate - result.charged);
            prop_assert_eq!(result.released, released);
            if r.overage_policy != OveragePolicy::AllowWithOverdraft {
                prop_assert!(debt_unchanged(step), "{:?} created debt", r.overage_policy);
            }
        }
        (Command::Commit(c), Err(e)) => {
            let overage_refused = step.before.reservation(&c.reservation_id).is_some_and(|r| {
                r.status == ReservationStatus::Active
                    && r.unit == c.unit
                    && step.now <= r.settle_deadline()
                    && r.overage_policy == OveragePolicy::Reject
                    && c.actual > r.estimate
            });
            if overage_refused && !matches!(e, Rejection::IdempotencyMismatch) {
                prop_assert!(matches!(e, Rejection::BudgetExceeded { .. }), "got {:?}", e);
            }
        }
        (
            Command::Event(c),
            Ok(Outcome::EventApplied {
                result,
                replayed: false,
            }),
        ) => {
            let charged = result.charged.unwrap_or(c.actual);
            prop_assert!((0..=c.actual).contains(&charged));
            prop_assert!(result.charged.is_none_or(|v| v < c.actual));
            if charged < c.actual {
                // A scope without overdraft that could not cover the amount is flagged.
                for scope in budgeted_scopes(step.before, &c.subject, c.unit) {
                    let key = budget_key(&scope, c.unit);
                    let (old, new) = (step.before.budget(&key), step.after.budget(&key));
                    let short =
                        old.is_some_and(|b| b.remaining < c.actual && b.overdraft_limit == 0);
                    if short {
                        prop_assert!(
                            new.is_some_and(|b| b.is_over_limit),
                            "{} not flagged",
                            scope
                        );
                    }
                }
            }
            match c.overage_policy {
                Some(OveragePolicy::Reject) => prop_assert_eq!(charged, c.actual),
                Some(OveragePolicy::AllowIfAvailable) => {
                    prop_assert!(debt_unchanged(step), "ALLOW_IF_AVAILABLE created debt")
                }
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}
