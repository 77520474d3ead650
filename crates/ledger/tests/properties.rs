//! Property tests for the ledger state machine.
//!
//! Every case provisions one tenant, one API key and up to four budgets at random, then
//! drives `ledger::apply` with a random sequence of reserves (live and dry run), commits,
//! releases, extensions, direct events, decisions, funding operations, maintenance passes
//! and clock advances. Idempotency keys are reused now and then, and earlier requests are
//! resent verbatim. Each property checks one family of rules after every command.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use ledger::{
    apply, Action, Actor, Applied, Balance, Budget, BudgetKey, Command, CommitCmd, DecideCmd,
    Decision, EventCmd, ExtendCmd, FundCmd, FundingOp, Idempotency, Millis, NewApiKey, NewBudget,
    NewTenant, Outcome, OveragePolicy, Rejection, ReleaseCmd, Reservation, ReservationStatus,
    ReserveCmd, SnapshotData, State, StoredOutcome, Subject, Unit, TERMINAL_RETENTION_MS,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

const TENANT: &str = "t";
const DIGEST: [u8; 32] = [7; 32];
const UNIT: Unit = Unit::UsdMicrocents;
const START: Millis = 1_700_000_000_000;
const SECOND: Millis = 1_000;
const HOUR: Millis = 3_600 * SECOND;
const DAY: Millis = 24 * HOUR;
/// The tenant's maximum reservation TTL (the ledger's default; the setup does not set one).
const MAX_TTL: Millis = HOUR;
/// Every idempotency record must stay replayable for at least this long.
const MIN_IDEMPOTENCY_RETENTION: Millis = DAY;

/// The scopes budgets may be created at (each one present or not, at random).
const BUDGET_SCOPES: [&str; 4] = [
    "tenant:t",
    "tenant:t/workspace:w",
    "tenant:t/workspace:w/agent:a",
    "tenant:t/workspace:w/agent:b",
];

/// Subjects as `(tenant, workspace, agent)`. Mixed case is deliberate: scopes lower-case it.
/// The last two reach only the tenant budget (no budget exists at their deeper scopes).
const SUBJECTS: [(&str, Option<&str>, Option<&str>); 6] = [
    ("T", None, None),
    ("t", Some("w"), None),
    ("t", Some("w"), Some("a")),
    ("t", Some("W"), Some("B")),
    ("t", None, Some("a")),
    ("t", Some("x"), Some("a")),
];

// ---------------------------------------------------------------------------------------
// Generated inputs
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct BudgetSpec {
    allocated: i64,
    overdraft_limit: i64,
    policy: Option<OveragePolicy>,
}

#[derive(Debug, Clone)]
struct Setup {
    /// One entry per [`BUDGET_SCOPES`].
    budgets: Vec<Option<BudgetSpec>>,
    default_policy: Option<OveragePolicy>,
    max_extensions: Option<u32>,
}

/// Which idempotency key a request carries.
#[derive(Debug, Clone)]
enum Key {
    Fresh,
    /// A key already used in the same namespace (a fresh one if there is none yet).
    Reuse(Index),
    /// A key already used anywhere, most likely in another namespace.
    Foreign(Index),
}

/// Which reservation a settlement names.
#[derive(Debug, Clone)]
enum Target {
    /// One of the four most recently created reservations.
    Recent(Index),
    Any(Index),
    Missing,
}

/// An amount, or one relative to the headroom of the budgets it will meet (the smallest
/// `remaining` among them), so that exact fits and shortfalls of one unit come up often.
#[derive(Debug, Clone)]
enum Quantity {
    Absolute(i64),
    /// `headroom + delta`, floored at 0.
    Headroom(i64),
}

/// A moment in a reservation's life the clock can be moved to.
#[derive(Debug, Clone, Copy)]
enum Moment {
    LeaseEnd,
    SettleDeadline,
    /// When a terminal reservation may be evicted.
    RetentionEnd,
}

/// A commit's actual amount.
#[derive(Debug, Clone)]
enum Actual {
    Absolute(i64),
    /// `estimate + delta`, floored at 0.
    Relative(i64),
}

impl Actual {
    fn resolve(&self, estimate: i64) -> i64 {
        match self {
            Actual::Absolute(v) => *v,
            Actual::Relative(delta) => estimate.saturating_add(*delta).max(0),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        subject: usize,
        unit: Unit,
        estimate: Quantity,
        ttl_ms: Option<i64>,
        grace_ms: i64,
        policy: Option<OveragePolicy>,
        dry_run: bool,
        key: Key,
    },
    Commit {
        target: Target,
        unit: Unit,
        actual: Actual,
        key: Key,
    },
    Release {
        target: Target,
        key: Key,
    },
    Extend {
        target: Target,
        by_ms: i64,
        key: Key,
    },
    Event {
        subject: usize,
        unit: Unit,
        actual: Quantity,
        policy: Option<OveragePolicy>,
        key: Key,
    },
    Decide {
        subject: usize,
        unit: Unit,
        estimate: Quantity,
        key: Key,
    },
    Fund {
        scope: usize,
        operation: FundingOp,
        amount: Quantity,
        spent: Option<i64>,
        key: Option<Key>,
    },
    Maintain {
        limit: usize,
    },
    Advance {
        ms: i64,
    },
    /// Moves the clock to `offset` ms from a moment of a reservation's life (if ahead),
    /// then runs a maintenance pass if `sweep`.
    AdvanceTo {
        target: Target,
        moment: Moment,
        offset: i64,
        sweep: bool,
    },
    /// Moves the clock to `offset` ms from when an idempotency record expires (if ahead),
    /// then runs a maintenance pass if `sweep`.
    AdvanceToRecordExpiry {
        pick: Index,
        offset: i64,
        sweep: bool,
    },
    /// Sends an earlier idempotent request again, unchanged (with fresh server-side ids).
    Resend {
        pick: Index,
    },
}

/// Mostly small against budgets of up to 10 000 000, sometimes a budget's worth.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        10 => 1..=5_000i64,
        6 => 1..=200_000i64,
        2 => 1..=5_000_000i64,
    ]
}

