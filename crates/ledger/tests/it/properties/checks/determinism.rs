//! Properties 5 and 6: determinism, journals and snapshots.

use ledger::{apply, Applied, Command, Millis, State, TERMINAL_RETENTION_MS};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::normalized;
use crate::properties::driver::Driver;
use crate::properties::{DAY, HOUR};

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

pub fn check_determinism(driver: Driver) -> Result<(), TestCaseError> {
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

pub fn check_restore_midway(driver: &Driver, split: Index) -> Result<(), TestCaseError> {
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
