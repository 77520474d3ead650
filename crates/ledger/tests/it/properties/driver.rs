//! Building commands from the generated operations, and running a case.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::properties::model::{apply, Command, Outcome, Step as Applied};
use ledger::{
    Action, Actor, Attempt, BudgetFilter, BulkBudgets, BulkTenants, ClaimDelivery, Commit,
    CreateWebhook, Decide, DueDeliveries, EventCategory, EventType, Extend, Funding, Idempotency,
    Millis, NewApiKey, NewBudget, NewTenant, NewWebhook, RecordAttempt, RecordEvent, Release,
    Reserve, RetryPolicy, State, Subject, TenantFilter, TenantPatch, Unit, UpdateWebhook,
    WebhookPatch, WebhookPlane, WebhookStatus, TERMINAL_RETENTION_MS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::{budget_key, normalized, scopes_of, terminal_at};
use crate::properties::strategies::{Key, Moment, Op, Quantity, Setup, Target};
use crate::properties::{BUDGET_SCOPES, DIGEST, START, SUBJECTS, TENANT, UNIT};

pub fn subject(index: usize) -> Subject {
    let (tenant, workspace, agent) = SUBJECTS[index];
    Subject {
        tenant: Some(tenant.into()),
        workspace: workspace.map(Into::into),
        agent: agent.map(Into::into),
        ..Subject::default()
    }
}

fn idem(key: String) -> Idempotency {
    Idempotency {
        key: key.into(),
        fingerprint: [0; 32],
    }
}

/// A live reserve with default lease settings; callers override fields as needed.
pub fn reserve_cmd(
    key: String,
    id: String,
    subject: Subject,
    unit: Unit,
    estimate: i64,
) -> Reserve {
    Reserve {
        actor: Actor::ApiKey(DIGEST),
        idem: idem(key),
        reservation_id: id,
        subject,
        action: Action {
            kind: "llm.completion".into(),
            name: "chat".into(),
            tags: None,
        },
        unit,
        estimate,
        ttl_ms: None,
        grace_period_ms: 0,
        overage_policy: None,
        dry_run: false,
        metadata: None,
    }
}

pub fn decide_cmd(key: String, subject: Subject, unit: Unit, estimate: i64) -> Decide {
    Decide {
        actor: Actor::ApiKey(DIGEST),
        idem: idem(key),
        subject,
        unit,
        estimate,
    }
}

pub fn setup_commands(setup: &Setup) -> Vec<Command> {
    let mut commands = vec![
        Command::CreateTenant {
            actor: Actor::Admin,
            tenant: NewTenant {
                tenant_id: TENANT.into(),
                name: "Tenant T".into(),
                parent_tenant_id: None,
                default_commit_overage_policy: setup.default_policy,
                default_reservation_ttl_ms: None,
                max_reservation_ttl_ms: None,
                max_reservation_extensions: setup.max_extensions,
                reservation_expiry_policy: None,
                metadata: BTreeMap::new(),
            },
        },
        Command::CreateApiKey {
            actor: Actor::Admin,
            key: NewApiKey {
                key_id: "key-1".into(),
                tenant_id: TENANT.into(),
                key_prefix: "cyc_live_".into(),
                digest: DIGEST,
                name: "agent key".into(),
                description: None,
                permissions: None,
                scope_filter: Vec::new(),
                // Never expires, however far a case advances the clock.
                expires_at_ms: Some(Millis::MAX),
                metadata: None,
            },
        },
    ];
    commands.extend(watchers());
    for (scope, spec) in BUDGET_SCOPES.iter().zip(&setup.budgets) {
        if let Some(spec) = spec {
            commands.push(Command::CreateBudget {
                actor: Actor::Admin,
                budget: NewBudget {
                    ledger_id: format!("ledger-{scope}"),
                    tenant_id: Some(TENANT.into()),
                    scope: scope.to_string(),
                    unit: UNIT,
                    allocated: spec.allocated,
                    overdraft_limit: spec.overdraft_limit,
                    commit_overage_policy: spec.policy,
                    rollover_policy: None,
                    period_start_ms: None,
                    period_end_ms: None,
                    metadata: None,
                },
            });
        }
    }
    commands
}

/// What watches the case's events: a key that expires three hours in (for
/// `api_key.expired`), and the [`SUBSCRIPTIONS`]: the tenant's, to its budget and
/// reservation events with utilization levels of its own, and a system-wide one to threshold
/// crossings at another level, key expiries and reservation expiries.
fn watchers() -> Vec<Command> {
    let expiring = Command::CreateApiKey {
        actor: Actor::Admin,
        key: NewApiKey {
            key_id: "key-expiring".into(),
            tenant_id: TENANT.into(),
            key_prefix: "cyc_live_".into(),
            digest: [9; 32],
            name: "short-lived key".into(),
            description: None,
            permissions: None,
            scope_filter: Vec::new(),
            expires_at_ms: Some(START + 3 * 3_600_000),
            metadata: None,
        },
    };
    let subscription = |i: usize, owner: Option<&str>, types, categories, levels: &str| {
        Command::CreateWebhook(CreateWebhook {
            actor: Actor::Admin,
            plane: WebhookPlane::Admin,
            owner: owner.map(Into::into),
            webhook: NewWebhook {
                subscription_id: SUBSCRIPTIONS[i].into(),
                name: None,
                description: None,
                url: format!("https://hooks.example.com/{i}"),
                event_types: types,
                event_categories: categories,
                scope_filter: None,
                thresholds: Some(format!(r#"{{"budget_utilization":[{levels}]}}"#)),
                sealed_secret: "sealed".into(),
                headers: Vec::new(),
                retry_policy: RetryPolicy::default(),
                disable_after_failures: 3,
                metadata: None,
            },
        })
    };
    let system_types = vec![
        EventType::BudgetThresholdCrossed,
        EventType::ApiKeyExpired,
        EventType::ReservationExpired,
    ];
    vec![
        expiring,
        subscription(
            0,
            Some(TENANT),
            Vec::new(),
            vec![EventCategory::Budget, EventCategory::Reservation],
            "0.5, 0.8",
        ),
        subscription(1, None, system_types, Vec::new(), "0.25"),
    ]
}

/// The setup's webhook subscriptions.
/// How long the sequences' claims hold a delivery (the Redis engine's dispatchers hold one
/// for two minutes; the sequences' clock moves in seconds to days).
const CLAIM_HOLD_MS: u64 = 30_000;

pub const SUBSCRIPTIONS: [&str; 2] = ["w-tenant", "w-system"];

/// The idempotency namespace of a request, as the protocol defines it: operations on a
/// reservation are scoped by its id, the others by endpoint.
pub type Namespace = (&'static str, String);

pub fn namespace(command: &Command) -> Option<(Namespace, &Idempotency)> {
    let global = |name: &'static str| (name, String::new());
    match command {
        Command::Reserve(c) => Some((global("reserve"), &c.idem)),
        Command::Decide(c) => Some((global("decide"), &c.idem)),
        Command::Event(c) => Some((global("event"), &c.idem)),
        Command::Commit(c) => Some((("commit", c.reservation_id.clone()), &c.idem)),
        Command::Release(c) => Some((("release", c.reservation_id.clone()), &c.idem)),
        Command::Extend(c) => Some((("extend", c.reservation_id.clone()), &c.idem)),
        Command::FundBudget { fund, .. } => fund.idem.as_ref().map(|i| (global("fund"), i)),
        Command::BulkTenants(c) => Some((global("tenants-bulk"), &c.idem)),
        Command::BulkBudgets(c) => Some((global("budgets-bulk"), &c.idem)),
        _ => None,
    }
}

fn idem_mut(command: &mut Command) -> Option<&mut Idempotency> {
    match command {
        Command::Reserve(c) => Some(&mut c.idem),
        Command::Decide(c) => Some(&mut c.idem),
        Command::Event(c) => Some(&mut c.idem),
        Command::Commit(c) => Some(&mut c.idem),
        Command::Release(c) => Some(&mut c.idem),
        Command::Extend(c) => Some(&mut c.idem),
        Command::FundBudget { fund, .. } => fund.idem.as_mut(),
        Command::BulkTenants(c) => Some(&mut c.idem),
        Command::BulkBudgets(c) => Some(&mut c.idem),
        _ => None,
    }
}

/// 32 bytes derived deterministically from `text`.
fn digest_of(text: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut hasher = DefaultHasher::new();
        (i, text).hash(&mut hasher);
        chunk.copy_from_slice(&hasher.finish().to_le_bytes());
    }
    out
}

/// Sets the request fingerprint: a digest of the payload without the idempotency key and
/// without the ids the server generates (reservation and event ids), as a server would.
pub fn sealed(mut command: Command) -> Command {
    let mut payload = command.clone();
    match &mut payload {
        Command::Reserve(c) => c.reservation_id.clear(),
        Command::Event(c) => c.event_id.clear(),
        _ => {}
    }
    if let Some(idem) = idem_mut(&mut payload) {
        idem.key = "".into();
        idem.fingerprint = [0; 32];
    }
    let fingerprint = digest_of(&format!("{payload:?}"));
    if let Some(idem) = idem_mut(&mut command) {
        idem.fingerprint = fingerprint;
    }
    command
}

// ---------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------

/// What a check sees of one applied command.
pub struct Step<'a> {
    pub before: &'a State,
    pub command: &'a Command,
    pub now: Millis,
    pub applied: &'a Applied,
    pub after: &'a State,
}

type Check<'c> = dyn FnMut(&Step) -> Result<(), TestCaseError> + 'c;

/// Turns operations into commands (using what earlier outcomes revealed: reservation ids,
/// keys in use) and applies them, recording everything it applied.
pub struct Driver {
    pub state: State,
    pub now: Millis,
    issued: usize,
    reservations: Vec<String>,
    keys: BTreeMap<Namespace, Vec<String>>,
    all_keys: Vec<String>,
    resendable: Vec<Command>,
    pub log: Vec<(Command, Millis, Applied)>,
}

impl Driver {
    pub fn run(setup: &Setup, ops: &[Op], check: &mut Check) -> Result<Driver, TestCaseError> {
        crate::properties::model::reset_archive();
        let mut driver = Driver {
            state: State::new(),
            now: START,
            issued: 0,
            reservations: Vec::new(),
            keys: BTreeMap::new(),
            all_keys: Vec::new(),
            resendable: Vec::new(),
            log: Vec::new(),
        };
        for command in setup_commands(setup) {
            let applied = driver.step(command, check)?;
            prop_assert!(applied.result.is_ok(), "setup failed: {:?}", applied.result);
        }
        for op in ops {
            if let Some(command) = driver.command_for(op) {
                driver.step(command, check)?;
            }
        }
        Ok(driver)
    }

    fn step(&mut self, command: Command, check: &mut Check) -> Result<&Applied, TestCaseError> {
        let before = self.state.clone();
        crate::properties::model::at_step(self.log.len());
        let applied = apply(&mut self.state, command.clone(), self.now);
        check(&Step {
            before: &before,
            command: &command,
            now: self.now,
            applied: &applied,
            after: &self.state,
        })?;
        if let Ok(Outcome::Reserved {
            result,
            replayed: false,
            ..
        }) = &applied.result
        {
            self.reservations
                .extend(result.reservation_id.as_deref().map(str::to_string));
        }
        if namespace(&command).is_some() {
            self.resendable.push(command.clone());
        }
        self.log.push((command, self.now, applied));
        Ok(&self.log.last().expect("just pushed").2)
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.issued += 1;
        format!("{prefix}{}", self.issued)
    }

    fn key(&mut self, namespace: Namespace, choice: &Key) -> String {
        let used = self.keys.entry(namespace).or_default();
        let reused = match choice {
            Key::Fresh => None,
            Key::Reuse(pick) => (!used.is_empty()).then(|| used[pick.index(used.len())].clone()),
            Key::Foreign(pick) => (!self.all_keys.is_empty())
                .then(|| self.all_keys[pick.index(self.all_keys.len())].clone()),
        };
        let key = reused.unwrap_or_else(|| {
            self.issued += 1;
            format!("k{}", self.issued)
        });
        if !used.contains(&key) {
            used.push(key.clone());
        }
        if !self.all_keys.contains(&key) {
            self.all_keys.push(key.clone());
        }
        key
    }

    /// The smallest `remaining` among the budgets of `scopes` (0 if none has one).
    fn headroom(&self, scopes: &[String], unit: Unit) -> i64 {
        scopes
            .iter()
            .filter_map(|scope| self.state.budget(&budget_key(scope, unit)))
            .map(|b| b.remaining)
            .min()
            .unwrap_or(0)
    }

    fn resolve(&self, quantity: &Quantity, scopes: &[String], unit: Unit) -> i64 {
        match quantity {
            Quantity::Absolute(v) => *v,
            Quantity::Headroom(delta) => self.headroom(scopes, unit).saturating_add(*delta).max(0),
        }
    }

    /// Moves the clock forward to `at + offset` (never backwards), and returns the
    /// maintenance pass to run then if `sweep`.
    fn advance_to(&mut self, at: Option<Millis>, offset: i64, sweep: bool) -> Option<Command> {
        if let Some(at) = at {
            self.now = self.now.max(at.saturating_add(offset));
        }
        sweep.then_some(Command::Maintain {
            limit: usize::MAX,
            archive_after_ms: 0,
        })
    }

    fn target(&self, target: &Target) -> String {
        let n = self.reservations.len();
        match target {
            Target::Recent(pick) if n > 0 => {
                let window = n.min(4);
                self.reservations[n - window + pick.index(window)].clone()
            }
            Target::Any(pick) if n > 0 => self.reservations[pick.index(n)].clone(),
            _ => "r-missing".into(),
        }
    }

    fn command_for(&mut self, op: &Op) -> Option<Command> {
        let actor = Actor::ApiKey(DIGEST);
        let command = match op {
            Op::Reserve {
                subject: s,
                unit,
                estimate,
                ttl_ms,
                grace_ms,
                policy,
                dry_run,
                key,
            } => {
                let subject = subject(*s);
                let estimate = self.resolve(estimate, &scopes_of(&subject), *unit);
                let key = self.key(("reserve", String::new()), key);
                let id = self.fresh("r");
                Command::Reserve(Reserve {
                    ttl_ms: *ttl_ms,
                    grace_period_ms: *grace_ms,
                    overage_policy: *policy,
                    dry_run: *dry_run,
                    ..reserve_cmd(key, id, subject, *unit, estimate)
                })
            }
            Op::Commit {
                target,
                unit,
                actual,
                key,
            } => {
                let id = self.target(target);
                let estimate = self.state.reservation(&id).map_or(0, |r| r.estimate);
                Command::Commit(Commit {
                    actor,
                    idem: idem(self.key(("commit", id.clone()), key)),
                    reservation_id: id,
                    unit: *unit,
                    actual: actual.resolve(estimate),
                    metadata: None,
                })
            }
            Op::Release { target, key } => {
                let id = self.target(target);
                Command::Release(Release {
                    actor,
                    idem: idem(self.key(("release", id.clone()), key)),
                    reservation_id: id,
                    reason: None,
                })
            }
            Op::Extend { target, by_ms, key } => {
                let id = self.target(target);
                Command::Extend(Extend {
                    actor,
                    idem: idem(self.key(("extend", id.clone()), key)),
                    reservation_id: id,
                    extend_by_ms: *by_ms,
                })
            }
            Op::Event {
                subject: s,
                unit,
                actual,
                policy,
                key,
            } => {
                let subject = subject(*s);
                Command::Event(RecordEvent {
                    actor,
                    idem: idem(self.key(("event", String::new()), key)),
                    event_id: self.fresh("e"),
                    actual: self.resolve(actual, &scopes_of(&subject), *unit),
                    subject,
                    unit: *unit,
                    overage_policy: *policy,
                })
            }
            Op::Decide {
                subject: s,
                unit,
                estimate,
                key,
            } => {
                let subject = subject(*s);
                let estimate = self.resolve(estimate, &scopes_of(&subject), *unit);
                let key = self.key(("decide", String::new()), key);
                Command::Decide(decide_cmd(key, subject, *unit, estimate))
            }
            Op::Fund {
                scope,
                operation,
                amount,
                spent,
                bulk: true,
                ..
            } => Command::BulkBudgets(BulkBudgets {
                actor: Actor::Admin,
                tenant_id: TENANT.into(),
                filter: BudgetFilter {
                    scope_prefix: Some(BUDGET_SCOPES[*scope].into()),
                    ..BudgetFilter::default()
                },
                operation: *operation,
                unit: UNIT,
                amount: self.resolve(amount, &[BUDGET_SCOPES[*scope].into()], UNIT),
                spent: *spent,
                reason: None,
                expected_count: None,
                idem: Idempotency {
                    key: self.fresh("bulk").into(),
                    fingerprint: [0; 32],
                },
            }),
            Op::Fund {
                scope,
                operation,
                amount,
                spent,
                key,
                bulk: false,
            } => Command::FundBudget {
                actor: Actor::Admin,
                fund: Funding {
                    tenant_id: Some(TENANT.into()),
                    scope: BUDGET_SCOPES[*scope].into(),
                    unit: UNIT,
                    operation: *operation,
                    amount: self.resolve(amount, &[BUDGET_SCOPES[*scope].into()], UNIT),
                    spent: *spent,
                    reason: None,
                    idem: key
                        .as_ref()
                        .map(|k| idem(self.key(("fund", String::new()), k))),
                },
            },
            Op::Maintain {
                limit,
                archive_after_ms,
            } => Command::Maintain {
                limit: *limit,
                archive_after_ms: *archive_after_ms,
            },
            Op::Advance { ms } => {
                self.now += ms;
                return None;
            }
            Op::AdvanceTo {
                target,
                moment,
                offset,
                sweep,
            } => {
                let at = self
                    .state
                    .reservation(&self.target(target))
                    .and_then(|r| match moment {
                        Moment::LeaseEnd => Some(r.expires_at_ms),
                        Moment::SettleDeadline => Some(r.settle_deadline()),
                        Moment::RetentionEnd => terminal_at(r).map(|at| at + TERMINAL_RETENTION_MS),
                    });
                return self.advance_to(at, *offset, *sweep);
            }
            Op::AdvanceToRecordExpiry {
                pick,
                offset,
                sweep,
            } => {
                let records = normalized(self.state.to_snapshot()).idempotency;
                let at = (!records.is_empty())
                    .then(|| records[pick.index(records.len())].1.expires_at_ms);
                return self.advance_to(at, *offset, *sweep);
            }
            Op::Resend { pick } => {
                if self.resendable.is_empty() {
                    return None;
                }
                let mut command = self.resendable[pick.index(self.resendable.len())].clone();
                match &mut command {
                    Command::Reserve(c) => c.reservation_id = self.fresh("r"),
                    Command::Event(c) => c.event_id = self.fresh("e"),
                    _ => {}
                }
                // Already sealed: the fingerprint ignores the ids just replaced.
                return Some(command);
            }
            Op::TenantStatus {
                status,
                bulk: false,
            } => Command::UpdateTenant {
                actor: Actor::Admin,
                tenant_id: TENANT.into(),
                patch: TenantPatch {
                    status: Some(*status),
                    ..TenantPatch::default()
                },
            },
            Op::WebhookStatus {
                subscription,
                active,
            } => Command::UpdateWebhook(UpdateWebhook {
                actor: Actor::Admin,
                plane: WebhookPlane::Admin,
                subscription_id: SUBSCRIPTIONS[*subscription].into(),
                patch: WebhookPatch {
                    status: Some(if *active {
                        WebhookStatus::Active
                    } else {
                        WebhookStatus::Paused
                    }),
                    ..WebhookPatch::default()
                },
            }),
            Op::DueDeliveries { claimed } => Command::DueDeliveries(DueDeliveries {
                limit: 100,
                skip: Vec::new(),
                hold_ms: claimed.then_some(CLAIM_HOLD_MS),
            }),
            Op::Claim { pick } => {
                let due = self.state.to_snapshot().deliveries;
                if due.is_empty() {
                    return None;
                }
                let d = &due[pick.index(due.len())];
                Command::ClaimDelivery(ClaimDelivery {
                    delivery_id: d.delivery_id.clone(),
                    attempts: d.attempts,
                    hold_ms: Some(CLAIM_HOLD_MS),
                })
            }
            Op::Attempt { pick, success } => {
                let due = self.state.to_snapshot().deliveries;
                if due.is_empty() {
                    return None;
                }
                Command::RecordAttempt(RecordAttempt {
                    delivery_id: due[pick.index(due.len())].delivery_id.clone(),
                    attempt: Attempt {
                        success: *success,
                        response_status: Some(if *success { 200 } else { 500 }),
                        response_time_ms: 5,
                        error_message: (!*success).then(|| "HTTP 500".into()),
                    },
                    retry_in_ms: 1_000,
                })
            }
            Op::TenantStatus { status, bulk: true } => Command::BulkTenants(BulkTenants {
                actor: Actor::Admin,
                filter: TenantFilter {
                    search: Some(TENANT.into()),
                    ..TenantFilter::default()
                },
                target: *status,
                expected_count: None,
                idem: Idempotency {
                    key: self.fresh("bulk").into(),
                    fingerprint: [0; 32],
                },
            }),
        };
        Some(sealed(command))
    }
}

pub fn no_check(_: &Step) -> Result<(), TestCaseError> {
    Ok(())
}