/// An amount that is usually ordinary and once in `1 + odds` times near `i64::MAX`.
fn amount_or_huge(odds: u32) -> impl Strategy<Value = i64> {
    prop_oneof![odds => amount(), 1 => (i64::MAX - 10)..=i64::MAX]
}

fn quantity(huge_odds: u32) -> impl Strategy<Value = Quantity> {
    prop_oneof![
        3 => amount_or_huge(huge_odds).prop_map(Quantity::Absolute),
        1 => (-2..=2i64).prop_map(Quantity::Headroom),
    ]
}

fn policy() -> impl Strategy<Value = OveragePolicy> {
    prop::sample::select(OveragePolicy::ALL.to_vec())
}

fn unit() -> impl Strategy<Value = Unit> {
    prop_oneof![9 => Just(UNIT), 1 => Just(Unit::Tokens)]
}

fn subject_index() -> impl Strategy<Value = usize> {
    0..SUBJECTS.len()
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        6 => Just(Key::Fresh),
        2 => any::<Index>().prop_map(Key::Reuse),
        1 => any::<Index>().prop_map(Key::Foreign),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        6 => any::<Index>().prop_map(Target::Recent),
        3 => any::<Index>().prop_map(Target::Any),
        1 => Just(Target::Missing),
    ]
}

fn actual() -> impl Strategy<Value = Actual> {
    prop_oneof![
        2 => amount_or_huge(40).prop_map(Actual::Absolute),
        2 => (-1..=1i64).prop_map(Actual::Relative),
        3 => (-5_000..=5_000i64).prop_map(Actual::Relative),
        2 => (-2_000_000..=2_000_000i64).prop_map(Actual::Relative),
    ]
}

