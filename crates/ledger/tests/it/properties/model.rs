//! The operations a case drives, as one enum: the generator needs a single type to draw and
//! resend requests of every kind, and the checks a single type of answer. Each variant
//! holds (or builds) one typed ledger operation; [`apply`] runs it and wraps its output.

use std::sync::Arc;

use ledger::{
    Actor, ApiKey, Applied, Budget, BulkBudgets, BulkResult, BulkTenants, Commit, CommitResult,
    CreateApiKey, CreateBudget, CreateTenant, CreateWebhook, Decide, DecideResult, Delivery,
    DueDeliveries, EventResult, Extend, ExtendResult, FundBudget, FundResult, Funding, Idempotent,
    Maintain, Millis, NewApiKey, NewBudget, NewTenant, RecordAttempt, RecordEvent, Release,
    ReleaseResult, Reserve, ReserveResult, State, Tenant, TenantPatch, UpdateTenant, UpdateWebhook,
    WebhookSubscription,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Reserve(Reserve),
    Commit(Commit),
    Release(Release),
    Extend(Extend),
    Decide(Decide),
    Event(RecordEvent),
    CreateTenant {
        actor: Actor,
        tenant: NewTenant,
    },
    UpdateTenant {
        actor: Actor,
        tenant_id: String,
        patch: TenantPatch,
    },
    CreateApiKey {
        actor: Actor,
        key: NewApiKey,
    },
    CreateBudget {
        actor: Actor,
        budget: NewBudget,
    },
    FundBudget {
        actor: Actor,
        fund: Funding,
    },
    Maintain {
        limit: usize,
    },
    BulkTenants(BulkTenants),
    BulkBudgets(BulkBudgets),
    CreateWebhook(CreateWebhook),
    UpdateWebhook(UpdateWebhook),
    /// The dispatcher asking for work: fails what is no longer deliverable.
    DueDeliveries(DueDeliveries),
    RecordAttempt(RecordAttempt),
}

/// What an operation answered, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Reserved {
        result: Arc<ReserveResult>,
        remaining_ttl_ms: Option<i64>,
        replayed: bool,
    },
    Committed {
        result: Arc<CommitResult>,
        replayed: bool,
    },
    Released {
        result: Arc<ReleaseResult>,
        replayed: bool,
    },
    Extended {
        result: Arc<ExtendResult>,
        remaining_ttl_ms: i64,
        replayed: bool,
    },
    Decided {
        result: Arc<DecideResult>,
        replayed: bool,
    },
    EventApplied {
        result: Arc<EventResult>,
        replayed: bool,
    },
    Funded {
        result: Arc<FundResult>,
        replayed: bool,
    },
    Bulk {
        result: Arc<BulkResult>,
        replayed: bool,
    },
    Maintained {
        expired: usize,
        keys_expired: usize,
        evicted: usize,
    },
    Webhook(Arc<WebhookSubscription>),
    Due(usize),
    Attempted(Option<Arc<Delivery>>),
    Tenant(Tenant),
    ApiKey(ApiKey),
    Budget(Budget),
}

/// `Applied`, as the checks see it.
pub type Step = Applied<Outcome>;

/// Applies `command` with [`ledger::apply`] and wraps its typed output.
pub fn apply(state: &mut State, command: Command, now: Millis) -> Step {
    fn run<O: ledger::Operation>(
        state: &mut State,
        op: O,
        now: Millis,
        wrap: impl FnOnce(O::Output) -> Outcome,
    ) -> Step {
        let applied = ledger::apply(state, op, now);
        Applied {
            result: applied.result.map(wrap),
            effects: applied.effects,
            tenant: applied.tenant,
        }
    }
    macro_rules! replayable {
        ($variant:ident) => {
            |once: Idempotent<_>| Outcome::$variant {
                result: once.result,
                replayed: once.replayed,
            }
        };
    }
    match command {
        Command::Reserve(op) => run(state, op, now, |r| Outcome::Reserved {
            result: r.once.result,
            remaining_ttl_ms: r.remaining_ttl_ms,
            replayed: r.once.replayed,
        }),
        Command::Extend(op) => run(state, op, now, |e| Outcome::Extended {
            result: e.once.result,
            remaining_ttl_ms: e.remaining_ttl_ms,
            replayed: e.once.replayed,
        }),
        Command::Commit(op) => run(state, op, now, replayable!(Committed)),
        Command::Release(op) => run(state, op, now, replayable!(Released)),
        Command::Decide(op) => run(state, op, now, replayable!(Decided)),
        Command::Event(op) => run(state, op, now, replayable!(EventApplied)),
        Command::FundBudget { actor, fund } => {
            run(state, FundBudget { actor, fund }, now, replayable!(Funded))
        }
        Command::CreateTenant { actor, tenant } => {
            run(state, CreateTenant { actor, tenant }, now, |w| {
                Outcome::Tenant(w.tenant)
            })
        }
        Command::UpdateTenant {
            actor,
            tenant_id,
            patch,
        } => {
            let op = UpdateTenant {
                actor,
                tenant_id,
                patch,
            };
            run(state, op, now, Outcome::Tenant)
        }
        Command::CreateApiKey { actor, key } => {
            run(state, CreateApiKey { actor, key }, now, Outcome::ApiKey)
        }
        Command::CreateBudget { actor, budget } => {
            run(state, CreateBudget { actor, budget }, now, Outcome::Budget)
        }
        Command::BulkTenants(op) => run(state, op, now, replayable!(Bulk)),
        Command::BulkBudgets(op) => run(state, op, now, replayable!(Bulk)),
        Command::Maintain { limit } => {
            run(state, Maintain { limit }, now, |m| Outcome::Maintained {
                expired: m.expired,
                keys_expired: m.keys_expired,
                evicted: m.evicted,
            })
        }
        Command::CreateWebhook(op) => run(state, op, now, Outcome::Webhook),
        Command::UpdateWebhook(op) => run(state, op, now, Outcome::Webhook),
        Command::DueDeliveries(op) => run(state, op, now, |due| Outcome::Due(due.len())),
        Command::RecordAttempt(op) => run(state, op, now, Outcome::Attempted),
    }
}
