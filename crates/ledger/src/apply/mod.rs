//! The state machine: `apply(&mut State, operation, now) -> Applied<output>`.
//!
//! Every operation is its own type with its own output ([`Operation`]), so a caller gets the
//! result of exactly the operation it asked for. An operation runs against a read-only view
//! of the state ([`Tx`]) and only *stages* its effects; [`apply`] writes them after the
//! operation has succeeded. A refused operation therefore changes nothing, by construction —
//! the one exception, made explicit, is an expiry discovered on the way ([`Tx::lapse`]).

mod admission;
mod api_keys;
mod auth;
mod budgets;
mod bulk;
mod decide;
mod detect;
mod emit;
mod events;
mod lifecycle;
mod maintain;
mod once;
mod overview;
mod policies;
mod reads;
mod reserve;
mod sorted;
mod tenants;
mod webhooks;

use std::sync::Arc;

pub use api_keys::{
    ApiKeyListQuery, ApiKeyPatch, ApiKeySort, CreateApiKey, InvalidKey, KeyValidation, ListApiKeys,
    NewApiKey, RevokeApiKey, UpdateApiKey, ValidateApiKey,
};
pub use auth::{Actor, Authenticate, Authorize, Principal};
pub use budgets::{
    utilization_ppb, valid_scope_value, BudgetFilter, BudgetListQuery, BudgetOrder, BudgetPatch,
    BudgetSort, CreateBudget, FundBudget, Funding, ListBudgets, LookupBudget, NewBudget,
    SetBudgetFrozen, UpdateBudget,
};
pub use bulk::{BulkBudgets, BulkTenants, BulkWebhooks, WebhookAction, BULK_LIMIT};
pub use decide::Decide;
pub use detect::{Anomaly, AnomalyWatch, EmitAnomalies, Watch, WatchAnomalies, DETECTED_TYPES};
pub(crate) use emit::Cause;
pub use emit::NewEvent;
pub use events::RecordEvent;
pub use lifecycle::{Commit, Extend, Extended, Release};
pub use maintain::{Maintain, Maintained};
pub use once::{Idempotency, Idempotent};
pub use overview::{GetOverview, Overview, OVERVIEW_ROWS};
pub use policies::{
    CreatePolicy, ListPolicies, NewPolicy, PolicyListQuery, PolicyPatch, UpdatePolicy,
};
pub use reads::{
    GetBalances, GetReservation, ListReservations, Page, ReservationPage, MAX_SCAN_PER_PAGE,
};
pub use reserve::{Reserve, Reserved};
pub use sorted::{SortedPage, Window};
pub use tenants::{
    CreateTenant, GetTenant, ListTenants, NewTenant, TenantFilter, TenantListQuery, TenantPatch,
    TenantSort, TenantWritten, UpdateTenant, TENANT_CLOSED_REASON,
};
pub use webhooks::{
    Attempt, ClaimDelivery, CreateWebhook, DeleteWebhook, DueDeliveries, DueDelivery, GetWebhook,
    GetWebhookSecurity, ListWebhooks, NewWebhook, QueueReplay, RecordAttempt, SetWebhookSecurity,
    UpdateWebhook, WebhookFilter, WebhookPatch, WebhookPlane, WebhookSort,
};

use crate::{
    ArchiveLookup, Archived, Budget, BudgetKey, Effect, Found, Millis, Origin, Rejection, State,
};

/// One operation of the state machine: its request is the implementing type, its answer
/// [`Operation::Output`]. Implemented in this module tree only (sealed), each next to the
/// rules it runs.
pub trait Operation: sealed::Sealed + Clone + Send + 'static {
    type Output: std::fmt::Debug + PartialEq + Send + 'static;

    /// Decides the operation against `tx`'s view of the state, staging its effects.
    fn run(self, tx: &mut Tx<'_>) -> Result<Self::Output, Rejection>;

    /// What this operation needs read from the store's history before it can run against
    /// `state` at `now`: the archived reservation it names, if it names one that is not in
    /// the state (see [`crate::archive`]). The store reads it outside the ledger lock and
    /// passes it to [`apply_in`]; most operations never need one.
    fn archive_lookup(&self, state: &State, now: Millis) -> Option<ArchiveLookup>;
}

