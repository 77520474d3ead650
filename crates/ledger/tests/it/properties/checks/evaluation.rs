//! Property 4: evaluation (decide, dry run) predicts admission (live reserve).

use ledger::{apply, Command, Decision, Outcome, ReserveCmd};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::properties::checks::reason_code;
use crate::properties::driver::{decide_cmd, reserve_cmd, sealed, Step};

pub fn check_evaluation(step: &Step) -> Result<(), TestCaseError> {
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
