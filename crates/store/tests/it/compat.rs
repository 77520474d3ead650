//! Data written by an earlier release recovers as it did then, byte for byte.
//!
//! `fixtures/format-1` is a data directory written by a release of format version 1 (its
//! README says which, and what it holds): a snapshot, the journal segment it covers and a
//! journal tail after it, plus `expected-state.bin`, the state that release recovered from
//! them. Journals and snapshots record effects and state, not requests, so changing how the
//! ledger decides must leave this recovery unchanged; a change to the format fails here.

use std::fmt::Debug;
use std::fs;
use std::path::Path;

use ledger::{SnapshotData, SnapshotV1, State};
use store::embedded::{recover, verify, Recovered};
use tempfile::TempDir;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format-1");
const EXPECTED_STATE: &str = "expected-state.bin";
/// The journal sequence number the fixture's snapshot covers, and the last one written.
const SNAPSHOT_SEQ: u64 = 37;
const LAST_SEQ: u64 = 71;

/// The fixture's data files (not its README or expected state) in a scratch directory:
/// recovery with repair may write to them, and the fixture must stay as written.
fn copy_fixture() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in fs::read_dir(FIXTURE).expect("read fixture") {
        let path = entry.expect("fixture entry").path();
        let name = path.file_name().expect("file name");
        let name_str = name.to_str().expect("UTF-8 name");
        if name_str.starts_with("journal-") || name_str.starts_with("snapshot-") {
            fs::copy(&path, dir.path().join(name)).expect("copy fixture file");
        }
    }
    dir
}

/// The persistent state with its records in a fixed order: idempotency records come out of
/// a state in arrival order, which depends on how it was rebuilt, not on what it holds.
fn canonical(state: &State) -> SnapshotData {
    let mut data = state.to_snapshot();
    data.reservations.sort_by_key(|r| r.reservation_id.clone());
    data.idempotency.sort_by(|a, b| a.0.cmp(&b.0));
    data
}

/// Asserts that `recovered` started from the snapshot, replayed the whole journal tail and
/// holds exactly the state the release recovered.
#[track_caller]
fn assert_recovered_as_written(what: &str, recovered: &Recovered, expected: &[u8]) {
    assert_eq!(
        recovered.snapshot_seq,
        Some(SNAPSHOT_SEQ),
        "{what}: snapshot"
    );
    assert_eq!(
        recovered.records_replayed,
        LAST_SEQ - SNAPSHOT_SEQ,
        "{what}: journal records replayed after the snapshot"
    );
    assert_eq!(recovered.last_seq, LAST_SEQ, "{what}: last seq");
    assert_eq!(recovered.truncated_bytes, 0, "{what}: nothing is torn");
    let state = canonical(&recovered.state);
    // Format 1 knew no webhooks: none come out of it, and the rest encodes as it did.
    assert!(
        state.webhooks.is_empty() && state.deliveries.is_empty(),
        "{what}: webhooks"
    );
    assert_eq!(
        (
            &state.webhook_security,
            state.last_event,
            state.last_delivery
        ),
        (&None, 0, 0),
        "{what}: webhook state"
    );
    let state = SnapshotV1 {
        tenants: state.tenants,
        api_keys: state.api_keys,
        budgets: state.budgets,
        policies: state.policies,
        reservations: state.reservations,
        idempotency: state.idempotency,
    };
    let bytes = postcard::to_allocvec(&state).expect("encode state");
    if bytes == expected {
        return;
    }
    // Name the first difference, where the expected state still decodes.
    let written: SnapshotV1 = postcard::from_bytes(expected)
        .expect("the expected state no longer decodes: the state's encoding changed");
    first_difference(what, "tenants", &state.tenants, &written.tenants);
    first_difference(what, "API keys", &state.api_keys, &written.api_keys);
    first_difference(what, "budgets", &state.budgets, &written.budgets);
    first_difference(what, "policies", &state.policies, &written.policies);
    first_difference(
        what,
        "reservations",
        &state.reservations,
        &written.reservations,
    );
    first_difference(
        what,
        "idempotency",
        &state.idempotency,
        &written.idempotency,
    );
    panic!("{what}: the recovered state is equal but encodes differently");
}

#[track_caller]
fn first_difference<T: PartialEq + Debug>(what: &str, rows: &str, got: &[T], written: &[T]) {
    assert_eq!(got.len(), written.len(), "{what}: number of {rows}");
    if let Some((got, written)) = got.iter().zip(written).find(|(g, w)| g != w) {
        panic!("{what}: {rows} differ\nrecovered: {got:?}\n  written: {written:?}");
    }
}

#[test]
fn a_format_1_data_directory_recovers_the_state_it_was_written_with() {
    let expected = fs::read(Path::new(FIXTURE).join(EXPECTED_STATE)).expect("read expected");
    let dir = copy_fixture();

    let (read_only, violations) = verify(dir.path()).expect("verify the fixture");
    assert!(violations.is_empty(), "{violations:?}");
    assert_recovered_as_written("verify", &read_only, &expected);

    let repaired = recover(dir.path(), true).expect("recover the fixture");
    assert_recovered_as_written("recovery with repair", &repaired, &expected);
}
