//! Generated inputs: the setup of a case and the operations it runs.

use ledger::{FundingOp, OveragePolicy, TenantStatus, Unit};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::properties::{BUDGET_SCOPES, DAY, HOUR, SECOND, SUBJECTS, UNIT};

#[derive(Debug, Clone)]
pub struct BudgetSpec {
    pub allocated: i64,
    pub overdraft_limit: i64,
    pub policy: Option<OveragePolicy>,
}

#[derive(Debug, Clone)]
pub struct Setup {
    /// One entry per [`BUDGET_SCOPES`].
    pub budgets: Vec<Option<BudgetSpec>>,
    pub default_policy: Option<OveragePolicy>,
    pub max_extensions: Option<u32>,
}

/// Which idempotency key a request carries.
#[derive(Debug, Clone)]
pub enum Key {
    Fresh,
    /// A key already used in the same namespace (a fresh one if there is none yet).
    Reuse(Index),
    /// A key already used anywhere, most likely in another namespace.
    Foreign(Index),
}

/// Which reservation a settlement names.
#[derive(Debug, Clone)]
pub enum Target {
    /// One of the four most recently created reservations.
    Recent(Index),
    Any(Index),
    Missing,
}

/// An amount, or one relative to the headroom of the budgets it will meet (the smallest
/// `remaining` among them), so that exact fits and shortfalls of one unit come up often.
#[derive(Debug, Clone)]
pub enum Quantity {
    Absolute(i64),
    /// `headroom + delta`, floored at 0.
    Headroom(i64),
}

/// A moment in a reservation's life the clock can be moved to.
#[derive(Debug, Clone, Copy)]
pub enum Moment {
    LeaseEnd,
    SettleDeadline,
    /// When a terminal reservation may be evicted.
    RetentionEnd,
}

/// A commit's actual amount.
#[derive(Debug, Clone)]
pub enum Actual {
    Absolute(i64),
    /// `estimate + delta`, floored at 0.
    Relative(i64),
}

impl Actual {
    pub fn resolve(&self, estimate: i64) -> i64 {
        match self {
            Actual::Absolute(v) => *v,
            Actual::Relative(delta) => estimate.saturating_add(*delta).max(0),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Op {
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
    /// With `bulk`, as a bulk action over the scope and every budget below it.
    Fund {
        scope: usize,
        operation: FundingOp,
        amount: Quantity,
        spent: Option<i64>,
        key: Option<Key>,
        bulk: bool,
    },
    Maintain {
        limit: usize,
        archive_after_ms: i64,
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
    /// Moves the tenant to `status`: a suspension, a resumption, or the close that releases
    /// its reservations, closes its budgets and revokes its keys in one step (and after
    /// which reopening is refused). With `bulk`, as a bulk action's row.
    TenantStatus {
        status: TenantStatus,
        bulk: bool,
    },
    /// Pauses or resumes one of the setup's subscriptions.
    WebhookStatus {
        subscription: usize,
        active: bool,
    },
    /// The dispatcher: asks for due work (as the Redis engine's do, passing over claimed
    /// deliveries, when `claimed`), claims a due delivery, or records an attempt of one.
    DueDeliveries {
        claimed: bool,
    },
    Claim {
        pick: Index,
    },
    Attempt {
        pick: Index,
        success: bool,
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

pub fn setup() -> impl Strategy<Value = Setup> {
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
        prop::bool::weighted(0.25),
    )
        .prop_map(|(scope, operation, amount, spent, key, bulk)| Op::Fund {
            scope,
            operation,
            amount,
            spent,
            key,
            bulk,
        });
    // Archiving at once, soon, or never in a case: sequences cross the boundary between
    // the state and the archive all the time.
    let archive_after = prop_oneof![Just(0), Just(SECOND), Just(i64::MAX)];
    let maintain = (prop_oneof![0..=3usize, Just(usize::MAX)], archive_after).prop_map(
        |(limit, archive_after_ms)| Op::Maintain {
            limit,
            archive_after_ms,
        },
    );
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
    // Rare, and a close rarer still: after it every write is refused.
    let tenant_status = prop_oneof![
        3 => Just(TenantStatus::Active),
        3 => Just(TenantStatus::Suspended),
        1 => Just(TenantStatus::Closed),
    ]
    .prop_flat_map(|status| (Just(status), any::<bool>()))
    .prop_map(|(status, bulk)| Op::TenantStatus { status, bulk });
    let webhooks = prop_oneof![
        1 => (0..2usize, any::<bool>())
            .prop_map(|(subscription, active)| Op::WebhookStatus { subscription, active }),
        1 => any::<bool>().prop_map(|claimed| Op::DueDeliveries { claimed }),
        1 => any::<Index>().prop_map(|pick| Op::Claim { pick }),
        3 => (any::<Index>(), prop::bool::weighted(0.7))
            .prop_map(|(pick, success)| Op::Attempt { pick, success }),
    ];
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
        1 => tenant_status,
        2 => webhooks,
    ]
}

pub fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..200)
}