mod sealed {
    pub trait Sealed {}
}

/// Implements [`Operation`] for `$op` by a method of [`Tx`].
/// With `archive: $lookup`, the operation's [`Operation::archive_lookup`] is `$lookup`;
/// without, it never needs one.
macro_rules! operation {
    ($op:ty => $output:ty, $method:ident) => {
        $crate::apply::operation!($op => $output, $method, archive: |_: &$op, _, _| None);
    };
    ($op:ty => $output:ty, $method:ident, archive: $lookup:expr) => {
        impl $crate::apply::sealed::Sealed for $op {}
        impl $crate::apply::Operation for $op {
            type Output = $output;
            fn run(
                self,
                tx: &mut $crate::apply::Tx<'_>,
            ) -> Result<Self::Output, $crate::Rejection> {
                tx.$method(self)
            }
            fn archive_lookup(
                &self,
                state: &$crate::State,
                now: $crate::Millis,
            ) -> Option<$crate::ArchiveLookup> {
                ($lookup)(self, state, now)
            }
        }
    };
}
pub(crate) use operation;

/// What applying an operation did: the reply, and the effects to make durable before it is
/// sent (already applied to the state, except by [`stage_in`]). A refused operation has no effects, except the
/// expiry of a reservation found past its grace period ([`Tx::lapse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied<T> {
    pub result: Result<T, Rejection>,
    pub effects: Vec<Effect>,
    /// The caller's effective tenant, once known (for the `X-Cycles-Tenant` header).
    pub tenant: Option<Arc<str>>,
}

/// Applies one operation at time `now`. Deterministic: no clock, no randomness, no I/O.
/// For an operation that needs an archived reservation, see [`apply_in`].
pub fn apply<O: Operation>(state: &mut State, operation: O, now: Millis) -> Applied<O::Output> {
    apply_in(state, operation, now, &Origin::default, None)
}

/// Applies one operation on behalf of a request: its events carry the request's origin,
/// asked of `origin` only when the operation emits one (most emit none). `found` is what
/// the store's history holds for the operation's [`Operation::archive_lookup`] against this
/// `state` (`None` when it had none).
pub fn apply_in<O: Operation>(
    state: &mut State,
    operation: O,
    now: Millis,
    origin: &dyn Fn() -> Origin,
    found: Option<Found>,
) -> Applied<O::Output> {
    let applied = stage_in(state, operation, now, origin, found);
    for effect in &applied.effects {
        state.apply_effect(effect);
    }
    applied
}

/// Decides one operation as [`apply_in`] does without changing the state: the effects are
/// returned unapplied. A store that cannot make effects durable serves through this what
/// changes nothing (a read, a refusal) and refuses the rest, its state untouched.
pub fn stage_in<O: Operation>(
    state: &State,
    operation: O,
    now: Millis,
    origin: &dyn Fn() -> Origin,
    found: Option<Found>,
) -> Applied<O::Output> {
    let mut tx = Tx {
        state,
        staged: Vec::new(),
        lapsed: Vec::new(),
        tenant: None,
        now,
        origin,
        asked: std::cell::OnceCell::new(),
        numbered: Numbered::default(),
        found,
    };
    let result = operation.run(&mut tx);
    let Tx {
        staged,
        lapsed,
        tenant,
        ..
    } = tx;
    let effects = match &result {
        Ok(_) => {
            assert!(
                lapsed.is_empty(),
                "invariant: an operation that records a lapsed reservation refuses"
            );
            staged
        }
        // The staged effects of a refused operation are dropped unapplied: all or nothing.
        Err(_) => lapsed,
    };
    Applied {
        result,
        effects,
        tenant,
    }
}

