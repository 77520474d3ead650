//! The state machine: `apply(&mut State, Command, now) -> Applied`.

mod admin;
mod auth;
mod lifecycle;
mod list;
mod maintain;
mod policy;
mod reserve;

use std::sync::Arc;

use crate::{
    Budget, BudgetKey, Command, Effect, IdemKey, IdemRecord, Millis, Outcome, Rejection, State,
    StoredOutcome,
};

/// What applying a command did: the reply, and the effects to make durable before it is
/// sent. A refused command usually has no effects; the exception is a reservation found
/// past its grace period, whose expiry is recorded even though the caller gets 410.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub result: Result<Outcome, Rejection>,
    pub effects: Vec<Effect>,
    /// The caller's effective tenant, once known (for the `X-Cycles-Tenant` header).
    pub tenant: Option<Arc<str>>,
}

/// Applies one command at time `now`. Deterministic: no clock, no randomness, no I/O.
pub fn apply(state: &mut State, command: Command, now: Millis) -> Applied {
    let mut tx = Tx {
        state,
        effects: Vec::new(),
        tenant: None,
        now,
    };
    let result = tx.dispatch(command);
    Applied {
        result,
        effects: tx.effects,
        tenant: tx.tenant,
    }
}

/// One command's view of the state: reads go straight to it, writes go through [`Tx::put`].
pub(crate) struct Tx<'a> {
    pub(crate) state: &'a mut State,
    effects: Vec<Effect>,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) now: Millis,
}

impl Tx<'_> {
    fn dispatch(&mut self, command: Command) -> Result<Outcome, Rejection> {
        match command {
            Command::Authenticate(actor) => self.authenticate(&actor).map(Outcome::Authenticated),
            Command::Reserve(c) => self.reserve(c),
            Command::Decide(c) => self.decide(c),
            Command::Event(c) => self.event(c),
            Command::Commit(c) => self.commit(c),
            Command::Release(c) => self.release(c),
            Command::Extend(c) => self.extend(c),
            Command::GetReservation {
                actor,
                reservation_id,
            } => self.get_reservation(&actor, &reservation_id),
            Command::Balances(q) => self.balances(q),
            Command::ListReservations(q) => self.list_reservations(q),
            Command::CreateTenant { actor, tenant } => self.create_tenant(&actor, tenant),
            Command::GetTenant { actor, tenant_id } => self.get_tenant(&actor, &tenant_id),
            Command::UpdateTenant {
                actor,
                tenant_id,
                patch,
            } => self.update_tenant(&actor, &tenant_id, patch),
            Command::CreateApiKey { actor, key } => self.create_api_key(&actor, key),
            Command::RevokeApiKey {
                actor,
                key_id,
                reason,
            } => self.revoke_api_key(&actor, &key_id, reason),
            Command::CreateBudget { actor, budget } => self.create_budget(&actor, budget),
            Command::ListBudgets { actor, query } => self.list_budgets(&actor, query),
            Command::LookupBudget { actor, scope, unit } => {
                self.lookup_budget(&actor, &scope, unit)
            }
            Command::FundBudget { actor, fund } => self.fund_budget(&actor, fund),
            Command::UpdateBudget {
                actor,
                scope,
                unit,
                patch,
            } => self.update_budget(&actor, &scope, unit, patch),
            Command::SetBudgetFrozen {
                actor,
                scope,
                unit,
                frozen,
            } => self.set_budget_frozen(&actor, &scope, unit, frozen),
            Command::CreatePolicy { actor, policy } => self.create_policy(&actor, policy),
            Command::ListPolicies { actor, query } => self.list_policies(&actor, query),
            Command::UpdatePolicy {
                actor,
                policy_id,
                patch,
            } => self.update_policy(&actor, &policy_id, patch),
            Command::Maintain { limit } => Ok(self.maintain(limit)),
        }
    }

    /// Records an effect and applies it at once, so later reads in this command see it.
    pub(crate) fn put(&mut self, effect: Effect) {
        self.state.apply_effect(&effect);
        self.effects.push(effect);
    }

    /// Writes budgets after checking the ledger invariant on every one of them: either all
    /// are written or, if any is broken, none is.
    pub(crate) fn put_budgets(&mut self, budgets: Vec<Budget>) -> Result<(), Rejection> {
        for b in &budgets {
            b.check_invariant()?;
        }
        for mut b in budgets {
            b.updated_at_ms = self.now;
            self.put(Effect::PutBudget(Arc::new(b)));
        }
        Ok(())
    }

    /// The stored outcome for an idempotency key, if a live record exists. The same key with
    /// a different payload is a mismatch.
    pub(crate) fn replay(
        &self,
        key: &IdemKey,
        fingerprint: &[u8; 32],
    ) -> Result<Option<StoredOutcome>, Rejection> {
        match self.state.idempotency.get(key) {
            Some(rec) if rec.expires_at_ms > self.now => {
                if &rec.fingerprint == fingerprint {
                    Ok(Some(rec.outcome.clone()))
                } else {
                    Err(Rejection::IdempotencyMismatch)
                }
            }
            _ => Ok(None),
        }
    }

    pub(crate) fn remember(
        &mut self,
        key: IdemKey,
        fingerprint: [u8; 32],
        outcome: StoredOutcome,
        retention_ms: Millis,
    ) {
        let record = IdemRecord {
            fingerprint,
            outcome,
            expires_at_ms: self.now.saturating_add(retention_ms),
        };
        self.put(Effect::PutIdempotency(Arc::new(key), Arc::new(record)));
    }

    /// Remembers a command's `result` as `stored` makes it a replayable outcome, and returns
    /// it shared with the record: the reply is rendered from the same allocation.
    pub(crate) fn remember_result<T>(
        &mut self,
        key: IdemKey,
        fingerprint: [u8; 32],
        result: T,
        stored: fn(Arc<T>) -> StoredOutcome,
        retention_ms: Millis,
    ) -> Arc<T> {
        let result = Arc::new(result);
        self.remember(key, fingerprint, stored(result.clone()), retention_ms);
        result
    }

    /// The budgets of `scopes` in `unit`, in the given order, skipping scopes without one.
    /// The copies share the budgets' text (scopes, ids), so a copy allocates nothing.
    pub(crate) fn budgets_for(
        &self,
        scopes: impl IntoIterator<Item = Arc<str>>,
        unit: crate::Unit,
    ) -> Vec<Budget> {
        scopes
            .into_iter()
            .filter_map(|scope| self.state.budget(&BudgetKey { scope, unit }).cloned())
            .collect()
    }
}

/// Idempotency retention per endpoint (reference-behaviour §2.6, made explicit).
pub(crate) const DAY_MS: Millis = 24 * 3_600_000;
