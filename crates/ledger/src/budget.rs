//! Budget ledgers and their arithmetic.
//!
//! Every function here works on copies and returns the new values, so a caller can check
//! every scope before anything is changed: operations across scopes are all-or-nothing.
//! The invariant `remaining = allocated − spent − reserved − debt` holds after every one.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{checked_add, checked_sub, Millis, Rejection, Unit};

/// What a commit (or event) does when the actual amount exceeds what was reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OveragePolicy {
    Reject,
    AllowIfAvailable,
    AllowWithOverdraft,
}

impl OveragePolicy {
    pub const ALL: [OveragePolicy; 3] = [
        OveragePolicy::Reject,
        OveragePolicy::AllowIfAvailable,
        OveragePolicy::AllowWithOverdraft,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BudgetStatus {
    Active,
    Frozen,
    Closed,
}

impl BudgetStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetStatus::Active => "ACTIVE",
            BudgetStatus::Frozen => "FROZEN",
            BudgetStatus::Closed => "CLOSED",
        }
    }
}

/// How unused budget is treated at a period boundary. Recorded and reported; periods are
/// rolled over by the operator's funding calls (RESET / RESET_SPENT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloverPolicy {
    None,
    CarryForward,
    CapAtAllocated,
}

/// A budget is addressed by its canonical scope and unit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BudgetKey {
    pub scope: Arc<str>,
    pub unit: Unit,
}

/// One `(scope, unit)` ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    // Text behind `Arc` (serialized as plain strings): a reserve or commit copies the
    // budgets it changes, and their keys, balances and reservations share the scope.
    pub ledger_id: Arc<str>,
    pub tenant_id: Arc<str>,
    pub scope: Arc<str>,
    pub unit: Unit,
    pub allocated: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub spent: i64,
    pub debt: i64,
    pub overdraft_limit: i64,
    pub is_over_limit: bool,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub status: BudgetStatus,
    pub rollover_policy: RolloverPolicy,
    pub period_start_ms: Option<Millis>,
    pub period_end_ms: Option<Millis>,
    /// Opaque JSON object text.
    pub metadata: Option<Arc<str>>,
    pub created_at_ms: Millis,
    pub updated_at_ms: Millis,
}

impl Budget {
    pub fn key(&self) -> BudgetKey {
        BudgetKey {
            scope: self.scope.clone(),
            unit: self.unit,
        }
    }

    /// Checks `remaining = allocated − spent − reserved − debt` and non-negativity.
    pub fn check_invariant(&self) -> Result<(), Rejection> {
        let expected = checked_sub(self.allocated, self.spent)
            .and_then(|v| checked_sub(v, self.reserved))
            .and_then(|v| checked_sub(v, self.debt))?;
        if expected != self.remaining
            || self.reserved < 0
            || self.spent < 0
            || self.debt < 0
            || self.overdraft_limit < 0
        {
            return Err(Rejection::Internal(format!(
                "ledger invariant violated at {} {}",
                self.scope,
                self.unit.as_str()
            )));
        }
        Ok(())
    }

    fn recompute_remaining(&mut self) -> Result<(), Rejection> {
        self.remaining = checked_sub(self.allocated, self.spent)
            .and_then(|v| checked_sub(v, self.reserved))
            .and_then(|v| checked_sub(v, self.debt))?;
        Ok(())
    }

    /// Holds `amount` for a reservation.
    pub fn hold(&mut self, amount: i64) -> Result<(), Rejection> {
        self.reserved = checked_add(self.reserved, amount)?;
        self.remaining = checked_sub(self.remaining, amount)?;
        Ok(())
    }

    /// Returns a hold (release or expiry).
    pub fn unhold(&mut self, amount: i64) -> Result<(), Rejection> {
        self.reserved = checked_sub(self.reserved, amount)?;
        self.remaining = checked_add(self.remaining, amount)?;
        Ok(())
    }

    /// Charges `amount` against the budget: `funded` of it from remaining, the rest as debt.
    fn charge(&mut self, amount: i64, funded: i64) -> Result<(), Rejection> {
        let deficit = checked_sub(amount, funded)?;
        self.spent = checked_add(self.spent, funded)?;
        self.debt = checked_add(self.debt, deficit)?;
        self.remaining = checked_sub(self.remaining, amount)?;
        Ok(())
    }
}

