//! Property tests for the ledger state machine.
//!
//! Every case provisions one tenant, one API key and up to four budgets at random, then
//! drives `ledger::apply` with a random sequence of reserves (live and dry run), commits,
//! releases, extensions, direct events, decisions, funding operations, maintenance passes,
//! webhook pauses and resumptions, delivery attempts and clock advances; two webhook
//! subscriptions and a key that expires watch it. Idempotency keys are reused now and then, and earlier requests are
//! resent verbatim. Each property checks one family of rules after every command.

mod checks;
mod driver;
mod model;
mod strategies;

use std::sync::Arc;

use crate::properties::model::{apply, Command, Outcome};
use ledger::{Millis, State, Unit};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::properties::checks::balances::Accounts;
use crate::properties::checks::determinism::{
    check_archive_is_invisible, check_determinism, check_restore_midway,
};
use crate::properties::checks::evaluation::check_evaluation;
use crate::properties::checks::events::check_events;
use crate::properties::checks::idempotency::Replays;
use crate::properties::checks::lifecycle::check_invariants;
use crate::properties::driver::{
    no_check, reserve_cmd, sealed, setup_commands, subject, Driver, Step,
};
use crate::properties::strategies::{ops, setup, BudgetSpec, Setup};

pub const TENANT: &str = "t";
pub const DIGEST: [u8; 32] = [7; 32];
pub const UNIT: Unit = Unit::UsdMicrocents;
pub const START: Millis = 1_700_000_000_000;
pub const SECOND: Millis = 1_000;
pub const HOUR: Millis = 3_600 * SECOND;
pub const DAY: Millis = 24 * HOUR;
/// The tenant's maximum reservation TTL (the ledger's default; the setup does not set one).
pub const MAX_TTL: Millis = HOUR;
/// Every idempotency record must stay replayable for at least this long.
pub const MIN_IDEMPOTENCY_RETENTION: Millis = DAY;
/// A bulk action's key replays for 15 minutes (admin spec §5).
pub const BULK_RETENTION: Millis = 15 * 60_000;

/// The scopes budgets may be created at (each one present or not, at random).
pub const BUDGET_SCOPES: [&str; 4] = [
    "tenant:t",
    "tenant:t/workspace:w",
    "tenant:t/workspace:w/agent:a",
    "tenant:t/workspace:w/agent:b",
];

/// Subjects as `(tenant, workspace, agent)`. Mixed case is deliberate: scopes lower-case it.
/// The last two reach only the tenant budget (no budget exists at their deeper scopes).
pub const SUBJECTS: [(&str, Option<&str>, Option<&str>); 6] = [
    ("T", None, None),
    ("t", Some("w"), None),
    ("t", Some("w"), Some("a")),
    ("t", Some("W"), Some("B")),
    ("t", None, Some("a")),
    ("t", Some("x"), Some("a")),
];

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

    /// Every change emits exactly the events it implies (threshold crossings and key
    /// expiries checked against the balances and keys), each delivered once to every ACTIVE
    /// subscription that wants it; a refusal emits nothing of its own.
    #[test]
    fn events_follow_changes_and_route_exactly(setup in setup(), ops in ops()) {
        Driver::run(&setup, &ops, &mut check_events)?;
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

    /// Archiving is invisible: the same commands with every settled reservation kept in
    /// memory answer the same, and change the same, as when they were archived (each
    /// answered from the archive).
    #[test]
    fn archived_reservations_answer_as_kept_ones(setup in setup(), ops in ops()) {
        let driver = Driver::run(&setup, &ops, &mut no_check)?;
        check_archive_is_invisible(&driver)?;
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