fn budget_spec() -> impl Strategy<Value = BudgetSpec> {
    let allocated = prop_oneof![
        1 => Just(0i64),
        2 => 0..=1_000_000i64,
        8 => 1_000_000..=10_000_000i64,
        1 => Just(i64::MAX),
    ];
    let overdraft_limit = prop_oneof![Just(0i64), 1..=2_000_000i64];
    (allocated, overdraft_limit, prop::option::of(policy())).prop_map(
        |(allocated, overdraft_limit, policy)| BudgetSpec {
            allocated,
            overdraft_limit,
            policy,
        },
    )
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::collection::vec(
            prop::option::weighted(0.85, budget_spec()),
            BUDGET_SCOPES.len(),
        ),
        prop::option::of(policy()),
        prop::option::of(0u32..=3),
    )
        .prop_map(|(budgets, default_policy, max_extensions)| Setup {
            budgets,
            default_policy,
            max_extensions,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let ttl = prop::option::of(prop_oneof![0..=120 * SECOND, HOUR..=3 * HOUR]);
    let grace = prop_oneof![Just(0i64), 0..=5 * SECOND, 0..=60 * SECOND];
    let reserve = (
        subject_index(),
        unit(),
        quantity(12),
        ttl,
        grace,
        prop::option::of(policy()),
        prop::bool::weighted(0.2),
        key(),
    )
        .prop_map(
            |(subject, unit, estimate, ttl_ms, grace_ms, policy, dry_run, key)| Op::Reserve {
                subject,
                unit,
                estimate,
                ttl_ms,
                grace_ms,
                policy,
                dry_run,
                key,
            },
        );
    let commit =
        (target(), unit(), actual(), key()).prop_map(|(target, unit, actual, key)| Op::Commit {
            target,
            unit,
            actual,
            key,
        });
    let release = (target(), key()).prop_map(|(target, key)| Op::Release { target, key });
    let extend = (
        target(),
        prop_oneof![0..=600 * SECOND, Just(i64::MAX)],
        key(),
    )
        .prop_map(|(target, by_ms, key)| Op::Extend { target, by_ms, key });
    let event = (
        subject_index(),
        unit(),
        quantity(40),
        prop::option::of(policy()),
        key(),
    )
        .prop_map(|(subject, unit, actual, policy, key)| Op::Event {
            subject,
            unit,
            actual,
            policy,
            key,
        });
    let decide = (subject_index(), unit(), quantity(12), key()).prop_map(
        |(subject, unit, estimate, key)| Op::Decide {
            subject,
            unit,
            estimate,
            key,
        },
    );
    let fund = (
        0..BUDGET_SCOPES.len(),
        prop::sample::select(FundingOp::ALL.to_vec()),
        quantity(12),
        prop::option::of(0..=5_000_000i64),
        prop::option::of(key()),
    )
        .prop_map(|(scope, operation, amount, spent, key)| Op::Fund {
            scope,
            operation,
            amount,
            spent,
            key,
        });
    let maintain =
        prop_oneof![0..=3usize, Just(usize::MAX)].prop_map(|limit| Op::Maintain { limit });
    let clock = prop_oneof![
        16 => prop_oneof![
            8 => 0..=2 * SECOND,
            4 => 10 * SECOND..=120 * SECOND,
            2 => HOUR..=2 * HOUR,
            1 => DAY..=2 * DAY,
            1 => 31 * DAY..=32 * DAY,
        ]
        .prop_map(|ms| Op::Advance { ms }),
        4 => (
            target(),
            prop_oneof![
                Just(Moment::LeaseEnd),
                Just(Moment::SettleDeadline),
                Just(Moment::RetentionEnd),
            ],
            -1..=1i64,
            any::<bool>(),
        )
            .prop_map(|(target, moment, offset, sweep)| Op::AdvanceTo {
                target,
                moment,
                offset,
                sweep,
            }),
        1 => (any::<Index>(), -1..=1i64, any::<bool>()).prop_map(|(pick, offset, sweep)| {
            Op::AdvanceToRecordExpiry {
                pick,
                offset,
                sweep,
            }
        }),
    ];
    let resend = any::<Index>().prop_map(|pick| Op::Resend { pick });
    prop_oneof![
        6 => reserve,
        5 => commit,
        2 => release,
        2 => extend,
        3 => event,
        1 => decide,
        3 => fund,
        1 => maintain,
        5 => clock,
        2 => resend,
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..200)
}

// ---------------------------------------------------------------------------------------
// Building commands
// ---------------------------------------------------------------------------------------

fn subject(index: usize) -> Subject {
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
fn reserve_cmd(key: String, id: String, subject: Subject, unit: Unit, estimate: i64) -> ReserveCmd {
    ReserveCmd {
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

fn decide_cmd(key: String, subject: Subject, unit: Unit, estimate: i64) -> DecideCmd {
    DecideCmd {
        actor: Actor::ApiKey(DIGEST),
        idem: idem(key),
        subject,
        unit,
        estimate,
    }
}

fn setup_commands(setup: &Setup) -> Vec<Command> {
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

/// The idempotency namespace of a request, as the protocol defines it: operations on a
/// reservation are scoped by its id, the others by endpoint.
type Namespace = (&'static str, String);

fn namespace(command: &Command) -> Option<(Namespace, &Idempotency)> {
    let global = |name: &'static str| (name, String::new());
    match command {
        Command::Reserve(c) => Some((global("reserve"), &c.idem)),
        Command::Decide(c) => Some((global("decide"), &c.idem)),
        Command::Event(c) => Some((global("event"), &c.idem)),
        Command::Commit(c) => Some((("commit", c.reservation_id.clone()), &c.idem)),
        Command::Release(c) => Some((("release", c.reservation_id.clone()), &c.idem)),
        Command::Extend(c) => Some((("extend", c.reservation_id.clone()), &c.idem)),
        Command::FundBudget { fund, .. } => fund.idem.as_ref().map(|i| (global("fund"), i)),
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
fn sealed(mut command: Command) -> Command {
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
struct Step<'a> {
    before: &'a State,
    command: &'a Command,
    now: Millis,
    applied: &'a Applied,
    after: &'a State,
}

type Check<'c> = dyn FnMut(&Step) -> Result<(), TestCaseError> + 'c;

/// Turns operations into commands (using what earlier outcomes revealed: reservation ids,
/// keys in use) and applies them, recording everything it applied.
struct Driver {
    state: State,
    now: Millis,
    issued: usize,
    reservations: Vec<String>,
    keys: BTreeMap<Namespace, Vec<String>>,
    all_keys: Vec<String>,
    resendable: Vec<Command>,
    log: Vec<(Command, Millis, Applied)>,
}

impl Driver {
    fn run(setup: &Setup, ops: &[Op], check: &mut Check) -> Result<Driver, TestCaseError> {
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
        sweep.then_some(Command::Maintain { limit: usize::MAX })
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
                Command::Reserve(ReserveCmd {
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
                Command::Commit(CommitCmd {
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
                Command::Release(ReleaseCmd {
                    actor,
                    idem: idem(self.key(("release", id.clone()), key)),
                    reservation_id: id,
                    reason: None,
                })
            }
            Op::Extend { target, by_ms, key } => {
                let id = self.target(target);
                Command::Extend(ExtendCmd {
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
                Command::Event(EventCmd {
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
                key,
            } => Command::FundBudget {
                actor: Actor::Admin,
                fund: FundCmd {
                    tenant_id: Some(TENANT.into()),
                    scope: BUDGET_SCOPES[*scope].into(),
                    unit: UNIT,
                    operation: *operation,
                    amount: self.resolve(amount, &[BUDGET_SCOPES[*scope].into()], UNIT),
                    spent: *spent,
                    idem: key
                        .as_ref()
                        .map(|k| idem(self.key(("fund", String::new()), k))),
                },
            },
            Op::Maintain { limit } => Command::Maintain { limit: *limit },
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
        };
        Some(sealed(command))
    }
}

fn no_check(_: &Step) -> Result<(), TestCaseError> {
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Helpers shared by the checks
// ---------------------------------------------------------------------------------------

fn budget_key(scope: &str, unit: Unit) -> BudgetKey {
    BudgetKey {
        scope: scope.into(),
        unit,
    }
}

/// The affected scopes of a subject (only the levels these tests use), lower-cased.
fn scopes_of(subject: &Subject) -> Vec<String> {
    let levels = [
        ("tenant", &subject.tenant),
        ("workspace", &subject.workspace),
        ("agent", &subject.agent),
    ];
    let mut path = String::new();
    let mut scopes = Vec::new();
    for (level, value) in levels {
        if let Some(value) = value {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(&format!("{level}:{}", value.to_lowercase()));
            scopes.push(path.clone());
        }
    }
    scopes
}

/// The affected scopes of `subject` that have a budget in `unit`, in hierarchy order.
fn budgeted_scopes(state: &State, subject: &Subject, unit: Unit) -> Vec<String> {
    scopes_of(subject)
        .into_iter()
        .filter(|scope| state.budget(&budget_key(scope, unit)).is_some())
        .collect()
}

/// The reservation a commit, release or extend names.
fn settled_id(command: &Command) -> Option<&str> {
    match command {
        Command::Commit(c) => Some(&c.reservation_id),
        Command::Release(c) => Some(&c.reservation_id),
        Command::Extend(c) => Some(&c.reservation_id),
        _ => None,
    }
}

/// The replayable part of an idempotent outcome, and whether it was a replay.
fn stored_outcome(outcome: &Outcome) -> Option<(StoredOutcome, bool)> {
    Some(match outcome {
        Outcome::Reserved {
            result, replayed, ..
        } => (StoredOutcome::Reserve(result.clone()), *replayed),
        Outcome::Committed { result, replayed } => {
            (StoredOutcome::Commit(result.clone()), *replayed)
        }
        Outcome::Released { result, replayed } => {
            (StoredOutcome::Release(result.clone()), *replayed)
        }
        Outcome::Extended {
            result, replayed, ..
        } => (StoredOutcome::Extend(result.clone()), *replayed),
        Outcome::Decided { result, replayed } => (StoredOutcome::Decide(result.clone()), *replayed),
        Outcome::EventApplied { result, replayed } => {
            (StoredOutcome::Event(result.clone()), *replayed)
        }
        Outcome::Funded { result, replayed } => (StoredOutcome::Fund(result.clone()), *replayed),
        _ => return None,
    })
}

/// When a terminal reservation reached its terminal state.
fn terminal_at(r: &Reservation) -> Option<Millis> {
    r.finalized_at_ms.or(r.expired_at_ms)
}

fn same_reservations(a: &State, b: &State) -> bool {
    a.reservation_count() == b.reservation_count()
        && a.reservations()
            .all(|r| b.reservation(&r.reservation_id) == Some(r))
}

/// Every reported balance equals the budget as it now stands.
fn balances_are_current(after: &State, balances: &[Balance]) -> Result<(), TestCaseError> {
    for reported in balances {
        let current = after
            .budget(&budget_key(&reported.scope, reported.unit))
            .map(Balance::from);
        prop_assert_eq!(current.as_ref(), Some(reported));
    }
    Ok(())
}

/// Shared strings as owned ones, to compare with expectations.
fn texts(shared: &[Arc<str>]) -> Vec<String> {
    shared.iter().map(|s| s.to_string()).collect()
}

fn balance_scopes(balances: &[Balance]) -> Vec<String> {
    balances.iter().map(|b| b.scope.to_string()).collect()
}

/// A snapshot with every list in a canonical order (hash maps iterate arbitrarily).
fn normalized(mut s: SnapshotData) -> SnapshotData {
    s.tenants.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
    s.api_keys.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    s.budgets.sort_by_key(Budget::key);
    s.reservations
        .sort_by(|a, b| a.reservation_id.cmp(&b.reservation_id));
    s.idempotency.sort_by(|a, b| a.0.cmp(&b.0));
    s
}

/// The decision reason a live refusal corresponds to on the evaluation surfaces.
fn reason_code(rejection: &Rejection) -> Option<&'static str> {
    Some(match rejection {
        Rejection::BudgetFrozen { .. } => "BUDGET_FROZEN",
        Rejection::BudgetClosed { .. } => "BUDGET_CLOSED",
        Rejection::OverdraftLimitExceeded { .. } => "OVERDRAFT_LIMIT_EXCEEDED",
        Rejection::DebtOutstanding { .. } => "DEBT_OUTSTANDING",
        Rejection::BudgetExceeded { .. } => "BUDGET_EXCEEDED",
        Rejection::NotFound(_) => "BUDGET_NOT_FOUND",
        Rejection::TenantClosed(_) => "TENANT_CLOSED",
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Property 1: the ledger's invariants and lifecycle rules
// ---------------------------------------------------------------------------------------

fn check_invariants(step: &Step) -> Result<(), TestCaseError> {
    let violations = step.after.verify();
    prop_assert!(
        violations.is_empty(),
        "{:?} after {:?} -> {:?}",
        violations,
        step.command,
        step.applied.result
    );
    for b in step.after.budgets() {
        prop_assert!(
            b.debt <= b.overdraft_limit,
            "debt beyond the overdraft limit at {}: {:?}",
            b.scope,
            b
        );
    }
    check_rejection_is_inert(step)?;
    check_settlement_is_accepted(step)?;
    check_reported_balances(step)?;
    check_reservation_transitions(step)?;
    check_maintenance(step)
}

/// A refused command changes nothing, except that a settlement finding its reservation past
/// the grace period records the expiry.
fn check_rejection_is_inert(step: &Step) -> Result<(), TestCaseError> {
    if let Err(rejection) = &step.applied.result {
        if !step.applied.effects.is_empty() {
            let id = settled_id(step.command);
            prop_assert!(
                matches!(rejection, Rejection::ReservationExpired(x) if Some(x.as_str()) == id),
                "refusal {:?} of {:?} has effects {:?}",
                rejection,
                step.command,
                step.applied.effects
            );
        }
    }
    if step.applied.effects.is_empty() {
        prop_assert!(
            step.before.budgets().eq(step.after.budgets()),
            "budgets changed without effects: {:?}",
            step.command
        );
        prop_assert!(
            same_reservations(step.before, step.after),
            "reservations changed without effects: {:?}",
            step.command
        );
    }
    Ok(())
}

/// An ACTIVE reservation within its grace period can be settled: a commit or release is
/// refused only for its own reasons (overage, wrong unit), an extend only within the lease
/// and the extension limit.
fn check_settlement_is_accepted(step: &Step) -> Result<(), TestCaseError> {
    let Err(e) = &step.applied.result else {
        return Ok(());
    };
    let Some(r) = settled_id(step.command).and_then(|id| step.before.reservation(id)) else {
        return Ok(());
    };
    if r.status != ReservationStatus::Active || matches!(e, Rejection::IdempotencyMismatch) {
        return Ok(());
    }
    let accepted = match step.command {
        Command::Commit(c) => {
            step.now > r.settle_deadline()
                || c.unit != r.unit
                || (c.actual > r.estimate
                    && matches!(
                        e,
                        Rejection::BudgetExceeded { .. }
                            | Rejection::OverdraftLimitExceeded { .. }
                            | Rejection::Overflow
                    ))
        }
        Command::Release(_) => step.now > r.settle_deadline(),
        Command::Extend(_) => {
            step.now > r.expires_at_ms
                || (r.extension_count >= r.max_extensions
                    && matches!(e, Rejection::MaxExtensionsExceeded { .. }))
        }
        _ => true,
    };
    prop_assert!(
        accepted,
        "{:?} refused with {:?} at {} while {:?}",
        step.command,
        e,
        step.now,
        r
    );
    Ok(())
}

/// Balances in fresh outcomes are the budgets as left by the command; a live reserve
/// never leaves a budget it holds on below zero.
fn check_reported_balances(step: &Step) -> Result<(), TestCaseError> {
    let Ok(outcome) = &step.applied.result else {
        return Ok(());
    };
    match (step.command, outcome) {
        (
            Command::Reserve(c),
            Outcome::Reserved {
                result,
                replayed: false,
                ..
            },
        ) if !c.dry_run => {
            prop_assert_eq!(result.decision, Decision::Allow);
            prop_assert_eq!(result.reserved, Some((c.unit, c.estimate)));
            prop_assert_eq!(
                balance_scopes(&result.balances),
                budgeted_scopes(step.before, &c.subject, c.unit)
            );
            for b in &result.balances {
                prop_assert!(b.remaining >= 0, "reserve oversubscribed {:?}", b);
            }
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Commit(c),
            Outcome::Committed {
                result,
                replayed: false,
            },
        ) => {
            let r = step
                .before
                .reservation(&c.reservation_id)
                .expect("committed");
            prop_assert_eq!(balance_scopes(&result.balances), texts(&r.budgeted_scopes));
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Release(c),
            Outcome::Released {
                result,
                replayed: false,
            },
        ) => {
            let r = step
                .before
                .reservation(&c.reservation_id)
                .expect("released");
            prop_assert_eq!(result.released, r.estimate);
            prop_assert_eq!(balance_scopes(&result.balances), texts(&r.budgeted_scopes));
            balances_are_current(step.after, &result.balances)
        }
        (
            Command::Extend(_),
            Outcome::Extended {
                result,
                replayed: false,
                ..
            },
        ) => balances_are_current(step.after, &result.balances),
        (
            Command::Event(c),
            Outcome::EventApplied {
                result,
                replayed: false,
            },
        ) => {
            prop_assert_eq!(
                balance_scopes(&result.balances),
                budgeted_scopes(step.before, &c.subject, c.unit)
            );
            balances_are_current(step.after, &result.balances)
        }
        _ => Ok(()),
    }
}

/// Reservations appear, change and disappear only as their lifecycle allows.
fn check_reservation_transitions(step: &Step) -> Result<(), TestCaseError> {
    let ids: BTreeSet<&str> = step
        .before
        .reservations()
        .chain(step.after.reservations())
        .map(|r| &*r.reservation_id)
        .collect();
    let mut expired = 0;
    for id in ids {
        match (step.before.reservation(id), step.after.reservation(id)) {
            (None, Some(new)) => check_created(step, new)?,
            (Some(old), None) => check_evicted(step, old)?,
            (Some(old), Some(new)) if old != new => {
                if new.status == ReservationStatus::Expired {
                    expired += 1;
                }
                check_transition(step, old, new)?;
            }
            _ => {}
        }
    }
    if let Ok(Outcome::Maintained { expired: n, .. }) = &step.applied.result {
        prop_assert_eq!(*n, expired);
    }
    Ok(())
}

fn check_created(step: &Step, new: &Reservation) -> Result<(), TestCaseError> {
    let (
        Command::Reserve(c),
        Ok(Outcome::Reserved {
            result, replayed, ..
        }),
    ) = (step.command, &step.applied.result)
    else {
        return Err(TestCaseError::fail(format!(
            "reservation {} created by {:?}",
            new.reservation_id, step.command
        )));
    };
    prop_assert!(
        !c.dry_run && !replayed,
        "dry run or replay created {:?}",
        new
    );
    prop_assert_eq!(&*new.reservation_id, c.reservation_id.as_str());
    prop_assert_eq!(result.reservation_id.as_ref(), Some(&new.reservation_id));
    prop_assert_eq!(result.expires_at_ms, Some(new.expires_at_ms));
    prop_assert_eq!(new.status, ReservationStatus::Active);
    prop_assert_eq!((new.unit, new.estimate), (c.unit, c.estimate));
    prop_assert_eq!(
        texts(&new.budgeted_scopes),
        budgeted_scopes(step.before, &c.subject, c.unit)
    );
    prop_assert_eq!(new.created_at_ms, step.now);
    prop_assert!(
        (step.now..=step.now + MAX_TTL).contains(&new.expires_at_ms),
        "lease beyond the maximum TTL: {:?}",
        new
    );
    Ok(())
}

fn check_evicted(step: &Step, old: &Reservation) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(step.command, Command::Maintain { .. }),
        "{:?} removed reservation {:?}",
        step.command,
        old
    );
    prop_assert_ne!(old.status, ReservationStatus::Active);
    let at = terminal_at(old);
    prop_assert!(
        at.is_some_and(|at| at + TERMINAL_RETENTION_MS <= step.now),
        "evicted before its retention ended: {:?} at {}",
        old,
        step.now
    );
    Ok(())
}

fn check_transition(
    step: &Step,
    old: &Reservation,
    new: &Reservation,
) -> Result<(), TestCaseError> {
    let id = &*old.reservation_id;
    let identity = |r: &Reservation| {
        (
            r.tenant_id.clone(),
            r.unit,
            r.estimate,
            r.budgeted_scopes.clone(),
            r.created_at_ms,
            r.grace_period_ms,
            r.overage_policy,
        )
    };
    prop_assert_eq!(identity(old), identity(new));
    prop_assert_eq!(
        old.status,
        ReservationStatus::Active,
        "terminal reservation changed: {:?} -> {:?}",
        old,
        new
    );
    let targeted = settled_id(step.command) == Some(id);
    match (new.status, &step.applied.result) {
        (
            ReservationStatus::Committed,
            Ok(Outcome::Committed {
                result,
                replayed: false,
            }),
        ) if targeted => {
            prop_assert_eq!(new.charged, Some(result.charged));
            prop_assert_eq!(new.finalized_at_ms, Some(step.now));
            prop_assert!(step.now <= old.settle_deadline());
        }
        (
            ReservationStatus::Released,
            Ok(Outcome::Released {
                replayed: false, ..
            }),
        ) if targeted => {
            prop_assert_eq!(new.finalized_at_ms, Some(step.now));
            prop_assert!(step.now <= old.settle_deadline());
        }
        (ReservationStatus::Expired, result)
            if matches!(step.command, Command::Maintain { .. })
                || (targeted
                    && matches!(result, Err(Rejection::ReservationExpired(x)) if x == id)) =>
        {
            prop_assert!(
                step.now > old.settle_deadline(),
                "expired within its grace period: {:?} at {}",
                old,
                step.now
            );
            prop_assert_eq!(new.expired_at_ms, Some(step.now));
        }
        (
            ReservationStatus::Active,
            Ok(Outcome::Extended {
                result,
                replayed: false,
                ..
            }),
        ) if targeted => {
            prop_assert!(
                step.now <= old.expires_at_ms,
                "extended after its lease ended"
            );
            prop_assert_eq!(new.expires_at_ms, result.expires_at_ms);
            prop_assert!(
                new.expires_at_ms >= old.expires_at_ms,
                "extension shrank the lease"
            );
            prop_assert!(
                new.expires_at_ms <= (step.now + MAX_TTL).max(old.expires_at_ms),
                "extension beyond the maximum TTL"
            );
            prop_assert_eq!(new.extension_count, old.extension_count + 1);
            prop_assert!(new.extension_count <= new.max_extensions);
        }
        _ => {
            return Err(TestCaseError::fail(format!(
                "illegal transition {:?} -> {:?} by {:?} -> {:?}",
                old, new, step.command, step.applied.result
            )))
        }
    }
    Ok(())
}

/// A maintenance pass expires what is due and evicts what is stale, up to its limit each.
fn check_maintenance(step: &Step) -> Result<(), TestCaseError> {
    let (Command::Maintain { limit }, Ok(Outcome::Maintained { expired, evicted })) =
        (step.command, &step.applied.result)
    else {
        return Ok(());
    };
    let lapsed =
        |r: &&Reservation| r.status == ReservationStatus::Active && r.settle_deadline() < step.now;
    let due = step.before.reservations().filter(lapsed).count();
    prop_assert_eq!(*expired, due.min(*limit));
    if *limit >= due {
        prop_assert_eq!(step.after.reservations().filter(lapsed).count(), 0);
    }
    let snapshot = step.before.to_snapshot();
    let stale_reservations = snapshot
        .reservations
        .iter()
        .filter(|r| r.status != ReservationStatus::Active)
        .filter(|r| terminal_at(r).is_some_and(|at| at + TERMINAL_RETENTION_MS <= step.now))
        .count();
    let stale_records = snapshot
        .idempotency
        .iter()
        .filter(|(_, rec)| rec.expires_at_ms <= step.now)
        .count();
    prop_assert_eq!(*evicted, (stale_reservations + stale_records).min(*limit));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Property 2: balances move only as the outcomes say
// ---------------------------------------------------------------------------------------

/// What one command implies for one budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Delta {
    reserved: i128,
    /// Added to `spent + debt`.
    charged: i128,
}

/// Tracks, from successful outcomes only, what every budget must hold.
#[derive(Default)]
struct Accounts {
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
    fn check(&mut self, step: &Step) -> Result<(), TestCaseError> {
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
                Some(_) if funded.as_deref() == Some(&*b.scope) => {}
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

    /// A fresh funding outcome changes exactly its budget, exactly as the operation says.
    /// Returns the funded scope.
    fn check_funding(&mut self, step: &Step) -> Result<Option<String>, TestCaseError> {
        let (
            Command::FundBudget { fund, .. },
            Ok(Outcome::Funded {
                result,
                replayed: false,
            }),
        ) = (step.command, &step.applied.result)
        else {
            return Ok(None);
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
        Ok(Some(new.scope.to_string()))
    }
}

/// A budget after a funding operation, per the admin spec.
fn expected_funding(old: &Budget, fund: &FundCmd) -> Balance {
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
    // An expiry returns the hold.
    for old in step.before.reservations() {
        let expired = step
            .after
            .reservation(&old.reservation_id)
            .is_some_and(|r| r.status == ReservationStatus::Expired);
        if old.status == ReservationStatus::Active && expired {
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

// ---------------------------------------------------------------------------------------
// Property 3: idempotency
// ---------------------------------------------------------------------------------------

struct Record {
    fingerprint: [u8; 32],
    outcome: StoredOutcome,
    at: Millis,
}

/// The first successful outcome per idempotency key, as the client saw it.
#[derive(Default)]
struct Replays {
    records: HashMap<(Namespace, String), Record>,
}

impl Replays {
    fn check(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let Some((ns, idem)) = namespace(step.command) else {
            return Ok(());
        };
        let slot = (ns, idem.key.to_string());
        let prior = self.records.get(&slot);
        // A record is certainly still live within the minimum retention.
        let live = prior.filter(|p| step.now < p.at + MIN_IDEMPOTENCY_RETENTION);
        match &step.applied.result {
            Ok(outcome) => {
                let (stored, replayed) = stored_outcome(outcome)
                    .ok_or_else(|| TestCaseError::fail(format!("unexpected {outcome:?}")))?;
                if replayed {
                    let prior = prior.ok_or_else(|| {
                        TestCaseError::fail(format!("replay without a record: {:?}", step.command))
                    })?;
                    prop_assert_eq!(prior.fingerprint, idem.fingerprint);
                    prop_assert_eq!(&prior.outcome, &stored, "replay differs from the original");
                    prop_assert!(
                        step.applied.effects.is_empty(),
                        "a replay changed the state"
                    );
                } else {
                    prop_assert!(
                        live.is_none(),
                        "key {:?} re-executed within its retention: {:?}",
                        &slot,
                        step.command
                    );
                    self.records.insert(
                        slot,
                        Record {
                            fingerprint: idem.fingerprint,
                            outcome: stored,
                            at: step.now,
                        },
                    );
                }
            }
            Err(Rejection::IdempotencyMismatch) => {
                let prior = prior.ok_or_else(|| {
                    TestCaseError::fail(format!("mismatch without a record: {:?}", step.command))
                })?;
                prop_assert_ne!(prior.fingerprint, idem.fingerprint);
                prop_assert!(step.applied.effects.is_empty());
            }
            Err(e) => {
                if let Some(prior) = live {
                    // Only a request naming an unknown budget is refused before its key is
                    // looked at; anything else must replay or report the mismatch.
                    let early = matches!(e, Rejection::BudgetNotFound(_))
                        && prior.fingerprint != idem.fingerprint;
                    prop_assert!(
                        early,
                        "live key {:?} neither replayed nor mismatched: {:?} -> {:?}",
                        &slot,
                        step.command,
                        e
                    );
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Property 4: evaluation (decide, dry run) predicts admission (live reserve)
// ---------------------------------------------------------------------------------------

fn check_evaluation(step: &Step) -> Result<(), TestCaseError> {
    let (subject, unit, estimate) = match step.command {
        Command::Reserve(c) => (&c.subject, c.unit, c.estimate),
        Command::Decide(c) => (&c.subject, c.unit, c.estimate),
        _ => return Ok(()),
    };
    let probe = |command: Command| apply(&mut step.before.clone(), sealed(command), step.now);
    let reserve = |key: &str, dry_run| {
        Command::Reserve(ReserveCmd {
            dry_run,
            ..reserve_cmd(
                key.into(),
                "r-probe".into(),
                subject.clone(),
                unit,
                estimate,
            )
        })
    };
    let live = probe(reserve("probe-live", false)).result;
    let dry = probe(reserve("probe-dry", true)).result;
    let decided = probe(Command::Decide(decide_cmd(
        "probe-decide".into(),
        subject.clone(),
        unit,
        estimate,
    )))
    .result;
    match (&live, &dry, &decided) {
        (
            Ok(_),
            Ok(Outcome::Reserved { result: d, .. }),
            Ok(Outcome::Decided { result: e, .. }),
        ) => {
            prop_assert_eq!((d.decision, e.decision), (Decision::Allow, Decision::Allow));
            prop_assert_eq!(d.reserved, Some((unit, estimate)));
        }
        (Err(x), Err(y), Err(z)) => {
            prop_assert_eq!(x, y);
            prop_assert_eq!(x, z);
        }
        (
            Err(x),
            Ok(Outcome::Reserved { result: d, .. }),
            Ok(Outcome::Decided { result: e, .. }),
        ) => {
            prop_assert_eq!((d.decision, e.decision), (Decision::Deny, Decision::Deny));
            prop_assert_eq!(&d.reason_code, &e.reason_code);
            prop_assert_eq!(d.reason_code.as_deref(), reason_code(x));
        }
        _ => {
            return Err(TestCaseError::fail(format!(
                "surfaces disagree: live {live:?}, dry run {dry:?}, decide {decided:?}"
            )))
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Properties 5 and 6: determinism, journals and snapshots
// ---------------------------------------------------------------------------------------

/// Maintenance passes far enough ahead that every lease lapses and every retention ends.
fn horizon_probes(now: Millis) -> [(Command, Millis); 3] {
    [
        (Command::Maintain { limit: 2 }, now + HOUR),
        (Command::Maintain { limit: usize::MAX }, now + 2 * HOUR),
        (
            Command::Maintain { limit: usize::MAX },
            now + 2 * HOUR + TERMINAL_RETENTION_MS + DAY,
        ),
    ]
}

fn check_determinism(driver: Driver) -> Result<(), TestCaseError> {
    // The same commands on a fresh state give the same results, bit for bit.
    let mut twin = State::new();
    for (command, now, applied) in &driver.log {
        let again = apply(&mut twin, command.clone(), *now);
        prop_assert_eq!(&again, applied, "diverged on {:?}", command);
    }
    // Replaying only the effects rebuilds the same state, and so does a snapshot.
    let mut journal = State::new();
    for effect in driver.log.iter().flat_map(|(_, _, a)| &a.effects) {
        journal.apply_effect(effect);
    }
    let restored = State::from_snapshot(driver.state.to_snapshot());
    let expected = normalized(driver.state.to_snapshot());
    prop_assert_eq!(&normalized(twin.to_snapshot()), &expected);
    prop_assert_eq!(&normalized(journal.to_snapshot()), &expected);
    prop_assert_eq!(&normalized(restored.to_snapshot()), &expected);
    // All four keep behaving alike (their indexes agree), and nothing outlives retention.
    let mut states = [driver.state, twin, journal, restored];
    for (command, at) in horizon_probes(driver.now) {
        let results: Vec<Applied> = states
            .iter_mut()
            .map(|s| apply(s, command.clone(), at))
            .collect();
        for r in &results[1..] {
            prop_assert_eq!(r, &results[0]);
        }
    }
    for s in &states {
        let left = s.to_snapshot();
        prop_assert!(
            left.reservations.is_empty(),
            "left behind: {:?}",
            left.reservations
        );
        prop_assert!(
            left.idempotency.is_empty(),
            "left behind: {:?}",
            left.idempotency
        );
        prop_assert!(s.verify().is_empty());
    }
    Ok(())
}

fn check_restore_midway(driver: &Driver, split: Index) -> Result<(), TestCaseError> {
    let k = split.index(driver.log.len() + 1);
    let mut state = State::new();
    for (command, now, _) in &driver.log[..k] {
        apply(&mut state, command.clone(), *now);
    }
    let mut restored = State::from_snapshot(state.to_snapshot());
    for (command, now, applied) in &driver.log[k..] {
        let again = apply(&mut restored, command.clone(), *now);
        prop_assert_eq!(&again, applied, "restored state diverged on {:?}", command);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig {
        // Keep the crate's tree clean: no regression files.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// `verify()` is clean, debt stays within the overdraft limit, refusals change nothing,
    /// reported balances are current, live reserves never oversubscribe, and reservations
    /// move only along their lifecycle.
    #[test]
    fn invariants_hold_after_every_command(setup in setup(), ops in ops()) {
        Driver::run(&setup, &ops, &mut check_invariants)?;
    }

    /// Every budget's `reserved`, `spent + debt` and `allocated` move exactly as the
    /// successful outcomes imply; unfunded budgets total what was charged; budgets never
    /// reset are never oversubscribed; overage policies are honoured.
    #[test]
    fn balances_move_only_as_outcomes_imply(setup in setup(), ops in ops()) {
        let mut accounts = Accounts::default();
        Driver::run(&setup, &ops, &mut |step: &Step| accounts.check(step))?;
    }

    /// Within its retention, a key with the same payload replays the original outcome
    /// without effects, and with another payload is refused as a mismatch.
    #[test]
    fn idempotency_keys_replay_or_mismatch(setup in setup(), ops in ops()) {
        let mut replays = Replays::default();
        Driver::run(&setup, &ops, &mut |step: &Step| replays.check(step))?;
    }

    /// Decide, a dry run and a live reserve agree on every state.
    #[test]
    fn evaluation_predicts_admission(setup in setup(), ops in ops()) {
        Driver::run(&setup, &ops, &mut check_evaluation)?;
    }

    /// Same commands, same results; effects alone and snapshots rebuild the same state;
    /// the rebuilt states behave the same and retain nothing past retention.
    #[test]
    fn apply_is_deterministic_and_replayable(setup in setup(), ops in ops()) {
        let driver = Driver::run(&setup, &ops, &mut no_check)?;
        check_determinism(driver)?;
    }

    /// A state restored from a snapshot at any point continues exactly like the original.
    #[test]
    fn snapshot_restore_continues_identically(
        setup in setup(),
        ops in ops(),
        split in any::<Index>(),
    ) {
        let driver = Driver::run(&setup, &ops, &mut no_check)?;
        check_restore_midway(&driver, split)?;
    }
}

/// Reservations of one subject and action share those values' allocations (and the scopes
/// derived from the subject), a different subject gets its own; a state loaded from a
/// snapshot has equal reservations, shared the same way.
#[test]
fn reservations_of_one_subject_share_it() {
    let setup = Setup {
        budgets: vec![
            Some(BudgetSpec {
                allocated: 1_000_000,
                overdraft_limit: 0,
                policy: None
            });
            BUDGET_SCOPES.len()
        ],
        default_policy: None,
        max_extensions: None,
    };
    let mut state = State::new();
    for command in setup_commands(&setup) {
        apply(&mut state, sealed(command), START)
            .result
            .expect("setup");
    }
    // Two reserves of one agent, then one of another agent.
    let subjects = [2, 2, 5];
    let ids: Vec<String> = subjects
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let command = reserve_cmd(format!("k{i}"), format!("r{i}"), subject(s), UNIT, 10);
            match apply(&mut state, sealed(Command::Reserve(command)), START).result {
                Ok(Outcome::Reserved { .. }) => format!("r{i}"),
                other => panic!("reserve {i}: {other:?}"),
            }
        })
        .collect();
    // The first two share every value of their subject and action; the third shares none.
    let check = |state: &State| {
        let [a, b, c] = [0, 1, 2].map(|i| state.reservation(&ids[i]).expect("reserved"));
        assert!(Arc::ptr_eq(&a.subject, &b.subject));
        assert!(Arc::ptr_eq(&a.action, &b.action));
        assert!(Arc::ptr_eq(&a.affected_scopes, &b.affected_scopes));
        assert!(!Arc::ptr_eq(&a.subject, &c.subject));
        assert_eq!(*a.subject, subject(2));
        assert_eq!(*c.subject, subject(5));
    };
    check(&state);
    let restored = State::from_snapshot(state.to_snapshot());
    for id in &ids {
        assert_eq!(restored.reservation(id), state.reservation(id));
    }
    check(&restored);
}