/// One operation's view of the state. Reads go to the state as it was before the operation
/// (the view is shared, so nothing can change it); writes are staged by [`Tx::put`] and
/// applied by [`apply`] only if the operation succeeds. An operation that writes the same
/// record twice must therefore carry its own running copy (see the tenant close and the
/// expiry sweep), never read back what it staged.
pub struct Tx<'a> {
    pub(crate) state: &'a State,
    staged: Vec<Effect>,
    /// The expiry of a reservation found past its grace, kept even though the operation
    /// that found it is refused (410).
    lapsed: Vec<Effect>,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) now: Millis,
    origin: &'a dyn Fn() -> Origin,
    /// The origin, once asked for.
    asked: std::cell::OnceCell<Origin>,
    /// Events and deliveries numbered so far by this operation.
    pub(crate) numbered: Numbered,
    /// What the store found for this operation's archive lookup (`None`: it had none).
    found: Option<Found>,
}

#[derive(Debug, Default)]
pub(crate) struct Numbered {
    pub(crate) events: u64,
    pub(crate) deliveries: u64,
}

impl Tx<'_> {
    /// The origin of the request this operation serves.
    pub(crate) fn origin(&self) -> &Origin {
        self.asked.get_or_init(|| (self.origin)())
    }

    /// The archived reservation `lookup` names, as the store found it (`None`: nothing
    /// archived under it). The operation's [`Operation::archive_lookup`] asked for it
    /// against the same state, so it has been looked up; if not, that is a bug, refused
    /// rather than answered as if nothing were archived.
    pub(crate) fn archived(
        &self,
        lookup: ArchiveLookup,
    ) -> Result<Option<Arc<Archived>>, Rejection> {
        match &self.found {
            Some(found) => Ok(found.clone()),
            None => Err(Rejection::Internal(format!(
                "{lookup:?} was needed but not looked up"
            ))),
        }
    }

    /// What was found for an earlier lookup, without asking for one.
    pub(crate) fn found(&self) -> Option<&Archived> {
        self.found.as_ref()?.as_deref()
    }

    /// Stages an effect, applied when the operation succeeds.
    pub(crate) fn put(&mut self, effect: Effect) {
        self.staged.push(effect);
    }

    /// Runs one row of a bulk action: its effects are kept if it succeeds and dropped if it
    /// is refused, without refusing the action (each row is all or nothing; the batch goes
    /// on).
    pub(crate) fn row<T>(
        &mut self,
        row: impl FnOnce(&mut Self) -> Result<T, Rejection>,
    ) -> Result<T, Rejection> {
        let mark = self.staged.len();
        let result = row(self);
        if result.is_err() {
            self.staged.truncate(mark);
        }
        result
    }

    /// How many effects are staged so far (whether a step staged any).
    pub(crate) fn staged_len(&self) -> usize {
        self.staged.len()
    }

    /// Stages budget writes after checking the ledger invariant on every one of them: either
    /// all are written or, if any is broken, the operation is refused. Every budget write
    /// goes through here, so this is where a utilization threshold crossing is seen, whatever
    /// `cause` moved it.
    pub(crate) fn put_budgets(
        &mut self,
        cause: Cause<'_>,
        budgets: Vec<Budget>,
    ) -> Result<(), Rejection> {
        for b in &budgets {
            b.check_invariant()?;
        }
        self.threshold_events(cause, &budgets);
        for mut b in budgets {
            b.updated_at_ms = self.now;
            self.put(Effect::PutBudget(Arc::new(b)));
        }
        Ok(())
    }

    /// Stages what `expire` stages (the expiry of a reservation found past its grace) to be
    /// kept whatever the operation answers, and returns `refusal`, its answer (410).
    pub(crate) fn lapse(
        &mut self,
        expire: impl FnOnce(&mut Self) -> Result<(), Rejection>,
        refusal: Rejection,
    ) -> Rejection {
        let mark = self.staged.len();
        match expire(self) {
            Ok(()) => {
                self.lapsed = self.staged.split_off(mark);
                refusal
            }
            Err(broken) => broken,
        }
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
