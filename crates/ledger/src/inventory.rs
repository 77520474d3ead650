//! What the admin overview reads: counts of tenants and budgets by state, and the budgets
//! in debt and over their limit, largest debt first. Kept by `State::apply_effect` as
//! tenants and budgets are written, so the overview costs O(1) plus its ten rows, whatever
//! the number of budgets; rebuilt on load like every index.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::{Budget, BudgetKey, BudgetStatus, Tenant, TenantStatus, Unit};

/// Budgets ordered by debt, largest first, then by address.
type ByDebt = BTreeSet<(Reverse<i64>, BudgetKey)>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Indexed by `TenantStatus as usize`.
    tenants: [usize; 3],
    /// Indexed by `BudgetStatus as usize`.
    budgets: [usize; 3],
    /// Indexed by `Unit as usize`.
    budgets_by_unit: [usize; Unit::ALL.len()],
    in_debt: ByDebt,
    over_limit: ByDebt,
}

/// The overview's counts, as of one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub tenants_by_status: [usize; 3],
    pub budgets_by_status: [usize; 3],
    pub budgets_by_unit: [usize; Unit::ALL.len()],
    pub budgets_in_debt: usize,
    pub budgets_over_limit: usize,
}

impl Inventory {
    pub(crate) fn tenant_written(&mut self, old: Option<&Tenant>, new: &Tenant) {
        if let Some(old) = old {
            self.tenants[old.status as usize] -= 1;
        }
        self.tenants[new.status as usize] += 1;
    }

    pub(crate) fn budget_written(&mut self, old: Option<&Budget>, new: &Budget) {
        if let Some(old) = old {
            self.budgets[old.status as usize] -= 1;
            self.budgets_by_unit[old.unit as usize] -= 1;
            // Every reserve and commit writes budgets: the common write, one neither in debt
            // nor over its limit, touches two counters and neither set.
            if old.debt > 0 || old.is_over_limit {
                let entry = (Reverse(old.debt), old.key());
                self.in_debt.remove(&entry);
                self.over_limit.remove(&entry);
            }
        }
        self.budgets[new.status as usize] += 1;
        self.budgets_by_unit[new.unit as usize] += 1;
        if new.debt > 0 {
            self.in_debt.insert((Reverse(new.debt), new.key()));
        }
        if new.is_over_limit {
            self.over_limit.insert((Reverse(new.debt), new.key()));
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            tenants_by_status: self.tenants,
            budgets_by_status: self.budgets,
            budgets_by_unit: self.budgets_by_unit,
            budgets_in_debt: self.in_debt.len(),
            budgets_over_limit: self.over_limit.len(),
        }
    }

    /// The budgets in debt, largest debt first.
    pub(crate) fn in_debt(&self) -> impl Iterator<Item = &BudgetKey> {
        self.in_debt.iter().map(|(_, key)| key)
    }

    /// The budgets over their overdraft limit, largest debt first.
    pub(crate) fn over_limit(&self) -> impl Iterator<Item = &BudgetKey> {
        self.over_limit.iter().map(|(_, key)| key)
    }
}

impl Counts {
    pub fn tenants(&self, status: TenantStatus) -> usize {
        self.tenants_by_status[status as usize]
    }

    pub fn budgets(&self, status: BudgetStatus) -> usize {
        self.budgets_by_status[status as usize]
    }

    pub fn budgets_in(&self, unit: Unit) -> usize {
        self.budgets_by_unit[unit as usize]
    }
}