/// The admission checks a new reservation must pass on one budget, in the order they apply.
/// Each pass runs across all budgeted scopes before the next, so an over-limit scope anywhere
/// wins over a debt or a shortfall elsewhere (runtime spec §4.1 rules 3–4).
pub fn admission_refusal(budgets: &[&Budget], estimate: i64) -> Option<Refusal> {
    if let Some(b) = budgets.iter().find(|b| b.status == BudgetStatus::Frozen) {
        return Some(Refusal::Frozen(b.scope.to_string()));
    }
    if let Some(b) = budgets.iter().find(|b| b.status == BudgetStatus::Closed) {
        return Some(Refusal::Closed(b.scope.to_string()));
    }
    if let Some(b) = budgets.iter().find(|b| b.is_over_limit) {
        return Some(Refusal::OverLimit(b.scope.to_string()));
    }
    if let Some(b) = budgets
        .iter()
        .find(|b| b.debt > 0 && b.overdraft_limit == 0)
    {
        return Some(Refusal::DebtOutstanding(b.scope.to_string()));
    }
    if let Some(b) = budgets.iter().find(|b| b.remaining < estimate) {
        return Some(Refusal::Insufficient {
            scope: b.scope.to_string(),
            remaining: b.remaining,
        });
    }
    None
}

/// Why a budget refuses a new reservation (or why an event is blocked by status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Frozen(String),
    Closed(String),
    OverLimit(String),
    DebtOutstanding(String),
    Insufficient { scope: String, remaining: i64 },
}

impl Refusal {
    /// The decision reason code for dry runs and `/decide`.
    pub fn reason_code(&self) -> &'static str {
        match self {
            Refusal::Frozen(_) => "BUDGET_FROZEN",
            Refusal::Closed(_) => "BUDGET_CLOSED",
            Refusal::OverLimit(_) => "OVERDRAFT_LIMIT_EXCEEDED",
            Refusal::DebtOutstanding(_) => "DEBT_OUTSTANDING",
            Refusal::Insufficient { .. } => "BUDGET_EXCEEDED",
        }
    }

    /// The error a live operation answers with.
    pub fn into_rejection(self, unit: Unit, requested: i64) -> Rejection {
        match self {
            Refusal::Frozen(scope) => Rejection::BudgetFrozen { scope },
            Refusal::Closed(scope) => Rejection::BudgetClosed { scope },
            Refusal::OverLimit(scope) => Rejection::OverdraftLimitExceeded {
                message: format!("Scope {scope} is over its overdraft limit; new reservations are blocked until it is funded"),
            },
            Refusal::DebtOutstanding(scope) => Rejection::DebtOutstanding { scope },
            Refusal::Insufficient { scope, remaining } => Rejection::BudgetExceeded {
                message: format!(
                    "Insufficient budget at scope {scope}: requested {requested} {}, remaining {remaining}",
                    unit.as_str()
                ),
            },
        }
    }
}

/// The result of charging an amount over budgeted scopes under an overage policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The amount actually charged on every scope (≤ the requested amount when capped).
    pub charged: i64,
    /// The new budget values, in the same order as given.
    pub budgets: Vec<Budget>,
}

/// Settles a commit of `actual` against a hold of `estimate` on every budgeted scope
/// (reference-behaviour §5.2; the deficit model of runtime spec A-4).
pub fn settle_commit(
    budgets: &[Budget],
    estimate: i64,
    actual: i64,
    policy: OveragePolicy,
) -> Result<Charge, Rejection> {
    let delta = checked_sub(actual, estimate)?;
    if delta > 0 && policy == OveragePolicy::Reject {
        return Err(Rejection::BudgetExceeded {
            message: format!(
                "Actual {actual} exceeds the reserved estimate {estimate} and the overage policy is REJECT"
            ),
        });
    }
    let mut out: Vec<Budget> = budgets.to_vec();
    // Return the hold first; the overage (if any) is then charged like a direct event.
    for b in &mut out {
        b.unhold(estimate)?;
        if delta <= 0 {
            b.charge(actual, actual)?;
        } else {
            b.charge(estimate, estimate)?;
        }
    }
    if delta <= 0 {
        return Ok(Charge {
            charged: actual,
            budgets: out,
        });
    }
    let overage = charge_amount(&out, delta, policy)?;
    Ok(Charge {
        charged: checked_add(estimate, overage.charged)?,
        budgets: overage.budgets,
    })
}

/// Charges `amount` on every budgeted scope without a hold (a direct event, or the overage
/// part of a commit). `budgets` hold the values the policy is evaluated against.
pub fn charge_amount(
    budgets: &[Budget],
    amount: i64,
    policy: OveragePolicy,
) -> Result<Charge, Rejection> {
    match policy {
        OveragePolicy::Reject => charge_reject(budgets, amount),
        OveragePolicy::AllowIfAvailable => Ok(charge_capped(budgets, amount)),
        OveragePolicy::AllowWithOverdraft => charge_overdraft(budgets, amount),
    }
}

