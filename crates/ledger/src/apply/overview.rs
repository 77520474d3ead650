//! The admin overview: counts and the largest debts, read from the state's inventory.

use crate::inventory::Counts;
use crate::{Budget, BudgetKey, Millis, Rejection};

use super::{operation, Actor, Tx};

/// How many budgets each offender list of the overview holds (the spec's `maxItems`).
pub const OVERVIEW_ROWS: usize = 10;

/// `GET /v1/admin/overview`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetOverview {
    pub actor: Actor,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overview {
    pub as_of_ms: Millis,
    pub counts: Counts,
    /// The budgets over their overdraft limit, largest debt first, at most [`OVERVIEW_ROWS`].
    pub over_limit: Vec<Budget>,
    /// The budgets in debt, largest debt first, at most [`OVERVIEW_ROWS`].
    pub in_debt: Vec<Budget>,
    /// Subscriptions: all, ACTIVE, DISABLED, and with consecutive failures.
    pub webhooks: [usize; 4],
    /// The subscriptions failing most (consecutive failures > 0), at most
    /// [`OVERVIEW_ROWS`].
    pub failing: Vec<std::sync::Arc<crate::WebhookSubscription>>,
}

operation!(GetOverview => Overview, overview);

impl Tx<'_> {
    fn overview(&mut self, op: GetOverview) -> Result<Overview, Rejection> {
        self.require_admin(&op.actor)?;
        let inventory = &self.state.inventory;
        let budgets = |keys: &mut dyn Iterator<Item = &BudgetKey>| -> Vec<Budget> {
            keys.filter_map(|k| self.state.budget(k).cloned())
                .take(OVERVIEW_ROWS)
                .collect()
        };
        // Subscriptions are an operator's inventory (not traffic): counted by a scan.
        let subscriptions = &self.state.webhooks.subscriptions;
        let count = |f: &dyn Fn(&crate::WebhookSubscription) -> bool| {
            subscriptions.values().filter(|w| f(w)).count()
        };
        let webhooks = [
            subscriptions.len(),
            count(&|w| w.status == crate::WebhookStatus::Active),
            count(&|w| w.status == crate::WebhookStatus::Disabled),
            count(&|w| w.consecutive_failures > 0),
        ];
        let mut failing: Vec<_> = subscriptions
            .values()
            .filter(|w| w.consecutive_failures > 0)
            .cloned()
            .collect();
        failing.sort_by(|a, b| {
            b.consecutive_failures
                .cmp(&a.consecutive_failures)
                .then(a.subscription_id.cmp(&b.subscription_id))
        });
        failing.truncate(OVERVIEW_ROWS);
        Ok(Overview {
            as_of_ms: self.now,
            counts: inventory.counts(),
            over_limit: budgets(&mut inventory.over_limit()),
            in_debt: budgets(&mut inventory.in_debt()),
            webhooks,
            failing,
        })
    }
}
