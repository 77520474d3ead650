//! Properties 5 and 6: determinism, journals and snapshots.

use crate::properties::model::{apply, at_step, Command, Outcome, Step as Applied};
use ledger::{Effect, Millis, Rejection, State, TERMINAL_RETENTION_MS};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::normalized;
use crate::properties::driver::Driver;
use crate::properties::{DAY, HOUR};

/// Maintenance passes far enough ahead that every lease lapses and every retention ends.
fn horizon_probes(now: Millis) -> [(Command, Millis); 3] {
    [
        (
            Command::Maintain {
                limit: 2,
                archive_after_ms: 0,
            },
            now + HOUR,
        ),
        (
            Command::Maintain {
                limit: usize::MAX,
                archive_after_ms: 0,
            },
            now + 2 * HOUR,
        ),
        (
            Command::Maintain {
                limit: usize::MAX,
                archive_after_ms: 0,
            },
            now + 2 * HOUR + TERMINAL_RETENTION_MS + DAY,
        ),
    ]
}

pub fn check_determinism(driver: Driver) -> Result<(), TestCaseError> {
    // The same commands on a fresh state give the same results, bit for bit.
    let mut twin = State::new();
    for (step, (command, now, applied)) in driver.log.iter().enumerate() {
        at_step(step);
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
    for (step, (command, at)) in horizon_probes(driver.now).into_iter().enumerate() {
        at_step(driver.log.len() + step);
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

pub fn check_archive_is_invisible(driver: &Driver) -> Result<(), TestCaseError> {
    let mut kept = State::new();
    for (step, (command, now, applied)) in driver.log.iter().enumerate() {
        at_step(step);
        let never_archived = match command {
            Command::Maintain { limit, .. } => Command::Maintain {
                limit: *limit,
                archive_after_ms: Millis::MAX,
            },
            other => other.clone(),
        };
        let again = apply(&mut kept, never_archived, *now);
        // Housekeeping differs by design: an archived record leaves with its reservation
        // instead of being evicted on its own later.
        let result = |r: &Result<Outcome, Rejection>| match r {
            Ok(Outcome::Maintained {
                expired,
                keys_expired,
                ..
            }) => Ok(Outcome::Maintained {
                expired: *expired,
                keys_expired: *keys_expired,
                evicted: 0,
                archived: 0,
            }),
            other => other.clone(),
        };
        let effects = |a: &Applied| -> Vec<Effect> {
            a.effects
                .iter()
                .filter(|e| {
                    !matches!(
                        e,
                        Effect::ArchiveReservation(_)
                            | Effect::ForgetArchivedKeys { .. }
                            | Effect::RemoveIdempotency(_)
                    )
                })
                .cloned()
                .collect()
        };
        prop_assert_eq!(
            result(&again.result),
            result(&applied.result),
            "archiving changed the answer to {:?}",
            command
        );
        prop_assert_eq!(
            effects(&again),
            effects(applied),
            "archiving changed the effects of {:?}",
            command
        );
    }
    Ok(())
}

pub fn check_restore_midway(driver: &Driver, split: Index) -> Result<(), TestCaseError> {
    let k = split.index(driver.log.len() + 1);
    let mut state = State::new();
    for (step, (command, now, _)) in driver.log[..k].iter().enumerate() {
        at_step(step);
        apply(&mut state, command.clone(), *now);
    }
    let mut restored = State::from_snapshot(state.to_snapshot());
    for (step, (command, now, applied)) in driver.log.iter().enumerate().skip(k) {
        at_step(step);
        let again = apply(&mut restored, command.clone(), *now);
        prop_assert_eq!(&again, applied, "restored state diverged on {:?}", command);
    }
    Ok(())
}