fn charge_reject(budgets: &[Budget], amount: i64) -> Result<Charge, Rejection> {
    if let Some(b) = budgets.iter().find(|b| b.remaining < amount) {
        return Err(Rejection::BudgetExceeded {
            message: format!(
                "Insufficient budget at scope {}: requested {amount} {}, remaining {}",
                b.scope,
                b.unit.as_str(),
                b.remaining
            ),
        });
    }
    let mut out = budgets.to_vec();
    for b in &mut out {
        b.charge(amount, amount)?;
    }
    Ok(Charge {
        charged: amount,
        budgets: out,
    })
}

/// ALLOW_IF_AVAILABLE: charge what every scope can cover (floor 0) and flag the scopes that
/// could not cover the whole amount as over limit. Never fails, never creates debt.
fn charge_capped(budgets: &[Budget], amount: i64) -> Charge {
    let available = budgets
        .iter()
        .map(|b| b.remaining.max(0))
        .min()
        .unwrap_or(0);
    let charged = amount.min(available);
    let mut out = budgets.to_vec();
    for b in &mut out {
        let short = b.remaining < amount;
        // `charged ≤ remaining` here, so these cannot overflow.
        b.spent += charged;
        b.remaining -= charged;
        if charged < amount && short {
            b.is_over_limit = true;
        }
    }
    Charge {
        charged,
        budgets: out,
    }
}

/// ALLOW_WITH_OVERDRAFT: scopes without an overdraft limit cap the amount like
/// ALLOW_IF_AVAILABLE; scopes with one take the unfunded part as debt up to their limit,
/// and any scope that would exceed its limit refuses the whole charge.
fn charge_overdraft(budgets: &[Budget], amount: i64) -> Result<Charge, Rejection> {
    let mut capped = amount;
    for b in budgets
        .iter()
        .filter(|b| b.overdraft_limit == 0 && b.remaining < amount)
    {
        capped = capped.min(b.remaining.max(0));
    }
    for b in budgets
        .iter()
        .filter(|b| b.overdraft_limit > 0 && b.remaining < capped)
    {
        let deficit = capped - b.remaining.max(0);
        if checked_add(b.debt, deficit)? > b.overdraft_limit {
            return Err(Rejection::OverdraftLimitExceeded {
                message: format!(
                    "Overdraft limit exceeded at scope {}: debt {} + deficit {deficit} > limit {}",
                    b.scope, b.debt, b.overdraft_limit
                ),
            });
        }
    }
    let mut out = budgets.to_vec();
    for b in &mut out {
        let funded = capped.min(b.remaining.max(0));
        let short = b.remaining < amount;
        b.charge(capped, funded)?;
        if capped < amount && b.overdraft_limit == 0 && short {
            b.is_over_limit = true;
        }
        if b.debt > b.overdraft_limit {
            b.is_over_limit = true;
        }
    }
    Ok(Charge {
        charged: capped,
        budgets: out,
    })
}

/// A funding operation of the admin plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FundingOp {
    Credit,
    Debit,
    Reset,
    ResetSpent,
    RepayDebt,
}

impl FundingOp {
    pub const ALL: [FundingOp; 5] = [
        FundingOp::Credit,
        FundingOp::Debit,
        FundingOp::Reset,
        FundingOp::ResetSpent,
        FundingOp::RepayDebt,
    ];
}

