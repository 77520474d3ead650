//! The operations a case drives, as one enum: the generator needs a single type to draw and
//! resend requests of every kind, and the checks a single type of answer. Each variant
//! holds (or builds) one typed ledger operation; [`apply`] runs it and wraps its output.
//!
//! [`apply`] is also the model's store for archived reservations: it keeps what every
//! archive took out of a state (the history store of a real engine) and gives an operation
//! the archived reservation it looks up, as an engine does.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use ledger::{
    Actor, ApiKey, Applied, ArchiveLookup, Archived, Budget, BulkBudgets, BulkResult, BulkTenants,
    ClaimDelivery, Commit, CommitResult, CreateApiKey, CreateBudget, CreateTenant, CreateWebhook,
    Decide, DecideResult, Delivery, DueDeliveries, Effect, EventResult, Extend, ExtendResult,
    Found, FundBudget, FundResult, Funding, Idempotent, Maintain, Millis, NewApiKey, NewBudget,
    NewTenant, Origin, RecordAttempt, RecordEvent, Release, ReleaseResult, Reserve, ReserveResult,
    State, Tenant, TenantPatch, UpdateTenant, UpdateWebhook, WebhookSubscription,
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
        archive_after_ms: Millis,
    },
    BulkTenants(BulkTenants),
    BulkBudgets(BulkBudgets),
    CreateWebhook(CreateWebhook),
    UpdateWebhook(UpdateWebhook),
    /// The dispatcher asking for work: fails what is no longer deliverable.
    DueDeliveries(DueDeliveries),
    ClaimDelivery(ClaimDelivery),
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
        archived: usize,
    },
    Webhook(Arc<WebhookSubscription>),
    Due(usize),
    Claimed(bool),
    Attempted(Option<Arc<Delivery>>),
    Tenant(Tenant),
    ApiKey(ApiKey),
    Budget(Budget),
}

/// `Applied`, as the checks see it.
pub type Step = Applied<Outcome>;

thread_local! {
    /// The archived reservations of the running case, by id, with the step of the case's
    /// log that archived each: a case's states are all of one history (copies and replays
    /// of the log archive the same reservations at the same steps), so they share one
    /// store, and a state at step `n` sees what steps before `n` archived, never what a
    /// later step will.
    static ARCHIVE: RefCell<HashMap<String, (usize, Arc<Archived>)>> = RefCell::default();
    /// The step of the case's log being applied (set by whoever replays the log).
    static STEP: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Forgets the archive of the previous case.
pub fn reset_archive() {
    ARCHIVE.with(|a| a.borrow_mut().clear());
    STEP.with(|s| s.set(0));
}

/// The next command applied is step `n` of the case's log.
pub fn at_step(n: usize) {
    STEP.with(|s| s.set(n));
}

/// What the model's store holds for `lookup` before the current step, as an engine's
/// history store answers.
fn find(lookup: &ArchiveLookup) -> Found {
    let step = STEP.with(std::cell::Cell::get);
    ARCHIVE.with(|archive| {
        let archive = archive.borrow();
        let mut before = archive
            .values()
            .filter(|(at, _)| *at < step)
            .map(|(_, a)| a);
        match lookup {
            ArchiveLookup::Reservation(id) => before
                .find(|a| &*a.reservation.reservation_id == id)
                .cloned(),
            ArchiveLookup::CreatedBy {
                tenant,
                key,
                created_at,
                any_time,
            } => {
                let found = before
                    .filter(|a| {
                        a.reservation.tenant_id == *tenant && a.reservation.idempotency_key == *key
                    })
                    .max_by_key(|a| a.reservation.created_at_ms)
                    .cloned();
                // The model finds by key alone; a history store finds by the times the
                // state gives it, which must name the one found.
                if let Some(a) = &found {
                    assert!(
                        *any_time || created_at.contains(&a.reservation.created_at_ms),
                        "the state's times {created_at:?} miss the archived reserve of \
                         {tenant}/{key}, created at {}",
                        a.reservation.created_at_ms
                    );
                }
                found
            }
        }
    })
}

/// Applies `command` with [`ledger::apply_in`] (given the archived reservation it looks
/// up, if any) and wraps its typed output.
pub fn apply(state: &mut State, command: Command, now: Millis) -> Step {
    fn run<O: ledger::Operation>(
        state: &mut State,
        op: O,
        now: Millis,
        wrap: impl FnOnce(O::Output) -> Outcome,
    ) -> Step {
        let found = op.archive_lookup(state, now).map(|lookup| find(&lookup));
        let applied = ledger::apply_in(state, op, now, &Origin::default, found);
        let step = STEP.with(std::cell::Cell::get);
        ARCHIVE.with(|archive| {
            let mut archive = archive.borrow_mut();
            for effect in &applied.effects {
                if let Effect::ArchiveReservation(a) = effect {
                    let id = a.reservation.reservation_id.to_string();
                    archive.entry(id).or_insert_with(|| (step, a.clone()));
                }
            }
        });
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
        Command::Maintain {
            limit,
            archive_after_ms,
        } => {
            let op = Maintain {
                limit,
                archive_after_ms,
            };
            run(state, op, now, |m| Outcome::Maintained {
                expired: m.expired,
                keys_expired: m.keys_expired,
                evicted: m.evicted,
                archived: m.archived,
            })
        }
        Command::CreateWebhook(op) => run(state, op, now, Outcome::Webhook),
        Command::UpdateWebhook(op) => run(state, op, now, Outcome::Webhook),
        Command::DueDeliveries(op) => run(state, op, now, |due| Outcome::Due(due.len())),
        Command::ClaimDelivery(op) => run(state, op, now, Outcome::Claimed),
        Command::RecordAttempt(op) => run(state, op, now, Outcome::Attempted),
    }
}
