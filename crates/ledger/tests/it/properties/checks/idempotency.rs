//! Property 3: idempotency.

use std::collections::HashMap;

use ledger::{Millis, Rejection, StoredOutcome};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::stored_outcome;
use crate::properties::driver::{namespace, Namespace, Step};
use crate::properties::{BULK_RETENTION, MIN_IDEMPOTENCY_RETENTION};

struct Record {
    fingerprint: [u8; 32],
    outcome: StoredOutcome,
    at: Millis,
}

/// The first successful outcome per idempotency key, as the client saw it.
#[derive(Default)]
pub struct Replays {
    records: HashMap<(Namespace, String), Record>,
}

impl Replays {
    pub fn check(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let Some((ns, idem)) = namespace(step.command) else {
            return Ok(());
        };
        // A record is certainly still live within the minimum retention (a bulk action's is
        // shorter).
        let retention = if matches!(ns.0, "tenants-bulk" | "budgets-bulk") {
            BULK_RETENTION
        } else {
            MIN_IDEMPOTENCY_RETENTION
        };
        let slot = (ns, idem.key.to_string());
        let prior = self.records.get(&slot);
        let live = prior.filter(|p| step.now < p.at + retention);
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
                    // Only a request naming an unknown budget, or a caller whose key was
                    // revoked (by its tenant's close), is refused before its key is looked
                    // at; anything else must replay or report the mismatch.
                    let early = (matches!(e, Rejection::BudgetNotFound(_))
                        && prior.fingerprint != idem.fingerprint)
                        || matches!(e, Rejection::Unauthorized(m) if m.contains("revoked"));
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