/// Applies a funding operation (admin spec §3.2). Over-limit is recomputed from the debt
/// afterwards, which is how an over-limit scope returns to service.
pub fn fund(
    budget: &Budget,
    op: FundingOp,
    amount: i64,
    spent_override: Option<i64>,
) -> Result<Budget, Rejection> {
    match budget.status {
        BudgetStatus::Frozen => {
            return Err(Rejection::BudgetFrozen {
                scope: budget.scope.to_string(),
            })
        }
        BudgetStatus::Closed => {
            return Err(Rejection::BudgetClosed {
                scope: budget.scope.to_string(),
            })
        }
        BudgetStatus::Active => {}
    }
    let mut b = budget.clone();
    match op {
        FundingOp::Credit => {
            b.allocated = checked_add(b.allocated, amount)?;
            b.remaining = checked_add(b.remaining, amount)?;
        }
        FundingOp::Debit => {
            if b.remaining < amount {
                return Err(Rejection::BudgetExceeded {
                    message: format!(
                        "Cannot debit {amount}: only {} remaining at scope {}",
                        b.remaining, b.scope
                    ),
                });
            }
            b.allocated = checked_sub(b.allocated, amount)?;
            b.remaining = checked_sub(b.remaining, amount)?;
        }
        FundingOp::Reset => {
            b.allocated = amount;
            b.recompute_remaining()?;
        }
        FundingOp::ResetSpent => {
            b.allocated = amount;
            b.spent = spent_override.unwrap_or(0);
            b.recompute_remaining()?;
        }
        FundingOp::RepayDebt => {
            let repayment = amount.min(b.debt);
            let excess = amount - repayment;
            b.debt -= repayment;
            b.allocated = checked_add(b.allocated, excess)?;
            b.recompute_remaining()?;
        }
    }
    b.is_over_limit = b.debt > b.overdraft_limit;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(allocated: i64) -> Budget {
        Budget {
            ledger_id: "l".into(),
            tenant_id: "t".into(),
            scope: "tenant:t".into(),
            unit: Unit::UsdMicrocents,
            allocated,
            remaining: allocated,
            reserved: 0,
            spent: 0,
            debt: 0,
            overdraft_limit: 0,
            is_over_limit: false,
            commit_overage_policy: None,
            status: BudgetStatus::Active,
            rollover_policy: RolloverPolicy::None,
            period_start_ms: None,
            period_end_ms: None,
            metadata: None,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    fn held(allocated: i64, spent: i64, hold: i64) -> Budget {
        let mut b = budget(allocated);
        b.spent = spent;
        b.remaining -= spent;
        b.hold(hold).unwrap();
        b
    }

    #[test]
    fn commit_under_estimate_releases_the_rest() {
        let c = settle_commit(
            &[held(1_000_000, 0, 500_000)],
            500_000,
            423_000,
            OveragePolicy::Reject,
        )
        .unwrap();
        let b = &c.budgets[0];
        assert_eq!(
            (c.charged, b.reserved, b.spent, b.remaining),
            (423_000, 0, 423_000, 577_000)
        );
        b.check_invariant().unwrap();
    }

    #[test]
    fn reject_refuses_any_overage() {
        let err = settle_commit(
            &[held(1_000_000, 0, 500_000)],
            500_000,
            500_001,
            OveragePolicy::Reject,
        );
        assert!(matches!(err, Err(Rejection::BudgetExceeded { .. })));
    }

    #[test]
    fn allow_if_available_caps_and_flags() {
        // Worked example 5 of runtime spec §6.5.
        let c = settle_commit(
            &[held(1_000_000, 900_000, 100_000)],
            100_000,
            150_000,
            OveragePolicy::AllowIfAvailable,
        )
        .unwrap();
        let b = &c.budgets[0];
        assert_eq!(
            (c.charged, b.spent, b.remaining, b.is_over_limit),
            (100_000, 1_000_000, 0, true)
        );
        b.check_invariant().unwrap();
    }

    #[test]
    fn overdraft_creates_debt_within_limit() {
        // Worked example 6 of runtime spec §6.5.
        let mut b = held(1_000_000, 885_000, 100_000);
        b.overdraft_limit = 100_000;
        let c = settle_commit(
            &[b.clone()],
            100_000,
            160_000,
            OveragePolicy::AllowWithOverdraft,
        )
        .unwrap();
        let n = &c.budgets[0];
        assert_eq!(
            (c.charged, n.spent, n.debt, n.remaining),
            (160_000, 1_000_000, 45_000, -45_000)
        );
        n.check_invariant().unwrap();
        // Worked example 7: the same commit over a 40 000 limit is refused.
        b.overdraft_limit = 40_000;
        let err = settle_commit(&[b], 100_000, 160_000, OveragePolicy::AllowWithOverdraft);
        assert!(matches!(err, Err(Rejection::OverdraftLimitExceeded { .. })));
    }

    #[test]
    fn capped_overage_flags_only_the_short_scope() {
        let parent = held(1_000_000, 0, 100);
        let mut child = held(150, 0, 100);
        child.scope = "tenant:t/agent:a".into();
        let c = settle_commit(&[parent, child], 100, 200, OveragePolicy::AllowIfAvailable).unwrap();
        assert_eq!(c.charged, 150);
        assert!(!c.budgets[0].is_over_limit);
        assert!(c.budgets[1].is_over_limit);
    }

    #[test]
    fn funding_ops_keep_the_invariant_and_clear_over_limit() {
        let mut b = budget(100);
        b.spent = 100;
        b.debt = 50;
        b.remaining = -50;
        b.is_over_limit = true;
        let repaid = fund(&b, FundingOp::RepayDebt, 80, None).unwrap();
        assert_eq!(
            (repaid.debt, repaid.allocated, repaid.remaining),
            (0, 130, 30)
        );
        assert!(!repaid.is_over_limit);
        repaid.check_invariant().unwrap();
        let reset = fund(&b, FundingOp::ResetSpent, 500, Some(10)).unwrap();
        assert_eq!((reset.spent, reset.remaining), (10, 440));
        reset.check_invariant().unwrap();
        assert!(matches!(
            fund(&budget(10), FundingOp::Debit, 11, None),
            Err(Rejection::BudgetExceeded { .. })
        ));
    }

    #[test]
    fn overflow_is_an_error() {
        let b = budget(i64::MAX);
        assert_eq!(
            fund(&b, FundingOp::Credit, 1, None),
            Err(Rejection::Overflow)
        );
    }
}
