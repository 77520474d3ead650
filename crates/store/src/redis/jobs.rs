//! What the writer thread runs: an operation with the request it came from, or a barrier
//! (a read of the history waiting for the instance to have read the log to its end).
//!
//! A job is run one of two ways. Under the writer's lease, [`Job::run`] applies it to the
//! state and the round appends its effects. Without the lease, once the instance has read
//! the log to its end, [`Job::read`] answers it on the spot if it changes nothing (a read,
//! a refusal) and gives it back otherwise: reads on an instance that does not hold the
//! lease do not take it from the one that writes.

use std::sync::Arc;

use ledger::{ArchiveLookup, Effect, Found, Millis, Operation, Origin, State};
use tokio::sync::oneshot;

use crate::forwarding::Handing;
use crate::history::{Item, Projector};
use crate::{AuditFacts, AuditFn, Reply, StoreError};

/// Answers a job once its records are in the log (or are not).
pub type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// What running a job under the lease came to: the effects to append, and how to answer
/// it once they are in the log (or are not).
#[derive(Default)]
pub struct Outcome {
    pub effects: Vec<Effect>,
    pub finish: Option<Finish>,
}

/// What a job runs against.
pub struct Ctx<'a> {
    pub state: &'a mut State,
    pub now: Millis,
    pub projector: &'a Projector,
    /// The history of the round's records so far: not in the history store until the
    /// round is appended.
    pub round: &'a [(u64, Item)],
}

impl Ctx<'_> {
    /// The archive of a reservation the state no longer holds: one that an earlier job of
    /// this round archived (the newest), else what the history holds once the history the
    /// instance has read is written.
    fn archived(&self, lookup: &ArchiveLookup) -> Result<Found, String> {
        let in_round = self.round.iter().rev().find_map(|(_, item)| match item {
            Item::Archived(a) if lookup.names(a) => Some(a.clone()),
            _ => None,
        });
        if in_round.is_some() {
            return Ok(in_round);
        }
        self.projector
            .progress()
            .wait_caught_up(crate::history::CATCH_UP);
        self.projector
            .history()
            .archived(lookup)
            .map(|found| found.map(Arc::new))
            .map_err(|e| e.to_string())
    }
}

pub trait Job: Send {
    /// Answers the job if it changes nothing, without applying it (the state as the log
    /// ends is the answer's); gives it back if it would change something.
    fn read(self: Box<Self>, ctx: &mut Ctx<'_>) -> Option<Box<dyn Job>>;

    /// Applies the job under the lease.
    fn run(self: Box<Self>, ctx: &mut Ctx<'_>) -> Outcome;

    /// Answers the job with the address of `peer`, the lease's holder, if its request may
    /// be sent there ([`StoreError::Forward`]): `untried`, before it has been tried here,
    /// only if its request allows that ([`Handing::Always`]). Gives it back otherwise.
    fn forward(self: Box<Self>, peer: &Arc<str>, untried: bool) -> Option<Box<dyn Job>>;

    /// Answers the job, untried, with `503` and `why` (it changed nothing): what it needed
    /// to be decided, a read of the log or of the history, failed.
    fn refuse(self: Box<Self>, why: String);
}

/// The answer an operation's request waits for.
pub type Answer<T> = oneshot::Sender<Result<Reply<T>, StoreError>>;

/// One operation of a request.
pub struct OperationJob<O: Operation> {
    pub operation: O,
    /// Whether, and when, its request may be sent to the lease's holder instead
    /// ([`crate::forwarding`]).
    pub forwardable: Option<Handing>,
    /// The request's origin, for the events the operation emits.
    pub origin: Origin,
    pub audit: Option<AuditFn<O::Output>>,
    pub answer: Answer<O::Output>,
}

impl<O: Operation> OperationJob<O> {
    /// What the history holds for the operation's lookup, if it has one; `Err` once the
    /// request is answered with the failure.
    fn found(&self, ctx: &Ctx<'_>) -> Result<Option<Found>, String> {
        match self.operation.archive_lookup(ctx.state, ctx.now) {
            None => Ok(None),
            Some(lookup) => ctx.archived(&lookup).map(Some),
        }
    }
}

impl<O: Operation> Job for OperationJob<O> {
    fn read(self: Box<Self>, ctx: &mut Ctx<'_>) -> Option<Box<dyn Job>> {
        // An audited request writes its entry whatever it answers.
        if self.audit.is_some() {
            return Some(self);
        }
        let found = match self.found(ctx) {
            Ok(found) => found,
            // Refused under the lease, as any operation whose history cannot be read.
            Err(_) => return Some(self),
        };
        let origin = || self.origin.clone();
        let staged = ledger::stage_in(ctx.state, self.operation.clone(), ctx.now, &origin, found);
        if !staged.effects.is_empty() {
            return Some(self);
        }
        let reply = Reply {
            result: staged.result,
            tenant: staged.tenant,
        };
        let _ = self.answer.send(Ok(reply));
        None
    }

    fn run(self: Box<Self>, ctx: &mut Ctx<'_>) -> Outcome {
        let found = match self.found(ctx) {
            Ok(found) => found,
            Err(why) => {
                self.refuse(why);
                return Outcome::default();
            }
        };
        let OperationJob {
            operation,
            forwardable: _,
            origin,
            audit,
            answer,
        } = *self;
        let now = ctx.now;
        let origin = || origin.clone();
        let mut applied = ledger::apply_in(ctx.state, operation, now, &origin, found);
        let entry = audit.and_then(|audit| {
            audit(AuditFacts {
                result: &applied.result,
                tenant: applied.tenant.as_ref(),
                state: ctx.state,
                now,
            })
        });
        if let Some(entry) = entry {
            applied.effects.push(Effect::Audit(Box::new(entry)));
        }
        let reply = Reply {
            result: applied.result,
            tenant: applied.tenant,
        };
        Outcome {
            effects: applied.effects,
            finish: Some(Box::new(move |written| {
                let _ = answer.send(written.map(|()| reply));
            })),
        }
    }

    fn forward(self: Box<Self>, peer: &Arc<str>, untried: bool) -> Option<Box<dyn Job>> {
        let handed = match self.forwardable {
            Some(Handing::Always) => true,
            Some(Handing::IfItWrites) => !untried,
            None => false,
        };
        if !handed {
            return Some(self);
        }
        let _ = self.answer.send(Err(StoreError::Forward(peer.clone())));
        None
    }

    fn refuse(self: Box<Self>, why: String) {
        let _ = self.answer.send(Err(StoreError::Unavailable(why)));
    }
}

/// Answered once the instance has read the log to its end (and handed its history over).
pub struct Barrier(pub oneshot::Sender<Result<(), StoreError>>);

impl Job for Barrier {
    fn read(self: Box<Self>, _: &mut Ctx<'_>) -> Option<Box<dyn Job>> {
        let _ = self.0.send(Ok(()));
        None
    }

    fn forward(self: Box<Self>, _: &Arc<str>, _: bool) -> Option<Box<dyn Job>> {
        Some(self)
    }

    fn refuse(self: Box<Self>, why: String) {
        let _ = self.0.send(Err(StoreError::Unavailable(why)));
    }

    fn run(self: Box<Self>, _: &mut Ctx<'_>) -> Outcome {
        let Barrier(answer) = *self;
        Outcome {
            effects: Vec::new(),
            finish: Some(Box::new(move |written| {
                let _ = answer.send(written);
            })),
        }
    }
}
